"""The trained drafters in fp32 and in bf16 (and, beside a 4-bit target, with 4-bit products) against the same
target, side by side in one process.

specviz.models.draft_dtype (specviz/models/device.py) runs the shipped EAGLE head, Medusa heads and distilled draft
in bf16 on CPUs that multiply bf16 in hardware; beside a `--weights q4` or `q4q8` target the EAGLE and EAGLE-3
heads' products are 4-bit (specviz.models.loading.load_trained; on 8-bit activations beside `q4q8`). This
measures what each buys: each MT-bench question (from --offset) runs `none` and every drafter in every variant,
order rotated per question, after a warm-up; speedups are per prompt over `none`, medians reported, with the
drafting time per step. Greedy outputs are checked against `none`'s.

    .venv/bin/python experiments/draft_dtype.py [--limit 6] [--json-out experiments/results/draft-dtype.json]
    .venv/bin/python experiments/draft_dtype.py --weights q4 --drafters eagle2 --limit 16
    .venv/bin/python experiments/draft_dtype.py --weights q4q8 --drafters eagle2,eagle3 --limit 8
"""
import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

import specviz
from specviz import models
from specviz.kernels import fastlinear
from specviz.models.device import DRAFT_DTYPE_ENV
from specviz.models.loading import load_shipped

PROMPTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "mt_bench.jsonl"


def shipped_in(dtype, loaded):
    """The preset's shipped drafters again, on the same target, in `dtype` (None: as specviz chooses)."""
    import os

    before = os.environ.get(DRAFT_DTYPE_ENV)
    if dtype is None:
        os.environ.pop(DRAFT_DTYPE_ENV, None)
    else:
        os.environ[DRAFT_DTYPE_ENV] = str(dtype).removeprefix("torch.")
    try:
        parts = load_shipped(models.PRESETS[loaded.name], loaded.target)
    finally:
        if before is None:
            os.environ.pop(DRAFT_DTYPE_ENV, None)
        else:
            os.environ[DRAFT_DTYPE_ENV] = before
    for module in parts.values():
        fastlinear.pack_linears(module)
    return dataclasses.replace(loaded, **parts)


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", default=str(PROMPTS))
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--drafters", default="eagle2,medusa,draft")
    ap.add_argument("--weights", default="fp32", choices=("fp32", "q4", "q4q8"), help="the target's weights")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    if args.model not in models.PRESETS:
        ap.error(f"--model must be a preset with shipped drafters: {', '.join(models.PRESETS)}")
    if not Path(args.prompts).is_file():
        ap.error(f"no prompt file at {args.prompts} (MT-bench sits in ../shared/data beside the clone): pass --prompts")
    loaded = models.load(args.model, device="cpu", weights=args.weights)
    variants = {"float32": shipped_in(torch.float32, loaded), "bfloat16": shipped_in(torch.bfloat16, loaded)}
    if loaded.weights in ("q4", "q4q8"):  # the EAGLE and EAGLE-3 heads' products 4-bit (the others: draft_dtype)
        variants["4-bit"] = shipped_in(None, loaded)
    if not fastlinear.native_bf16():
        print("note: this CPU has no native bf16 products, so specviz itself would keep fp32 drafts here", file=sys.stderr)
    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    prompts = [(r.get("turns") or [r.get("instruction")])[0] for r in rows][args.offset : args.offset + args.limit]
    methods = [("none", None, "none")] + [(f"{d} {v}", v, d) for d in args.drafters.split(",") for v in variants]

    def run(method, prompt, tokens):
        _, variant, drafter = method
        return specviz.generate(prompt, models=variants[variant or "float32"], drafter=drafter, max_new_tokens=tokens)

    for method in methods:  # warm-up: kernels, packed copies, the verify-cost curve of the "auto" budgets
        run(method, prompts[0], 16)
    results = {name: [] for name, _, _ in methods}
    for i, prompt in enumerate(prompts):
        order = methods[i % len(methods):] + methods[: i % len(methods)]
        for method in order:
            results[method[0]].append(run(method, prompt, args.max_new_tokens))
        print(f"prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
    base = results["none"]
    report = {"model": args.model, "weights": loaded.weights, "prompts": len(prompts), "offset": args.offset,
              "max_new_tokens": args.max_new_tokens, "native_bf16": fastlinear.native_bf16(), "methods": {}}
    print(f"target weights {loaded.weights}")
    print("| method | τ | tokens/s | speedup vs none (median, min–max) | drafting ms a step | output = none |\n"
          "|---|---|---|---|---|---|")
    for name, outs in results.items():
        speedups = [b.stats["wall_s"] / o.stats["wall_s"] for b, o in zip(base, outs)]
        tokens = sum(o.stats["new_tokens"] for o in outs)
        steps = sum(o.stats["steps"] for o in outs)
        entry = {"tau": tokens / steps, "draft_ms_per_step": 1e3 * sum(o.stats["draft_s"] for o in outs) / steps,
                 "tokens_per_s": tokens / sum(o.stats["wall_s"] for o in outs),
                 "speedup_vs_none": {"median": statistics.median(speedups), "min": min(speedups), "max": max(speedups)},
                 "outputs_match_none": all(o.token_ids == b.token_ids for b, o in zip(base, outs))}
        report["methods"][name] = entry
        s = entry["speedup_vs_none"]
        print(f"| `{name}` | {entry['tau']:.2f} | {entry['tokens_per_s']:.1f} | {s['median']:.2f}× "
              f"({s['min']:.2f}–{s['max']:.2f}) | {entry['draft_ms_per_step']:.2f} | {'yes' if entry['outputs_match_none'] else 'NO'} |")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1))
    return 0 if all(m["outputs_match_none"] for m in report["methods"].values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
