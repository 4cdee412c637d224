"""Two code trees' bench reports side by side: the same `specviz bench` command run from tree A and tree B
alternately (A B B A, or longer), then this script reads the JSON reports and says whether the T = 0 outputs are
the same and how far each drafter's speed moved.

    git worktree add /tmp/before <commit>; git worktree add /tmp/after <commit>
    (cd /tmp/before && PYTHONPATH=. python -m specviz bench ... --json-out A1.json)   # then B1, B2, A2
    python experiments/bench_ab.py --a A1.json A2.json --b B1.json B2.json [--label-a before --label-b after]

Outputs: each prompt's `none` output (its token count and preview) in every report, equal or not; every report's
"every drafter equals none". Speed: per drafter, the median over prompts of its speedup over `none` (a ratio
measured inside one run, so it is what to compare across runs) and its tokens/s, in each report; B's mean over
A's mean; and the spread between the two runs of the same tree, which is the noise that change is read against.
"""
import argparse
import json
import statistics
from pathlib import Path


def load(paths: list[str]) -> list[dict]:
    return [json.loads(Path(p).read_text()) for p in paths]


def outputs(report: dict) -> list[tuple]:
    return [(p["id"], p["output_tokens"], p["output_preview"]) for p in report["prompts"]]


def speed(report: dict, drafter: str) -> tuple[float | None, float]:
    d = report["drafters"][drafter]
    ratio = (d.get("speedup_vs_none") or {}).get("median")
    return ratio, d["tokens_per_s"]


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.fmean(values) if len(values) > 1 else 0.0


def compare(a: list[dict], b: list[dict], label_a: str, label_b: str) -> list[str]:
    lines = [f"reports: {len(a)} from {label_a}, {len(b)} from {label_b}; "
             f"command: `{a[0]['config']['command']}`", ""]
    same = all(outputs(r) == outputs(a[0]) for r in a + b)
    lines.append(f"`none`'s T = 0 outputs (token counts and previews of {len(a[0]['prompts'])} prompts) the same in "
                 f"every report: {'yes' if same else 'NO'}")
    for tag, reports in ((label_a, a), (label_b, b)):
        lines.append(f"every drafter's output equals `none`'s ({tag}): "
                     + ", ".join(str(r.get("outputs_match_none")) for r in reports))
    drafters = [d for d in a[0]["drafters"] if d in b[0]["drafters"]]
    lines += ["", f"| drafter | τ {label_a} / {label_b} | speedup over `none`, {label_a} runs | {label_b} runs "
                  f"| {label_b} ÷ {label_a} | run-to-run spread within a tree | tokens/s {label_a} | {label_b} |",
              "|---|---|---|---|---|---|---|---|"]
    for d in drafters:
        ra = [speed(r, d) for r in a]
        rb = [speed(r, d) for r in b]
        tau = f"{a[0]['drafters'][d]['tau']:.2f} / {b[0]['drafters'][d]['tau']:.2f}"
        ta = " · ".join(f"{t:.1f}" for _, t in ra)
        tb = " · ".join(f"{t:.1f}" for _, t in rb)
        if d == "none":
            mean_a, mean_b = statistics.fmean(t for _, t in ra), statistics.fmean(t for _, t in rb)
            lines.append(f"| `none` | 1.00 / 1.00 | | | {mean_b / mean_a:.3f} (tokens/s) "
                         f"| {max(spread([t for _, t in ra]), spread([t for _, t in rb])):.3f} | {ta} | {tb} |")
            continue
        sa, sb = [s for s, _ in ra], [s for s, _ in rb]
        lines.append(f"| `{d}` | {tau} | {' · '.join(f'{s:.2f}×' for s in sa)} | {' · '.join(f'{s:.2f}×' for s in sb)} "
                     f"| {statistics.fmean(sb) / statistics.fmean(sa):.3f} | {max(spread(sa), spread(sb)):.3f} "
                     f"| {ta} | {tb} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", nargs="+", required=True, help="the JSON reports of tree A")
    ap.add_argument("--b", nargs="+", required=True, help="the JSON reports of tree B")
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    args = ap.parse_args()
    print("\n".join(compare(load(args.a), load(args.b), args.label_a, args.label_b)))


if __name__ == "__main__":
    main()
