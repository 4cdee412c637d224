"""Running statistics of a decode, observed step by step (propose / verify / measure)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Metrics:
    steps: int = 0  # target forwards after the prefill
    new_tokens: int = 0  # committed tokens, replacement and bonus included
    drafted: int = 0  # drafted tokens (tree nodes), whether tested or not
    accepted: int = 0  # drafted tokens accepted and committed (none past an end-of-sequence cut)
    draft_s: float = 0.0
    verify_s: float = 0.0
    # per depth d (index d - 1): steps whose draft reached depth d, and steps that accepted a token at depth d
    reached: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)

    def observe(self, max_depth: int, n_drafted: int, n_accepted: int, n_committed: int, draft_s: float,
                verify_s: float) -> None:
        self.steps += 1
        self.new_tokens += n_committed
        self.drafted += n_drafted
        self.accepted += n_accepted
        self.draft_s += draft_s
        self.verify_s += verify_s
        while len(self.reached) < max_depth:
            self.reached.append(0)
            self.accepted_at.append(0)
        for d in range(max_depth):
            self.reached[d] += 1
        for d in range(n_accepted):
            self.accepted_at[d] += 1

    def summary(self, wall_s: float) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "new_tokens": self.new_tokens,
            # τ counts the replacement/bonus token: tokens committed per target forward
            "tau": self.new_tokens / self.steps if self.steps else 0.0,
            "acceptance_rate": self.accepted / self.drafted if self.drafted else None,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "per_position_acceptance": [a / r for a, r in zip(self.accepted_at, self.reached)],
            "reached": list(self.reached),  # the counts behind it, per depth
            "accepted_at": list(self.accepted_at),
            "acceptance_histogram": acceptance_histogram(self.reached, self.accepted_at),
            "wall_s": wall_s,
            "tokens_per_s": self.new_tokens / wall_s if wall_s > 0 else 0.0,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
        }


def acceptance_histogram(reached: list[int], accepted_at: list[int]) -> list[int]:
    """[h0, h1, ..., hD]: hj = verify steps that drafted something and accepted exactly j drafted tokens (the
    replacement/bonus token not counted; steps that drafted nothing left out, as vLLM's per-request
    `acceptance_histogram` leaves them out). From the per-depth counts: reached[0] steps drafted at least one token,
    accepted_at[d] steps accepted at least d + 1, so hj = accepted_at[j − 1] − accepted_at[j]."""
    if not reached:
        return []
    at_least = [reached[0], *accepted_at, 0]  # at_least[j]: steps that accepted j or more
    return [at_least[j] - at_least[j + 1] for j in range(len(accepted_at) + 1)]
