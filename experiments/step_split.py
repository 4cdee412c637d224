"""Where a decoding step's time goes besides the target forward: timers wrapped around the engine's parts
(prefill, target forward, acceptance test, step event, KV-cache surgery, detokenising), summed over the first N
MT-bench questions at 128 tokens and divided by the steps. The draft is what the step's time leaves over.

    .venv/bin/python experiments/step_split.py eagle2:lookup=4 [--questions 8] [--prompts FILE] [--weights auto|fp32|q4|q4q8]
        [--cpu-time]; several drafters, comma-separated (none,eagle2), alternate question by question
"""
import argparse
import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file from anywhere: find specviz

import torch  # noqa: E402

import specviz  # noqa: E402
from specviz import models  # noqa: E402
from specviz.decoding import engine, verify  # noqa: E402
from specviz.decoding.target import Target  # noqa: E402

PARTS = [(Target, "forward", "target forward (prefill included)"), (engine._Run, "_prefill", "prefill"),
         (verify, "verify", "acceptance test"), (engine._Run, "_step_event", "step event"),
         (engine, "keep_cache_entries", "KV-cache surgery"), (engine.Detokenizer, "push", "detokenise"),
         (engine.sampling, "display_probs", "p for display")]


CLOCK = time.perf_counter  # --cpu-time: time.thread_time, this thread's CPU time (torch on this one thread)


def timed(owner, name: str, label: str, seconds: dict) -> None:
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        started = CLOCK()
        try:
            return inner(*args, **kwargs)
        finally:
            seconds[label] += CLOCK() - started

    setattr(owner, name, wrapper)


def drafter_parts() -> list[tuple]:
    """Every drafter class's own propose and observe (what drafting costs a step, the head's forwards included)."""
    from specviz import drafters  # noqa: F401  (imports every drafter module)
    from specviz.decoding.drafter import Drafter

    classes, parts = [Drafter], []
    while classes:
        cls = classes.pop()
        classes += cls.__subclasses__()
        parts += [(cls, name, "draft (propose, observe)") for name in ("propose", "observe") if name in vars(cls)]
    return parts


def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("drafter")
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--weights", default="auto", choices=("auto", "fp32", "q4", "q4q8"))
    ap.add_argument("--prompts", default=str(Path(__file__).resolve().parent.parent.parent / "shared/data/mt_bench.jsonl"))
    ap.add_argument("--cpu-time", action="store_true", help="time this thread's CPU time, torch on one thread: on a "
                    "busy host a step's Python bookkeeping is then timed as if the host were quiet (waits not counted)")
    args = ap.parse_args(argv)
    global CLOCK
    if args.cpu_time:
        CLOCK = time.thread_time
        torch.set_num_threads(1)
    loaded = models.load("smollm2-135m", weights=args.weights)
    questions = [json.loads(line)["turns"][0] for line in open(args.prompts) if line.strip()][: args.questions]
    drafters = args.drafter.split(",")
    seconds = collections.defaultdict(float)
    for owner, name, label in PARTS + drafter_parts():
        timed(owner, name, label, seconds)
    split = {d: collections.defaultdict(float) for d in drafters}  # drafter -> label -> seconds (wall: the step)
    steps = dict.fromkeys(drafters, 0)
    for drafter in drafters:
        specviz.generate(questions[0], models=loaded, drafter=drafter, max_new_tokens=16)  # warm-up
    for question in questions:
        for drafter in drafters:  # alternated question by question, so a slow spell touches them alike
            seconds.clear()
            started = CLOCK()
            result = specviz.generate(question, models=loaded, drafter=drafter, max_new_tokens=128)
            split[drafter]["wall"] += CLOCK() - started
            steps[drafter] += result.stats["steps"]
            for label, s in seconds.items():
                split[drafter][label] += s
    top = ("target forward (prefill included)", "draft (propose, observe)", "acceptance test", "step event",
           "KV-cache surgery", "detokenise", "p for display")
    for drafter in drafters:
        parts, n = split[drafter], steps[drafter]
        wall = parts.pop("wall")
        print(f"{drafter} ({args.weights} weights): {n} steps, {1e3 * wall / n:.2f} ms a step")
        for label, s in sorted(parts.items(), key=lambda kv: -kv[1]):
            print(f"  {label:36s} {1e3 * s / n:6.2f} ms a step")
        rest = wall - sum(parts[label] for label in top)
        print(f"  {'the rest of the loop':36s} {1e3 * rest / n:6.2f} ms a step")
        print(f"  {'the loop besides forward and draft':36s} {1e3 * (rest + sum(parts[t] for t in top[2:])) / n:6.2f} ms a step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
