"""The target's verify-cost curve three ways, side by side in one process, rounds interleaved:

- `default`: transformers' forward with torch's default fp32 linear layers;
- `packed`: transformers' forward with oneDNN-packed weights (specviz.kernels.fastlinear), what transformers'
  `generate()` runs on in the bench;
- `fast`: specviz.kernels.fastdecoder (fused q/k/v and gate/up, in-place KV cache) on the packed weights, what the
  engine runs.

Writes JSON and prints a table.

    .venv/bin/python experiments/forward_variants.py [--json-out experiments/results/forward-variants.json]
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

from specviz import models
from specviz.decoding.target import Target
from specviz.kernels import fastlinear
from specviz.kernels.kvcache import crop_cache


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--sizes", default="1,2,3,4,8,16,32,64")
    ap.add_argument("--context-len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(n) for n in args.sizes.split(",")]
    os.environ[fastlinear.ENV_SWITCH] = "0"
    plain = models.load(args.model, device="cpu").target
    os.environ[fastlinear.ENV_SWITCH] = "1"
    packed = models.load(args.model, device="cpu").target
    assert fastlinear.is_packed(packed) and not fastlinear.is_packed(plain)
    targets = {"default": Target(plain), "packed": Target(packed), "fast": Target(packed)}
    targets["default"].fast = targets["packed"].fast = None  # transformers' own forward
    assert targets["fast"].fast is not None, "the fast decoder does not cover this model"
    generator = torch.Generator().manual_seed(0)
    vocab = plain.config.vocab_size
    context = torch.randint(vocab, (args.context_len,), generator=generator).tolist()
    caches = {}
    for label, target in targets.items():
        caches[label] = target.new_cache()
        target.forward(context, caches[label], logits=False)
    times = {(label, n): [] for label in targets for n in sizes}
    for _ in range(args.rounds + 1):  # round 0 warms up
        for n in sizes:
            ids = torch.randint(vocab, (n,), generator=generator).tolist()
            for label, target in targets.items():
                started = time.perf_counter()
                target.forward(ids, caches[label])
                times[label, n].append(time.perf_counter() - started)
                crop_cache(caches[label], args.context_len)
    ms = {label: {str(n): 1e3 * statistics.median(times[label, n][1:]) for n in sizes} for label in targets}
    report = {"model": args.model, "context_len": args.context_len, "torch_threads": torch.get_num_threads(),
              "rounds": args.rounds, "verify_cost_ms": ms}
    print("| new tokens | " + " | ".join(str(n) for n in sizes) + " |")
    print("|---" * (len(sizes) + 1) + "|")
    for label in targets:
        print(f"| {label} (ms) | " + " | ".join(f"{ms[label][str(n)]:.1f}" for n in sizes) + " |")
    for label in ("packed", "fast"):
        print(f"| default ÷ {label} | " + " | ".join(f"{ms['default'][str(n)] / ms[label][str(n)]:.2f}×" for n in sizes) + " |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
