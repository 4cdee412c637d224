"""llama.cpp as a bench peer, with a stub in place of llama-cpp-python: the bench hands it our prompt tokens and
settings, times it beside ours and reports its output against `none`'s, and says why when it cannot run."""
import json
import sys
import types
from pathlib import Path

import jsonschema
import pytest
import torch

from specviz import bench
from specviz.bench import cli as specviz_cli
from specviz.bench import llamacpp
from specviz.bench import report as bench_report
from specviz.models import LoadedModels

from tiny import TinyTokenizer, tiny_llama


@pytest.fixture(scope="module")
def tiny():
    target = tiny_llama(scale=3.0)
    return LoadedModels("tiny", target, None, TinyTokenizer(64), target.device, target.dtype)


def greedy_tokens(model, ids: list[int]):
    """The tiny target's greedy continuation, token by token, without end: what llama.cpp's generate() yields."""
    ids = list(ids)
    while True:
        with torch.no_grad():
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        ids.append(token)
        yield token


def stub_llama(model, plant: dict[str, int] | None = None):
    """(module, speculative module) standing in for llama_cpp: each Llama decodes with the tiny target; `plant` maps
    "plain" / "lookup" to an index where that context yields a wrong token instead."""
    calls = []

    class LlamaPromptLookupDecoding:
        def __init__(self, max_ngram_size, num_pred_tokens):
            self.max_ngram_size, self.num_pred_tokens = max_ngram_size, num_pred_tokens

    class Llama:
        def __init__(self, model_path, draft_model=None, **kwargs):
            self.kind = "plain" if draft_model is None else "lookup"
            self.draft_model, self.kwargs = draft_model, kwargs
            self.seed = None

        def set_seed(self, seed):
            self.seed = seed

        def reset(self):
            pass

        def generate(self, tokens, reset=True, **sampling):
            calls.append((self.kind, list(tokens), sampling, self.seed))
            wrong = (plant or {}).get(self.kind)
            for i, token in enumerate(greedy_tokens(model, tokens)):
                yield (token + 1) % model.config.vocab_size or 1 if i == wrong else token

    module = types.SimpleNamespace(Llama=Llama, __version__="0.0-stub", calls=calls)
    return module, types.SimpleNamespace(LlamaPromptLookupDecoding=LlamaPromptLookupDecoding)


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [{"id": "a", "instruction": "abc abc abc abc"}, {"id": "b", "instruction": "the cat sat on the mat. the cat"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def with_stub(monkeypatch, tiny, tmp_path, plant=None):
    module, speculative = stub_llama(tiny.target, plant)
    gguf = tmp_path / "tiny.Q4_1.gguf"
    monkeypatch.setattr(llamacpp, "import_llama", lambda: (module, speculative))
    monkeypatch.setattr(llamacpp, "gguf_of", lambda models: (gguf, None))
    monkeypatch.setattr(llamacpp, "probe", lambda gguf, threads: None)  # the stub loads in this process only
    return module


def settings(**overrides):
    return bench.quick_settings(**{"max_new_tokens": 10, "verify_sizes": (), "bandwidth_mb": 8, "bandwidth_repeats": 1,
                                   "drafters": ("ngram",), "peers": False, **overrides})


def test_llama_cpp_runs_beside_ours_with_our_tokens_and_settings(tiny, prompts_file, tmp_path, monkeypatch):
    module = with_stub(monkeypatch, tiny, tmp_path)
    prompts = bench.load_prompts(prompts_file)
    report = bench.run_bench(tiny, prompts, settings(seed=5))
    jsonschema.validate(report, bench.BENCH_SCHEMA)
    section = report["llama_cpp"]
    assert section["available"] and section["gguf"] == "tiny.Q4_1.gguf" and section["lookup"]["num_pred_tokens"] == 4
    plain, lookup = section["methods"]["llama_cpp"], section["methods"]["llama_cpp_lookup"]
    assert plain["outputs_equal_none"] == 2 and plain["parted_from_none"] == []
    assert lookup["outputs_match_plain"] is True and lookup["speedup_vs_plain"]["n"] == 2
    assert set(section["ours_over"]) == {"none", "ngram"} and section["ours_over"]["none"]["llama_cpp"]["n"] == 2
    # each decode got the prompt's own tokens, greedy sampling with every penalty off, the bench's seed
    encoded = {tuple(tiny.tokenizer(p.text)["input_ids"]) for p in prompts}
    timed = [c for c in module.calls if tuple(c[1]) in encoded]
    assert {c[0] for c in timed} == {"plain", "lookup"}
    for _, _, sampling, seed in timed:
        assert sampling["temp"] == 0.0 and sampling["repeat_penalty"] == 1.0 and sampling["min_p"] == 0.0 and seed == 5
    runs = [r for r in report["runs"] if r["method"].startswith("llama_cpp")]
    assert len(runs) == 4 and all(r["new_tokens"] == 10 for r in runs)  # stopped at the token budget
    markdown = bench.to_markdown(report)
    assert "## llama.cpp (llama-cpp-python 0.0-stub, `tiny.Q4_1.gguf`" in markdown
    assert "equals our `none`'s on 2 of 2 prompts" in markdown


def test_a_planted_divergence_is_reported_where_it_parts(tiny, prompts_file, tmp_path, monkeypatch, capsys):
    with_stub(monkeypatch, tiny, tmp_path, plant={"plain": 3, "lookup": 6})
    report = bench.run_bench(tiny, bench.load_prompts(prompts_file), settings())
    methods = report["llama_cpp"]["methods"]
    assert methods["llama_cpp"]["outputs_equal_none"] == 0
    assert [x["index"] for x in methods["llama_cpp"]["parted_from_none"]] == [3, 3]
    assert methods["llama_cpp_lookup"]["outputs_match_plain"] is False
    assert [x["index"] for x in methods["llama_cpp_lookup"]["mismatches"]] == [3, 3]  # where it parts from plain
    assert report["outputs_match_none"] is True  # llama.cpp's output is not held to ours
    specviz_cli.report_mismatches(report, out=sys.stdout)
    assert "llama.cpp's prompt lookup differs from its plain decoding on prompt a at token 3" in capsys.readouterr().out
    assert "the others part at token 3, 3" in bench.to_markdown(report)


def test_it_stops_at_our_end_of_sequence_token(tiny, prompts_file, tmp_path, monkeypatch):
    with_stub(monkeypatch, tiny, tmp_path)
    peers, _ = llamacpp.llama_cpp_peers(tiny, settings(), n_ctx=64)
    prompt = bench.load_prompts(prompts_file)[0]
    ids = tiny.tokenizer(prompt.text)["input_ids"]
    first = next(greedy_tokens(tiny.target, ids))
    peers.eos = {first}
    run = peers.run(llamacpp.PLAIN, prompt, ids, settings())
    assert run.token_ids == [first]  # our eos ids end it, whatever llama.cpp's own would be


def test_sampling_settings_reach_llama_cpp(tiny, tmp_path, monkeypatch):
    with_stub(monkeypatch, tiny, tmp_path)
    peers, _ = llamacpp.llama_cpp_peers(tiny, settings(), n_ctx=64)
    hot = peers.sampling(settings(temperature=0.7, top_p=0.9, top_k=20))
    assert (hot["temp"], hot["top_p"], hot["top_k"], hot["min_p"], hot["typical_p"]) == (0.7, 0.9, 20, 0.0, 1.0)


def test_without_llama_cpp_python_the_report_says_why(tiny, prompts_file, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails as where it is not installed
    report = bench.run_bench(tiny, bench.load_prompts(prompts_file), settings())
    jsonschema.validate(report, bench.BENCH_SCHEMA)
    assert report["llama_cpp"]["available"] is False and "make peers" in report["llama_cpp"]["reason"]
    assert not any(r["method"].startswith("llama_cpp") for r in report["runs"])
    assert "llama.cpp peers: not run (llama-cpp-python is not installed" in bench.to_markdown(report)


def test_a_llama_cpp_that_crashes_in_the_probe_is_left_out_and_the_bench_completes(tiny, prompts_file, tmp_path,
                                                                                   monkeypatch):
    module, speculative = stub_llama(tiny.target)  # the real probe, with a child that dies as llama.cpp's AMX kernels do
    monkeypatch.setattr(llamacpp, "import_llama", lambda: (module, speculative))
    monkeypatch.setattr(llamacpp, "gguf_of", lambda models: (tmp_path / "tiny.Q4_1.gguf", None))
    monkeypatch.setattr(llamacpp, "PROBE_CODE", "import os, signal, sys\n"
                        "assert sys.argv[1].endswith('tiny.Q4_1.gguf') and sys.argv[2] == '2'\n"
                        "os.kill(os.getpid(), signal.SIGSEGV)")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    report = bench.run_bench(tiny, bench.load_prompts(prompts_file), settings())
    jsonschema.validate(report, bench.BENCH_SCHEMA)
    reason = report["llama_cpp"]["reason"]
    assert report["llama_cpp"]["available"] is False and "crashed (SIGSEGV)" in reason and "make peers" in reason
    assert module.calls == [] and not any(r["method"].startswith("llama_cpp") for r in report["runs"])
    assert {r["method"] for r in report["runs"]} == {"none", "ngram"}  # ours still ran
    assert "llama.cpp peers: not run (llama-cpp-python crashed (SIGSEGV)" in bench.to_markdown(report)


@pytest.mark.parametrize("code, expected", [
    ("pass", None),
    ("raise SystemExit('no such file: ' + __import__('sys').argv[1])", "in a probe process: no such file: /x.gguf"),
])
def test_the_probe_passes_a_working_child_and_names_a_failing_one(monkeypatch, code, expected):
    monkeypatch.setattr(llamacpp, "PROBE_CODE", code)
    why = llamacpp.probe(Path("/x.gguf"), 1)
    if expected is None:
        assert why is None
    else:
        assert why.endswith(expected)


def test_a_model_without_a_gguf_file_is_named(tiny, tmp_path, monkeypatch):
    module, speculative = stub_llama(tiny.target)
    monkeypatch.setattr(llamacpp, "import_llama", lambda: (module, speculative))
    peers, info = llamacpp.llama_cpp_peers(tiny, settings(), n_ctx=64)
    assert peers is None and info == {"available": False, "reason": "'tiny' is not a preset, so there is no GGUF file to hand llama.cpp"}


def test_no_llama_cpp_turns_it_off_and_is_in_the_command(tiny, prompts_file, tmp_path, monkeypatch):
    module = with_stub(monkeypatch, tiny, tmp_path)
    monkeypatch.setattr(specviz_cli, "_load_models", lambda args: tiny)
    out = tmp_path / "b.json"
    argv = ["--prompts", str(prompts_file), "--max-new-tokens", "6", "--verify-sizes", "0", "--drafters", "ngram",
            "--no-peers", "--no-llama-cpp", "--bandwidth-mb", "8", "--json-out", str(out), "--md-out", str(tmp_path / "b.md")]
    assert specviz_cli.bench_main(argv) == 0
    report = json.loads(out.read_text())
    assert report["llama_cpp"] == {"available": False, "reason": "turned off (--no-llama-cpp)"} and module.calls == []
    assert "--no-llama-cpp" in report["config"]["command"]
    assert "--no-llama-cpp" in bench_report.command_for("tiny", settings(llama_cpp=False))  # the app's rerun line
    assert "--no-llama-cpp" not in bench_report.command_for("tiny", settings())


def test_the_benchmarks_page_shows_llama_cpp_beside_ours(tiny, prompts_file, tmp_path, monkeypatch, tiny_model_dir):
    from streamlit.testing.v1 import AppTest

    from app.state import ENV_MODEL

    with_stub(monkeypatch, tiny, tmp_path)
    saved = tmp_path / "with-llama.json"
    saved.write_text(json.dumps(bench.run_bench(tiny, bench.load_prompts(prompts_file), settings())))
    monkeypatch.setenv(ENV_MODEL, str(tiny_model_dir))
    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"), default_timeout=120)
    at.run()
    at.switch_page("app/pages/benchmarks.py")
    at.run()
    at.radio(key="bench_source").set_value("a file on the server")
    at.run()
    at.text_input(key="bench_path").set_value(str(saved))
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.exception]
    assert any("**llama.cpp** (llama-cpp-python 0.0-stub" in m.value for m in at.markdown)
    tables = [t.value for t in at.dataframe]
    peers = next(t for t in tables if "peer" in t.columns and "llama_cpp" in list(t["peer"]))
    assert list(peers["output = none (prompts)"])[0] == 2
    ours = next(t for t in tables if "ours" in t.columns)
    assert list(ours["ours"]) == ["none", "ngram"] and ours["over llama_cpp (median, min–max)"].notna().all()
