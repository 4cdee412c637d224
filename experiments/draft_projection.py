"""The drafters' projection onto their draft vocabulary on the default weights: the target's 8-bit head rows on
8-bit activations (specviz.drafters.base.vocab_projection) against the same rows packed in bf16 and fp32
(SPECVIZ_DRAFT_PROJECTION=packed), as drafting runs it.

1. each projection over 1, 4 and 8 rows onto 4,096 and 8,192 tokens (eagle2's and eagle3's draft vocabularies),
   median of 7 rounds of 50 calls after 20 warm-up ones;
2. with --questions N: eagle2 and eagle3 decoding the first N MT-bench questions at 128 tokens, T = 0, each with
   the 8-bit rows and with the packed ones, alternated question by question beside `none`: ms a token, drafting
   ms a step, τ, and whether every output is `none`'s.

    .venv/bin/python experiments/draft_projection.py [--questions 20] [--drafters eagle2,eagle3] [--threads 2]
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file from anywhere: find specviz

import torch  # noqa: E402

import specviz  # noqa: E402
from specviz import models  # noqa: E402
from specviz.bench.probes import BandwidthProbe  # noqa: E402
from specviz.drafters.base import PROJECTION_ENV  # noqa: E402
from specviz.kernels import quant  # noqa: E402
from specviz.kernels.fastlinear import rows_projection  # noqa: E402

PROMPTS = Path(__file__).resolve().parent.parent.parent / "shared/data/mt_bench.jsonl"


def per_call_ms(product, x: torch.Tensor) -> float:
    with torch.inference_mode():
        for _ in range(20):
            product(x)
        rounds = []
        for _ in range(7):
            started = time.perf_counter()
            for _ in range(50):
                product(x)
            rounds.append((time.perf_counter() - started) / 50)
    return 1e3 * statistics.median(rounds)


def products(target) -> None:
    head, weight = quant.q8_head(target), target.get_output_embeddings().weight
    print("| draft vocabulary | rows | 8-bit rows, 8-bit activations (ms) | bf16 packed (ms) | fp32 packed (ms) | bf16 over 8-bit |")
    print("|---|---|---|---|---|---|")
    for size in (4096, 8192):
        rows = torch.arange(size)
        eight, bf16, fp32 = head.rows(rows), rows_projection(weight, rows, torch.bfloat16), rows_projection(weight, rows)
        for n in (1, 4, 8):
            x = torch.randn(n, weight.shape[1], generator=torch.Generator().manual_seed(n))
            a, b, c = per_call_ms(eight, x), per_call_ms(bf16, x.bfloat16()), per_call_ms(fp32, x)
            print(f"| {size:,} | {n} | {a:.3f} | {b:.3f} | {c:.3f} | {b / a:.2f}× |")


def decodes(loaded, drafters: list[str], questions: list[str]) -> None:
    lanes = ["none"] + [f"{d} {form}" for d in drafters for form in ("8-bit", "packed")]
    seconds, tokens, steps, draft_ms, same = ({lane: 0.0 for lane in lanes} for _ in range(5))
    probe = BandwidthProbe(torch.device("cpu"))
    bandwidth = []
    for question in [questions[0]] + questions:  # the first once more, as warm-up
        warm = not bandwidth
        bandwidth.append(probe.measure())
        alone = None
        for lane in lanes:
            name, _, form = lane.partition(" ")
            os.environ[PROJECTION_ENV] = "packed" if form == "packed" else ""
            started = time.perf_counter()
            result = specviz.generate(question, models=loaded, drafter=name, max_new_tokens=128)
            elapsed = time.perf_counter() - started
            alone = result.token_ids if name == "none" else alone
            if warm:
                continue
            seconds[lane] += elapsed
            tokens[lane] += len(result.token_ids)
            steps[lane] += result.stats["steps"]
            draft_ms[lane] += result.stats.get("draft_s", 0.0) * 1e3
            same[lane] += result.token_ids == alone
    os.environ.pop(PROJECTION_ENV, None)
    print(f"\n{len(questions)} MT-bench questions, 128 tokens, T = 0; copy bandwidth {statistics.median(bandwidth[1:]):.1f} GB/s "
          f"(median; {min(bandwidth[1:]):.1f}–{max(bandwidth[1:]):.1f})\n")
    print("| lane | ms a token | over none | drafting ms a step | τ | outputs = none's |")
    print("|---|---|---|---|---|---|")
    base = seconds["none"] / tokens["none"]
    for lane in lanes:
        per_token = seconds[lane] / tokens[lane]
        print(f"| {lane} | {1e3 * per_token:.2f} | {base / per_token:.2f}× | {draft_ms[lane] / steps[lane]:.2f} | "
              f"{tokens[lane] / steps[lane]:.2f} | {int(same[lane])} of {len(questions)} |")


def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=0)
    ap.add_argument("--drafters", default="eagle2,eagle3")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = models.load("smollm2-135m")
    print(f"smollm2-135m, weights {loaded.weights}, torch {torch.__version__}, {args.threads} threads, "
          f"{platform.machine()}, {platform.processor() or 'cpu'}, products on the "
          f"{os.environ.get('SPECVIZ_Q4_PATH', 'auto')} path\n")
    products(loaded.target)
    if args.questions:
        questions = [json.loads(line)["turns"][0] for line in open(PROMPTS) if line.strip()][: args.questions]
        decodes(loaded, args.drafters.split(","), questions)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
