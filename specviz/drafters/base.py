"""The drafter interface every topology implements: propose a tree, then observe what was accepted."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.decoding.sampling import Sampling
from specviz.decoding.tree import DraftTree
from specviz.decoding.verify import LOSSLESS
from specviz.errors import SpecvizError


def check_total_tokens(drafter: str, total_tokens, whole_tree_allowed: bool = False) -> None:
    """A tree drafter's node budget: "auto" (cut by the measured verify cost) or a whole number >= 1
    (None too where it means the drafter's whole fixed tree)."""
    if total_tokens == "auto" or (total_tokens is None and whole_tree_allowed):
        return
    if isinstance(total_tokens, bool) or not isinstance(total_tokens, int) or total_tokens < 1:
        raise SpecvizError(f"{drafter} option total_tokens must be 'auto' or a whole number of nodes >= 1, got {total_tokens!r}")


def check_vocab_covers(drafter: str, draft_vocab, needed: int) -> None:
    """A draft vocabulary must hold at least the `needed` candidates a drafter ranks per position."""
    if draft_vocab is not None and len(draft_vocab) < needed:
        raise SpecvizError(f"{drafter} ranks {needed} candidates per position but its draft vocabulary has only "
                           f"{len(draft_vocab)} tokens; use a larger draft_vocab")


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
    acceptance = LOSSLESS

    @property
    def lossy(self) -> bool:
        return self.acceptance.lossy

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


def build(models, k: int, options: dict) -> Drafter:
    if options:
        raise SpecvizError(f"drafter 'none' takes no options, got: {', '.join(options)}")
    return NoDraft()
