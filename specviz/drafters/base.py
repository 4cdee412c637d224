"""The drafter interface every topology implements: propose a tree, then observe what was accepted."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.sampling import Sampling
from specviz.tree import DraftTree


@dataclass
class DraftRequest:
    ids: torch.Tensor  # (L,) committed token ids on the CPU; the last one (the root) is not in any cache yet
    max_depth: int  # no deeper than this: a step commits at most max_depth drafted tokens (the token budget)
    sampling: Sampling  # q is processed with the same settings as p
    generator: torch.Generator  # CPU generator: every random draw of a run comes from it, in order
    n_top: int  # size of the top-N lists kept for display


@dataclass
class Outcome:
    accepted: int  # drafted tokens accepted this step
    committed: list[int]  # tokens committed this step (accepted + replacement/bonus)
    features: torch.Tensor | None  # (m, H) target hidden states at the root and at each accepted node


class Drafter:
    """Subclasses override `propose`, and `start`/`observe` when they keep per-run state.

    A drafter object serves one run: make a fresh one per run (models it holds are shared, read-only)."""

    name = "base"
    needs_features = False  # wants the target's final hidden states (input to its LM head)
    lossy = False  # true only for an explicitly requested lossy acceptance rule

    def start(self, prompt_ids: torch.Tensor, features: torch.Tensor | None) -> None:
        """prompt_ids (L,); features (L - 1, H) for the prompt minus its last token, when needs_features."""

    def propose(self, request: DraftRequest) -> DraftTree:
        raise NotImplementedError

    def observe(self, outcome: Outcome) -> None:
        """Called after every verification."""

    def options(self) -> dict:
        """Settings shown in the start event."""
        return {}


class NoDraft(Drafter):
    """Plain autoregressive decoding through the same loop: propose nothing, the target adds one token."""

    name = "none"

    def propose(self, request: DraftRequest) -> DraftTree:
        return DraftTree()
