"""The reference race the race page loads in one click (assets/race-regimes.zip): `none` and eagle2 on the default
4-bit weights (8-bit activations) and on fp32, in one process, each lane the median (by tokens/s) of a few
decodes run in an interleaved order, with each set's measured c(8)/c(1) and where and when it was measured.

    python scripts/reference_race.py --repeats 3 --out assets/race-regimes.zip
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app import lanes, regimes  # noqa: E402
from app.state import DEFAULT_PROMPT  # noqa: E402
from specviz.backends.local import LocalBackend  # noqa: E402
from specviz.bench.probes import cpu_name  # noqa: E402
from specviz.bench.run import method_order  # noqa: E402
from specviz.decoding.costs import verify_curve  # noqa: E402
from specviz.decoding.settings import DecodeSettings  # noqa: E402
from specviz.models.loading import load_weight_sets  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--weights", default="q4q8,fp32")
    p.add_argument("--drafters", default="none,eagle2")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="decodes of each lane; the median by tokens/s is kept")
    p.add_argument("--out", default="assets/race-regimes.zip")
    args = p.parse_args(argv)
    sets, drafters = args.weights.split(","), args.drafters.split(",")
    loaded = load_weight_sets(args.model, sets, device="cpu")
    backends = {w: LocalBackend(models) for w, models in loaded.items()}
    for models in loaded.values():
        verify_curve(models)  # the tree budget's curve, measured before any run (as the app does when it loads)
    settings = DecodeSettings(max_new_tokens=args.max_new_tokens)
    lanes_of = [(w, d) for w in sets for d in drafters]
    decoded: dict[str, list[list[dict]]] = {}
    for r in range(args.repeats + 1):  # round 0 warms up, each lane once
        for w, d in method_order(lanes_of, r):
            events = backends[w].run(args.prompt, drafter=d, settings=settings)
            if r:
                decoded.setdefault(regimes.lane_name(d, w), []).append(events)
            print(f"round {r}: {d}@{w} {events[-1]['stats']['tokens_per_s']:.1f} tokens/s", file=sys.stderr)
    runs = {}
    for w, d in lanes_of:  # the lanes in the race's order: each weight set's none, then its drafters
        tries = decoded[regimes.lane_name(d, w)]
        middle = statistics.median_low(e[-1]["stats"]["tokens_per_s"] for e in tries)
        runs[regimes.lane_name(d, w)] = next(e for e in tries if e[-1]["stats"]["tokens_per_s"] == middle)
    regimes_of = {lane: {"weights": regimes.split_lane(lane)[1],
                         "verify_cost_ratio": regimes.cost_ratio(loaded[regimes.split_lane(lane)[1]].verify_curve)}
                  for lane in runs}
    about = {"machine": f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads",
             "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "command": shlex.join(["python", "scripts/reference_race.py", *(argv or sys.argv[1:])]),
             "load_average": os.getloadavg()[0],
             "median_of": args.repeats}
    Path(args.out).write_bytes(lanes.write_bundle(runs, regimes_of, about))
    print(f"wrote {args.out}: {', '.join(f'{k} {v}' for k, v in about.items())}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
