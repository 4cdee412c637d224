"""The load table's JSON (specviz.bench.loadtable): a document made by scripts/load_table.py's own functions
(its phases run with stand-in lanes that stream tokens without a server) is read back as the Cost page reads it,
broken ones are refused saying what is wrong, and the Cost page draws a table it is given (shipped or uploaded)
and says how to make one when there is none."""
import copy
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from streamlit.testing.v1 import AppTest

from app.state import ENV_MODEL
from specviz.bench import loadtable
from specviz.errors import SpecvizError

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
TIMEOUT = 120  # as tests/test_app.py: a 2-core CPU under load
CLIENTS = [1, 4]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("load_table", ROOT / "scripts" / "load_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up by name
    spec.loader.exec_module(module)
    return module


def stand_in(script, label: str, engine: str, tokens: int):
    """A lane that streams `tokens` tokens in two steps, with no server behind it."""
    def stream(prompt: str, max_new_tokens: int, client: int):
        n = min(tokens, max_new_tokens)
        time.sleep(0.002)
        yield SimpleNamespace(type="step", committed=list(range(n // 2)))
        yield SimpleNamespace(type="step", committed=list(range(n // 2, n)))
        yield SimpleNamespace(type="done", committed=[], token_ids=list(range(n)))
    return script.Lane(label, engine, stream)


@pytest.fixture(scope="module")
def table(script) -> dict:
    """What `scripts/load_table.py --clients 1,4 --rounds 2 --max-new-tokens 8 --json-out` writes, measured on
    stand-in lanes (versions() asks vLLM's venv: here fixed)."""
    lanes = [stand_in(script, "vLLM: plain", "vLLM", 8), stand_in(script, "specviz serve: none", "specviz serve", 6)]
    script.measure(lanes, CLIENTS, 2, ["a", "b", "c"], 8)
    args = SimpleNamespace(clients=CLIENTS, rounds=2, max_new_tokens=8)
    script.versions = lambda: {"python": "3", "torch": "2", "transformers": "4", "vllm": "vllm 0.32"}
    return script.build_report(lanes, args, ["--clients", "1,4", "--rounds", "2"], "stand-in lanes")


def test_a_table_the_script_builds_reads_back(table):
    got = loadtable.parse_load_table(json.dumps(table), "made.json")
    assert [lane["label"] for lane in got["lanes"]] == ["vLLM: plain", "specviz serve: none"]
    one = got["lanes"][0]["by_clients"]["4"]
    assert one["runs"] == 8 and one["errors"] == 0  # 4 runs a phase (one a client at 4), 2 rounds
    assert one["aggregate_range"][0] <= one["aggregate_tokens_per_s"] <= one["aggregate_range"][1]
    assert 0 < one["ttft_median_s"] <= one["ttft_p90_s"]
    assert got["command"] == "python scripts/load_table.py --clients 1,4 --rounds 2"


def broken(table, change):
    copied = copy.deepcopy(table)
    change(copied)
    return json.dumps(copied)


@pytest.mark.parametrize("change, message", [
    (lambda t: t.pop("lanes"), "at the top level: 'lanes' is a required property"),
    (lambda t: t["lanes"][1]["by_clients"].pop("4"), "lane 'specviz serve: none' has no results for 4 client"),
    (lambda t: t["lanes"][0]["by_clients"]["1"].update(aggregate_tokens_per_s="fast"),
     "at lanes/0/by_clients/1/aggregate_tokens_per_s"),
    (lambda t: t["lanes"][0]["by_clients"]["1"].pop("ttft_p90_s"), "'ttft_p90_s' is a required property"),
    (lambda t: t.update(clients=[]), "at clients"),
])
def test_a_broken_table_is_refused_saying_where(table, change, message):
    with pytest.raises(SpecvizError, match="not a (full )?(specviz )?load table") as err:
        loadtable.parse_load_table(broken(table, change), "mine.json")
    assert message in str(err.value) and "mine.json" in str(err.value)


@pytest.mark.parametrize("data, message", [(b"{", "is not JSON"), (b"\x80\x81", "is not a text file"),
                                           ("[]", "not a specviz load table")])
def test_what_is_not_a_table_at_all_is_refused(data, message):
    with pytest.raises(SpecvizError, match=message):
        loadtable.parse_load_table(data, "x.json")


def test_the_shipped_copy_is_read_when_it_is_there(table, tmp_path):
    assert loadtable.load_load_table(tmp_path / "none.json") is None
    path = tmp_path / "load-table-cpu.json"
    path.write_text(json.dumps(table))
    assert loadtable.load_load_table(path) == table
    path.write_text("{}")
    with pytest.raises(SpecvizError, match="load-table-cpu.json is not a specviz load table"):
        loadtable.load_load_table(path)


# ------------------------------------------------------------------------------------------ the page


@pytest.fixture
def cost_page(tiny_model_dir, monkeypatch, tmp_path):
    """The Cost page with no shipped load table (whatever specviz/bench/data holds): SHIPPED in a folder of its own."""
    monkeypatch.setenv(ENV_MODEL, str(tiny_model_dir))
    monkeypatch.setattr(loadtable, "SHIPPED", tmp_path / "load-table-cpu.json")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    at.switch_page("app/pages/cost.py")
    return ok(at.run())


def ok(at):
    assert not at.exception, [e.value for e in at.exception]
    return at


def load_chart(at) -> dict | None:
    chart = next((c for c in at.get("plotly_chart") if "cost_load" in c.proto.id), None)
    return None if chart is None else json.loads(chart.proto.spec)


def test_without_a_table_the_page_says_how_to_make_one(cost_page):
    at = cost_page
    assert any(h.value == "5. Many clients: throughput under concurrency" for h in at.header)
    assert loadtable.COMMAND in [c.value for c in at.code]
    assert load_chart(at) is None and not at.error
    assert any("Our engine decodes one run at a time" in m.value and "vLLM batches" in m.value for m in at.markdown)


def test_a_shipped_table_is_drawn_with_its_lanes_and_first_token_times(cost_page, table, monkeypatch):
    at = cost_page
    loadtable.SHIPPED.write_text(json.dumps(table))  # what the page reads, through load_load_table
    ok(at.run())
    chart = load_chart(at)
    assert [(t["name"], t["x"]) for t in chart["data"]] == [("vLLM: plain", CLIENTS), ("specviz serve: none", CLIENTS)]
    assert chart["data"][0]["y"] == [table["lanes"][0]["by_clients"][str(n)]["aggregate_tokens_per_s"] for n in CLIENTS]
    rows = next(d.value for d in at.dataframe if "first token, p90 (s)" in d.value.columns)
    assert list(zip(rows["clients"], rows["lane"])) == [(1, "vLLM: plain"), (1, "specviz serve: none"),
                                                          (4, "vLLM: plain"), (4, "specviz serve: none")]
    assert list(rows["first token, median (s)"]) == [round(lane["by_clients"][str(n)]["ttft_median_s"], 2)
                                                    for n in CLIENTS for lane in table["lanes"]]
    caption = next(c.value for c in at.caption if table["command"] in c.value)
    assert table["date"] in caption and "stand-in lanes" in caption and "From 1 to 4 clients" in caption
    assert any("Showing the shipped load table" in c.value for c in at.caption)


def test_an_uploaded_table_is_drawn_and_a_broken_one_refused(cost_page, table):
    at = cost_page
    upload = at.get("file_uploader")[1]  # the first is section 4's surface
    upload.upload("mine.json", json.dumps(table).encode(), "application/json")
    ok(at.run())
    assert not at.error and load_chart(at) is not None
    assert any("Showing the uploaded load table mine.json" in c.value for c in at.caption)
    at.get("file_uploader")[1].upload("bad.json", broken(table, lambda t: t.pop("clients")).encode(), "application/json")
    ok(at.run())
    assert [e.value for e in at.error] == ["bad.json is not a specviz load table (scripts/load_table.py --json-out) "
                                           "(at the top level: 'clients' is a required property)."]
    assert load_chart(at) is None and loadtable.COMMAND in [c.value for c in at.code]
