"""The Benchmarks page with a bench report that ran a vLLM lane (`specviz bench --vllm URL=label`), made by
bench.run_bench against the stand-in server (tests/fake_vllm.py) decoding with the tiny target, then uploaded as a
user would: the page's schema check accepts it, and the lane's label, τ and tokens/s show as the page formats them,
beside ours, with no exception anywhere on the page."""
import json
from pathlib import Path

import pytest
from fake_vllm import Served
from streamlit.testing.v1 import AppTest
from test_bench_vllm import PROMPTS, greedy, settings

from app.state import ENV_MODEL
from specviz import bench
from specviz.models import LoadedModels

from tiny import TinyTokenizer, tiny_llama

APP = str(Path(__file__).resolve().parent.parent / "app.py")
TIMEOUT = 120  # as tests/test_app.py: a 2-core CPU under load


@pytest.fixture(scope="module")
def report() -> dict:
    target = tiny_llama(scale=3.0)
    tiny = LoadedModels("tiny", target, None, TinyTokenizer(64), target.device, target.dtype)
    with Served(continuation=greedy(target)) as server:
        return bench.run_bench(tiny, PROMPTS, settings(seed=5, vllm=(("eagle3", server.url),)))


def ok(at):
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_page_checks_and_shows_a_reports_vllm_lane(report, tiny_model_dir, monkeypatch):
    lane = report["vllm"]["lanes"]["eagle3"]
    assert {r["method"] for r in report["runs"]} == {"none", "ngram", "vllm:eagle3"}
    data = json.dumps(report).encode()
    assert bench.parse_report(data, "bench.json")["vllm"] == report["vllm"]  # the upload's schema check

    monkeypatch.setenv(ENV_MODEL, str(tiny_model_dir))
    at = ok(AppTest.from_file(APP, default_timeout=TIMEOUT).run())
    at.switch_page("app/pages/benchmarks.py")
    ok(at.run())
    at.radio(key="bench_source").set_value("upload a JSON file")
    ok(at.run())
    at.get("file_uploader")[0].upload("bench.json", data, "application/json")
    ok(at.run())
    assert not at.error, [e.value for e in at.error]

    tables = [t.value for t in at.dataframe]
    lanes = next(t for t in tables if "lane" in t.columns and "tokens/s" in t.columns)
    row = lanes[lanes["lane"] == "eagle3"].iloc[0]
    assert row["server"] == lane["url"] and row["decoding"] == "speculative"
    assert row["τ"] == round(lane["tau"], 2) == 2.0 and row["tokens/s"] == round(lane["tokens_per_s"], 1)
    assert row["output = none (prompts)"] == "2 of 2"
    depth = next(t for t in tables if "d=1" in t.columns)
    assert list(depth.iloc[0]) == ["eagle3", 0.75, 0.5, 0.0]
    over = next(t for t in tables if "ours" in t.columns)
    assert list(over["ours"]) == ["none", "ngram"] and "over eagle3 (median, min–max)" in over.columns
    assert any("vLLM exposes no q, no tree and no u" in c.value for c in at.caption)
    charts = {c["layout"]["title"]["text"].split("<br>")[0]: c["data"]
              for c in (json.loads(chart.proto.spec) for chart in at.get("plotly_chart"))}
    rates = charts["Tokens per second (all prompts together)"]
    assert any(bar["name"] == "vLLM (served)" and bar["x"] == ["vllm:eagle3"] for bar in rates)
    assert "vllm:eagle3" in {trace["name"] for trace in charts["Acceptance histogram (all prompts)"]}
    assert "vllm:eagle3" in {trace["name"] for trace in charts["Per-position acceptance"]}
