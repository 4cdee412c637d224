"""What the drafters share: `none` (plain decoding through the same loop), the tree budget and draft-vocabulary
checks, and the timing rule that stops drafting once it no longer pays."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable

import torch

from specviz.decoding.drafter import Drafter, DraftRequest
from specviz.decoding.tree import DraftTree
from specviz.drafters.spec import DrafterSpec, Option
from specviz.errors import SpecvizError, shown
from specviz.kernels import quant
from specviz.kernels.fastlinear import kept_projection, rows_projection

if TYPE_CHECKING:
    from specviz.models.loading import LoadedModels

PLAIN = "none"  # the plain drafter's name: every comparison's baseline
PROJECTION_ENV = "SPECVIZ_DRAFT_PROJECTION"  # "auto" (unset) or "packed": vocab_projection keeps the rows in the draft's dtype


def check_total_tokens(drafter: str, total_tokens: object, whole_tree_allowed: bool = False) -> None:
    """A tree drafter's node budget: "auto" (cut by the measured verify cost) or a whole number >= 1
    (None too where it means the drafter's whole fixed tree)."""
    if total_tokens == "auto" or (total_tokens is None and whole_tree_allowed):
        return
    if isinstance(total_tokens, bool) or not isinstance(total_tokens, int) or total_tokens < 1:
        raise SpecvizError(f"{drafter} option total_tokens must be 'auto' or a whole number of nodes >= 1, got "
                           f"{shown(total_tokens)}")


def check_vocab_covers(drafter: str, draft_vocab: torch.Tensor | None, needed: int) -> None:
    """A draft vocabulary must hold at least the `needed` candidates a drafter ranks per position."""
    if draft_vocab is not None and len(draft_vocab) < needed:
        raise SpecvizError(f"{drafter} ranks {needed} candidates per position but its draft vocabulary has only "
                           f"{len(draft_vocab)} tokens; use a larger draft_vocab")


def vocab_projection(model: Any, rows: torch.Tensor | None, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """hidden (P, H) → logits (P, Vd) over the rows `rows` of `model`'s LM head (all when None), the drafting
    hot spot. Where the model's head is 8-bit blocks on 8-bit activations (the default weights) and the rows are
    whole tiles, those rows of it, whatever the head's dtype (SPECVIZ_DRAFT_DTYPE included): 2.5–3.8× faster than
    the rows in bf16 over 4,096 tokens and 1–8 rows on a 2-core Xeon with AVX-512 VNNI
    (experiments/draft_projection.py); else (a head on fp32 activations, rows not whole tiles of 16) or where
    SPECVIZ_DRAFT_PROJECTION=packed, the rows in `dtype` (oneDNN's packed product). A draft only proposes: the
    choice can change which tokens are drafted, never the output."""
    form = os.environ.get(PROJECTION_ENV) or "auto"
    if form not in ("auto", "packed"):
        raise SpecvizError(f"{PROJECTION_ENV} must be auto or packed, got {form!r}")
    head = quant.q8_head(model)
    if head is not None and head.on_8_bit_activations(rows) and form == "auto":
        rows_of_head = head if rows is None else kept_projection(head, rows, "q8", lambda: head.rows(rows))
        return lambda hidden: rows_of_head(hidden.float())
    return packed_rows(model.get_output_embeddings().weight, rows, dtype)


def packed_rows(weight: torch.Tensor, rows: torch.Tensor | None, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """hidden (P, H) in any dtype → logits over weight[rows] (all when None) by oneDNN's packed product in `dtype`."""
    projection = rows_projection(weight, rows, dtype)
    return lambda hidden: projection(hidden.to(dtype))


class NoDraft(Drafter):
    """Plain autoregressive decoding through the same loop: propose nothing, the target adds one token."""

    name = PLAIN

    def propose(self, request: DraftRequest) -> DraftTree:
        return DraftTree()


class DraftTiming:
    """Seconds one more unit of drafting (a draft token, a tree depth) costs, measured in this run, for the rules
    that stop drafting once its expected saving is worth less: a running mean that skips the first `cold`
    measurements, and that forgets slowly while it goes unused, so a stale high value gets measured again."""

    def __init__(self, cold: int = 0):
        self.seconds: float | None = None
        self.cold = cold

    def add(self, seconds: float) -> None:
        if self.cold > 0:
            self.cold -= 1
        else:
            self.seconds = seconds if self.seconds is None else 0.8 * self.seconds + 0.2 * seconds

    def exceeds(self, saving_s: float) -> bool:
        """Is one more unit dearer than `saving_s`? (Never before the first counted measurement.)"""
        if self.seconds is None or self.seconds <= saving_s:
            return False
        self.seconds *= 0.9  # it will not be measured while drafting stops here: forget slowly
        return True


def build(models: LoadedModels, k: int, options: dict[str, Any]) -> Drafter:
    return NoDraft()


SPEC = DrafterSpec(PLAIN, "plain autoregressive decoding: one target forward per token (the baseline)", build)


DRAFT_VOCAB = Option("draft_vocab", int, "trained", "the ids it may draft: trained (the vocabulary it was trained "
                     "with), full (every token), or the N most frequent of the trained one", low=1, high=1 << 20,
                     words=("trained", "full"), served=False)  # each value packs an LM-head copy: not a client's to pick
