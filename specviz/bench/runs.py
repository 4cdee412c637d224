"""A bench run's records and the arithmetic every section of the report shares: one decode (Run), a method's
decodes grouped by prompt (MethodRuns), per-prompt ratios, outputs that part from a reference, speeds; and the
Markdown cells the sections are written with."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from specviz.decoding.metrics import acceptance_histogram


@dataclass
class Run:
    """One decode of one prompt by one method (a drafter through our engine, or a peer)."""

    method: str
    prompt: str
    repeat: int
    token_ids: list[int]
    wall_s: float  # the whole call, prefill included, as a user waits for it
    steps: int = 0  # target forwards after the prefill (engine runs only)
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    reached: list[int] = field(default_factory=list)  # per depth d (index d - 1): steps whose draft reached d
    accepted_at: list[int] = field(default_factory=list)  # ... and steps that accepted a token at depth d
    tree: bool = False  # some step drafted a tree that is not a chain
    # a server lane's own timing of this decode, where it reports one (llama-server's `timings`): tokens/s of its
    # decode and of its prompt processing, without the client's HTTP, streaming and waiting
    server_tokens_per_s: float | None = None
    server_prompt_tokens_per_s: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.wall_s if self.wall_s > 0 else 0.0


def summary(values: list[float]) -> dict | None:
    """median / min / max of per-prompt ratios (None when there are none)."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


@dataclass
class MethodRuns:
    """One method's runs grouped by prompt: repeat 0 for tokens and counts, the median time over repeats."""

    runs: list[Run]
    by_prompt: dict[str, list[Run]] = field(init=False)

    def __post_init__(self):
        self.by_prompt = {}
        for run in self.runs:
            self.by_prompt.setdefault(run.prompt, []).append(run)

    def first(self, prompt: str) -> Run:
        return self.by_prompt[prompt][0]

    def wall_s(self, prompt: str) -> float:
        return statistics.median(r.wall_s for r in self.by_prompt[prompt])

    def tokens_per_s(self, prompt: str) -> float:
        return len(self.first(prompt).token_ids) / self.wall_s(prompt)

    def firsts(self) -> list[Run]:
        return [runs[0] for runs in self.by_prompt.values()]

    def totals(self) -> tuple[int, float]:
        """Tokens and seconds summed over prompts."""
        return sum(len(r.token_ids) for r in self.firsts()), sum(self.wall_s(p) for p in self.by_prompt)


def ratios(ours: MethodRuns, theirs: MethodRuns) -> list[float]:
    """Per prompt: our tokens/s over theirs (on the tokens each actually produced)."""
    return [ours.tokens_per_s(p) / theirs.tokens_per_s(p) for p in ours.by_prompt if p in theirs.by_prompt]


def mismatches(ours: MethodRuns, reference: MethodRuns) -> list[dict]:
    """Prompts where our tokens differ from the reference's: where they first differ and what each had there."""
    found = []
    for prompt in ours.by_prompt:
        a, b = reference.first(prompt).token_ids, ours.first(prompt).token_ids
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            found.append({"prompt": prompt, "index": at, "expected": a[at] if at < len(a) else None,
                          "got": b[at] if at < len(b) else None, "expected_tokens": len(a), "got_tokens": len(b)})
    return found


def acceptance(method: MethodRuns) -> dict:
    """Steps, τ, drafted and accepted tokens, per-position acceptance and the acceptance histogram over the
    first repeat of each prompt."""
    firsts = method.firsts()
    steps, drafted, accepted = (sum(getattr(r, key) for r in firsts) for key in ("steps", "drafted", "accepted"))
    depth = max((len(r.reached) for r in firsts), default=0)
    reached = [sum(r.reached[d] for r in firsts if d < len(r.reached)) for d in range(depth)]
    accepted_at = [sum(r.accepted_at[d] for r in firsts if d < len(r.accepted_at)) for d in range(depth)]
    return {
        "steps": steps,
        "tau": sum(len(r.token_ids) for r in firsts) / steps if steps else 0.0,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "per_position_acceptance": [a / n for a, n in zip(accepted_at, reached)],
        "acceptance_histogram": acceptance_histogram(reached, accepted_at),
    }


def speed(method: MethodRuns) -> dict:
    tokens, seconds = method.totals()
    return {"new_tokens": tokens, "wall_s": seconds, "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
            "ms_per_token": 1e3 * seconds / tokens if tokens else None}


def fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def spread(s: dict | None, spec: str = ".2f", unit: str = "×") -> str:
    """median (min–max) of a summary: of ratios by default ('1.05× (0.98–1.10)'), or of other numbers."""
    return "–" if s is None else f"{s['median']:{spec}}{unit} ({s['min']:{spec}}–{s['max']:{spec}})"


def matched(value) -> str:
    return {True: "yes", False: "**NO**", None: "not checked (T > 0)"}[value]


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
