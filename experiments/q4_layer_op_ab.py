"""What running each 4-bit decoder layer as one C++ call (specviz::q4_layer, csrc/q4layer.cpp) saves over the lean
decoder's op-by-op Python loop: one target forward of SmolLM2-135M with `--weights q4` over n new tokens after 256
cached (a decoding step or a verify: the same bits both ways), and a prefill of n prompt tokens into an empty cache
(op by op, over 16 tokens the attention is scaled_dot_product_attention: the same to rounding); the two ways
alternated in one process, median of 10 rounds after 2.

    .venv/bin/python experiments/q4_layer_op_ab.py
"""
import statistics
import sys
import time

import torch

from specviz import models
from specviz.decoding.target import Target

SIZES = (1, 2, 4, 8, 16)
PREFILLS = (32, 64, 128)


def main() -> int:
    target = Target(models.load("smollm2-135m", device="cpu", weights="q4").target)
    if target.fast is None or not target.fast.stack.layer_op:
        print("the layer op does not run here (no C++ ops, or the layers are not all 4-bit)")
        return 1
    context = torch.randint(49152, (256,), generator=torch.Generator().manual_seed(0)).tolist()
    cache = target.new_cache()
    target.forward(context, cache, logits=False)
    times = {(op, kind, n): [] for op in (True, False) for kind, sizes in (("step", SIZES), ("prefill", PREFILLS))
             for n in sizes}
    for _ in range(12):
        for op, kind, n in times:
            target.fast.stack.layer_op = op
            fresh = target.new_cache() if kind == "prefill" else cache
            started = time.perf_counter()
            if kind == "prefill":
                target.forward(context[:n], fresh, logits=False)
            else:
                target.forward(context[-n:], cache)
            times[op, kind, n].append(time.perf_counter() - started)
            cache.crop(len(context))
    print(f"torch threads {torch.get_num_threads()}; ms of one forward (median)")
    for op_kind, n in sorted({(kind, n) for _, kind, n in times}, key=lambda k: (k[0] != "step", k[1])):
        one, loop = (1e3 * statistics.median(times[op, op_kind, n][2:]) for op in (True, False))
        what = f"{n} new tokens after 256" if op_kind == "step" else f"prefill of {n} tokens"
        print(f"{what:26s}: one call a layer {one:6.2f} ms, op by op {loop:6.2f} ms, {loop / one:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
