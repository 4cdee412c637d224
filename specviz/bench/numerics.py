"""Greedy outputs against `none`: a drafter's failure, or a floating-point near-tie.

At temperature 0 a drafter's output is the target's own greedy output up to floating-point near-ties: verifying
K + 1 tokens in one (tree-masked) forward adds the same products in a different order than the one-token forward
of plain decoding, and where the target's two most likely tokens have logits within rounding of each other the
argmax can come out the other way (Chen et al., 2023: the output is the target's "within hardware numerics").
Such a flip is a numerics event, reported with the two logits; any other difference is a failed drafter.
"""
from __future__ import annotations

from typing import Callable

import torch

from specviz.decoding.target import Target

# A gap between the top two logits counts as a near-tie when it is within this many units of rounding
# (torch.finfo(dtype).eps, the spacing of numbers near 1) at the size of the top logit: a sum taken in another
# order moves by a few such units. In float32 at a logit of 20 that is 1e-5; in bfloat16, 0.6.
NEAR_TIE_ROUNDING_UNITS = 4


def tolerance(dtype: torch.dtype, top_logit: float) -> float:
    """The largest top-1/top-2 logit gap that counts as a floating-point near-tie in `dtype`."""
    return NEAR_TIE_ROUNDING_UNITS * torch.finfo(dtype).eps * max(1.0, abs(top_logit))


def near_tie(logits: torch.Tensor, expected: int | None, got: int | None, dtype: torch.dtype) -> dict:
    """At the first position where two greedy outputs differ: the target's two largest logits there (from a
    one-token forward, as plain decoding computes them), their gap, the tolerance, and whether this is a
    near-tie: the two outputs' tokens are the target's top two and the gap is within the tolerance.
    logits: (V,) the target's logits at that position."""
    values, ids = torch.topk(logits.float(), 2)
    top = [[int(i), float(v)] for i, v in zip(ids.tolist(), values.tolist())]
    gap = top[0][1] - top[1][1]
    limit = tolerance(dtype, top[0][1])
    tie = {expected, got} == {top[0][0], top[1][0]} and gap <= limit
    return {"top": top, "gap": gap, "tolerance": limit, "near_tie": tie}


def logits_after(model, ids: list[int], vocab_size: int | None = None) -> torch.Tensor:
    """(V,) the target's logits for the token after `ids`: every token but the last cached in one forward, then
    the last in a one-token forward, as plain decoding reaches that position."""
    target = Target(model, vocab_size)
    cache = target.new_cache()
    if len(ids) > 1:
        target.forward(ids[:-1], cache, logits=False)
    return target.forward(ids[-1:], cache)[1][-1]


def sort_out(drafters: dict[str, dict], logits_at: Callable[[str, int], torch.Tensor], dtype: torch.dtype) -> None:
    """For each drafter's report (its `mismatches` against `none` at temperature 0): move the near-ties to
    `numerics_events`, each with the target's two logits at the first differing token, and set
    `outputs_match_none` from what is left. logits_at(prompt id, index): the target's logits at that token of
    `none`'s output."""
    for report in drafters.values():
        failures, events = [], []
        for found in report["mismatches"]:
            if found["expected"] is None or found["got"] is None:  # one output is a prefix of the other
                failures.append(found)
                continue
            verdict = near_tie(logits_at(found["prompt"], found["index"]), found["expected"], found["got"], dtype)
            if verdict["near_tie"]:
                events.append({**found, **verdict})
            else:
                failures.append(found)
        report["mismatches"], report["numerics_events"] = failures, events
        report["outputs_match_none"] = not failures


def markdown(report: dict) -> list[str]:
    """The Markdown report's lines on numerics events (none when there were none)."""
    rows = [(name, x) for name, d in report["drafters"].items() for x in d.get("numerics_events", [])]
    if not rows:
        return []
    lines = ["", "## Numerics events", "",
             "Greedy outputs that part from `none` at a floating-point near-tie: the two tokens are the target's top "
             f"two and their logits are within {NEAR_TIE_ROUNDING_UNITS} units of rounding of each other "
             "(specviz/bench/numerics.py). Not a failed drafter; the outputs are compared up to that token.", "",
             "| method | prompt | token | top-1 (id: logit) | top-2 (id: logit) | gap | tolerance |", "|---|---|---|---|---|---|---|"]
    for name, x in rows:
        (a, la), (b, lb) = x["top"]
        lines.append(f"| `{name}` | {x['prompt']} | {x['index']} | {a}: {la:.6g} | {b}: {lb:.6g} | {x['gap']:.3g} | "
                     f"{x['tolerance']:.3g} |")
    return lines
