"""The batch surface (specviz.bench.batch): measured on a tiny model with every cell and its metadata, its B = 1
row in the verify-cost curve's conventions, the predicted gain against a hand computation (and a planted
c(B, K) for c(B, K + 1) caught), the shipped surface, the CLI, the GPU script's part, and the Cost page."""
import contextlib
import copy
import importlib.util
import json
import math
import re
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest
from test_bench import one_thread  # noqa: F401  (autouse: one torch thread, as the bench's tests run tiny models)

from app.state import ENV_MODEL
from specviz import analysis
from specviz.bench import batch
from specviz.cli import main as specviz_cli
from specviz.decoding import costs
from specviz.errors import SpecvizError

from tiny import tiny_llama

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
TIMEOUT = 120  # a real page with a model on a slow, shared machine (as tests/test_app.py)
SMALL = batch.SurfaceSettings(batch_sizes=(1, 2, 4), new_tokens=(1, 2, 3), context_len=16, rounds=3,
                              bandwidth_mb=8, bandwidth_repeats=1)
# c(B, n) in ms for the hand computations: B = 1 nearly flat in n, B = 4 steep
HAND = {"1": {"1": 10.0, "2": 11.0, "3": 12.0}, "4": {"1": 20.0, "2": 30.0, "3": 40.0}}


@pytest.fixture(scope="module")
def tiny_surface():
    model = tiny_llama()
    return model, batch.measure_surface(model, SMALL, name="tiny", command="pytest")


def test_the_surface_of_a_tiny_model_has_every_cell_positive_and_its_metadata(tiny_surface):
    model, surface = tiny_surface
    grid = {str(b): {str(n) for n in SMALL.new_tokens} for b in SMALL.batch_sizes}
    for field in ("ms", "ms_min", "ms_max", "relative_iqr"):
        assert {b: set(row) for b, row in surface[field].items()} == grid, field
    for b, row in surface["ms"].items():
        for n, ms in row.items():
            assert 0 < surface["ms_min"][b][n] <= ms <= surface["ms_max"][b][n]
    assert surface["config"]["batch_sizes"] == [1, 2, 4] and surface["config"]["rounds"] == 3
    assert surface["model"] == "tiny" and surface["command"] == "pytest"
    machine = surface["machine"]
    assert machine["device"] == "cpu" and machine["dtype"] == "float32" and machine["torch_threads"] == 1
    assert len(machine["bandwidth_gb_s_before_after"]) == 2 and machine["bandwidth_gb_s"] > 0
    lean_curves = bool(surface["lean_b1_ms"]) + bool(surface["lean_b1_ms_vnni"])
    assert surface["noise"]["cells"] == len(SMALL.batch_sizes) * len(SMALL.new_tokens) + len(SMALL.new_tokens) * lean_curves
    assert surface["amx_tiles"] is False and surface["lean_b1_ms_vnni"] is None  # fp32 activations: no tiles
    assert 0 <= surface["noise"]["median_relative_iqr"] <= surface["noise"]["max_relative_iqr"]
    batch.parse_surface(json.dumps(surface))  # the file the CLI writes is one the page accepts


def test_the_b1_row_is_keyed_as_the_verify_cost_curve_and_the_lean_decoder_beside_it(tiny_surface):
    model, surface = tiny_surface
    curve = costs.verify_costs(model, SMALL.new_tokens, SMALL.context_len, repeats=1)["chain"]
    assert set(surface["ms"]["1"]) == set(curve)  # {"n": ms}, n as strings
    assert surface["lean_b1_ms"] is not None and set(surface["lean_b1_ms"]) == set(curve)  # the CPU runs the lean decoder
    assert "fastdecoder" in surface["lean_b1_forward"] and surface["forward"] == batch.BATCHED_FORWARD
    # a model with few positions shortens the context exactly as the verify-cost curve does
    short = tiny_llama(max_positions=24)
    shortened = batch.measure_surface(short, batch.quick_surface_settings(context_len=64, bandwidth_mb=8, rounds=1))
    assert shortened["config"]["context_len"] == costs.fitting_context(short, (1, 2), 64) == 21


def test_where_amx_tiles_run_the_surface_also_times_the_vnni_path_in_the_same_rounds(monkeypatch):
    """On a model with 8-bit activations and a CPU whose products take AMX tiles (faked here: the paths are held
    by products.products_on, recorded), the B = 1 curve is measured twice, once with the products held to VNNI."""
    from test_q8act import q4q8_pair

    from specviz.kernels import products
    _, model = q4q8_pair()
    held = []

    @contextlib.contextmanager
    def products_on(path):
        held.append(path)
        yield

    monkeypatch.setattr(products, "amx_tiles", lambda: True)
    monkeypatch.setattr(products, "products_on", products_on)
    surface = batch.measure_surface(model, SMALL, name="tiny q8", command="pytest")
    assert surface["amx_tiles"] is True
    assert set(surface["lean_b1_ms_vnni"]) == set(surface["lean_b1_ms"]) == {str(n) for n in SMALL.new_tokens}
    # every vnni cell, every round and the warm-up one, held to the VNNI path; no other cell
    assert held and set(held) == {"avx512"} and len(held) == len(SMALL.new_tokens) * (SMALL.rounds + 1)
    batch.parse_surface(json.dumps(surface))
    monkeypatch.setattr(products, "amx_tiles", lambda: False)
    assert batch.measure_surface(model, SMALL, name="tiny q8")["lean_b1_ms_vnni"] is None


def test_every_round_runs_every_cell_in_a_new_order_after_a_warm_up():
    calls = []
    cells = {i: (lambda i=i: calls.append(i)) for i in range(6)}
    times = batch.timed_rounds(cells, rounds=4, seed=0, device=torch.device("cpu"))
    assert all(len(t) == 4 for t in times.values())  # the warm-up round is not kept
    rounds = [calls[6 * r: 6 * r + 6] for r in range(5)]
    assert all(sorted(r) == list(range(6)) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # shuffled, not one fixed order


def test_the_gain_matches_a_hand_computation():
    e = (1 - 0.5 ** 3) / (1 - 0.5)  # E(α = 0.5, K = 2) = 1.75
    gains = analysis.measured_batch_gain(HAND, alpha=0.5, k=2, draft_cost=0.1)
    assert gains[1] == pytest.approx(e / (12 / 10 + 2 * 0.1))  # 1.25
    assert gains[4] == pytest.approx(e / (40 / 20 + 2 * 0.1))  # 0.795: no gain at B = 4
    assert analysis.surface_ratios(HAND)[4] == {1: 1.0, 2: 1.5, 3: 2.0}
    with pytest.raises(ValueError, match="no n = 4"):
        analysis.measured_batch_gain(HAND, alpha=0.5, k=3, draft_cost=0.0)


def test_a_planted_c_of_k_for_c_of_k_plus_1_is_caught(monkeypatch):
    """Verifying K drafted tokens scores K + 1 (the last committed token's successor too): pricing the step at
    c(B, K) makes the gain look larger, and the hand computation catches it."""
    expected = {1: 1.75 / 1.4, 4: 1.75 / 2.2}

    def agrees() -> bool:
        gains = analysis.measured_batch_gain(HAND, alpha=0.5, k=2, draft_cost=0.1)
        return all(math.isclose(gains[b], g) for b, g in expected.items())

    assert agrees()
    monkeypatch.setattr(analysis, "speculative_step_cost", lambda row, k, d: row[k] / row[1] + k * d)
    assert not agrees()


def test_node_cost_uses_the_total_throughput_of_all_b_sequences():
    rows = {r["batch"]: r for r in analysis.batch_node_rows(HAND, alpha=0.5, k=2, draft_cost=0.1, usd_per_hour=1.0)}
    assert rows[4]["plain_tokens_per_s"] == pytest.approx(4 * 1000 / 20)  # 200 tokens/s over the 4 sequences
    assert rows[4]["plain_usd_per_million"] == pytest.approx(1.0 / (200 * 3600) * 1e6)
    assert rows[4]["spec_tokens_per_s"] == pytest.approx(4 * 1.75 * 1000 / (20 * 2.2))
    assert rows[1]["spec_tokens_per_s"] / rows[1]["plain_tokens_per_s"] == pytest.approx(1.25)


def test_the_shipped_surface_validates_and_covers_the_grid():
    surface = batch.load_surface()
    assert surface["config"]["batch_sizes"] == list(batch.BATCH_SIZES)
    assert surface["config"]["new_tokens"] == list(batch.NEW_TOKENS)
    assert {b: set(row) for b, row in surface["ms"].items()} == {str(b): {str(n) for n in batch.NEW_TOKENS}
                                                                   for b in batch.BATCH_SIZES}
    assert surface["model"] == "smollm2-135m" and surface["machine"]["dtype"] == "float32"
    assert surface["machine"]["device"] == "cpu" and "batch-cost" in surface["command"]
    assert surface["config"]["context_len"] == 256 and surface["config"]["rounds"] >= 10
    assert set(surface["lean_b1_ms"]) == {str(n) for n in batch.NEW_TOKENS}


@pytest.mark.parametrize("edit, message", [
    (lambda s: "{not json", "is not JSON"),
    (lambda s: {**s, "kind": "specviz bench report"}, "not a specviz batch surface (at kind"),
    (lambda s: {**s, "ms": {**s["ms"], "2": {"1": 5.0}}}, "not a full batch surface: ms at B = 2"),
    (lambda s: {**s, "ms_min": {**s["ms_min"], "4": {"1": 5.0}}}, "ms_min at B = 4"),
    (lambda s: {**s, "ms": {**s["ms"], "1": {**s["ms"]["1"], "2": -1.0}}}, "at ms/1/2"),
    (lambda s: {**s, "config": {**s["config"], "new_tokens": [2, 3]}}, "at config/new_tokens"),
    (lambda s: {**s, "lean_b1_ms": {"1": 5.0}, "lean_b1_forward": None}, "at lean_b1_forward"),
])
def test_a_malformed_surface_is_a_clear_error(tiny_surface, edit, message):
    edited = edit(copy.deepcopy(tiny_surface[1]))
    with pytest.raises(SpecvizError, match=re.escape(message)):
        batch.parse_surface(edited if isinstance(edited, str) else json.dumps(edited), "x.json")


def test_the_cli_writes_a_surface_and_refuses_bad_grids(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert specviz_cli.main(["batch-cost", "--model", str(tiny_model_dir), "--device", "cpu", "--batch-sizes", "1,2",
                             "--new-tokens", "1,2", "--context-len", "8", "--rounds", "1", "--out", str(out)]) == 0
    surface = batch.load_surface(out)
    assert set(surface["ms"]) == {"1", "2"} and "--rounds 1" in surface["command"]
    assert "c(B, n) ÷ c(B, 1)" in capsys.readouterr().out
    for flag, value, message in (("--new-tokens", "2,4", "include 1"), ("--batch-sizes", "1,two", "comma-separated"),
                                 ("--rounds", "0", "rounds")):
        assert specviz_cli.main(["batch-cost", "--model", str(tiny_model_dir), flag, value]) == 2
        assert message in capsys.readouterr().err


def test_the_gpu_script_measures_the_surface(monkeypatch):
    from specviz import bench
    from specviz.models import LoadedModels

    from tiny import TinyTokenizer

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    monkeypatch.setattr(bench, "load_prompts", lambda path=None, limit=None: [bench.Prompt("p", "abcabc abc")])
    target = tiny_llama()
    tiny = LoadedModels("tiny", target, None, TinyTokenizer(64), target.device, target.dtype)
    shape = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                 intermediate_size=64, vocab_size=64, max_position_embeddings=128)
    settings = bench.quick_settings(max_new_tokens=8, verify_sizes=(1, 2), cost_repeats=1, bandwidth_mb=8,
                                    bandwidth_repeats=1, context_len=16, drafters=("none",), peers=False)
    result = gpu_check.run_checks(tiny, shape, settings, 1, surface=batch.quick_surface_settings(bandwidth_mb=8))
    batch.parse_surface(json.dumps(result["embedded"]["batch_surface"]))
    assert result["timings_s"]["batch_surface_s"] > 0


# ------------------------------------------------------------------------------------------ the page


@pytest.fixture
def cost_page(tiny_model_dir, monkeypatch):
    monkeypatch.setenv(ENV_MODEL, str(tiny_model_dir))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    at.switch_page("app/pages/cost.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def section_text(at) -> str:
    return " ".join(m.value for m in [*at.markdown, *at.caption, *at.header, *at.subheader])


def chart_names(at, key: str) -> list[str]:
    chart = next(c for c in at.get("plotly_chart") if key in c.proto.id)
    return [trace["name"] for trace in json.loads(chart.proto.spec)["data"]]


def test_the_cost_page_shows_the_shipped_surface_beside_the_model(cost_page):
    at = cost_page
    assert any("measured, and modelled" in h.value for h in at.header)
    text = section_text(at)
    assert "Showing the shipped surface" in text and "python -m specviz batch-cost" in text
    assert "Leviathan et al., 2023" in text and "total throughput" in text
    names = chart_names(at, "cost_batch")
    assert any(n.startswith("MEASURED surface: smollm2-135m (float32)") for n in names)
    assert any(n.startswith("MODELLED: 70B") for n in names)
    assert len(at.get("plotly_chart")) >= 3  # the two heatmaps and the gain
    assert at.dataframe and not at.error
    shipped = batch.load_surface()
    assert heatmap_row(at, "cost_b_ms", 0) == pytest.approx(list(shipped["ms"]["1"].values()))
    at.radio(key="cost_b_stat").set_value("fastest round (the least disturbed)")
    at.run()
    assert heatmap_row(at, "cost_b_ms", 0) == pytest.approx(list(shipped["ms_min"]["1"].values()))


def heatmap_row(at, key: str, row: int) -> list[float]:
    chart = next(c for c in at.get("plotly_chart") if key in c.proto.id)
    return json.loads(chart.proto.spec)["data"][0]["z"][row]


def test_the_cost_page_takes_an_uploaded_surface_and_rejects_a_malformed_one(cost_page, tiny_surface):
    at = cost_page
    at.get("file_uploader")[0].upload("mine.json", json.dumps(tiny_surface[1]).encode(), "application/json")
    at.run()
    assert not at.exception and not at.error
    assert "Showing the uploaded surface mine.json" in section_text(at)
    assert not any(n.startswith("MEASURED surface: tiny") for n in chart_names(at, "cost_batch"))  # K = 4 needs n = 5
    assert any("the measured curve needs n = K + 1 = 5" in i.value for i in at.info)
    at.slider(key="cost_b_k").set_value(2)
    at.run()
    assert any(n.startswith("MEASURED surface: tiny") for n in chart_names(at, "cost_batch"))

    busy = (ROOT / "docs" / "results" / "batch-surface-cpu-busy.json").read_bytes()  # cell spread 343 % of the median
    at.get("file_uploader")[0].upload("busy.json", busy, "application/json")
    at.run()
    assert any("measured on a busy machine" in w.value for w in at.warning)

    at.get("file_uploader")[0].upload("bad.json", b'{"kind": "something else"}', "application/json")
    at.run()
    assert not at.exception
    assert any("not a specviz batch surface" in e.value and "shipped surface instead" in e.value for e in at.error)
    assert "Showing the shipped surface" in section_text(at)


def test_the_cost_page_draws_the_verify_cost_curve_with_and_without_amx_tiles(cost_page):
    at = cost_page
    assert chart_names(at, "cost_verify_curve") == ["as the engine runs it"]  # the shipped surface: no AMX there
    assert any("ran no AMX tiles" in c.value for c in at.caption)
    surface = copy.deepcopy(batch.load_surface())
    lean = surface["lean_b1_ms"]
    surface["amx_tiles"] = True
    surface["lean_b1_ms_vnni"] = {n: ms * (1 + int(n) / 4) for n, ms in lean.items()}  # steeper without tiles
    at.get("file_uploader")[0].upload("amx.json", json.dumps(surface).encode(), "application/json")
    at.run()
    assert not at.exception and not at.error
    assert chart_names(at, "cost_verify_curve") == ["AMX tiles", "AVX-512 VNNI (tiles off)"]
    last = max(lean, key=int)
    first = min(lean, key=int)
    vnni_ratio = surface["lean_b1_ms_vnni"][last] / surface["lean_b1_ms_vnni"][first]
    assert any(f"{vnni_ratio:.2f}× without" in c.value and f"{lean[last] / lean[first]:.2f}× one token with tiles"
               in c.value for c in at.caption)


def test_alpha_defaults_to_a_measured_chain_run(cost_page):
    at = cost_page
    trace = [{"type": "start", "drafter": "ngram", "options": {"k": 4}},
             {"type": "step", "tests": [{"accepted": True}, {"accepted": True}, {"accepted": False}]},
             {"type": "step", "tests": [{"accepted": True}]},
             {"type": "done", "stats": {"steps": 2, "draft_s": 0.01, "verify_s": 0.1, "tokens_per_s": 40.0, "tau": 2.5,
                                        "acceptance_rate": 0.375}}]
    at.session_state["trace"] = trace
    at.session_state["trace_source"] = "live"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="cost_b_alpha_source").value == "live: ngram"
    assert any("α = 0.750: accepted ÷ tested (3 of 4)" in c.value for c in at.caption)
    assert "α = 0.75" in json.loads(next(c for c in at.get("plotly_chart") if "cost_batch" in c.proto.id).proto.spec)["layout"]["title"]["text"]
