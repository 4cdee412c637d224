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

Each test names the rule that decided it (`events.RULES`): "chain" (x drawn from q, α = min(1, p/q)), "point mass" (x picked,
q = δx, α = p′(x)), "greedy" (accept iff x is p's argmax) or "typical" (Medusa's lossy threshold test, below).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from specviz.decoding import sampling
from specviz.decoding.events import CHAIN, GREEDY, POINT_MASS, TYPICAL
from specviz.decoding.tree import ROOT, DraftTree


@dataclass
class NodeTest:
    node: int
    token: int
    p: float  # p(token) that the test used (after earlier rejections at the same node, the residual's)
    q: float | None  # q(token); None for a point mass
    alpha: float
    u: float | None  # None when greedy or typical (no random draw decides the test)
    accepted: bool  # typical: passed the threshold (the step keeps the longest passing prefix, see verify_typical)
    residual_top: list[list[Any]] | None = None  # top-N of the residual after a rejection: [[token, prob], ...]
    rule: str = CHAIN  # one of events.RULES
    threshold: float | None = None  # typical: the threshold p(x) had to exceed


@dataclass
class Verdict:
    path: list[int] = field(default_factory=list)  # accepted node indices, root to deepest
    tests: list[NodeTest] = field(default_factory=list)
    token: int = -1  # the replacement or bonus token that ends the step
    kind: str = "bonus"  # "replacement" after a rejection, "bonus" after a fully accepted path
    final_dist_top: list[list[Any]] | None = None  # top-N of the distribution `token` was sampled from


def top_n(probs: torch.Tensor, n: int) -> list[list[Any]]:
    """[[token, prob], ...] for the n most likely tokens of a (V,) distribution."""
    if n <= 0:
        return []
    values, ids = sampling.row_topk(probs, min(n, probs.shape[-1]))
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
        verdict.token = top[0][0] if len(top) > 1 and top[0][1] > top[1][1] else sampling.row_argmax(p[node + 1])
    return verdict


class Lossless:
    """The acceptance rule every drafter brings unless it asks for another: `verify` (greedy argmax at
    temperature 0, the speculative sampling rule above it). A rule is called with the tree, p (n + 1, V), greedy,
    the generator and n_top, and with the target's raw logits (n + 1, V) and the temperature, which this rule has
    no use for (Medusa's typical rule thresholds softmax(logits / T))."""

    lossy = False

    def __call__(self, tree: DraftTree, p: torch.Tensor, greedy: bool, generator: torch.Generator, n_top: int,
                 logits: torch.Tensor | None = None, temperature: float = 1.0) -> Verdict:
        return verify(tree, p, greedy, generator, n_top)


LOSSLESS = Lossless()


@dataclass(frozen=True)
class Typical:
    """Medusa's typical acceptance, as its code runs it (FasterDecoding/Medusa `evaluate_posterior`, the `fast` path
    of `medusa_generate`). NOT lossless: the output no longer follows p; events of such a run are marked lossy. At
    temperature 0 it is the greedy rule (Medusa's `temperature == 0` branch keeps the longest prefix of argmax
    tokens, which is what the greedy walk finds: a Medusa node's children are distinct tokens).

    At temperature T > 0, with P = softmax(logits / T) at each position (temperature only: top-k and top-p play no
    part in it) and H its entropy:
      - a node x passes when P(x) > min(hard_cap, entropy_factor · exp(−H)) at its parent;
      - every root-to-leaf path of the tree is a candidate; its accepted length is the number of passing nodes
        before its first failure; the step keeps the candidate with the longest accepted prefix, ties broken by the
        larger Σ log P over that prefix;
      - the token that closes the step is P's argmax after the last accepted node (Medusa's first candidate token,
        taken unconditionally: the argmax under `fast`), not a sample.

    The constants are Medusa's (Cai et al., 2024): the paper writes min(ε, δ · exp(−H)) with ε the hard threshold
    and δ the entropy-dependent one; its code calls them `posterior_threshold=0.09` and `posterior_alpha=0.3`
    (recommended there as about √posterior_threshold). The hard cap binds on confident distributions (low H), the
    entropy term on flat ones. H is computed as Medusa's code computes it, with 1e-5 added inside the log."""

    hard_cap: float = 0.09  # ε in the paper, posterior_threshold in Medusa's code: the largest threshold ever used
    entropy_factor: float = 0.3  # δ in the paper, posterior_alpha in Medusa's code: multiplies exp(−H(P))
    lossy = True  # a class attribute, not a field

    def thresholds(self, probs: torch.Tensor) -> torch.Tensor:
        """(..., V) distributions → (...) thresholds min(hard_cap, entropy_factor · exp(−H))."""
        entropy = -(probs * torch.log(probs + 1e-5)).sum(-1)  # Medusa's entropy, 1e-5 inside the log
        return torch.clamp(self.entropy_factor * torch.exp(-entropy), max=self.hard_cap)

    def threshold(self, p_here: torch.Tensor) -> float:
        """The threshold for one (V,) distribution."""
        return float(self.thresholds(p_here))

    def __call__(self, tree: DraftTree, p: torch.Tensor, greedy: bool, generator: torch.Generator, n_top: int,
                 logits: torch.Tensor | None = None, temperature: float = 1.0) -> Verdict:
        if greedy:
            return verify(tree, p, True, generator, n_top)
        tempered = p if logits is None else torch.softmax(logits.float() / temperature, dim=-1).cpu()
        return verify_typical(tree, tempered, self, n_top)


MEDUSA_TYPICAL = Typical()  # Medusa's published constants


def verify_typical(tree: DraftTree, probs: torch.Tensor, rule: Typical, n_top: int = 5) -> Verdict:
    """Medusa's selection (see `Typical`) over a tree.

    probs: (n + 1, V), row 0 is softmax(logits / T) after the root, row i + 1 after node i.
    The verdict's tests are every node whose ancestors all passed (the nodes the selection can reach), parents
    first; `accepted` on a test says it passed the threshold. The path is the longest passing prefix over all
    root-to-leaf candidates, so a passing node can be off it (a sibling's branch reached deeper)."""
    verdict = Verdict()
    if len(tree):
        thresholds = rule.thresholds(probs)  # (n + 1,)
        parents = [parent + 1 for parent in tree.parents]  # the row each node is tested on
        p_x = probs[torch.tensor(parents), torch.tensor(tree.tokens)]  # (n,)
        passed = (p_x > thresholds[parents]).tolist()
        p_x, thresholds = p_x.tolist(), thresholds.tolist()
        reached: list[bool] = []  # nodes whose ancestors all passed
        for i, parent in enumerate(tree.parents):
            if parent == ROOT or (passed[parent] and reached[parent]):
                verdict.tests.append(NodeTest(i, tree.tokens[i], p_x[i], None, float(passed[i]), None, passed[i],
                                              rule=TYPICAL, threshold=thresholds[parents[i]]))  # q: unread
            reached.append(parent == ROOT or (passed[parent] and reached[parent]))
        verdict.path = _longest_passing_prefix(tree, passed, p_x)
    last = verdict.path[-1] if verdict.path else ROOT
    verdict.kind = "replacement" if tree.children()[last] else "bonus"
    verdict.token = int(probs[last + 1].argmax())
    verdict.final_dist_top = top_n(probs[last + 1], n_top)
    return verdict


def _longest_passing_prefix(tree: DraftTree, passed: list[bool], p_x: list[float]) -> list[int]:
    """Medusa's choice among the root-to-leaf candidates: the most passing nodes before the first failure, ties
    by the larger Σ log P over them, then the first candidate in Medusa's order (deepest paths first, and among
    paths of one depth the later node first, as its `retrieve_indices` lists them)."""
    best, best_key = [], (0, 0.0)
    leaves = sorted(tree.leaf_paths(), key=lambda path: (-len(path), -path[-1]))
    for path in leaves:
        n = 0
        while n < len(path) and passed[path[n]]:
            n += 1
        if n == 0:
            continue
        key = (n, sum(math.log(p_x[i]) for i in path[:n]))
        if key > best_key:  # strict: the first of equal candidates stays, as Medusa's argmax keeps it
            best, best_key = path[:n], key
    return best


def _greedy_pick(tree: DraftTree, children: list[int], p_here: torch.Tensor, verdict: Verdict) -> int | None:
    if not children:  # a leaf (every step of `none`): nothing to test, the argmax comes once, as the verdict's token
        return None
    best = sampling.row_argmax(p_here)
    for c in children:
        accepted = tree.tokens[c] == best
        verdict.tests.append(
            NodeTest(c, tree.tokens[c], float(p_here[tree.tokens[c]]), tree.q[c], float(accepted), None, accepted,
                     rule=GREEDY)
        )
        if accepted:
            return c
    return None


def _sampled_pick(tree: DraftTree, children: list[int], p_here: torch.Tensor, verdict: Verdict,
                  generator: torch.Generator, n_top: int) -> int | None:
    residual = p_here
    for c in children:
        x = tree.tokens[c]
        q_dist = tree.q_dist[c]
        q_x = 1.0 if q_dist is None else float(q_dist[x])
        p_x = float(residual[x])
        alpha = min(1.0, p_x / q_x) if q_x > 0 else 0.0
        u = sampling.uniform(generator)
        accepted = u < alpha
        test = NodeTest(c, x, p_x, None if q_dist is None else q_x, alpha, u, accepted,
                        rule=POINT_MASS if q_dist is None else CHAIN)
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
