"""The benchmark on tiny random models: a valid report, a mismatch detector that fires, the GPU script's CPU path."""
import copy
import importlib.util
import json
from pathlib import Path

import jsonschema
import pytest
import torch

from specviz import bench
from specviz.backends import local as local_backend
from specviz.bench import cli as specviz_cli
from specviz.bench import probes
from specviz.bench import report as bench_report
from specviz.bench import run as bench_run
from specviz.bench.runs import MethodRuns, Run
from specviz.decoding import costs
from specviz.decoding import verify as verify_module
from specviz.decoding.drafter import Drafter
from specviz.decoding.tree import DraftTree
from specviz.drafters import build_drafter, make_drafter
from specviz.errors import SpecvizError
from specviz.models import LoadedModels
from specviz.models.heads import EagleHead, MedusaHeads

from tiny import TinyTokenizer, tiny_llama

ROOT = Path(__file__).resolve().parent.parent
PROMPT_ROWS = [
    {"question_id": 7, "turns": ["abc abc abc abc", "a second turn, ignored"]},
    {"id": "cat", "instruction": "the cat sat on the mat. the cat"},
]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices gain nothing from threads, and on a busy machine threads wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny():
    """A tiny target with every kind of drafter: a draft model, an EAGLE head and Medusa heads (random)."""
    target = tiny_llama(scale=3.0)
    draft = tiny_llama(seed=0, layers=2, scale=2.0)  # the target's weights with a flatter head: mostly agrees
    torch.manual_seed(0)
    eagle, medusa = EagleHead(target.config).eval(), MedusaHeads(target.config).eval()
    for p in [*eagle.parameters(), *medusa.parameters()]:
        p.data.normal_(0, 0.3)
    return LoadedModels("tiny", target, draft, TinyTokenizer(64), target.device, target.dtype, eagle=eagle, medusa=medusa)


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in PROMPT_ROWS))
    return path


def small(**overrides) -> bench.BenchSettings:
    return bench.quick_settings(**{"max_new_tokens": 12, "verify_sizes": (1, 2, 4), "cost_repeats": 1,
                                   "bandwidth_mb": 8, "bandwidth_repeats": 1, "context_len": 32, **overrides})


def cli(tmp_path, prompts_file, *extra) -> list[str]:
    return ["--prompts", str(prompts_file), "--max-new-tokens", "12", "--verify-sizes", "1,2,4", "--context-len", "32",
            "--bandwidth-mb", "8", "--json-out", str(tmp_path / "b.json"), "--md-out", str(tmp_path / "b.md"), *extra]


def test_prompts_use_the_first_turn_or_the_instruction(prompts_file):
    prompts = bench.load_prompts(prompts_file)
    assert prompts == [bench.Prompt("7", "abc abc abc abc"), bench.Prompt("cat", PROMPT_ROWS[1]["instruction"])]
    assert len(bench.load_prompts(prompts_file, limit=1)) == 1
    builtin = bench.load_prompts()
    assert 12 <= len(builtin) <= 20 and len({p.id for p in builtin}) == len(builtin)


def test_a_line_separator_inside_a_prompt_is_part_of_the_prompt(tmp_path):
    """U+2028 is valid inside a JSON string (the training instructions have some); JSONL rows end at \\n only."""
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"instruction": "one\u2028two"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert [p.text for p in bench.load_prompts(path)] == ["one\u2028two"]


def test_a_curve_of_one_size_gives_a_report_without_tree_predictions(tmp_path, prompts_file, tiny, monkeypatch):
    """--verify-sizes 1 (the floor's forward alone): no cost of a several-token step to predict from."""
    monkeypatch.setattr(specviz_cli, "_load_models", lambda args: tiny)
    argv = cli(tmp_path, prompts_file, "--drafters", "ngram,eagle2", "--no-peers")
    argv[argv.index("1,2,4")] = "1"
    assert specviz_cli.bench_main(argv) == 0
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["verify_cost_ms"].keys() == {"1"} and report["floor"]["forward_1_ms"] > 0
    assert "eagle2" not in report["predicted_speedup"]  # a step verifies several tokens: c(n) unknown
    assert "none" in report["predicted_speedup"]  # one token a step: c(1) is all it needs


@pytest.mark.parametrize("flag, value, message", [
    ("--limit", "0", "--limit must be >= 1"),
    ("--bandwidth-mb", "0", "bandwidth probe needs at least 1 MB"),
])
def test_bad_bench_numbers_fail_before_any_decode(tmp_path, prompts_file, tiny, monkeypatch, capsys, flag, value, message):
    monkeypatch.setattr(specviz_cli, "_load_models", lambda args: tiny)
    monkeypatch.setattr(bench_run, "run_drafter", lambda *a, **k: pytest.fail("decoded before refusing the settings"))
    assert specviz_cli.bench_main(cli(tmp_path, prompts_file, flag, value, "--no-peers")) == 2
    assert message in capsys.readouterr().err


def test_an_unwritable_output_fails_before_the_run(tmp_path, prompts_file, monkeypatch, capsys):
    monkeypatch.setattr(specviz_cli, "_load_models", lambda args: pytest.fail("loaded models for a run it cannot save"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = cli(tmp_path, prompts_file)
    argv[argv.index("--json-out") + 1] = str(blocker / "b.json")
    assert specviz_cli.bench_main(argv) == 2
    assert "cannot write" in capsys.readouterr().err


def test_a_failed_output_write_still_prints_the_report(tmp_path, prompts_file, tiny, monkeypatch, capsys):
    monkeypatch.setattr(specviz_cli, "_load_models", lambda args: tiny)

    def full_disk(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(specviz_cli, "write_atomically", full_disk)
    assert specviz_cli.bench_main(cli(tmp_path, prompts_file, "--drafters", "ngram", "--no-peers")) == 2
    out, err = capsys.readouterr()
    assert "| `ngram` |" in out and "No space left on device" in err


@pytest.mark.parametrize("data, message", [(b"\x80{}", "not a text file"), (b"{", "not JSON"),
                                           (b"[1, 2]", "not a specviz bench report")])
def test_a_file_that_is_no_report_is_a_clear_error(data, message):
    with pytest.raises(SpecvizError, match=message):
        bench.parse_report(data, "upload.json")


def test_a_bad_prompts_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": []}\n')
    with pytest.raises(SpecvizError, match="bad.jsonl:1"):
        bench.load_prompts(bad)


def test_cli_on_a_tiny_model_writes_a_report_that_validates(tmp_path, prompts_file, tiny, monkeypatch, capsys):
    monkeypatch.setattr(specviz_cli, "_load_models", lambda args: tiny)
    assert specviz_cli.bench_main(cli(tmp_path, prompts_file)) == 0
    report = json.loads((tmp_path / "b.json").read_text())
    jsonschema.validate(report, bench.BENCH_SCHEMA)
    assert list(report["drafters"]) == ["none", "ngram", "draft", "medusa", "eagle2", "draft:adaptive=true", "eagle2:lookup=4"]  # + variants()
    assert set(report["peers"]) == {"generate", "generate_assisted", "generate_prompt_lookup"}
    assert report["outputs_match_none"] is True and report["mismatching_prompts"] == []
    for name, d in report["drafters"].items():
        assert d["outputs_match_none"] is True and d["tau"] >= 1.0, name
    assert report["drafters"]["none"]["acceptance_rate"] is None and report["drafters"]["draft"]["acceptance_rate"] > 0
    assert report["drafters"]["eagle2"]["tree"] and not report["drafters"]["draft"]["tree"]  # priced on the tree curve
    assert all(p["outputs_match_generate"] for p in report["peers"].values())  # the peers got our settings
    assert list(report["verify_cost_ms"]) == ["1", "2", "4"] and list(report["tree_verify_cost_ms"]) == ["1", "2", "4"]
    assert report["floor"]["weight_bytes"] > 0 and report["floor_ms_per_token"] > 0
    assert report["floor"]["bandwidth_samples"] == 2  # one right before each `none` run
    assert len(report["runs"]) == 2 * 10  # two prompts × (5 drafters + 2 variants + 3 peers)
    markdown = (tmp_path / "b.md").read_text()
    assert markdown.startswith("# specviz bench") and "python -m specviz bench --prompts" in markdown
    assert markdown in capsys.readouterr().out


def test_sampling_and_repeats_validate_and_skip_the_identity_check(tiny, prompts_file):
    prompts = bench.load_prompts(prompts_file)
    report = bench.run_bench(tiny, prompts, small(temperature=0.8, top_p=0.9, repeats=2, drafters=("ngram",)))
    bench.validate(report)
    assert report["outputs_match_none"] is None and report["drafters"]["ngram"]["outputs_match_none"] is None
    assert len(report["runs"]) == 2 * 2 * 5
    assert report["floor"]["bandwidth_samples"] == 4 and report["floor"]["none_share_of_floor_per_prompt"]["n"] == 2
    assert tiny.draft.generation_config.num_assistant_tokens is None  # the shared draft was not mutated


def test_each_prompt_is_held_to_the_floor_of_the_bandwidth_measured_beside_it():
    """A tenant halves the bandwidth during prompt b and `none` slows down with it: per prompt, `none` is at 50 %
    of its floor both times, while the run's totals against the median bandwidth would say otherwise."""
    runs = MethodRuns([Run("none", "a", 0, [1] * 100, 1.0), Run("none", "b", 0, [1] * 100, 2.0),
                       Run("none", "b", 1, [1] * 100, 2.0)])
    weight_bytes = 10**8  # 100 MB: 5 ms at 20 GB/s, 10 ms at 10 GB/s
    floor = bench_report.floor_report(weight_bytes, {"a": [20.0], "b": [10.0, 10.0]}, runs)
    assert floor["none_share_of_floor_per_prompt"] == {"median": pytest.approx(0.5), "min": pytest.approx(0.5),
                                                       "max": pytest.approx(0.5), "n": 2}
    assert floor["none_share_of_floor"] == pytest.approx(0.5)
    assert floor["bandwidth_gb_s"] == 10.0 and floor["bandwidth_gb_s_range"] == [10.0, 20.0]
    assert floor["none_ms_per_token"] == pytest.approx(15.0)  # 3 s of `none` over 200 tokens (medians per prompt)
    assert floor["none_share_of_floor_totals"] == pytest.approx(10.0 / 15.0)
    assert "50 %" in bench.floor_sentence({**floor, "forward_1_ms": None})
    report = {"floor": floor, "runs": [{"method": r.method, "prompt": r.prompt, "repeat": r.repeat,
                                        "new_tokens": len(r.token_ids), "wall_s": r.wall_s} for r in runs.runs]}
    assert bench.none_against_bandwidth(report) == [
        {"prompt": "a", "bandwidth_gb_s": 20.0, "none_ms_per_token": pytest.approx(10.0)},
        {"prompt": "b", "bandwidth_gb_s": 10.0, "none_ms_per_token": pytest.approx(20.0)}]
    assert bench.none_against_bandwidth({**report, "floor": {"bandwidth_gb_s": 10.0}}) == []  # an older report


class ConstantDrafter(Drafter):
    """Proposes token 3 k times: wrong almost everywhere."""

    name = "ngram"

    def propose(self, request):
        tree = DraftTree()
        for _ in range(min(2, request.max_depth)):
            tree.add(3, len(tree) - 1)
        return tree


def plant_a_wrong_token(monkeypatch):
    """Replace `ngram` by a constant drafter and break verification so that it accepts every drafted token."""
    real_verify = verify_module.verify

    def accept_everything(tree, p, greedy, generator, n_top=5):
        verdict = real_verify(tree, p, greedy, generator, n_top)
        if len(tree):
            verdict.path, verdict.token, verdict.kind = list(range(len(tree))), int(p[-1].argmax()), "bonus"
        return verdict

    monkeypatch.setattr(verify_module, "verify", accept_everything)
    planted = lambda name, models, k=4, options=None: ConstantDrafter() if name == "ngram" else build_drafter(name, models, k, options)  # noqa: E731
    monkeypatch.setattr(local_backend, "build_drafter", planted)  # where the bench's runs get their drafters


def test_the_mismatch_detector_fires_on_a_planted_wrong_token(tiny, prompts_file, tmp_path, monkeypatch, capsys):
    plant_a_wrong_token(monkeypatch)
    report = bench.run_bench(tiny, bench.load_prompts(prompts_file), small(drafters=("ngram",), peers=False))
    bench.validate(report)
    ngram = report["drafters"]["ngram"]
    assert ngram["outputs_match_none"] is False and report["outputs_match_none"] is False
    assert {m["prompt"] for m in ngram["mismatches"]} == {"7", "cat"} == set(report["mismatching_prompts"])
    assert all(m["got"] == 3 for m in ngram["mismatches"])
    assert report["drafters"]["none"]["outputs_match_none"] is True
    assert specviz_cli.exit_code(report) == 1 and specviz_cli.exit_code(report, allow_mismatch=True) == 0

    monkeypatch.setattr(specviz_cli, "_load_models", lambda args: tiny)
    assert specviz_cli.bench_main(cli(tmp_path, prompts_file, "--drafters", "ngram", "--no-peers")) == 1
    err = capsys.readouterr().err
    assert "MISMATCH: drafter 'ngram' differs from 'none' on prompt 7" in err
    assert "**MISMATCH" in (tmp_path / "b.md").read_text()
    assert specviz_cli.bench_main(cli(tmp_path, prompts_file, "--drafters", "ngram", "--no-peers", "--allow-mismatch")) == 0


def test_an_unavailable_drafter_is_refused_before_measuring(tiny, prompts_file):
    no_draft = copy.copy(tiny)
    no_draft.draft = None
    with pytest.raises(SpecvizError, match="'draft' is not available"):
        bench.run_bench(no_draft, bench.load_prompts(prompts_file), small(drafters=("draft",)))


def test_a_head_trained_elsewhere_runs_beside_the_shipped_one(tiny, prompts_file, tmp_path):
    """eagle2:head=FOLDER (and medusa:head=FOLDER) load that folder's weights once and bench them beside the
    shipped head, under the variant's own name."""
    torch.manual_seed(1)
    other = EagleHead(tiny.target.config).eval()
    for p in other.parameters():
        p.data.normal_(0, 0.3)
    other.save(tmp_path / "mine", {}, dtype=torch.float32)
    spec = f"eagle2:head={tmp_path / 'mine'}"
    first, second = make_drafter(spec, tiny), make_drafter(spec, tiny)
    assert first.head is second.head and first.head is not tiny.eagle and make_drafter("eagle2", tiny).head is tiny.eagle
    loaded = first.head.fc.weight
    assert torch.equal(loaded, other.fc.weight.to(loaded.dtype))  # in the shipped heads' dtype (models.draft_dtype)
    report = bench.run_bench(tiny, bench.load_prompts(prompts_file), small(drafters=("none", "eagle2", spec), peers=False))
    assert report["drafters"][spec]["outputs_match_none"] and report["drafters"]["eagle2"]["outputs_match_none"]
    with pytest.raises(SpecvizError, match="no trained medusa head in"):
        make_drafter(f"medusa:head={tmp_path / 'nothing'}", tiny)


def test_tree_shape_rotation_and_streamed_bytes():
    tree = costs.full_tree(9, 4)
    assert tree.parents == [-1, -1, -1, -1, 0, 0, 0, 0, 1] and not tree.is_chain
    assert bench_run.method_order(["a", "b", "c"], 4) == ["b", "c", "a"]
    model = tiny_llama()  # untied: the input embedding is not streamed, the LM head is
    total = sum(p.numel() * 4 for p in model.parameters())
    assert probes.streamed_weight_bytes(model) == total - 64 * 32 * 4


def test_the_schema_rejects_a_report_without_its_drafters(tiny, prompts_file):
    report = bench.run_bench(tiny, bench.load_prompts(prompts_file, limit=1), small(peers=False, drafters=("none",), verify_sizes=()))
    bench.validate(report)
    assert report["verify_cost_ms"] == {} and report["predicted_speedup"] == {}
    del report["drafters"]["none"]["tau"]
    with pytest.raises(jsonschema.ValidationError):
        bench.validate(report)


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_gpu_check_without_a_gpu_says_so_and_writes_json(tmp_path, capsys):
    gpu_check = load_gpu_check()
    assert gpu_check.main(["--out", str(tmp_path / "g.json")]) == 0
    assert "no CUDA GPU" in json.loads((tmp_path / "g.json").read_text())["skipped"]
    assert "skipped" in capsys.readouterr().err


def test_gpu_check_parts_run_on_tiny_models(tiny, monkeypatch):
    gpu_check = load_gpu_check()
    monkeypatch.setattr(bench, "load_prompts", lambda path=None, limit=None: [bench.Prompt("p", "abcabc abc")])
    shape = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                 intermediate_size=64, vocab_size=64, max_position_embeddings=128)
    result = gpu_check.run_checks(tiny, shape, small(drafters=("none", "ngram")), limit=1)
    bench.validate(result["embedded"]["bench"])
    assert set(result["embedded"]["verify_cost_ms"]) == {"1", "2", "4"}
    assert result["large"]["parameters"] > 0 and set(result["large"]["tree_verify_cost_ms"]) == {"1", "2", "4"}
    json.dumps(result)  # one JSON document


def test_gpu_check_stand_in_tokenizer_round_trips():
    tok = load_gpu_check().ByteTokenizer()
    assert tok.decode(tok("héllo")["input_ids"]) == "héllo"


def test_the_benchmarks_page_runs_a_bench_and_shows_a_saved_report(tiny_model_dir, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from app.state import ENV_MODEL

    monkeypatch.setenv(ENV_MODEL, str(tiny_model_dir))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.run()
    at.switch_page("app/pages/benchmarks.py")
    at.run()
    assert not at.exception and [t.value for t in at.title] == ["Benchmarks"]
    at.slider(key="bench_limit").set_value(1)
    at.slider(key="bench_max_new").set_value(4)
    at.button(key="bench_run").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert len(at.get("plotly_chart")) == 7  # rates, spread, verify cost, predicted, acceptance, its histogram, none vs bandwidth
    assert "python -m specviz bench --model" in at.code[0].value

    at.radio(key="bench_source").set_value("a file on the server")  # the page's default report
    at.run()
    at.text_input(key="bench_path").set_value(str(bench.REFERENCE_REPORT))
    at.run()
    assert not at.exception and not at.error
    assert len(at.get("plotly_chart")) == 6

    old = json.loads(bench.REFERENCE_REPORT.read_text())  # as earlier versions wrote reports:
    for key in ("bandwidth_gb_s_range", "bandwidth_samples", "bandwidth_by_prompt",  # one bandwidth figure a run
                "none_share_of_floor_per_prompt", "none_share_of_floor_totals"):
        old["floor"].pop(key)
    (tmp_path / "old.json").write_text(json.dumps(old))
    at.text_input(key="bench_path").set_value(str(tmp_path / "old.json"))
    at.run()
    assert not at.exception and not at.error
    assert len(at.get("plotly_chart")) == 5 and any("measured once in the run" in m.value for m in at.markdown)

    saved = tmp_path / "saved.json"
    saved.write_text('{"not": "a report"}')
    at.text_input(key="bench_path").set_value(str(saved))
    at.run()
    assert "is not a specviz bench report" in at.error[0].value
