"""A modelled clock: a run's real steps (tokens verified, draft forwards) replayed at step costs from a roofline
model of a GPU serving a large target, instead of the times measured on this machine.

One forward over n tokens of a model with P parameters, b bytes a weight, on hardware of bandwidth B (bytes/s) and
F FLOP/s (dense), costs at least

    c(n) = max(P × b ÷ B, 2 × P × n ÷ F)

(streaming every weight once, or doing the arithmetic, whichever is longer; KV-cache reads, kernel launches and
communication left out). A step that drafts with d forwards of a draft of P_q parameters and verifies n tokens
costs d × c_q(1) + c(n). The acceptance replayed is the run's own: this model pair's, not a large target's.

Pure Python; no streamlit, no torch.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from specviz.analysis import GPU_DATASHEET
from specviz.drafters import PLAIN, REGISTRY, drafter_name

FORMULA = ("c(n) = max(P × b ÷ B, 2 × P × n ÷ F) per forward over n tokens; a step costs d × c_q(1) + c(n), "
           "d draft forwards of a draft of P_q = share × P parameters, n tokens verified")
CAVEAT = ("MODELLED: each step's tokens and draft forwards are this run's, priced by the roofline formula; the "
          "acceptance is this model pair's, not a large target's and its draft's, and prefill, KV-cache reads and "
          "communication are left out.")
DEFAULT_DRAFT_SHARE = 0.02  # a draft part's parameters ÷ the target's where the models are not at hand


@dataclass(frozen=True)
class Roofline:
    """A target on hardware: P parameters at b bytes each, B bytes/s, F FLOP/s; the draft as a share of P."""

    label: str
    params: float  # P
    bytes_per_weight: float  # b
    bandwidth: float  # B, bytes/s (all GPUs together)
    flops: float  # F, dense FLOP/s (all GPUs together)
    draft_share: float = DEFAULT_DRAFT_SHARE  # P_q ÷ P

    def forward_s(self, n: int, params: float | None = None) -> float:
        """c(n): seconds of one forward over n tokens of a model of `params` (default: the target's)."""
        params = self.params if params is None else params
        return max(params * self.bytes_per_weight / self.bandwidth, 2 * params * n / self.flops)

    def step_s(self, draft_forwards: int, verified: int) -> float:
        """d × c_q(1) + c(n): one speculative step's seconds."""
        return draft_forwards * self.forward_s(1, self.draft_share * self.params) + self.forward_s(verified)

    def step_cost(self, draft_forwards: int, verified: int) -> float:
        """The step's cost in plain target forwards, step_s ÷ c(1): the step cost that the Cost page's formula
        (analysis.predicted_speedup) divides by."""
        return self.step_s(draft_forwards, verified) / self.forward_s(1)

    def describe(self) -> str:
        return (f"{self.label}: P = {self.params / 1e9:g}B, b = {self.bytes_per_weight:g} bytes, "
                f"B = {self.bandwidth / 1e12:g} TB/s, F = {self.flops / 1e12:g} TFLOP/s; c(1) = {1e3 * self.forward_s(1):.2f} ms, "
                f"c(8) ÷ c(1) = {self.forward_s(8) / self.forward_s(1):.2f}")


def on_gpus(label: str, gpu: str, n_gpus: int, params: float, bytes_per_weight: float) -> Roofline:
    """A roofline on `n_gpus` of a datasheet GPU (specviz.analysis.GPU_DATASHEET: its bandwidth and dense bf16
    FLOP/s), scaled perfectly."""
    sheet = GPU_DATASHEET[gpu]
    return Roofline(label, params, bytes_per_weight, n_gpus * sheet["bandwidth_tb_s"] * 1e12,
                    n_gpus * sheet["bf16_tflops"] * 1e12)


# The 70B at 16-bit does not fit one 80 GB H100: 8 of them each stream an eighth, as the Cost page's worked node.
H100_70B = "modelled: H100, 70B at 16-bit (8 GPUs)"
PRESETS = {
    H100_70B: on_gpus(H100_70B, "H100 SXM", 8, 70e9, 2),
    "modelled: H200, 70B at 8-bit (1 GPU)": on_gpus("modelled: H200, 70B at 8-bit (1 GPU)", "H200", 1, 70e9, 1),
    "modelled: H100, 8B at 16-bit (1 GPU)": on_gpus("modelled: H100, 8B at 16-bit (1 GPU)", "H100 SXM", 1, 8e9, 2),
}


def with_draft_share(clock: Roofline, share: float) -> Roofline:
    return replace(clock, draft_share=share)


# ------------------------------------------------------------------------------------------- a run's steps


def draft_forwards(step: dict, drafter: str) -> int:
    """The draft forwards a step took: none for `none` and the n-gram lookup (no model), one for Medusa's heads
    (one pass gives every depth), else the forwards the step reports it ran (`draft_forwards`: a draft model's
    dropped tokens included), or, in a trace without them, one per depth of what it drafted."""
    spec = REGISTRY.get(drafter_name(drafter))
    if drafter_name(drafter) == PLAIN or spec is None or spec.needs is None:
        return 0
    if step.get("draft_forwards") is not None:
        return int(step["draft_forwards"])
    if spec.needs == "medusa":
        return 1
    depths = [node["depth"] for node in step.get("nodes") or []]
    return max(depths) if depths else int(step.get("drafted") or 0)


def verified(step: dict) -> int:
    """Tokens the step's target forward took: the root and every drafted node."""
    nodes = step.get("nodes") or []
    return 1 + (len(nodes) if nodes else int(step.get("drafted") or 0))


def step_times(events: list[dict], clock: Roofline) -> list[float]:
    """Each step's end, in modelled seconds since the run's first step began (the run's elapsed_s, modelled)."""
    drafter, t, times = events[0]["drafter"], 0.0, []
    for step in (e for e in events if e["type"] == "step"):
        t += clock.step_s(draft_forwards(step, drafter), verified(step))
        times.append(t)
    return times


def modelled_tokens_per_s(events: list[dict], clock: Roofline) -> float:
    times = step_times(events, clock)
    tokens = sum(len(e["committed"]) for e in events if e["type"] == "step")
    return tokens / times[-1] if times and times[-1] > 0 else 0.0
