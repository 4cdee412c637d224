"""fp32 weights (oneDNN-packed, today's default) against the GGUF's 4-bit blocks kept 4-bit (`--weights q4`,
specviz.kernels.quant), side by side in one process, alternated within each round; medians after a warm-up round.

1. the 4-bit op alone against oneDNN's packed fp32 product, one row: 576 → 1536 (gate / up) and 576 → 49152 (the LM
   head's shape; the embedded model's LM head is its Q8_0 embedding and stays fp32, so this one is what a 4-bit
   head would cost);
2. one target forward (LM head included) over 1, 4, 8 new tokens after 256 cached;
3. a greedy decode (`none`) of one prompt, tokens per second;
4. greedy outputs of both at 64 tokens on the first prompts of specviz/bench/data/prompts.jsonl: equal, or the fp32
   target's logit margin (top-1 minus top-2) at the first token where they part (and the q4 target's there).
`--outputs-only --questions ../shared/data/mt_bench.jsonl --tokens 128` runs only 4, over every question's first
turn (the bench's prompts), and sums up.

    .venv/bin/python experiments/q4_weights_ab.py [--rounds 7] [--prompts 5] [--threads 2]
    .venv/bin/python experiments/q4_weights_ab.py --outputs-only --questions ../shared/data/mt_bench.jsonl --tokens 128
    .venv/bin/python experiments/q4_weights_ab.py --model qwen2.5-coder --rounds 3 --questions ../shared/data/mt_bench.jsonl --limit 10 --tokens 128
(`--model qwen2.5-coder`: its Q4_K_M file's blocks, 4-bit and 8-bit; part 1 keeps the embedded model's shapes.)
"""
import argparse
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

from specviz import api, models
from specviz.decoding import engine
from specviz.decoding.settings import DecodeSettings
from specviz.decoding.target import Target
from specviz.drafters import NoDraft
from specviz.kernels import blocks, fastlinear, quant
from specviz.kernels.kvcache import crop_cache

PROMPTS = Path(__file__).resolve().parents[1] / "specviz" / "bench" / "data" / "prompts.jsonl"
WAYS = ("fp32", "q4")


def alternated(calls: dict, rounds: int) -> dict:
    """name → median seconds of calls[name](), the names alternated (order flipped every round), round 0 dropped."""
    times = {name: [] for name in calls}
    for round_ in range(rounds + 1):
        for name in (list(calls) if round_ % 2 else list(calls)[::-1]):
            started = time.perf_counter()
            calls[name]()
            if round_:
                times[name].append(time.perf_counter() - started)
    return {name: statistics.median(t) for name, t in times.items()}


def spread(calls: dict, rounds: int, repeats: int = 3) -> dict:
    """The medians of `repeats` separate alternated runs: how much a ratio moves on a shared machine."""
    return [alternated(calls, rounds) for _ in range(repeats)]


def op_alone(rounds: int) -> list[str]:
    lines = ["| product, 1 row | oneDNN fp32 (ms) | q4 op (ms) | fp32 ÷ q4 |", "|---|---|---|---|"]
    for out in (1536, 49152):
        generator = torch.Generator().manual_seed(out)
        codes = torch.randint(0, 256, (out, 288), generator=generator, dtype=torch.uint8)
        scales = (torch.rand(out, 18, generator=generator) * 0.02).half().float()
        mins = (-torch.rand(out, 18, generator=generator) * 0.15).half().float()
        packed = fastlinear.reorder(blocks.dequantize(codes, scales, mins))
        x = torch.randn(1, 576, generator=generator)
        calls = {"fp32": partial(fastlinear.packed_product, x, packed, None),
                 "q4": partial(quant.q4_product, x, codes, scales, mins)}
        runs = spread(calls, rounds * 4)
        ratios = [r["fp32"] / r["q4"] for r in runs]
        middle = runs[ratios.index(statistics.median(ratios))]  # the run whose ratio is the median (3 runs)
        lines.append(f"| 576 → {out} | {1e3 * middle['fp32']:.3f} | {1e3 * middle['q4']:.3f} | "
                     f"{statistics.median(ratios):.2f}× (runs: {', '.join(f'{r:.2f}' for r in ratios)}) |")
    return lines


def forwards(targets: dict, rounds: int, context_len: int) -> list[str]:
    vocab = targets["fp32"].model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(vocab, (context_len,), generator=generator).tolist()
    caches = {}
    for way, target in targets.items():
        caches[way] = target.new_cache()
        target.forward(context, caches[way], logits=False)
    lines = [f"| forward after {context_len} cached | fp32 (ms) | q4 (ms) | fp32 ÷ q4 |", "|---|---|---|---|"]
    for n in (1, 4, 8):
        ids = torch.randint(vocab, (n,), generator=generator).tolist()

        def call(way, ids=ids):
            targets[way].forward(ids, caches[way])
            crop_cache(caches[way], context_len)

        runs = spread({way: (lambda way=way: call(way)) for way in WAYS}, rounds)
        ratios = [r["fp32"] / r["q4"] for r in runs]
        middle = runs[ratios.index(statistics.median(ratios))]
        lines.append(f"| {n} new tokens | {1e3 * middle['fp32']:.1f} | {1e3 * middle['q4']:.1f} | "
                     f"{statistics.median(ratios):.2f}× (runs: {', '.join(f'{r:.2f}' for r in ratios)}) |")
    return lines


def greedy(loaded, ids, tokens):
    settings = DecodeSettings(max_new_tokens=tokens, temperature=0.0)
    return list(engine.decode(loaded.target, loaded.tokenizer, NoDraft(), ids, settings))[-1]


def decode_speed(loaded: dict, prompt_ids, rounds: int, tokens: int) -> list[str]:
    done = {}

    def call(way):
        done[way] = greedy(loaded[way], prompt_ids, tokens)

    runs = spread({way: (lambda way=way: call(way)) for way in WAYS}, rounds, repeats=1)[0]
    return ["| greedy `none`, one prompt | fp32 | q4 | fp32 ÷ q4 (time) |", "|---|---|---|---|",
            f"| {tokens} tokens, s | {runs['fp32']:.2f} | {runs['q4']:.2f} | {runs['fp32'] / runs['q4']:.2f}× |",
            f"| tokens equal | {done['fp32'].token_ids == done['q4'].token_ids} | | |"]


def margin_at(target: Target, ids: list[int]) -> float:
    """The fp32 target's top-1 minus top-2 logit for the token after `ids`."""
    _, logits = target.forward(ids, target.new_cache())
    top = logits[-1].topk(2).values
    return float(top[0] - top[1])


def outputs(loaded: dict, targets: dict, prompts: list[str], tokens: int) -> list[str]:
    lines = [f"| prompt | greedy {tokens} tokens, q4 against fp32 |", "|---|---|"]
    equal, margins = 0, []
    for prompt in prompts:
        ids = api.encode_prompt(loaded["fp32"].tokenizer, prompt)
        got = {way: greedy(loaded[way], ids, tokens).token_ids for way in WAYS}
        if got["fp32"] == got["q4"]:
            equal += 1
            lines.append(f"| {prompt[:48]}… | equal ({len(got['fp32'])} tokens) |")
            continue
        first = next((i for i, (a, b) in enumerate(zip(got["fp32"], got["q4"])) if a != b),
                     min(len(got["fp32"]), len(got["q4"])))  # one a prefix of the other: parts where it stops
        at = ids + got["fp32"][:first]
        margin, q4_margin = margin_at(targets["fp32"], at), margin_at(targets["q4"], at)
        margins.append(margin)
        lines.append(f"| {prompt[:48]}… | part at token {first}: fp32 margin there {margin:.4f}, q4 margin "
                     f"{q4_margin:.4f} |")
    summary = f"equal on {equal} of {len(prompts)}"
    if margins:
        summary += (f"; where they part, the fp32 target's top-1 minus top-2 logit is {min(margins):.4f}–"
                    f"{max(margins):.4f} (median {statistics.median(margins):.4f})")
    return lines + ["", summary]


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context-len", type=int, default=256)
    ap.add_argument("--outputs-only", action="store_true", help="only the greedy outputs (part 4)")
    ap.add_argument("--questions", help="a JSONL of MT-bench questions (first turns) instead of the prompts file")
    ap.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt in part 4")
    ap.add_argument("--model", default="smollm2-135m", help="a preset whose GGUF holds 4-bit blocks")
    ap.add_argument("--limit", type=int, help="the first N questions only")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    assert quant.available(), "specviz's C++ ops are not built here"
    loaded = {way: models.load(args.model, device="cpu", weights=way) for way in WAYS}
    assert loaded["q4"].weights == "q4"
    targets = {way: Target(loaded[way].target) for way in WAYS}
    path = {0: "portable", 1: "AVX2", 2: "AVX-512"}[torch.ops.specviz.q4_path(-1)]
    prompts = [json.loads(line)["instruction"] for line in PROMPTS.read_text().splitlines()[: args.prompts]]
    if args.questions:
        prompts = [json.loads(line)["turns"][0] for line in Path(args.questions).read_text().splitlines() if line.strip()]
    prompts = prompts[: args.limit]
    print(f"{args.model}, torch {torch.__version__}, {torch.get_num_threads()} threads, q4 path {path}; medians of "
          f"{args.rounds} alternated rounds after a warm-up (op alone: {4 * args.rounds}); each ratio from 3 separate "
          "runs: the median ratio, and the times of the run that gave it")
    if args.outputs_only:
        print("\n".join(outputs(loaded, targets, prompts, args.tokens)), flush=True)
        return 0
    for lines in (op_alone(args.rounds), forwards(targets, args.rounds, args.context_len),
                  decode_speed(loaded, api.encode_prompt(loaded["fp32"].tokenizer, prompts[0]), 5, 32),
                  outputs(loaded, targets, prompts, args.tokens)):
        print("\n".join(lines) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
