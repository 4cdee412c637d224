"""The target's measured forward latency as a function of how many tokens it verifies at once (the verify-cost
curve): the bench reports it, and the tree drafters' "auto" budget is chosen from it."""
from __future__ import annotations

import statistics
import time
from typing import Any, Sequence

import torch

from specviz.decoding.target import Target
from specviz.decoding.tree import DraftTree
from specviz.kernels.kvcache import crop_cache

# Every n up to 8, then steps: on a CPU the curve is not smooth there (SmolLM2-135M on 2 cores: 3-6 tokens cost
# about what 1 costs, 7 is a step up), and interpolating between 1, 2, 4 and 8 overprices 5-6 token trees, the
# cheapest place to verify more candidates.
AUTO_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64)

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def full_tree(n_nodes: int, branching: int) -> DraftTree:
    """A breadth-first full tree: nodes 0..b-1 are the root's children, b..2b-1 node 0's, and so on."""
    tree = DraftTree()
    for i in range(n_nodes):
        tree.add(0, i // branching - 1)
    return tree


def fitting_context(model: Any, sizes: Sequence[int], context_len: int) -> int:
    """The context length, shortened so that context + the largest n fits the model's positions."""
    positions: int = getattr(model.config, "max_position_embeddings", None) or 2**31
    return max(1, min(context_len, positions - max(sizes) - 1))


@torch.inference_mode()
def verify_costs(model: Any, sizes: Sequence[int], context_len: int = 256, repeats: int = 5, branching: int = 0,
                 chain: bool = True) -> dict[str, dict[str, float]]:
    """Median ms of one target forward over n new tokens (the root + n - 1 drafted nodes) after `context_len`
    cached tokens, run as the engine runs it (logits for every new token), for each n in sizes.

    Returns {"chain": {n: ms}, "tree": {n: ms}}: a chain uses the causal mask; a tree (only when branching > 0)
    is a full tree with that many children per node, with its 4D mask and position ids, built before the clock
    starts; chain=False skips the chain. The context is shortened to fit the model's positions."""
    target = Target(model)
    device = target.device
    context_len = fitting_context(model, sizes, context_len)
    generator = torch.Generator().manual_seed(0)
    vocab = model.get_input_embeddings().weight.shape[0]
    cache = target.new_cache()
    target.forward(torch.randint(vocab, (context_len,), generator=generator).tolist(), cache, logits=False)
    inputs: dict[tuple[str, int], tuple[list[int], torch.Tensor | None, torch.Tensor | None]] = {}  # (shape, n) -> (ids, position_ids, mask)
    for n in sizes:
        ids = torch.randint(vocab, (n,), generator=generator).tolist()
        if chain:
            inputs["chain", n] = (ids, None, None)
        if branching:
            tree = full_tree(n - 1, branching)
            inputs["tree", n] = (ids, tree.position_ids(context_len, device=device),
                                 tree.attention_mask(context_len, dtype=model.dtype, device=device))
    times: dict[tuple[str, int], list[float]] = {key: [] for key in inputs}
    for _ in range(repeats + 1):  # round by round over every input, so drift touches them alike; round 0 warms up
        for key, (ids, position_ids, mask) in inputs.items():
            synchronize(device)
            started = time.perf_counter()
            target.forward(ids, cache, position_ids, mask)
            synchronize(device)
            times[key].append(time.perf_counter() - started)
            crop_cache(cache, context_len)
    costs: dict[str, dict[str, float]] = {"chain": {}, "tree": {}}
    for (shape, n), measured in times.items():
        costs[shape][str(n)] = 1e3 * statistics.median(measured[1:])
    return costs


def verify_curve(models: Any) -> dict[int, float]:
    """n -> seconds of one tree-shaped verify forward of `models.target` (a specviz.models.LoadedModels), for
    the drafters whose budget follows it ("auto"): measured on first use and kept on `models` as
    `models.verify_curve`, so it is measured once per loaded model (the app measures it when it loads one)."""
    curve = getattr(models, "verify_curve", None)
    if curve is None:
        ms = verify_costs(models.target, AUTO_SIZES, context_len=128, repeats=3, branching=4, chain=False)["tree"]
        curve = models.verify_curve = {int(n): t / 1e3 for n, t in ms.items()}
    return curve


class CostCurve:
    """n -> seconds, linear between measured sizes, extrapolated past the last one along the last segment's slope
    (never falling: a noisy last size must not price larger forwards as cheaper; a curve of one size is flat).
    `measured_up_to`: the largest size timed, past which it is an extrapolation. Each n is computed once (a tree
    budget asks for every n up to its candidate count each step)."""

    def __init__(self, curve: dict[int, float]):
        if not curve:
            raise ValueError("an empty cost curve")
        self.curve, self.sizes = curve, sorted(curve)
        self.measured_up_to = self.sizes[-1]
        self.memo: dict[int, float] = {}

    def __call__(self, n: int) -> float:
        cost = self.memo.get(n)
        if cost is None:
            cost = self.memo[n] = self._at(n)
        return cost

    def _at(self, n: int) -> float:
        xs, curve = self.sizes, self.curve
        if n <= xs[0] or len(xs) == 1:
            return curve[xs[0]]
        for a, b in zip(xs, xs[1:]):
            if n <= b:
                return curve[a] + (curve[b] - curve[a]) * (n - a) / (b - a)
        a, b = xs[-2], xs[-1]
        return curve[b] + max(0.0, curve[b] - curve[a]) * (n - b) / (b - a)


def interpolate(curve: dict[int, float]) -> CostCurve:
    """The measured curve as a function of n (CostCurve)."""
    return CostCurve(curve)
