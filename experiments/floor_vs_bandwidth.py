"""Does `none` follow the memory? From a bench report (with per-run bandwidth, made since 2026-12-01): `none`'s ms
per token against the bandwidth measured right before it, as the Benchmarks page draws it, summarised as the
Pearson correlation and, below and above a bandwidth split, the median ms per token and the median share of the
floor's tokens/s (the floor at that prompt's bandwidth ÷ its ms per token).

    .venv/bin/python experiments/floor_vs_bandwidth.py docs/results/bench-floor-t0.json [--split 40]
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file from anywhere: find specviz

from specviz import bench  # noqa: E402


def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--split", type=float, default=40.0, help="GB/s between the low and the high group")
    args = ap.parse_args(argv)
    points = bench.none_against_bandwidth(bench.load_report(args.report))
    if len(points) < 2:
        print("this report has no per-run bandwidth (made before 2026-12-01) or fewer than 2 prompts", file=sys.stderr)
        return 2
    weight_bytes = bench.load_report(args.report)["floor"]["weight_bytes"]
    x = [p["bandwidth_gb_s"] for p in points]
    y = [p["none_ms_per_token"] for p in points]
    share = [weight_bytes / (a * 1e9) * 1e3 / b for a, b in zip(x, y)]
    print(f"{len(points)} prompts; correlation(bandwidth, none ms/token) = {statistics.correlation(x, y):.2f}")
    for label, low in (("below", True), ("at or above", False)):
        group = [i for i, a in enumerate(x) if (a < args.split) == low]
        if group:
            print(f"{label} {args.split:g} GB/s: {len(group)} prompts, median {statistics.median(y[i] for i in group):.1f} "
                  f"ms per token, {100 * statistics.median(share[i] for i in group):.0f} % of the floor's tokens/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
