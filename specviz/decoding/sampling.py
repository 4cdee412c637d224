"""Logits → processed probabilities, and sampling. Pure functions.

The lossless guarantee holds for the *processed* distributions, so the target's p and the draft's q both go
through `process` with the same settings before any acceptance test.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specviz.errors import SpecvizError


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 means greedy (argmax)
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut

    def __post_init__(self):
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise SpecvizError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise SpecvizError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise SpecvizError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def check_probs(probs: torch.Tensor, who: str) -> None:
    """(..., V) probabilities from `process` or `display_probs`. A NaN or +inf logit, or a row of -inf only,
    makes the softmax's normaliser NaN and so the whole row NaN: one column is enough to check (a full
    isnan scan of the logits cost a noticeable share of a 135M model's step)."""
    if torch.isnan(probs[..., 0]).any():
        raise SpecvizError(f"the {who} model produced NaN or infinite logits; check its weights and dtype")


def process(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """(..., V) logits → (..., V) float32 probabilities after temperature, top-k and top-p.

    Greedy gives a point mass on the argmax, so the same acceptance rule covers both cases.
    """
    logits = logits.float()
    if sampling.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sampling.top_p < 1.0:
        probs = _top_p(probs, sampling.top_p)
    return probs


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (always at least one)."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_p.cumsum(-1) - sorted_p  # mass of the strictly more likely tokens
    sorted_p = sorted_p.masked_fill(mass_before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return kept / kept.sum(-1, keepdim=True)


def display_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """What the UI shows as p or q: the processed distribution, or plain softmax when greedy
    (a point mass would hide how confident the model was)."""
    if sampling.greedy:
        return torch.softmax(logits.float(), dim=-1)
    return process(logits, sampling)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token id from a (V,) distribution."""
    return int(torch.multinomial(probs, 1, generator=generator))


def uniform(generator: torch.Generator) -> float:
    return float(torch.rand((), generator=generator, device=generator.device))
