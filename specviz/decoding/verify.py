"""Verification of a draft tree against the target's distributions: greedy and lossless sampling.

One rule covers chains and trees. At a node with children c1, c2, ... (tried in order) and the target's
distribution p at that node:
  - accept child x with probability α = min(1, p(x) / q(x)), drawing u ~ U(0, 1) and accepting when u < α
    (the notation's u ≤ α; the two differ only on an event of probability zero);
  - on rejection replace p by the residual max(0, p − q), normalised, and try the next child;
  - if every child is rejected, sample the replacement from the current p (the last residual);
  - at a node with no children (every drafted token on the path was accepted) sample the bonus token from p.
For a point-mass proposal (n-gram tokens, top-k tree children) q = δx, so α = p(x) and the residual is p with
x removed and renormalised. With one child per node this is the standard speculative sampling rule; with
several children each drawn from q it is the multi-draft rule of SpecInfer. Greedy decoding uses the target's
argmax instead: accept the child equal to it, else the argmax is the replacement (or bonus).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specviz.decoding import sampling
from specviz.decoding.tree import ROOT, DraftTree


@dataclass
class NodeTest:
    node: int
    token: int
    p: float  # p(token) that the test used (after earlier rejections at the same node, the residual's)
    q: float | None  # q(token); None for a point mass
    alpha: float
    u: float | None  # None when greedy
    accepted: bool
    residual_top: list | None = None  # top-N of the residual after a rejection: [[token, prob], ...]


@dataclass
class Verdict:
    path: list[int] = field(default_factory=list)  # accepted node indices, root to deepest
    tests: list[NodeTest] = field(default_factory=list)
    token: int = -1  # the replacement or bonus token that ends the step
    kind: str = "bonus"  # "replacement" after a rejection, "bonus" after a fully accepted path
    final_dist_top: list | None = None  # top-N of the distribution `token` was sampled from


def top_n(probs: torch.Tensor, n: int) -> list:
    """[[token, prob], ...] for the n most likely tokens of a (V,) distribution."""
    if n <= 0:
        return []
    values, ids = torch.topk(probs, min(n, probs.shape[-1]))
    return [[int(i), round(float(v), 6)] for i, v in zip(ids.tolist(), values.tolist())]


def verify(
    tree: DraftTree,
    p: torch.Tensor,  # (n + 1, V): row 0 is p after the root, row i + 1 is p after node i
    greedy: bool,
    generator: torch.Generator,
    n_top: int = 5,
) -> Verdict:
    kids = tree.children()
    verdict = Verdict()
    node = ROOT
    while True:
        p_here = p[node + 1]
        moved_to = (
            _greedy_pick(tree, kids[node], p_here, verdict)
            if greedy
            else _sampled_pick(tree, kids[node], p_here, verdict, generator, n_top)
        )
        if moved_to is None:
            break
        verdict.path.append(moved_to)
        node = moved_to
    verdict.kind = "replacement" if kids[node] else "bonus"
    if greedy:
        verdict.final_dist_top = top_n(p[node + 1], n_top)
        top = verdict.final_dist_top
        # the argmax, read off the top-n where its first entry is strictly the largest (else ties: argmax's first)
        verdict.token = top[0][0] if len(top) > 1 and top[0][1] > top[1][1] else int(p[node + 1].argmax())
    return verdict


class Lossless:
    """The acceptance rule every drafter brings unless it asks for another: `verify` (greedy argmax at
    temperature 0, the speculative sampling rule above it)."""

    lossy = False

    def __call__(self, tree: DraftTree, p: torch.Tensor, greedy: bool, generator: torch.Generator, n_top: int) -> Verdict:
        return verify(tree, p, greedy, generator, n_top)


LOSSLESS = Lossless()


@dataclass(frozen=True)
class Typical:
    """Medusa's typical acceptance: accept x when p(x) > min(hard_cap, entropy_factor · exp(−H(p))). NOT lossless:
    the output no longer follows p exactly; events of such a run are marked lossy. At temperature 0 it is the
    greedy rule.

    The constants are Medusa's (Cai et al., 2024; FasterDecoding/Medusa `medusa_generate` and
    `evaluate_posterior`): the paper writes min(ε, δ · exp(−H)) with ε the hard threshold and δ the
    entropy-dependent one; its code calls them `posterior_threshold=0.09` and `posterior_alpha=0.3` (recommended
    there as about √posterior_threshold). The hard cap binds on confident distributions (low H), the entropy term on
    flat ones. Two differences from Medusa's code, both kept on purpose: H here is the entropy of p itself (Medusa
    adds 1e-5 inside the log), and the walk takes, at each node, the first child that passes (Medusa keeps the
    longest passing candidate path, ties broken by likelihood)."""

    hard_cap: float = 0.09  # ε in the paper, posterior_threshold in Medusa's code: the largest threshold ever used
    entropy_factor: float = 0.3  # δ in the paper, posterior_alpha in Medusa's code: multiplies exp(−H(p))
    lossy = True  # a class attribute, not a field

    def threshold(self, p_here: torch.Tensor) -> float:
        """min(hard_cap, entropy_factor · exp(−H(p))) for one (V,) distribution p."""
        entropy = float(-(p_here * torch.log(p_here.clamp_min(1e-12))).sum())
        return min(self.hard_cap, self.entropy_factor * math.exp(-entropy))

    def __call__(self, tree: DraftTree, p: torch.Tensor, greedy: bool, generator: torch.Generator, n_top: int) -> Verdict:
        if greedy:
            return verify(tree, p, True, generator, n_top)
        return verify_typical(tree, p, self, generator, n_top)


MEDUSA_TYPICAL = Typical()  # Medusa's published constants


def verify_typical(tree: DraftTree, p: torch.Tensor, rule: Typical, generator: torch.Generator, n_top: int = 5) -> Verdict:
    """Walk the tree taking the first child that passes the typical test; then sample the next token from p."""
    kids = tree.children()
    verdict = Verdict()
    node = ROOT
    while True:
        p_here = p[node + 1]
        threshold = rule.threshold(p_here)
        moved_to = None
        for c in kids[node]:
            p_x = float(p_here[tree.tokens[c]])
            accepted = p_x > threshold
            verdict.tests.append(NodeTest(c, tree.tokens[c], p_x, tree.q[c], float(accepted), None, accepted))
            if accepted:
                moved_to = c
                break
        if moved_to is None:
            break
        verdict.path.append(moved_to)
        node = moved_to
    verdict.kind = "replacement" if kids[node] else "bonus"
    verdict.token = sampling.sample(p[node + 1], generator)
    verdict.final_dist_top = top_n(p[node + 1], n_top)
    return verdict


def _greedy_pick(tree, children, p_here, verdict) -> int | None:
    if not children:  # a leaf (every step of `none`): nothing to test, the argmax comes once, as the verdict's token
        return None
    best = int(p_here.argmax())
    for c in children:
        accepted = tree.tokens[c] == best
        verdict.tests.append(
            NodeTest(c, tree.tokens[c], float(p_here[tree.tokens[c]]), tree.q[c], float(accepted), None, accepted)
        )
        if accepted:
            return c
    return None


def _sampled_pick(tree, children, p_here, verdict, generator, n_top) -> int | None:
    residual = p_here
    for c in children:
        x = tree.tokens[c]
        q_dist = tree.q_dist[c]
        q_x = 1.0 if q_dist is None else float(q_dist[x])
        p_x = float(residual[x])
        alpha = min(1.0, p_x / q_x) if q_x > 0 else 0.0
        u = sampling.uniform(generator)
        accepted = u < alpha
        test = NodeTest(c, x, p_x, None if q_dist is None else q_x, alpha, u, accepted)
        verdict.tests.append(test)
        if accepted:
            return c
        residual = _residual(residual, x, q_dist)
        test.residual_top = top_n(residual, n_top)
    verdict.token = sampling.sample(residual, generator)
    verdict.final_dist_top = top_n(residual, n_top)
    return None


def _residual(p: torch.Tensor, x: int, q_dist: torch.Tensor | None) -> torch.Tensor:
    """max(0, p − q) normalised; q is δx when q_dist is None."""
    if q_dist is None:
        r = p.clone()
        r[x] = 0.0
    else:
        r = (p - q_dist).clamp_(min=0.0)
    total = r.sum()
    if total <= 1e-12:  # p == q up to rounding: the rejection had probability ~0, and p is the right fallback
        return p
    return r / total
