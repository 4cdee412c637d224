"""What a user would run instead: transformers' generate(), assisted generation and prompt lookup, on the same
model objects, prompts and token budget."""
from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING

import torch
from transformers import GenerationConfig

from specviz.bench.prompts import Prompt
from specviz.bench.runs import Run
from specviz.decoding import engine
from specviz.decoding.costs import synchronize

if TYPE_CHECKING:
    from specviz.bench.settings import BenchSettings

PEERS = ("generate", "generate_assisted", "generate_prompt_lookup")


def generation_config(models, settings: BenchSettings) -> GenerationConfig:
    """generate()'s settings matched to our engine's: the same end-of-sequence ids (and no min_new_tokens, so
    both stop there), the same sampling, and none of the processors a model's defaults may add (top-k 50,
    repetition penalty ...) that our engine does not apply. A fresh object: nothing shared is mutated."""
    eos = sorted(engine.eos_ids(models.target, models.tokenizer))
    pad = getattr(models.tokenizer, "pad_token_id", None)
    sampled = not settings.sampling.greedy
    config = GenerationConfig(
        max_new_tokens=settings.max_new_tokens,
        min_length=0,
        do_sample=sampled,
        typical_p=1.0,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        num_beams=1,
        eos_token_id=eos or None,
        pad_token_id=pad if pad is not None else (eos[0] if eos else None),
    )
    if sampled:  # set only when sampling: generate() warns about sampling flags given to greedy decoding
        config.update(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k)  # 0: no cut, as ours
    return config


def assistant_of(draft, k: int):
    """The draft model as generate()'s assistant, drafting exactly k tokens a step like our `draft` drafter.

    transformers reads K and its schedule from the assistant's own generation_config, so the assistant is a
    shallow copy of the draft (the same weights, no memory) carrying its own config: the shared draft object,
    which other sessions may be using, is never mutated."""
    assistant = copy.copy(draft)
    config = copy.deepcopy(draft.generation_config)
    config.num_assistant_tokens = k
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = 0.0  # no early stop on low draft confidence: always k tokens
    assistant.generation_config = config
    return assistant


def peer_arguments(models, settings: BenchSettings) -> dict[str, dict]:
    """generate() keyword arguments of each peer that applies to these models."""
    base = generation_config(models, settings)
    peers = {"generate": {"generation_config": base}}
    if getattr(models, "draft", None) is not None:
        peers["generate_assisted"] = {"generation_config": base, "assistant_model": assistant_of(models.draft, settings.k)}
    lookup = copy.deepcopy(base)
    lookup.prompt_lookup_num_tokens = settings.k  # max_matching_ngram_size stays transformers' default (2)
    peers["generate_prompt_lookup"] = {"generation_config": lookup}
    return peers


def run_peer(models, name: str, arguments: dict, prompt: Prompt, prompt_ids: list[int], settings: BenchSettings,
             repeat: int = 0) -> Run:
    device = models.target.device
    ids = torch.tensor([prompt_ids], device=device)
    # generate() samples from torch's global generator: seed it for this call, and give its state back afterwards
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.inference_mode():
        torch.manual_seed(settings.seed)
        synchronize(device)
        started = time.perf_counter()
        out = models.target.generate(ids, attention_mask=torch.ones_like(ids), **arguments)
        synchronize(device)
        wall = time.perf_counter() - started
    return Run(name, prompt.id, repeat, out[0, len(prompt_ids):].tolist(), wall)
