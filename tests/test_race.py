"""The topology race: lanes built from each run's events (app/lanes.py), the replay document, the trace bundle,
and the page through streamlit's AppTest on the tiny model with itself as the draft model (so three drafters:
none, ngram, draft)."""
import io
import json
import zipfile
from dataclasses import asdict
from pathlib import Path

import pytest
from streamlit.delta_generator import DeltaGenerator
from streamlit.testing.v1 import AppTest

from app import lanes, state
from specviz import models as m
from specviz import roofline
from specviz.backends.local import LocalBackend
from specviz.decoding.settings import DecodeSettings
from specviz.errors import SpecvizError

APP = str(Path(__file__).resolve().parent.parent / "app.py")
TIMEOUT = 120  # AppTest's default (3 s) is for scripts without a model; a 2-core CPU under load needs far more
PROMPT = "Count: one two three one two three"
THREE = ["none", "ngram", "draft"]


@pytest.fixture(scope="module")
def runs(tiny_model_dir) -> dict[str, list[dict]]:
    """A race of three drafters at temperature 0 on the tiny model (its own draft model)."""
    shared = LocalBackend(m.load(str(tiny_model_dir), draft_model=str(tiny_model_dir), device="cpu"))
    return {d: shared.run(PROMPT, drafter=d, settings=DecodeSettings(max_new_tokens=10)) for d in THREE}


def committed(events: list[dict]) -> list[list[str]]:
    return [[c["text"], c["kind"]] for e in events if e["type"] == "step" for c in e["committed"]]


def assert_lanes_follow(lane_dicts: list[dict], runs: dict[str, list[dict]]) -> None:
    """Each lane holds its run's tokens (with their kinds), step times and finish time, in the runs' order."""
    assert [lane["drafter"] for lane in lane_dicts] == list(runs)
    for lane in lane_dicts:
        events = runs[lane["drafter"]]
        steps = [e for e in events if e["type"] == "step"]
        assert [t for s in lane["steps"] for t in s["tokens"]] == committed(events)
        assert sum(len(s["tokens"]) for s in lane["steps"]) == lane["new_tokens"] == events[-1]["stats"]["new_tokens"]
        assert [s["t"] for s in lane["steps"]] == [s["timing"]["elapsed_s"] for s in steps]
        assert lane["finish_s"] == steps[-1]["timing"]["elapsed_s"]
        assert lane["tokens_per_s"] == events[-1]["stats"]["tokens_per_s"]


# ------------------------------------------------------------------------------------------ app/lanes.py


def test_lanes_hold_each_runs_tokens_and_measured_times(runs):
    built = lanes.build_lanes(runs)
    assert_lanes_follow([asdict(lane) for lane in built], runs)
    assert [lane.same_as_none for lane in built] == [True, True, True]  # temperature 0: every text is none's
    assert {c[1] for lane in built for s in lane.steps for c in s["tokens"]} >= {"autoregressive", "accepted"}


def test_a_lane_whose_text_differs_from_none_is_marked(runs):
    changed = json.loads(json.dumps(runs["ngram"]))
    changed[-1]["token_ids"] = changed[-1]["token_ids"][:-1] + [changed[-1]["token_ids"][-1] + 1]
    built = lanes.build_lanes({"none": runs["none"], "ngram": changed})
    assert [lane.same_as_none for lane in built] == [True, False]
    hot = json.loads(json.dumps(runs))
    for events in hot.values():
        events[0]["sampling"]["temperature"] = 1.0
    assert [lane.same_as_none for lane in lanes.build_lanes(hot)] == [None, None, None]  # samples: nothing to match


def test_the_document_embeds_the_lanes_and_needs_no_network(runs):
    built = lanes.build_lanes(runs)
    data = lanes.race_data(built, prompt=PROMPT, temperature=0.0, max_new_tokens=10, note="a note")
    document = lanes.race_document(data)
    assert lanes.read_race_data(document) == json.loads(json.dumps(data))
    assert "<script src" not in document and "<link" not in document and "http" not in document.lower()
    assert data["speeds"] == [0.25, 0.5, 1, 2, 4]  # the speed control's choices, 0.25× to 4×
    assert "D.speeds.forEach" in document  # the document builds its speed menu from them


def test_token_text_cannot_break_out_of_the_document(runs):
    hostile = json.loads(json.dumps(runs))
    step = next(e for e in hostile["none"] if e["type"] == "step")
    step["committed"][0]["text"] = "</script><script>alert(1)</script><!--"
    data = lanes.race_data(lanes.build_lanes(hostile), prompt="<b>hi</b>", temperature=0.0, max_new_tokens=10, note="")
    document = lanes.race_document(data)
    assert "alert(1)" in document and "<script>alert(1)" not in document and "<b>hi" not in document
    assert lanes.read_race_data(document)["lanes"][0]["steps"][0]["tokens"][0][0].startswith("</script>")


def test_a_bundle_exported_and_loaded_back_replays_the_same_lanes(runs):
    data = lanes.write_bundle(runs)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        assert [lane["drafter"] for lane in manifest["lanes"]] == THREE
        assert sorted(zf.namelist()) == sorted(["manifest.json"] + [lane["trace"] for lane in manifest["lanes"]])
    loaded = lanes.read_bundle(data)
    assert loaded == json.loads(json.dumps(runs))
    assert lanes.build_lanes(loaded) == lanes.build_lanes(runs)


def test_a_bundle_keeps_each_lanes_weights_verify_cost_and_draft_share(runs):
    regimes_of = {"none": {"weights": "q4q8", "verify_cost_ratio": 2.67},
                  "draft": {"weights": "q4q8", "verify_cost_ratio": 2.67, "draft_share": 0.08}}
    assert lanes.bundle_about(lanes.write_bundle(runs, regimes_of))[0] == regimes_of


def test_a_modelled_clock_replays_only_specvizs_own_steps(runs):
    """Another engine's lane (a vLLM server's: its chunks as steps, no tree, no draft counts) keeps its measured
    time under a modelled clock, and says so; our lanes beside it are modelled."""
    theirs = json.loads(json.dumps(runs["ngram"]))
    theirs[0].update(engine="vllm", drafter="vllm", detail="counts")
    for event in theirs:
        if event["type"] == "step":
            event.update(nodes=None, drafted=None, accepted=None)
    clock = roofline.PRESETS[roofline.H100_70B]
    none, vllm = lanes.build_lanes({"none": runs["none"], "vllm": theirs}, clock=clock)
    assert [s["t"] for s in none.steps] == roofline.step_times(runs["none"], clock)
    assert [s["t"] for s in vllm.steps] == [e["timing"]["elapsed_s"] for e in theirs if e["type"] == "step"]
    assert vllm.tokens_per_s == theirs[-1]["stats"]["tokens_per_s"]
    assert "MODELLED" not in vllm.label and "measured" in vllm.label and "only specviz's own steps" in vllm.label
    assert vllm.baseline is None  # no speedup of measured time over a modelled `none`
    assert vllm.same_as_none is True  # its text is still compared


def zipped(files: dict[str, str | bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, content in files.items():
            zf.writestr(name, content)
    return buffer.getvalue()


def manifest(*lanes_: tuple[str, str]) -> str:
    return json.dumps({"format": lanes.BUNDLE_FORMAT, "version": 1,
                       "lanes": [{"drafter": d, "trace": f} for d, f in lanes_]})


def trace_text(events: list[dict]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


@pytest.mark.parametrize("make, message", [
    (lambda r: b"PK not really a zip", "not a zip file"),
    (lambda r: zipped({"lane.jsonl": trace_text(r["none"])}), "no manifest.json"),
    (lambda r: zipped({"manifest.json": "{nope"}), "manifest.json is not JSON"),
    (lambda r: zipped({"manifest.json": json.dumps({"format": "other"})}), "not a specviz-race-bundle manifest"),
    (lambda r: zipped({"manifest.json": json.dumps({"format": lanes.BUNDLE_FORMAT, "version": 1, "lanes": []})}),
     "lists no lanes"),
    (lambda r: zipped({"manifest.json": manifest(("none", "gone.jsonl"))}), "which the zip does not hold"),
    (lambda r: zipped({"manifest.json": manifest(("none", "a.jsonl")), "a.jsonl": '{"type": "step"}\n'}),
     "not a specviz trace"),
    (lambda r: zipped({"manifest.json": manifest(("none", "a.jsonl")), "a.jsonl": trace_text(r["none"][:-1])}),
     "ends before its done event"),
    (lambda r: zipped({"manifest.json": manifest(("ngram", "a.jsonl")), "a.jsonl": trace_text(r["none"])}),
     "is a run of 'none', not of 'ngram'"),
    (lambda r: zipped({"manifest.json": manifest(("[x](http://e)", "a.jsonl")), "a.jsonl": trace_text(r["none"])}),
     "not a drafter name"),
    (lambda r: zipped({"manifest.json": manifest(("none", "a.jsonl")),
                       "a.jsonl": trace_text([r["none"][0], {**r["none"][1], "committed": "x"}, r["none"][-1]])}),
     "does not follow the specviz event schema"),
    (lambda r: zipped({"manifest.json": manifest(("none", "a.jsonl"), ("ngram", "b.jsonl")),
                       "a.jsonl": trace_text(r["none"]),
                       "b.jsonl": trace_text([{**r["ngram"][0], "seed": 99}] + r["ngram"][1:])}),
     "the ngram lane ran with another seed than the none lane"),
])
def test_a_malformed_bundle_is_a_clear_error(runs, make, message):
    with pytest.raises(SpecvizError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        lanes.read_bundle(make(runs), "race.zip")


def test_the_run_store_is_bounded_and_keeps_the_recently_used():
    store = lanes.RunStore(max_runs=2)
    store.put("a", [1])
    store.put("b", [2])
    assert store.get("a") == [1]  # now the most recent
    store.put("c", [3])
    assert store.get("b") is None and store.get("a") == [1] and store.get("c") == [3]


# ------------------------------------------------------------------------------------------ the page


@pytest.fixture
def race_app(tiny_model_dir, monkeypatch):
    """The app with the tiny model as target and draft; the process-wide model and finished races start empty."""
    load = m.load
    monkeypatch.setattr(m, "load", lambda name, **options: load(name, **{**options, "draft_model": name}))
    monkeypatch.setenv(state.ENV_MODEL, str(tiny_model_dir))
    state.st.cache_resource.clear()  # the loaded model (loaded again with its draft) and the finished races
    yield
    state.st.cache_resource.clear()


def ok(at):
    assert not at.exception, [e.value for e in at.exception]
    return at


def race_page(**params) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in params.items():
        at.query_params[key] = value
    ok(at.run())
    at.switch_page("app/pages/race.py")
    return ok(at.run())


def shown_data(at) -> dict:
    """The data of the race document the page shows."""
    frames = at.get("iframe")
    assert len(frames) == 1
    return lanes.read_race_data(frames[0].proto.srcdoc)


def race_runs(at) -> dict[str, list[dict]]:
    return {d: events for (_, d), events in at.session_state["race_cache"].items()}


@pytest.fixture
def downloads(monkeypatch) -> dict:
    """What each download button of a run offers, by label (AppTest keeps only a media URL)."""
    offered, original = {}, DeltaGenerator.download_button

    def record(self, label, data, *args, **kwargs):
        offered[label] = data
        return original(self, label, data, *args, **kwargs)

    monkeypatch.setattr(DeltaGenerator, "download_button", record)
    return offered


def test_a_race_of_three_drafters_builds_lanes_from_its_runs(race_app, downloads):
    at = race_page(drafters=",".join(THREE), max_tokens="8")
    assert not at.get("iframe")  # prefilled, ready to press start
    at.button(key="race_run").click()
    ok(at.run())
    assert not at.error, [e.value for e in at.error]
    runs = race_runs(at)
    assert list(runs) == THREE and all(e[-1]["stats"]["new_tokens"] <= 8 for e in runs.values())
    data = shown_data(at)
    assert_lanes_follow(data["lanes"], runs)
    assert "one after another" in data["note"] and "one engine worker per lane" in data["note"]
    assert any("every lane produced exactly the same text as `none`" in s.value for s in at.success)
    # the analysis stays below the lanes
    assert len(at.dataframe) == 1 and len(at.get("plotly_chart")) >= 4

    html = downloads["Download the race (HTML, replays offline)"]
    assert html == at.get("iframe")[0].proto.srcdoc  # the file is the document the page shows
    assert_lanes_follow(lanes.read_race_data(html)["lanes"], runs)  # every lane's tokens and timings
    assert lanes.read_bundle(downloads["Download the trace bundle (zip: one JSONL trace per lane)"]) == runs


def test_the_url_prefills_the_race_and_the_page_keeps_it_in_the_url(race_app):
    at = race_page(prompt="Say hi", drafters="ngram,none,nope", seed="7", temperature="0.5", max_tokens="5",
                   presenter="0")
    assert at.text_input(key="race_prompt").value == "Say hi"
    assert at.multiselect(key="race_drafters").value == ["ngram", "none"]
    assert at.number_input(key="race_seed").value == 7
    assert at.number_input(key="race_temperature").value == 0.5
    assert at.number_input(key="race_max_new").value == 5
    assert at.toggle(key="race_presenter").value is False
    assert [w.value for w in at.warning] == ["Left out of the link's settings: drafters nope (this model offers "
                                             "none, ngram, draft, draft:adaptive=true)."]
    assert dict(at.query_params) == {"prompt": "Say hi", "drafters": "ngram,none", "seed": "7", "temperature": "0.5",
                                     "max_tokens": "5"}
    at.button(key="race_run").click()
    ok(at.run())
    assert {e[0]["seed"] for e in race_runs(at).values()} == {7}
    assert {e[0]["sampling"]["temperature"] for e in race_runs(at).values()} == {0.5}
    assert any("each lane is a different sample of the same distribution" in i.value for i in at.info)


def test_an_empty_prompt_says_so_and_cannot_start_the_race(race_app):
    at = race_page(prompt="   ")
    assert "Enter a prompt to run the race." in [w.value for w in at.warning]
    assert at.button(key="race_run").disabled


def test_a_bad_url_value_is_named_and_the_rest_still_applies(race_app):
    at = race_page(temperature="hot", max_tokens="9999", seed="[x](http://e)", drafters="none")
    assert at.number_input(key="race_temperature").value == 0.0  # the sidebar's
    assert at.multiselect(key="race_drafters").value == ["none"]
    warning = at.warning[0].value
    assert "temperature=hot" in warning and "max_tokens=9999" in warning
    assert "\\[x\\]\\(http://e\\)" in warning  # shown as text, not as a link


def test_a_finished_race_is_shared_with_another_session_at_no_cost(race_app, monkeypatch):
    first = race_page(drafters="none,ngram", max_tokens="6")
    first.button(key="race_run").click()
    ok(first.run())

    def no_decode(*args, **kwargs):
        raise AssertionError("the second showing decoded again")

    monkeypatch.setattr(state, "run_decode", no_decode)
    second = race_page(drafters="none,ngram", max_tokens="6")  # another browser session, the same settings
    assert second.button(key="race_run").label == "Run the race (replay)"
    second.button(key="race_run").click()
    ok(second.run())
    assert shown_data(second)["lanes"] == shown_data(first)["lanes"]
    third = race_page(drafters="none,ngram", max_tokens="6", seed="1")  # another seed: a different run
    assert third.button(key="race_run").label == "Run the race (2 to decode)"


def test_presenter_mode_shows_only_the_lanes(race_app):
    at = race_page(drafters="none,ngram", max_tokens="4", presenter="1")
    assert at.toggle(key="race_presenter").value is True
    assert any('[data-testid="stSidebar"]' in h.proto.body and "display: none" in h.proto.body for h in at.html)
    at.button(key="race_run").click()
    ok(at.run())
    assert shown_data(at)["presenter"] is True and at.get("iframe")
    assert not at.dataframe and not at.get("plotly_chart") and not at.get("download_button")
    assert 'class="race presenter"' in at.get("iframe")[0].proto.srcdoc
    at.toggle(key="race_presenter").set_value(False)
    ok(at.run())
    assert at.dataframe and at.query_params.get("presenter") is None


def test_an_uploaded_bundle_replays_without_a_model_and_a_malformed_one_is_an_error(race_app, runs, monkeypatch):
    monkeypatch.setenv(state.ENV_MODEL, "/no/such/model")
    at = race_page()
    assert any("No model is loaded" in w.value for w in at.warning)
    upload = at.get("file_uploader")[0]
    upload.upload("race.zip", lanes.write_bundle(runs), "application/zip")
    ok(at.run())
    assert not at.main.error, [e.value for e in at.main.error]  # (the sidebar says the folder is missing)
    assert_lanes_follow(shown_data(at)["lanes"], runs)
    assert len(at.dataframe) == 1  # the analysis of the bundle's runs

    at.get("file_uploader")[0].set_value(("bad.zip", b"not a zip at all", "application/zip"))
    ok(at.run())
    assert [e.value for e in at.main.error] == ["Could not load the race bundle: ` bad.zip `: not a zip file (a race "
                                           "bundle is the zip the race page downloads)"]
    assert not at.get("iframe")
