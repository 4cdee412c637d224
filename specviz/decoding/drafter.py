"""The drafter interface the loop calls: a drafter proposes a tree for the committed context, then observes what the
target accepted. Every topology in specviz/drafters implements it; so can a drafter of your own."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specviz.decoding.policy import LengthPolicy
from specviz.decoding.sampling import Sampling
from specviz.decoding.tree import DraftTree
from specviz.decoding.verify import LOSSLESS, Lossless, Typical


@dataclass
class DraftRequest:
    ids: torch.Tensor  # (L,) committed token ids on the CPU; the last one (the root) is not in any cache yet
    max_depth: int  # no deeper than this: a step commits at most max_depth drafted tokens (the token budget)
    sampling: Sampling  # q is processed with the same settings as p
    generator: torch.Generator  # CPU generator: every random draw of a run comes from it, in order
    n_top: int  # size of the top-N lists kept for display


@dataclass
class Outcome:
    accepted: int  # drafted tokens accepted and committed this step (none past an end-of-sequence cut)
    committed: list[int]  # tokens committed this step (accepted + replacement/bonus)
    features: torch.Tensor | None  # (len(committed), H) target hidden states at the root and each committed accepted node


class Drafter:
    """Subclasses override `propose`, and `start`/`observe` when they keep per-run state.

    A drafter object serves one run: make a fresh one per run (models it holds are shared, read-only)."""

    name = "base"
    needs_features = False  # wants the target's final hidden states (input to its LM head)
    feature_layers: tuple[int, ...] = ()  # with needs_features: these decoder layers' inputs instead, side by side
    # how the target's verdict on this drafter's tree is reached: (tree, p, greedy, generator, n_top) -> Verdict;
    # every drafter verifies losslessly unless a lossy rule is explicitly asked for (Medusa's typical=true)
    acceptance: Lossless | Typical = LOSSLESS
    _policy: LengthPolicy | None = None

    @property
    def policy(self) -> LengthPolicy:
        """How many tokens it drafts a step (specviz.decoding.policy): the registry gives each drafter it builds
        the run's k_policy (cost-aware by default); a drafter constructed directly keeps its fixed settings."""
        if self._policy is None:
            self._policy = LengthPolicy()
        return self._policy

    @policy.setter
    def policy(self, policy: LengthPolicy) -> None:
        self._policy = policy

    @property
    def lossy(self) -> bool:
        return self.acceptance.lossy

    def start(self, prompt_ids: torch.Tensor, features: torch.Tensor | None) -> None:
        """prompt_ids (L,); features (L - 1, H) for the prompt minus its last token, when needs_features."""

    def propose(self, request: DraftRequest) -> DraftTree:
        raise NotImplementedError

    def observe(self, outcome: Outcome) -> None:
        """Called after every verification."""

    def options(self) -> dict[str, Any]:
        """Settings shown in the start event."""
        return {}
