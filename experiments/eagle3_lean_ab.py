"""The EAGLE-3 head's layer on the lean path (specviz.kernels.fastdecoder.FastEagle3Head: q/k/v and gate/up fused,
an in-place cache; a 4-bit layer as one C++ call, q4_eagle3_layer) against the same lean path op by op (the C++
attention op, torch's dispatcher between the products) and against the head's own torch modules, on the same target
and head in one process, with `eagle2` (whose 4-bit head runs as one q4_layer call) beside them.

Each MT-bench question (from --offset) runs `none`, `eagle2` and `eagle3` the three ways, order rotated per question,
after a warm-up; speedups are per prompt over `none`, medians reported, with the drafting time per step. Greedy
outputs are checked against `none`'s. With the default tree budget ("auto", cut by the verify-cost curve) and early
stop, faster drafting can also change a tree's size, so τ may move too: the speedup includes that.

    .venv/bin/python experiments/eagle3_lean_ab.py [--limit 8] [--weights fp32] | tee experiments/results/eagle3-lean-ab.txt
"""
import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path
from unittest import mock

import specviz
from specviz import models
from specviz.kernels import fastdecoder

PROMPTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "mt_bench.jsonl"


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default=str(PROMPTS))
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--weights", default=None, help="the target's weights (default: specviz's, q4q8 on a CPU: then "
                    "both heads' products are 4-bit on 8-bit activations)")
    args = ap.parse_args(argv)
    if not Path(args.prompts).is_file():
        ap.error(f"no prompt file at {args.prompts} (MT-bench sits in ../shared/data beside the clone): pass --prompts")
    loaded = models.load("smollm2-135m", device="cpu", **({"weights": args.weights} if args.weights else {}))
    rows = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    prompts = [r["turns"][0] for r in rows][args.offset : args.offset + args.limit]
    if not prompts:
        ap.error(f"no prompts from --offset {args.offset} with --limit {args.limit}")
    methods = ["none", "eagle2", "eagle3 lean", "eagle3 op-by-op", "eagle3 modules"]

    def op_by_op(head):
        fast = fastdecoder.FastEagle3Head(head)  # a copy of its own: the shared one keeps its layer op
        fast.layer_op = False
        return fast

    paths = {"eagle3 op-by-op": op_by_op, "eagle3 modules": lambda head: None}  # None: the head's modules run

    def run(method, prompt, tokens):
        path = paths.get(method)
        with mock.patch.object(fastdecoder, "for_eagle3", path) if path else contextlib.nullcontext():
            return specviz.generate(prompt, models=loaded, drafter=method.split()[0], max_new_tokens=tokens)

    for method in methods:  # warm-up
        run(method, prompts[0], 16)
    results = {m: [] for m in methods}
    for i, prompt in enumerate(prompts):
        for method in methods[i % len(methods):] + methods[: i % len(methods)]:
            results[method].append(run(method, prompt, args.max_new_tokens))
        print(f"prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
    base = results["none"]
    print(f"smollm2-135m, weights {loaded.weights}, {len(prompts)} MT-bench questions from {args.offset}, "
          f"{args.max_new_tokens} new tokens, T = 0")
    print("| method | τ | tokens/s | speedup vs none (median, min–max) | drafting ms a step | output = none |\n"
          "|---|---|---|---|---|---|")
    same = True
    for name, outs in results.items():
        speedups = [b.stats["wall_s"] / o.stats["wall_s"] for b, o in zip(base, outs)]
        tokens, steps = sum(o.stats["new_tokens"] for o in outs), sum(o.stats["steps"] for o in outs)
        match = all(o.token_ids == b.token_ids for b, o in zip(base, outs))
        same &= match
        print(f"| `{name}` | {tokens / steps:.2f} | {tokens / sum(o.stats['wall_s'] for o in outs):.1f} | "
              f"{statistics.median(speedups):.2f}× ({min(speedups):.2f}–{max(speedups):.2f}) | "
              f"{1e3 * sum(o.stats['draft_s'] for o in outs) / steps:.2f} | {'yes' if match else 'NO'} |")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
