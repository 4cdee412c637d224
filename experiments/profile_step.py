"""Where one decoding step of the target spends its time: torch.profiler over 20 forwards of one token (or
`--new-tokens N`, a verify's N) with 256 tokens cached through transformers' forward and through specviz.kernels.fastdecoder, both on the packed weights. Prints each
one's top ops by self time and the share of the linear products (`--weights q4`: the GGUF's 4-bit projections).

    .venv/bin/python experiments/profile_step.py [--model smollm2-135m] [--weights q4] [--new-tokens 4]
"""
import argparse
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from specviz import models
from specviz.decoding.target import Target
from specviz.kernels.kvcache import crop_cache

LINEAR_OPS = ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm", "aten::linear", "specviz::q4_linear", "specviz::q4k_linear",
              "specviz::q8_linear", "specviz::q6k_linear")


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--context-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--weights", default="fp32", choices=("fp32", "q4", "q4q8"))
    ap.add_argument("--new-tokens", type=int, default=1, help="tokens per step (a verify of that many)")
    args = ap.parse_args(argv)
    model = models.load(args.model, device="cpu", weights=args.weights).target
    context = torch.randint(model.config.vocab_size, (args.context_len,), generator=torch.Generator().manual_seed(0)).tolist()
    for label, fast in (("transformers", False), ("specviz.kernels.fastdecoder", True)):
        target = Target(model)
        if not fast:
            target.fast = None
        cache = target.new_cache()
        target.forward(context, cache, logits=False)

        def step(target=target, cache=cache):
            target.forward(context[-args.new_tokens:], cache)
            crop_cache(cache, args.context_len)

        for _ in range(5):  # warm-up
            step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                step()
        ops = prof.key_averages()
        total = sum(op.self_cpu_time_total for op in ops)
        linear = sum(op.self_cpu_time_total for op in ops if op.key in LINEAR_OPS)
        calls = sum(op.count for op in ops if op.key in LINEAR_OPS) // args.steps
        print(f"\n## {label}: {total / 1e3 / args.steps:.1f} ms of op time per step (profiled); "
              f"linear products {100 * linear / total:.0f} % ({calls} calls per step)")
        for op in sorted(ops, key=lambda o: -o.self_cpu_time_total)[:8]:
            print(f"  {op.key:55s} {100 * op.self_cpu_time_total / total:5.1f} %  {op.self_cpu_time_total / 1e3 / args.steps:6.2f} ms"
                  f"  {op.count // args.steps} calls/step")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
