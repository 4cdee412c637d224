"""The attention block of a decoding step as one C++ op (specviz.kernels.extension, specviz/kernels/csrc/attend.cpp)
against torch's ops, side by side in one process: one forward of the target over n new tokens after 256 cached,
through specviz.kernels.fastdecoder, the two ways alternated within each round on the same model object; medians
over the rounds after a warm-up round. Also checks that both give the same greedy next tokens.

    .venv/bin/python experiments/attention_op_ab.py [--sizes 1,2,4,8,16,32] [--rounds 15]
"""
import argparse
import statistics
import sys
import time

import torch

from specviz import models
from specviz.decoding.target import Target
from specviz.kernels import extension, fastdecoder
from specviz.kernels.kvcache import crop_cache


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--sizes", default="1,2,4,6,8,12,16,32")
    ap.add_argument("--context-len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    sizes = [int(n) for n in args.sizes.split(",")]
    assert extension.available(), "specviz's C++ ops are not built here"
    target = Target(models.load(args.model, device="cpu").target)
    stack = target.fast.stack
    assert stack.one_op, "the op does not apply to this model"
    fastdecoder.ONE_OP_MAX_TOKENS = max(sizes)  # measure it at every size, also past the cut-off the engine uses
    generator = torch.Generator().manual_seed(0)
    vocab = target.model.config.vocab_size
    context = torch.randint(vocab, (args.context_len,), generator=generator).tolist()
    cache = target.new_cache()
    target.forward(context, cache, logits=False)
    ways = ("torch ops", "one op")
    times = {(way, n): [] for way in ways for n in sizes}
    for round_ in range(args.rounds + 1):  # round 0 warms up
        for n in sizes:
            ids = torch.randint(vocab, (n,), generator=generator).tolist()
            logits = {}
            for way in ways if round_ % 2 else ways[::-1]:
                stack.one_op = way == "one op"
                started = time.perf_counter()
                logits[way] = target.forward(ids, cache)[1]
                times[way, n].append(time.perf_counter() - started)
                crop_cache(cache, args.context_len)
            assert torch.equal(logits["torch ops"].argmax(-1), logits["one op"].argmax(-1))
            torch.testing.assert_close(logits["one op"], logits["torch ops"], atol=1e-3, rtol=1e-4)
    ms = {way: [1e3 * statistics.median(times[way, n][1:]) for n in sizes] for way in ways}
    print(f"{args.model}, torch {torch.__version__}, {torch.get_num_threads()} threads; one forward over n new "
          f"tokens after {args.context_len} cached, ms (median of {args.rounds} alternated rounds)")
    print("| new tokens | " + " | ".join(str(n) for n in sizes) + " |")
    print("|---" * (len(sizes) + 1) + "|")
    for way in ways:
        print(f"| {way} | " + " | ".join(f"{t:.1f}" for t in ms[way]) + " |")
    print("| torch ops ÷ one op | " + " | ".join(f"{a / b:.2f}×" for a, b in zip(ms["torch ops"], ms["one op"])) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
