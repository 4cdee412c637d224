"""vLLM servers as bench lanes, against the stand-in server (tests/fake_vllm.py) decoding with the tiny target:
each lane gets our prompt tokens and settings, runs interleaved with ours, and is reported beside ours with vLLM's
own per-step counts; a server that is not there stops the bench before it measures anything."""
import json
import socket

import jsonschema
import pytest
import torch
from fake_vllm import Served

from specviz import bench
from specviz.bench import cli as specviz_cli
from specviz.bench.vllm import parse_lanes
from specviz.decoding.prompt import encode_prompt
from specviz.errors import SpecvizError
from specviz.models import LoadedModels

from tiny import TinyTokenizer, tiny_llama


@pytest.fixture(scope="module")
def tiny():
    target = tiny_llama(scale=3.0)
    return LoadedModels("tiny", target, None, TinyTokenizer(64), target.device, target.dtype)


def greedy(model):
    """The tiny target's greedy continuation of a prompt, what the stand-in server commits for it."""
    def continuation(prompt: list[int], budget: int) -> list[int]:
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(budget):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        return ids[len(prompt):]
    return continuation


PROMPTS = [bench.Prompt("a", "abc abc abc abc"), bench.Prompt("b", "the cat sat on the mat. the cat")]


@pytest.fixture
def prompts_file(tmp_path):
    """PROMPTS as the CLI reads them."""
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": p.id, "instruction": p.text}) + "\n" for p in PROMPTS))
    return path


def settings(**overrides):
    return bench.quick_settings(**{"max_new_tokens": 10, "verify_sizes": (), "bandwidth_mb": 8, "bandwidth_repeats": 1,
                                   "drafters": ("ngram",), "peers": False, "llama_cpp": False, **overrides})


def test_a_vllm_lane_runs_beside_ours_with_our_tokens_and_vllms_counts(tiny):
    prompts = PROMPTS
    with Served(continuation=greedy(tiny.target)) as server:
        report = bench.run_bench(tiny, prompts, settings(seed=5, vllm=(("eagle3", server.url),)))
        requests = server.app.state.requests
    jsonschema.validate(report, bench.BENCH_SCHEMA)
    lane = report["vllm"]["lanes"]["eagle3"]
    assert lane["url"] == server.url and lane["model"] == "fake-model" and lane["speculative"] is True
    assert lane["outputs_equal_none"] == 2 and lane["parted_from_none"] == []
    # 10 tokens a prompt: the prefill's token, then steps committing 3, 2, 1, 3 (accepting 2, 1, 0, 2 of 3 drafted)
    assert lane["tau"] == pytest.approx(2.0) and lane["drafted"] == 24 and lane["accepted"] == 10
    assert lane["per_position_acceptance"] == pytest.approx([0.75, 0.5, 0.0])
    assert lane["acceptance_histogram"] == [2, 2, 4, 0]
    assert lane["speedup_vs_none"]["n"] == 2 and set(report["vllm"]["ours_over"]) == {"none", "ngram"}
    runs = [r for r in report["runs"] if r["method"] == "vllm:eagle3"]
    assert len(runs) == 2 and all(r["new_tokens"] == 10 for r in runs)
    # every decode got our prompt's token ids, at T = 0 with the bench's budget and seed (the warm-up's 10 too)
    encoded = [encode_prompt(tiny.tokenizer, p.text) for p in prompts]
    assert [r["prompt"] for r in requests] == [encoded[0], *encoded]
    assert all(r["temperature"] == 0.0 and r["max_tokens"] == 10 and r["seed"] == 5 for r in requests)
    markdown = bench.to_markdown(report)
    assert "## vLLM (running servers" in markdown and f"| `eagle3` | {server.url} (speculative) | 2.00 |" in markdown
    assert "| `eagle3` | 0.75 | 0.50 | 0.00 |" in markdown and "over `eagle3`" in markdown


def test_a_lane_that_parts_from_none_is_reported_not_failed(tiny):
    def wrong_third(prompt, budget):
        out = greedy(tiny.target)(prompt, budget)
        return out[:3] + [(out[3] + 1) % 64] + out[4:]

    with Served(continuation=wrong_third) as server:
        report = bench.run_bench(tiny, PROMPTS, settings(vllm=(("v", server.url),)))
    lane = report["vllm"]["lanes"]["v"]
    assert lane["outputs_equal_none"] == 0 and [x["index"] for x in lane["parted_from_none"]] == [3, 3]
    assert report["outputs_match_none"] is True  # vLLM's output is not held to ours: its kernels round otherwise


def test_a_lane_whose_server_is_not_there_stops_the_bench_before_it_measures(tiny, prompts_file, monkeypatch, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # free: nobody listens
    decoded = []
    monkeypatch.setattr("specviz.bench.run.run_drafter", lambda *a, **k: decoded.append(a))
    with pytest.raises(SpecvizError, match=f"no vLLM server answers at {url}"):
        bench.run_bench(tiny, PROMPTS, settings(vllm=(("gone", url),)))
    assert decoded == []
    monkeypatch.setattr(specviz_cli, "_load_models", lambda args: tiny)
    assert specviz_cli.bench_main(["--prompts", str(prompts_file), "--vllm", url, "--no-peers", "--verify-sizes", "0"]) == 2
    assert "no vLLM server answers" in capsys.readouterr().err


def test_the_cli_takes_lanes_by_url_and_label(tiny, prompts_file, tmp_path, monkeypatch):
    monkeypatch.setattr(specviz_cli, "_load_models", lambda args: tiny)
    out = tmp_path / "b.json"
    with Served(continuation=greedy(tiny.target)) as one, Served(continuation=greedy(tiny.target)) as two:
        argv = ["--prompts", str(prompts_file), "--max-new-tokens", "6", "--verify-sizes", "0", "--drafters", "ngram",
                "--no-peers", "--no-llama-cpp", "--bandwidth-mb", "8", "--vllm", f"{one.url}=plain,vllm+{two.url}",
                "--json-out", str(out)]
        assert specviz_cli.bench_main(argv) == 0
    report = json.loads(out.read_text())
    assert list(report["vllm"]["lanes"]) == ["plain", two.url.removeprefix("http://")]
    assert {r["method"] for r in report["runs"]} == {"none", "ngram", "vllm:plain", f"vllm:{two.url.removeprefix('http://')}"}


@pytest.mark.parametrize("text, message", [
    ("127.0.0.1:8000", "http\\(s\\) URLs"),
    ("http://a:1=x,http://b:2=x", "share a label"),
])
def test_bad_lanes_are_refused_with_the_form_to_use(text, message):
    with pytest.raises(SpecvizError, match=message):
        parse_lanes(text)
