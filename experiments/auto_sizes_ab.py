"""A/B of the "auto" tree budget's cost curve: interpolated from n = 1, 2, 4, 8, ... (`*_old`) or measured at every
n up to 8 (`*_new`: costs.AUTO_SIZES, what ships), for EAGLE-2 and Medusa, interleaved prompt by prompt, order rotated.

    .venv/bin/python experiments/auto_sizes_ab.py 2,12,22,32,42,52,62,72   (MT-bench question indices)
"""
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from specviz import api, models
from specviz.decoding import engine
from specviz.decoding.costs import interpolate, verify_curve
from specviz.decoding.settings import DecodeSettings
from specviz.drafters import draft_vocabulary, make_drafter
from specviz.drafters.eagle import EagleDrafter, TreeShape
from specviz.drafters.medusa import MedusaDrafter

QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "data" / "mt_bench.jsonl"
OLD_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64)  # the sizes the curve was interpolated from


def methods(m, old, new) -> dict:
    """name -> a factory of a fresh drafter for one run."""
    v4096 = draft_vocabulary(m.eagle, 4096)
    return {
        "none": lambda: make_drafter("none", m),
        "eagle_old": lambda: EagleDrafter(m.eagle, m.target, TreeShape(), draft_vocab=m.eagle.draft_vocab, verify_cost=old),
        "eagle_new": lambda: EagleDrafter(m.eagle, m.target, TreeShape(), draft_vocab=m.eagle.draft_vocab, verify_cost=new),
        "eagle_new4096": lambda: EagleDrafter(m.eagle, m.target, TreeShape(), draft_vocab=v4096, verify_cost=new),
        "medusa_old": lambda: MedusaDrafter(m.medusa, m.target, draft_vocab=m.medusa.draft_vocab, total_tokens="auto",
                                            verify_cost=old),
        "medusa_new": lambda: MedusaDrafter(m.medusa, m.target, draft_vocab=m.medusa.draft_vocab, total_tokens="auto",
                                            verify_cost=new),
    }


def run(m, question: str, drafter):
    """Wall seconds and the done event of one greedy decode of 128 tokens."""
    ids = api.encode_prompt(m.tokenizer, question)
    started, done = time.perf_counter(), None
    for event in engine.decode(m.target, m.tokenizer, drafter, ids, DecodeSettings(max_new_tokens=128), m.name,
                               question, m.vocab_size):
        done = event
    return time.perf_counter() - started, done


def main(argv) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    torch.set_num_threads(2)
    m = models.load("smollm2-135m")
    curve = verify_curve(m)
    print({n: round(v * 1e3, 1) for n, v in curve.items()})
    old = interpolate({n: v for n, v in curve.items() if n in OLD_SIZES})
    new = interpolate(curve)
    questions = [json.loads(line)["turns"][0] for line in open(QUESTIONS) if line.strip()]
    indices = [int(i) for i in argv[0].split(",")]
    factories = methods(m, old, new)
    names = list(factories)
    for name in names:  # warm-up
        run(m, questions[0][:200], factories[name]())
    speedups = {n: [] for n in names}
    taus = {n: [] for n in names}
    nodes = {n: [] for n in names}
    for j, i in enumerate(indices):
        order = names[j % len(names):] + names[: j % len(names)]
        out = {n: run(m, questions[i], factories[n]()) for n in order}
        base_s, base = out["none"]
        for n in names:
            seconds, done = out[n]
            assert done.token_ids == base.token_ids, (n, i)
            speedups[n].append(base_s / seconds * len(done.token_ids) / len(base.token_ids))
            taus[n].append(done.stats["tau"])
            nodes[n].append(done.stats["drafted"] / done.stats["steps"])
        print(i, {n: round(speedups[n][-1], 3) for n in names}, flush=True)
    for n in names:
        print(f"{n:15s} speedup median {statistics.median(speedups[n]):.3f} (min {min(speedups[n]):.2f} "
              f"max {max(speedups[n]):.2f}) tau {statistics.mean(taus[n]):.2f} nodes/step {statistics.mean(nodes[n]):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
