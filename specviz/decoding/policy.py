"""How many tokens a drafter drafts each step: a fixed K, or what this machine's verify-cost curve says pays.

The cost-aware rule (`k_policy=cost`). Let a step draft n tokens, and let P_i be the chance that the first i are
all accepted (so the i-th drafted token is committed with chance P_i). The step then commits, in expectation,

    E(n) = 1 + P_1 + ... + P_n        (+1: the replacement or bonus token every step adds)

tokens, and takes T(n) = c(n + 1) + D(n) seconds: one target forward over the root and the n drafted tokens (c,
the measured verify-cost curve, specviz.decoding.costs) plus the drafting itself (D(n) = n·d for a drafter that
runs a draft forward per token, 0 for one whose draft is already paid for or free: a lookup). Plain decoding
commits 1 token in c(1): its rate is 1/c(1).

Drafting one more token raises the step's expected tokens per second E/T exactly when its value P_{n+1} is worth
its marginal cost at the rate reached so far (where that marginal cost is positive; a measured curve can dip):

    P_{n+1} / (c(n + 2) − c(n + 1) + d)  >  E(n) / T(n).

From n = 0, E/T is plain decoding's 1/c(1): the first token is drafted only if P_1 · c(1) > c(2) − c(1) + d, its
expected saving (P_1 of a future one-token forward, c(1)) worth more than its marginal verify and draft cost. Each
token kept this way raises the rate, so a draft the rule keeps never has an expected rate below 1/c(1): when no
length pays, the draft is empty and the step is one plain forward. Where every chance P_1..P_m is known before
verifying (a lookup's continuation, a drafted chain, a tree's ranked nodes), the rule takes the n ≤ m with the
highest E(n)/T(n) (`best_length`), which also looks past a costly size to a cheaper stretch of the curve behind it.
Where each further chance costs a draft forward to learn (a draft model), the drafter asks `worth_drafting` before
each forward, with the chances ahead estimated from the acceptance measured at those positions so far, looking as
far ahead as the drafter may draft (so one costly size on the curve does not stop a draft that pays further on).
Once drafted, the forwards are spent: choosing how many drafted tokens to verify then weighs only the verify cost
(`spent_s` holds the draft time already paid, the same for every choice).

Every estimate above can be wrong, and a drafter's own work each step (a lookup, Medusa's heads, a draft model
catching up) is not in c. So the run also keeps the tokens per second it actually got from the steps where the
drafter was asked for a draft and from plain steps (`StepRates`); while drafting steps have been the slower, the
drafter is not asked (the step is a plain forward, stop "slower") but for one probe every PROBE_EVERY steps, so a
drafter never costs a run more than that probe's share of the gap. This reads wall-clock time, so under COST two runs
of one request can draft on different steps: the output is the same at T = 0 (and distributed the same at T > 0),
the trees and, at T > 0, the sampled text need not be. FIXED never skips a step or cuts a draft for this run's
timings (a tree's `auto` node budget still reads this machine's verify curve, and its early stop the head's own
timings).

P_i comes from the drafter's own q where it has one (the product of q along the path, EAGLE-2's path score), and
from a running per-position acceptance (`RunningAcceptance`) where it has none (prompt lookup).
The chance estimates only decide how many tokens are proposed; verification is unchanged, so the output is too.
"""
from __future__ import annotations

from typing import Callable, Sequence

COST, FIXED = "cost", "fixed"
K_POLICIES = (COST, FIXED)
DEFAULT_K_POLICY = COST
# why a step's draft stopped (the step event's `stop`)
STOP_COST = "cost"  # one more token would not pay under the verify cost (the chance estimated before drafting it)
STOP_CONFIDENCE = "confidence"  # the drafter's own q made its drafted tokens not worth verifying: they were dropped
STOP_CAP = "cap"  # K (or the tree's depth, or the tokens left to generate) reached
STOP_NO_MATCH = "no match"  # the drafter had nothing more to propose (a lookup found no earlier match)
STOP_SLOWER = "slower"  # not asked to draft: this run's drafting steps have committed tokens more slowly (StepRates)
STOPS = (STOP_COST, STOP_CONFIDENCE, STOP_CAP, STOP_NO_MATCH, STOP_SLOWER)

VerifyCost = Callable[[int], float]  # n tokens -> seconds of one verify forward


def check_k_policy(value: object) -> str:
    from specviz.errors import SpecvizError, shown

    if value not in K_POLICIES:
        raise SpecvizError(f"k_policy must be one of {', '.join(K_POLICIES)}, got {shown(value)}")
    return str(value)


def step_rate(chances: Sequence[float], n: int, cost: VerifyCost, draft_s: float = 0.0, spent_s: float = 0.0) -> float:
    """E(n) / T(n): expected tokens per second of a step that verifies the first n of `chances` (cumulative
    chances of acceptance), each of them costing draft_s seconds to draft, after spent_s already spent drafting."""
    return (1.0 + sum(chances[:n])) / (cost(n + 1) + n * draft_s + spent_s)


def best_length(chances: Sequence[float], cost: VerifyCost, draft_s: float = 0.0, spent_s: float = 0.0) -> int:
    """The n ≤ len(chances) with the highest expected tokens per second E(n)/T(n) (the module's rule); 0 when no
    draft beats one plain forward. chances: P_1, P_2, ... for a chain, or a tree's nodes ranked best first (each
    node's path chance; then n is the node budget and c(n + 1) the cost of verifying those nodes and the root).
    draft_s: the cost of drafting each token still to be drafted; spent_s: drafting already paid for, whatever n."""
    best, best_rate, expected = 0, 1.0 / (cost(1) + spent_s), 1.0
    for n, chance in enumerate(chances, 1):
        expected += chance
        rate = expected / (cost(n + 1) + n * draft_s + spent_s)
        if rate > best_rate:
            best, best_rate = n, rate
    return best


def chain_stop(kept: int, found: int, cap: int, cut: str = STOP_COST) -> str:
    """Why a chain stopped: the drafter found `found` tokens of the `cap` it may draft, and kept `kept` of them
    (`cut`: the reason when it kept fewer than it found)."""
    if kept < found:
        return cut
    return STOP_CAP if found >= cap else STOP_NO_MATCH


class RunningAcceptance:
    """Per-position acceptance measured in this run, for a drafter without q: rate(i) estimates the chance that
    the i-th drafted token is accepted given that the tokens before it were. An exponential moving average (weight
    `weight` per step that tried the position, so recent steps count most); a position no step tries drifts back toward the prior by `relax` of the gap a
    step, so a drafter that stopped drafting after its acceptance collapsed tries again after a while."""

    def __init__(self, prior: float = 0.5, weight: float = 0.2, relax: float = 0.01):
        self.prior, self.weight, self.relax = prior, weight, relax
        self.rates: list[float] = []

    def rate(self, position: int) -> float:
        """position: 1 for the first drafted token."""
        return self.rates[position - 1] if position <= len(self.rates) else self.prior

    def chances(self, n: int) -> list[float]:
        """P_1 .. P_n: the cumulative products of the per-position rates."""
        out, chance = [], 1.0
        for i in range(1, n + 1):
            chance *= self.rate(i)
            out.append(chance)
        return out

    def observe(self, drafted: int, accepted: int) -> None:
        """One verified chain (or a tree's depths): `drafted` deep, its first `accepted` tokens accepted. Position
        i was tried if i ≤ drafted and every token before it was accepted."""
        tried = min(drafted, accepted + 1)
        while len(self.rates) < tried:
            self.rates.append(self.prior)
        for i in range(len(self.rates)):
            if i < tried:
                self.rates[i] += self.weight * (float(i < accepted) - self.rates[i])
            else:
                self.rates[i] += self.relax * (self.prior - self.rates[i])


PROBE_EVERY = 8  # while drafting steps are the slower, one step in this many still drafts, to see whether it pays again


class StepRates:
    """Tokens per second of a run's steps that drafted (the drafter was asked, all its costs counted) and of its
    plain ones, each a discounted mean over recent steps (`decay` a step of its kind). The plain rate starts from
    `plain_s`, one plain forward's seconds on the measured curve, until plain steps are seen. The run's first
    drafting step is not counted (a drafter reads the whole prompt then), and drafting is judged only after
    `evidence` drafting steps."""

    def __init__(self, plain_s: float | None = None, decay: float = 0.9, evidence: int = 3):
        self.decay, self.evidence = decay, evidence
        self.seconds = {True: 0.0, False: plain_s or 0.0}
        self.tokens = {True: 0.0, False: 1.0 if plain_s else 0.0}
        self.drafted = 0  # drafting steps seen, the uncounted first included
        self.waited = 0  # steps not drafted since the last drafting step

    def rate(self, drafting: bool) -> float | None:
        return self.tokens[drafting] / self.seconds[drafting] if self.seconds[drafting] > 0 else None

    def observe(self, drafting: bool, seconds: float, tokens: int) -> None:
        if drafting:
            self.drafted += 1
            if self.drafted == 1:
                return
        self.seconds[drafting] = self.decay * self.seconds[drafting] + seconds
        self.tokens[drafting] = self.decay * self.tokens[drafting] + tokens

    def draft_now(self) -> bool:
        """Draft this step? Yes unless drafting steps have been the slower; then once every PROBE_EVERY steps."""
        drafting, plain = self.rate(True), self.rate(False)
        if self.drafted <= self.evidence or drafting is None or plain is None or drafting >= plain \
                or self.waited + 1 >= PROBE_EVERY:
            self.waited = 0
            return True
        self.waited += 1
        return False


class LengthPolicy:
    """A drafter's draft-length policy for one run: FIXED (draft what the drafter's settings say: K tokens, the
    whole tree or its own node budget) or COST (the module's rule, with `cost` the measured verify-cost curve)."""

    def __init__(self, kind: str = FIXED, cost: VerifyCost | None = None):
        check_k_policy(kind)
        if kind == COST and cost is None:
            raise ValueError("the cost-aware draft length needs a verify-cost curve")
        self.kind = kind
        self.cost = cost
        self.acceptance = RunningAcceptance()
        self.rates = StepRates(cost(1) if cost is not None else None)
        self.asked = True  # was the drafter asked for this step's draft

    @property
    def sized(self) -> bool:
        """Does the verify cost size the draft (COST)?"""
        return self.kind == COST

    def length(self, chances: Sequence[float], spent_s: float = 0.0) -> int:
        """How many of the proposed tokens (or ranked tree nodes) with these chances to verify, their drafting
        (spent_s) already paid for: all under FIXED."""
        if self.cost is None or self.kind == FIXED:
            return len(chances)
        return best_length(chances, self.cost, spent_s=spent_s)

    def worth_drafting(self, chances: Sequence[float], draft_s: float = 0.0, cap: int | None = None) -> bool:
        """Before one more draft forward, `chances` drafted so far (each forward draft_s seconds, already spent):
        would drafting on, to any length up to `cap` tokens in all (one more when None), raise the best expected
        rate of verifying what is drafted now? The chances ahead are the running acceptance's at their positions.
        Always under FIXED."""
        if self.cost is None or self.kind == FIXED:
            return True
        n = len(chances)
        spent = n * draft_s
        best = step_rate(chances, best_length(chances, self.cost, spent_s=spent), self.cost, spent_s=spent)
        ahead, chance = list(chances), chances[-1] if chances else 1.0
        for position in range(n + 1, max(n + 1, cap or 0) + 1):
            chance *= self.acceptance.rate(position)
            ahead.append(chance)
            if step_rate(ahead, position, self.cost, spent_s=position * draft_s) > best:  # every forward to here
                return True
        return False

    def draft_now(self) -> bool:
        """Ask the drafter for a draft this step? Always under FIXED; under COST unless steps that drafted have
        committed tokens more slowly than plain steps (then one probe every PROBE_EVERY steps)."""
        self.asked = self.kind == FIXED or self.cost is None or self.rates.draft_now()
        return self.asked

    def observe_step(self, seconds: float, tokens: int) -> None:
        """The step just done: its seconds, from asking for the draft to committing, and the tokens it committed."""
        self.rates.observe(self.asked, seconds, tokens)

    def observe(self, drafted: int, accepted: int) -> None:
        self.acceptance.observe(drafted, accepted)
