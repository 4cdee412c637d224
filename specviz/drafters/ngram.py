"""Prompt lookup: find the last n tokens earlier in the context and propose what followed them.

It has no q: each proposed token is a point mass, so verification accepts it with probability p(x). How much of the
continuation it proposes follows the run's draft-length policy, from the acceptance measured at each position."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from specviz.decoding.drafter import Drafter, DraftRequest
from specviz.decoding.policy import chain_stop
from specviz.decoding.tree import DraftTree
from specviz.drafters.options import construct
from specviz.drafters.spec import DrafterSpec, K, Option
from specviz.errors import SpecvizError

if TYPE_CHECKING:
    from specviz.models.loading import LoadedModels


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, k: int = 4, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise SpecvizError(f"ngram needs 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.k = k
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def options(self) -> dict[str, Any]:
        return {"k": self.k, "max_ngram": self.max_ngram, "min_ngram": self.min_ngram}

    def propose(self, request: DraftRequest) -> DraftTree:
        tree = DraftTree(forwards=0)  # a lookup runs no model
        cap = min(self.k, request.max_depth)
        found = lookup(request.ids, cap, self.max_ngram, self.min_ngram)
        kept = self.policy.length(self.policy.acceptance.chances(len(found)))
        for token in found[:kept]:
            tree.add(token, parent=len(tree) - 1)
        tree.stop = chain_stop(kept, len(found), cap)
        return tree


def lookup(ids: torch.Tensor, k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Continuation (up to k tokens) of the most recent earlier occurrence of the longest matching suffix."""
    return lookup_match(ids, k, max_ngram, min_ngram)[1]


def lookup_match(ids: torch.Tensor, k: int, max_ngram: int, min_ngram: int) -> tuple[int, list[int]]:
    """(n, continuation): the length n of the longest suffix of `ids` found earlier in them (max_ngram down to
    min_ngram) and up to k tokens that followed its most recent earlier occurrence; (0, []) when none is found."""
    if k <= 0:
        return 0, []
    length = ids.shape[0]
    for n in range(max_ngram, min_ngram - 1, -1):
        if length <= n:
            continue
        windows = ids[:-1].unfold(0, n, 1)  # (L - n, n): every earlier n-gram that has a continuation
        starts = (windows == ids[-n:]).all(dim=1).nonzero().flatten()
        if starts.numel():
            start = int(starts[-1]) + n
            return n, ids[start : start + k].tolist()
    return 0, []


def build(models: LoadedModels, k: int, options: dict[str, Any]) -> NgramDrafter:
    return construct(NgramDrafter, "ngram", options, k=k)


SPEC = DrafterSpec(
    "ngram", "prompt lookup: copy what followed the last matching n-gram in the context (no q)", build,
    options=(K, Option("max_ngram", int, 3, "longest n-gram it matches", low=1, high=8),
             Option("min_ngram", int, 1, "shortest n-gram it matches", low=1, high=8)),
    chain=True)
