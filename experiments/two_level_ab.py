"""The K-quant scales in their two levels (specviz.kernels.quant.Q4KLinear, Q6KLinear: Q4_K's and Q6_K's own
fp32-per-256 × small-integer scales, widened in L1 as the op goes) against the same weights with every scale widened
to an fp32 in memory (Q4Linear, Q8Linear: what `--weights q4` held before), side by side in one process.

Two loads of the same `--weights q4` target; the second has each Q4KLinear / Q6KLinear (and a Q6_K LM head) swapped
for its widened twin. Reported: the bytes a step streams, the one-token forward after 256 cached (alternated
within each round, 3 separate runs, medians after a warm-up round), and whether the two give the same logits (they
must: the same values, the same summation order).

    .venv/bin/python experiments/two_level_ab.py [--model qwen2.5-coder] [--rounds 7] [--threads 2]
"""
import argparse
import statistics
import sys

import torch

from specviz import models
from specviz.bench.probes import streamed_weight_bytes
from specviz.decoding.target import Target
from specviz.kernels import blocks, quant
from specviz.kernels.kvcache import crop_cache

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from q4_weights_ab import spread  # noqa: E402  (the alternated-rounds timer)


def widened(model) -> int:
    """Swap the model's two-level block linears (and LM head) for their widened twins, in place; returns how many."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if isinstance(child, (quant.Q4KLinear, quant.Q6KLinear))]
    for parent, name, child in swaps:
        widen = blocks.widen_q4_k if isinstance(child, quant.Q4KLinear) else blocks.widen_q6_k
        bias = None if child.bias is None else child.bias.detach()
        setattr(parent, name, quant.block_linear(widen(*child.blocks()), bias))
    head = quant.q8_head(model)
    if head is not None and isinstance(head.linear, quant.Q6KLinear):
        object.__setattr__(model, quant.HEAD_ATTRIBUTE, quant.Q8Head(*blocks.widen_q6_k(*head.linear.blocks())))
    return len(swaps)


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context-len", type=int, default=256)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    assert quant.available(), "specviz's C++ ops are not built here"
    ways = {way: models.load(args.model, device="cpu", weights="q4") for way in ("two levels", "widened")}
    swapped = widened(ways["widened"].target)
    targets = {way: Target(loaded.target) for way, loaded in ways.items()}
    path = {0: "portable", 1: "AVX2", 2: "AVX-512"}[torch.ops.specviz.q4_path(-1)]
    print(f"{args.model}, torch {torch.__version__}, {torch.get_num_threads()} threads, path {path}; {swapped} "
          f"projections widened; medians of {args.rounds} alternated rounds after a warm-up, 3 separate runs")
    for way, loaded in ways.items():
        print(f"- {way}: {streamed_weight_bytes(loaded.target) / 1e6:,.0f} MB of weights a step")
    vocab = ways["widened"].target.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(vocab, (args.context_len,), generator=generator).tolist()
    caches, logits = {}, {}
    with torch.inference_mode():
        for way, target in targets.items():
            caches[way] = target.new_cache()
            _, logits[way] = target.forward(context, caches[way])
        print(f"- the same logits over the {args.context_len}-token context: {torch.equal(*logits.values())}")
        print("\n| one forward after 256 cached | two levels (ms) | widened (ms) | widened ÷ two levels |\n|---|---|---|---|")
        for n in (1, 5):
            ids = torch.randint(vocab, (n,), generator=generator).tolist()

            def call(way, ids=ids):
                targets[way].forward(ids, caches[way])
                crop_cache(caches[way], args.context_len)

            runs = spread({way: (lambda way=way: call(way)) for way in targets}, args.rounds)
            ratios = [r["widened"] / r["two levels"] for r in runs]
            middle = runs[ratios.index(statistics.median(ratios))]
            print(f"| {n} new token{'s' if n > 1 else ''} | {1e3 * middle['two levels']:.1f} | "
                  f"{1e3 * middle['widened']:.1f} | {statistics.median(ratios):.2f}× "
                  f"(runs: {', '.join(f'{r:.2f}' for r in ratios)}) |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
