"""Two regimes on one machine: the target on two weight sets (fp32 and the default 4-bit blocks on 8-bit
activations), the lanes that name the weights they ran on, and which regime a measured verify-cost curve puts
each set in. No streamlit here.

The premise of speculative decoding is that a target forward over a few tokens costs about what one over a single
token costs, because decoding streams every weight once per forward (memory-bound). Where the arithmetic is the
bottleneck instead (compute-bound: integer products on a few CPU cores), verifying 8 tokens costs several times
one, and a step that verifies them pays only where it commits more tokens than that.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from specviz.bench.regimes import MEMORY_BOUND_BELOW, RATIO_N, SEPARATOR, cost_ratio, regime
from specviz.models.quantized import WEIGHT_WORDS

if TYPE_CHECKING:
    import torch

__all__ = ["MEMORY_BOUND_BELOW", "RATIO_N", "SEPARATOR", "cost_ratio", "regime"]  # what the pages read from here too


def lane_name(drafter: str, weights: str | None) -> str:
    """`drafter` on `weights` (eagle2@fp32), or the drafter alone where the race runs one weight set."""
    return f"{drafter}{SEPARATOR}{weights}" if weights else drafter


def split_lane(lane: str) -> tuple[str, str | None]:
    """(drafter, weights or None) of a lane name."""
    drafter, _, weights = lane.partition(SEPARATOR)
    return drafter, weights or None


def baseline_of(lane: str, lanes: list[str], plain: str = "none") -> str | None:
    """The lane a lane's speedup is measured against: `none` on the same weights, where the race has it."""
    base = lane_name(plain, split_lane(lane)[1])
    return base if base in lanes else None


def weights_words(weights: str | None) -> str:
    return WEIGHT_WORDS.get(weights or "", weights or "weights not recorded")


def lane_label(weights: str | None, ratio: float | None) -> str:
    """What a lane says of its regime: its weights and measured c(8) ÷ c(1)."""
    if ratio is None:
        return f"{weights or 'weights not recorded'} · verify cost not measured"
    return f"{weights} · c({RATIO_N})/c(1) {ratio:.2f} ({regime(ratio)})"


def regime_sentence(ratios: dict[str, float]) -> str:
    """One sentence per weight set, chosen from its measured c(8) ÷ c(1): which regime it is in and what a step
    must commit for speculation to pay there. The ratio sets the break-even, not the outcome: whether a drafter
    pays is its τ against that, which the race measures."""
    parts = []
    for weights, ratio in ratios.items():
        head = (f"On {weights_words(weights)} ({weights}) a verify of {RATIO_N} tokens costs {ratio:.2f}× one: "
                f"{regime(ratio)}, so a step verifying {RATIO_N} tokens pays only when it commits more than "
                f"{ratio:.1f} tokens (more still to pay for its drafting)")
        if ratio < MEMORY_BOUND_BELOW:
            parts.append(f"{head}; verifying is nearly free, so almost any acceptance pays for the verify.")
        else:
            parts.append(f"{head}; every extra token verified costs real time, so a drafter pays on these weights "
                         "only where its steps commit that many, and shorter drafts cost less to verify.")
    return " ".join(parts)


def part_share(models, part: str | None) -> float | None:
    """A draft part's own parameters ÷ the target's (a specviz.models.LoadedModels), block linears counted by their
    shape: the draft size a modelled clock gives a draft of this pair. The target's embedding and LM head that a
    draft model holds as its own submodules are the target's, not the draft's (an EAGLE or Medusa head reads them
    too, and holds none). None where the part is not loaded."""
    module = models.part(part) if part else None
    if module is None:
        return None
    key = (part, id(module))  # each loaded part once: comparing embeddings reads the whole of both
    if key not in models.part_shares:
        models.part_shares[key] = parameters(module, targets_in(module, models.target)) / parameters(models.target)
    return models.part_shares[key]


def storage(tensor: torch.Tensor) -> int:
    """Where a tensor's data lives: its storage's address, or, for an opaque tensor (a oneDNN-packed weight), which
    has no storage to ask, the tensor's own identity."""
    try:
        return tensor.untyped_storage().data_ptr()
    except RuntimeError:  # "Cannot access storage of OpaqueTensorImpl"
        return id(tensor)


def targets_in(part: torch.nn.Module, target: torch.nn.Module) -> set[int]:
    """The storages of `part`'s tensors that are the target's: every tensor it shares with the target, and its
    embedding and LM head where they are the target's cast to another dtype (models.heads.share_embedding's copies
    beside a target in another dtype)."""
    shared = {storage(t) for t in (*target.parameters(), *target.buffers())}
    theirs = [m.weight for m in embeddings(target)]
    for weight in (m.weight for m in embeddings(part)):
        if storage(weight) not in shared and any(
                weight.shape == t.shape and weight.dtype != t.dtype and bool((weight == t.to(weight.dtype)).all())
                for t in theirs):
            shared.add(storage(weight))
    return shared


def embeddings(model: Any) -> list[Any]:
    """A transformers model's input embedding and output head; none for a module without them (a head)."""
    return [module for get in ("get_input_embeddings", "get_output_embeddings")
            if hasattr(model, get) and (module := getattr(model, get)()) is not None]


def parameters(module: torch.nn.Module, leave_out: set[int] | None = None) -> int:
    """The weights of `module` (block linears by their shape), but those whose storage is in `leave_out`."""
    from specviz.kernels.quant import BLOCK_LINEARS

    leave_out = leave_out or set()
    blocks = [m for m in module.modules()
              if isinstance(m, BLOCK_LINEARS) and not any(storage(b) in leave_out for b in m.buffers())]
    return int(sum(p.numel() for p in module.parameters() if storage(p) not in leave_out)
               + sum(m.in_features * m.out_features for m in blocks))


class RunKey(NamedTuple):
    """What a race run depends on besides its lane (the race page's cache holds {(RunKey, lane): events})."""

    prompt: str
    weights: str | None  # the weight set it ran on (None: another engine's own)
    settings: Any  # the race's app.state.Settings, its drafter cleared


def measured_in_process(cache: dict) -> dict[str, dict]:
    """drafter@weights → {drafter, weights, tau, speedup, lane} from this process's finished race runs ({(RunKey,
    lane): events}, the race page's cache): each drafter's last run on each weight set beside a `none` run of the
    same settings and weights."""
    rows = {}
    for (key, lane), events in cache.items():
        drafter, named = split_lane(lane)
        base = cache.get((key, lane_name("none", named)))
        if drafter == "none" or base is None or events[-1]["type"] != "done" or base[-1]["type"] != "done":
            continue
        weights = named or key.weights
        stats, plain = events[-1]["stats"], base[-1]["stats"]["tokens_per_s"]
        rows[lane_name(drafter, weights)] = {"drafter": drafter, "weights": weights, "tau": stats["tau"],
                                             "speedup": stats["tokens_per_s"] / plain if plain else None,
                                             "lane": lane_name(drafter, weights)}
    return rows
