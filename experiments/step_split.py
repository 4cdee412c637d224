"""Where a decoding step's time goes besides the target forward: timers wrapped around the engine's parts
(prefill, target forward, acceptance test, step event, KV-cache surgery, detokenising), summed over the first N
MT-bench questions at 128 tokens and divided by the steps. The draft is what the step's time leaves over.

    .venv/bin/python experiments/step_split.py eagle2:lookup=4 [--questions 8] [--prompts FILE] [--weights auto|fp32|q4|q4q8]
"""
import argparse
import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file from anywhere: find specviz

import specviz  # noqa: E402
from specviz import models  # noqa: E402
from specviz.decoding import engine, verify  # noqa: E402
from specviz.decoding.target import Target  # noqa: E402

PARTS = [(Target, "forward", "target forward (prefill included)"), (engine._Run, "_prefill", "prefill"),
         (verify, "verify", "acceptance test"), (engine._Run, "_step_event", "step event"),
         (engine, "keep_cache_entries", "KV-cache surgery"), (engine.Detokenizer, "push", "detokenise"),
         (engine.sampling, "display_probs", "p for display")]


def timed(owner, name: str, label: str, seconds: dict) -> None:
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            seconds[label] += time.perf_counter() - started

    setattr(owner, name, wrapper)


def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("drafter")
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--weights", default="auto", choices=("auto", "fp32", "q4", "q4q8"))
    ap.add_argument("--prompts", default=str(Path(__file__).resolve().parent.parent.parent / "shared/data/mt_bench.jsonl"))
    args = ap.parse_args(argv)
    loaded = models.load("smollm2-135m", weights=args.weights)
    questions = [json.loads(line)["turns"][0] for line in open(args.prompts) if line.strip()][: args.questions]
    seconds = collections.defaultdict(float)
    for owner, name, label in PARTS:
        timed(owner, name, label, seconds)
    specviz.generate(questions[0], models=loaded, drafter=args.drafter, max_new_tokens=16)  # warm-up
    seconds.clear()
    wall, steps = 0.0, 0
    for question in questions:
        started = time.perf_counter()
        result = specviz.generate(question, models=loaded, drafter=args.drafter, max_new_tokens=128)
        wall += time.perf_counter() - started
        steps += result.stats["steps"]
    print(f"{args.drafter} ({args.weights} weights): {steps} steps, {1e3 * wall / steps:.2f} ms a step")
    for label, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {label:36s} {1e3 * s / steps:6.2f} ms a step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
