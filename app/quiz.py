"""The lab's *Check yourself*: questions on the real acceptance tests of the learner's run, answered by the
engine's own values, and the labels that name which p and which α a test read. No streamlit here."""
from __future__ import annotations

import random
from dataclasses import dataclass

from specviz.decoding.events import CHAIN, POINT_MASS, TYPICAL, rule_of


@dataclass(frozen=True)
class Question:
    """One question on one real acceptance test of the learner's run."""

    kind: str  # "accept": will it be accepted?  "alpha": what is α?
    step: int
    test_index: int
    token: str
    p: float  # the p(x) the test used
    q: float | None  # the q(x) the test used (None: a point mass)
    u: float | None  # None when greedy
    greedy: bool
    argmax_token: str | None  # greedy: the target's most likely token here
    alpha: float
    accepted: bool  # typical: passed the threshold
    after_rejection: bool = False  # sampled, and a sibling was rejected before it at the same parent: p is p'
    rule: str = CHAIN  # the rule that decided the test (specviz.decoding.events.RULES)
    threshold: float | None = None  # typical: the threshold P(x) had to exceed

    @property
    def p_label(self) -> str:
        return p_label(self.greedy, self.after_rejection, self.rule)

    def reason(self) -> str:
        if self.rule == TYPICAL:
            threshold = "its threshold" if self.threshold is None else f"the threshold {self.threshold:.4g}"
            relation = ">" if self.accepted else "≤"
            return (f"Medusa's typical test (lossy; no u, no α): P(x) = {self.p:.4g} {relation} {threshold} = "
                    f"min(ε, δ · exp(−H)), so it {'passed' if self.accepted else 'failed'}. (Passing is not enough to "
                    "be kept: the step keeps the longest passing prefix among the tree's paths.)")
        if self.greedy:
            verdict = "is" if self.accepted else "is not"
            return (f"At temperature 0 a drafted token is accepted exactly when it is the target's argmax: "
                    f"{self.token!r} {verdict} the target's most likely token here"
                    + ("." if self.accepted else f" ({self.argmax_token!r} is)."))
        if self.q is None:
            p = "p'(x)" if self.after_rejection else "p(x)"
            formula = f"x was picked, not sampled (a point mass, q = 1 on x), so α = {p} = {self.p:.4g}"
            if self.after_rejection:
                formula += " (p' = p with the siblings rejected before it removed, renormalised)"
        else:
            formula = f"α = min(1, p/q) = min(1, {self.p:.4g} / {self.q:.4g}) = {self.alpha:.4g}"
        if self.kind == "alpha":
            return formula + "."
        relation = "<" if self.u < self.alpha else "≥"
        return f"{formula}; u = {self.u:.4f} {relation} α, so it was {'accepted' if self.accepted else 'rejected'}."


def questions(events: list[dict], seed: int = 0, n: int = 6) -> list[Question]:
    """Up to n questions drawn from the run's tests: "accept?" questions with accepted and rejected tests mixed
    when both occur, and (when not greedy, where α is only 0 or 1) every second one an "α?" question on a test
    whose α is neither about 0 nor about 1, when the run has such tests."""
    greedy = events[0]["sampling"]["temperature"] == 0
    pool = []
    for step in (e for e in events if e["type"] == "step"):
        targets = {r["node"]: r["p_top"] for r in step["target"]}
        for i, test in enumerate(step["tests"]):
            node = step["nodes"][test["node"]]
            top = targets.get(node["parent"])
            rule = rule_of(test, greedy, events[0].get("lossy", False))
            # only a lossless sampled test updates p after a rejected sibling; greedy and typical tests read the raw p
            after = rule in (CHAIN, POINT_MASS) and any(
                step["nodes"][t["node"]]["parent"] == node["parent"] for t in step["tests"][:i])
            pool.append(Question(
                kind="accept", step=step["step"], test_index=i, token=test["text"], p=test["p"], q=test["q"],
                u=test["u"], greedy=greedy, argmax_token=top[0][1] if top else None, alpha=test["alpha"],
                accepted=test["accepted"], after_rejection=after, rule=rule, threshold=test.get("threshold")))
    rng = random.Random(seed)
    accepted = [q for q in pool if q.accepted]
    rejected = [q for q in pool if not q.accepted]
    rng.shuffle(accepted)
    rng.shuffle(rejected)
    mixed = [q for pair in zip(accepted, rejected) for q in pair] + accepted[len(rejected):] + rejected[len(accepted):]
    if greedy:
        return mixed[:n]
    middling = [q for q in pool if 0.02 < q.alpha < 0.98 and q.rule in (CHAIN, POINT_MASS)]
    rng.shuffle(middling)
    alphas = [Question(**{**q.__dict__, "kind": "alpha"}) for q in middling]
    chosen, used = [], set()
    while len(chosen) < n and (mixed or alphas):
        source = alphas if (len(chosen) % 2 and alphas) or not mixed else mixed
        question = source.pop(0)
        if (question.step, question.test_index) not in used:  # one question per test
            used.add((question.step, question.test_index))
            chosen.append(question)
    return chosen


def score(answers: dict, asked: int) -> str:
    """The score line: how many answers were right, of how many answered, of how many asked."""
    right = sum(a["right"] for a in answers.values())
    return f"{right} right, {len(answers)} of {asked} answered"


def p_label(greedy: bool, after_rejection: bool, rule: str | None = None) -> str:
    """What the p(x) a test used is: at temperature 0 always the target's raw p (the argmax rule updates nothing);
    sampled, p′ after a rejected sibling at the same parent; under Medusa's typical rule softmax(logits / T)."""
    if rule == TYPICAL:
        return "P(x) = softmax(logits / T), target"
    return "p′(x), after the rejected siblings" if after_rejection and not greedy else "p(x), target"


def alpha_label(greedy: bool, point_mass: bool, after_rejection: bool = False) -> str:
    """The rule that gave a test its α: the argmax at temperature 0, p(x) or p′(x) for a point mass, else
    min(1, p/q)."""
    if greedy:
        return "α (T = 0: 1 if x is the argmax, else 0)"
    if point_mass:
        return "α = p′(x)" if after_rejection else "α = p(x)"
    return "α = min(1, p/q)"


def check_answer(question: Question, guess) -> tuple[bool, str]:
    """(right?, the true value as text). `guess`: True/False for "accept", a number for "alpha" (right within
    0.005, or 2 % of α, whichever is larger: the page shows p and q to four decimals)."""
    if question.kind == "accept":
        return bool(guess) == question.accepted, "accepted" if question.accepted else "rejected"
    tolerance = max(0.005, 0.02 * question.alpha)
    return abs(float(guess) - question.alpha) <= tolerance, f"{question.alpha:.4g}"
