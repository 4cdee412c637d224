"""Integration on the real embedded model (smollm2-135m, fetched by `make test`)."""
import json
import subprocess
import sys

import pytest
import torch

import specviz
from specviz import api, drafters, models
from specviz.decoding import engine
from specviz.drafters.base import NoDraft
from specviz.drafters.ngram import NgramDrafter

from tiny import decode_settings

pytestmark = [pytest.mark.skipif(not models.is_fetched("smollm2-135m"), reason="smollm2-135m is not fetched (make fetch)"),
              pytest.mark.slow]

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox",
]


@pytest.fixture(scope="module")
def smol():
    return models.load("smollm2-135m", device="cpu", weights="fp32")  # the reference is transformers on the fp32 model


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_ngram_and_none_equal_transformers_generate(smol, prompt):
    ids = api.encode_prompt(smol.tokenizer, prompt)
    reference = smol.target.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False)[0, len(ids) :].tolist()
    for drafter in (NoDraft(), NgramDrafter(4)):
        done = list(engine.decode(smol.target, smol.tokenizer, drafter, ids, decode_settings(max_new_tokens=40)))[-1]
        assert done.token_ids == reference, drafter.name


def test_sampling_runs_and_is_reproducible(smol):
    kwargs = dict(models=smol, drafter="ngram", max_new_tokens=24, temperature=0.8, top_p=0.95, seed=3)
    a, b = specviz.generate(PROMPTS[1], **kwargs), specviz.generate(PROMPTS[1], **kwargs)
    assert a.token_ids == b.token_ids and a.text
    assert a.text == smol.tokenizer.decode(a.token_ids, skip_special_tokens=True)


def test_cli_json_prints_exactly_one_object(tmp_path):
    trace = tmp_path / "t.jsonl"
    out = subprocess.run(
        [sys.executable, "-m", "specviz", "generate", "--prompt", PROMPTS[1], "--drafter", "ngram",
         "--max-new-tokens", "12", "--json", "--trace", str(trace)],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(result) == {"text", "token_ids", "stats"} and len(result["token_ids"]) <= 12
    for key in ("steps", "tau", "acceptance_rate", "per_position_acceptance", "tokens_per_s", "wall_s"):
        assert key in result["stats"]
    assert specviz.decoding.events.replayed_text(specviz.decoding.events.read_trace(trace))[1] == result["token_ids"]


def test_cli_bad_input_is_one_line_not_a_traceback():
    out = subprocess.run(
        [sys.executable, "-m", "specviz", "generate", "--prompt", "hi", "--drafter", "nope"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 2
    assert "unknown drafter" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("drafter", [name for name, spec in drafters.REGISTRY.items() if spec.needs])  # trained
def test_shipped_drafters_greedy_equal_the_target_alone(smol, drafter):
    if drafter not in drafters.available(smol):
        pytest.skip(f"no shipped {drafter} weights in assets/")
    ids = api.encode_prompt(smol.tokenizer, PROMPTS[0])
    reference = smol.target.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0, len(ids) :].tolist()
    # a fixed draft length: the cost-aware one may draft nothing where this host's verify cost says it does not pay
    result = specviz.generate(PROMPTS[0], models=smol, drafter=f"{drafter}:k_policy=fixed", max_new_tokens=32)
    assert result.token_ids == reference
    assert result.stats["tau"] > 1.0  # the trained drafter gets some tokens accepted
