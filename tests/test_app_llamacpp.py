"""The app's pages with llama.cpp as they are with vLLM, against the llama-server stand-in (tests/fake_llamacpp.py):
the Benchmarks page shows a report's llama-server lanes (made by bench.run_bench with a stand-in llama-server
program, tests/fake_llama_server.py) beside ours; the app pointed at a llama-server (SPECVIZ_BACKEND=llama+http://...)
decodes on Live decoding with the counts-only note naming llama.cpp, and the tree explorer and the lab say they
have nothing to show for it; the race runs a llama.cpp lane beside ours. No page raises, and none calls llama.cpp
vLLM."""
import json
import stat
import sys
from pathlib import Path

import fake_llamacpp
import pandas
import pytest
from fake_llamacpp import Served
from streamlit.testing.v1 import AppTest
from test_bench_llamaserver import PROMPTS, settings

from app import teaching
from app.lanes import MEASURED_ONLY, read_race_data
from app.state import ENV_BACKEND, ENV_MODEL
from specviz import bench, roofline
from specviz.bench import llamaserver
from specviz.models import LoadedModels

from tiny import TinyTokenizer, tiny_llama

APP = str(Path(__file__).resolve().parent.parent / "app.py")
TIMEOUT = 120  # as tests/test_app.py: a 2-core CPU under load
LANES = ("plain:threads=1", "draft-eagle3:p_min=0.6,n_max=3")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    """A bench report with two llama-server lanes: the stand-in program plays llama-server, empty files its GGUFs
    (as tests/test_bench_llamaserver.py's fake_server)."""
    folder = tmp_path_factory.mktemp("llama-server")
    program = folder / "llama-server"
    script = Path(__file__).resolve().parent / "fake_llama_server.py"
    program.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    program.chmod(program.stat().st_mode | stat.S_IEXEC)
    files = {kind: folder / f"{kind}.gguf" for kind in ("target", "draft", "eagle3")}
    for f in files.values():
        f.write_bytes(b"")
    target = tiny_llama(scale=3.0)
    tiny = LoadedModels("tiny", target, None, TinyTokenizer(64), target.device, target.dtype)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECVIZ_LLAMA_SERVER", str(program))
        mp.setattr(llamaserver, "lane_files", lambda model, configs: files)
        return bench.run_bench(tiny, PROMPTS, settings(llama_server=LANES))


def ok(at):
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def shown(at) -> list[str]:
    """Every message, caption and Markdown text on the page and in its sidebar."""
    kinds = ("markdown", "caption", "info", "warning", "success", "error", "subheader", "title")
    return [e.value for root in (at, at.sidebar) for kind in kinds for e in getattr(root, kind)]


def not_called_vllm(at) -> None:
    """No text names vLLM, but the histogram's note, which cites vLLM's convention beside llama.cpp's."""
    wrong = [text for text in shown(at) if "vLLM" in text and not text.startswith(teaching.HISTOGRAM_NOTE)]
    assert not wrong, wrong


def test_the_benchmarks_page_shows_a_reports_llama_server_lanes(report, tiny_model_dir, monkeypatch):
    section = report["llama_server"]
    eagle = section["lanes"]["draft-eagle3:p_min=0.6,n_max=3"]
    data = json.dumps(report).encode()
    assert bench.parse_report(data, "bench.json")["llama_server"] == section  # the upload's schema check

    monkeypatch.setenv(ENV_MODEL, str(tiny_model_dir))
    at = ok(AppTest.from_file(APP, default_timeout=TIMEOUT).run())
    at.switch_page("app/pages/benchmarks.py")
    ok(at.run())
    at.radio(key="bench_source").set_value("upload a JSON file")
    ok(at.run())
    at.get("file_uploader")[0].upload("bench.json", data, "application/json")
    ok(at.run())

    tables = [t.value for t in at.dataframe]
    lanes = next(t for t in tables if "mean length (llama.cpp's)" in t.columns)
    assert list(lanes["lane"]) == list(LANES) and list(lanes["threads"]) == [1, eagle["threads"]]
    row = lanes[lanes["lane"] == LANES[1]].iloc[0]
    assert row["τ"] == round(eagle["tau"], 2) == 2.0 and row["mean length (llama.cpp's)"] == round(1 + 10 / 8, 2)
    assert row["acceptance"] == round(eagle["acceptance_rate"], 2) and row["tokens/s"] == round(eagle["tokens_per_s"], 1)
    assert row["over none (median)"] == round(eagle["speedup_vs_none"]["median"], 2)
    assert row["output = none (prompts)"] == "0 of 2"  # the stand-in is another model: reported, not an error
    plain = lanes[lanes["lane"] == LANES[0]].iloc[0]
    assert plain["τ"] == 1.0 and pandas.isna(plain["acceptance"])  # it drafts nothing
    depth = next(t for t in tables if "d=1" in t.columns)
    assert list(depth.iloc[0]) == [LANES[1], 0.75, 0.5, 0.0]  # the plain lane drafts nothing: no row
    over = next(t for t in tables if "ours" in t.columns)
    assert list(over["ours"]) == ["none", "ngram"]
    assert {f"over {label} (median, min–max)" for label in LANES} <= set(over.columns)
    captions = [c.value for c in at.caption]
    assert any("llama.cpp exposes no q, no tree and no u" in c and "8 bits" in c for c in captions)
    assert any("each llama-server lane as llama.cpp:<label>" in c for c in captions)
    assert "--spec-type draft-eagle3" in "".join(m.value for m in at.markdown)  # the servers' command lines

    charts = {c["layout"]["title"]["text"].split("<br>")[0]: c["data"]
              for c in (json.loads(chart.proto.spec) for chart in at.get("plotly_chart"))}
    rates = charts["Tokens per second (all prompts together)"]
    assert any(bar["name"] == "llama.cpp (llama-server)" and bar["x"] == [f"llama.cpp:{label}" for label in LANES]
               for bar in rates)
    assert f"llama.cpp:{LANES[1]}" in {trace["name"] for trace in charts["Per-position acceptance"]}
    assert f"llama.cpp:{LANES[1]}" in {trace["name"] for trace in charts["Acceptance histogram (all prompts)"]}


def test_the_app_on_llamacpp_decodes_live_and_says_what_it_cannot_show(monkeypatch):
    with Served() as server:
        monkeypatch.setenv(ENV_BACKEND, "llama+" + server.url)
        at = ok(AppTest.from_file(APP, default_timeout=TIMEOUT).run())
        assert at.sidebar.selectbox(key="sb_drafter").options == ["llamacpp"]
        at.switch_page("app/pages/live.py")
        ok(at.run())
        at.sidebar.slider(key="sb_max_new").set_value(10)
        ok(at.run())
        at.button(key="live_run").click()
        ok(at.run())
        events = at.session_state["live_events"]
        assert events[0]["engine"] == "llamacpp" and events[0]["detail"] == "counts"
        assert len(events[-1]["token_ids"]) == 10
        html = "".join(h.proto.body for h in at.html)
        assert html.count('class="specviz-token"') == 10
        assert [m.value for m in at.metric][:3] == ["5", "10", "2.00"]  # the prefill's token, then 3, 2, 1, 3
        charts = [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
        assert len(charts) == 2  # the step chart, and the acceptance histogram from llama.cpp's per-step counts
        assert [bar["customdata"] for bar in charts[1]["data"]] == [[1, 1, 2, 0]]  # accepting 2, 1, 0, 2 of 3
        notes = [i.value for i in at.info if "no draft tree" in i.value]
        assert notes and all("came from llama.cpp" in n for n in notes)
        not_called_vllm(at)
        for page in ("app/pages/tree.py", "app/pages/lab.py"):
            at.switch_page(page)
            ok(at.run())
            assert any("came from llama.cpp" in i.value and "nothing to show" in i.value for i in at.info), page
            not_called_vllm(at)
        assert server.app.state.requests  # the run went to the stand-in


def test_the_race_runs_a_llamacpp_lane_beside_ours(tiny_model_dir, monkeypatch):
    monkeypatch.setenv(ENV_MODEL, str(tiny_model_dir))
    monkeypatch.delenv("SPECVIZ_RACE_BACKEND", raising=False)
    with Served() as server:
        at = AppTest.from_file(APP, default_timeout=TIMEOUT)
        at.query_params["max_tokens"] = "6"
        ok(at.run())
        at.switch_page("app/pages/race.py")
        ok(at.run())
        assert "llamacpp" not in at.multiselect(key="race_drafters").options
        at.text_input(key="race_engine").set_value("llama+" + server.url)
        ok(at.run())
        assert "llamacpp" in at.multiselect(key="race_drafters").options
        at.multiselect(key="race_drafters").set_value(["none", "llamacpp"])
        at.number_input(key="race_temperature").set_value(0.0)
        ok(at.run())
        at.button(key="race_run").click()
        ok(at.run())
        runs = {d: events for (_, d), events in at.session_state["race_cache"].items()}
        assert {"none", "llamacpp"} <= set(runs)  # the cache may also hold a run the page made before the choice
        lane = runs["llamacpp"]
        assert lane[0]["engine"] == "llamacpp" and lane[0]["detail"] == "counts"
        assert len(lane[-1]["token_ids"]) == 6
        prompt = server.app.state.requests[-1]["prompt"]  # token ids, or the chat template's text
        ids = list(prompt) if isinstance(prompt, list) else list(range(len(prompt.split())))
        assert lane[-1]["token_ids"] == fake_llamacpp.continuation(ids, 6)
        frames = at.get("iframe")
        assert len(frames) == 1  # the lanes, ours and llama.cpp's, replay together
        shown_lanes = {lane["drafter"]: lane for lane in read_race_data(frames[0].proto.srcdoc)["lanes"]}
        assert list(shown_lanes) == ["none", "llamacpp"] and shown_lanes["llamacpp"]["tau"] == 2.0  # 1 + 3 + 2
        assert shown_lanes["llamacpp"]["same_as_none"] is None  # not marked as a lane of ours that parted
        results = next(t.value for t in at.dataframe if "lane" in t.value.columns)
        assert any("`llamacpp` 0, 1, 1, 0; 1 drafted nothing" in c.value for c in at.caption)  # its histogram
        assert list(results["lane"]) == ["none", "llamacpp"]
        # another engine's greedy text is compared for information, not taken for a failed drafter
        assert not any("failed drafter" in w.value for w in at.warning)
        assert any("llamacpp" in i.value and "llama.cpp" in i.value and "for information" in i.value for i in at.info)
        # a modelled clock replays our lane; llama.cpp's chunks keep the time measured, and the page says so
        at.selectbox(key="race_clock").set_value(next(iter(roofline.PRESETS)))
        ok(at.run())
        modelled = {lane["drafter"]: lane for lane in read_race_data(at.get("iframe")[0].proto.srcdoc)["lanes"]}
        assert "MODELLED clock" in modelled["none"]["label"]
        assert modelled["llamacpp"]["steps"] == shown_lanes["llamacpp"]["steps"]
        assert modelled["llamacpp"]["label"] == MEASURED_ONLY and modelled["llamacpp"]["baseline"] is None
        assert any("`llamacpp` keeps the time measured" in w.value for w in at.warning)
        not_called_vllm(at)
