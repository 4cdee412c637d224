"""`specviz bench` (every drafter against `none` and the peers, side by side) and `specviz batch-cost`."""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace

import torch

from specviz.arguments import add_decoding_args, add_model_args, add_weights_arg, decode_settings, int_list
from specviz.atomic import check_writable, write_atomically
from specviz.bench import QUICK_SIZES, BenchSettings, load_prompts, quick_settings, regimes, run_bench, to_markdown, validate
from specviz.bench.llamaserver import parse_configs
from specviz.bench.vllm import parse_lanes
from specviz.decoding.policy import check_k_policy
from specviz.errors import SpecvizError


def cmd_batch_cost(args) -> int:
    from specviz import models
    from specviz.bench import batch

    settings = batch.SurfaceSettings(batch_sizes=int_list(args.batch_sizes, "--batch-sizes"),
                                     new_tokens=int_list(args.new_tokens, "--new-tokens"), context_len=args.context_len,
                                     rounds=args.rounds, seed=args.seed)
    settings.check()
    if args.out:
        check_writable(args.out)
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = models.load(args.model, device=args.device, dtype=args.dtype, weights=args.weights)
    options = ("model", "device", "dtype", "weights", "threads", "batch_sizes", "new_tokens", "context_len", "rounds", "seed")
    command = shlex.join(["python", "-m", "specviz", "batch-cost", *[word for name in options if getattr(args, name) is not None
                                                                     for word in (f"--{name.replace('_', '-')}", str(getattr(args, name)))]])
    surface = batch.measure_surface(
        loaded.target, settings, loaded.name, command + (f" --out {shlex.quote(args.out)}" if args.out else ""),
        progress=lambda done, total, label: print(f"[{done}/{total}] {label}", file=sys.stderr, flush=True))
    print(batch.to_markdown(surface))
    if args.out:
        write_atomically(args.out, json.dumps(surface, indent=1) + "\n")
    return 0



def cmd_bench(args) -> int:
    return bench_main(args.rest)


def build_bench_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specviz bench",
                                description="Every drafter against `none` and against transformers' generate(), side by side.")
    add_model_args(p)
    regimes.allow_weight_sets(p)  # --weights q4q8,fp32: every drafter on each set (specviz/bench/regimes.py)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: bfloat16 on cuda, float32 elsewhere)")
    p.add_argument("--drafters", default="", help="comma-separated, e.g. none,ngram,draft,medusa,eagle2 (default: all available); a drafter may carry options: eagle2:draft_vocab=full:total_tokens=16")
    p.add_argument("--k-policy", default="", metavar="POLICY,...",
                   help="draft-length policies to run each drafter under, side by side in one interleaved run: cost "
                        "(what the measured verify cost says pays, the default), fixed (K tokens, the whole tree), "
                        "e.g. cost,fixed")
    p.add_argument("--prompts", default=None, help="JSONL with `turns` (first turn used) or `instruction` (default: the built-in set)")
    p.add_argument("--limit", type=int, default=None, help="use the first N prompts")
    add_decoding_args(p, BenchSettings(), drafter=False)
    p.add_argument("--repeats", type=int, default=1, help="decodes of each (prompt, method); the median time is kept")
    p.add_argument("--no-peers", action="store_true", help="skip transformers' generate() baselines")
    p.add_argument("--no-llama-cpp", action="store_true",
                   help="skip llama.cpp's plain decoding and prompt lookup (run when llama-cpp-python is installed: `make peers`)")
    p.add_argument("--vllm", default="", metavar="URL[=LABEL],...",
                   help="running vLLM servers as lanes beside ours (each with the speculative method it was started "
                        "with: plain, ngram, draft model, EAGLE-3; docs/vllm.md), e.g. http://127.0.0.1:8001=eagle3")
    p.add_argument("--llama-server", nargs="*", default=[], metavar="CONFIG",
                   help="llama.cpp's llama-server (built by `make llamacpp`) as lanes, one started per configuration: "
                        "plain, ngram-simple, ngram-mod, ngram-map-k, ngram-cache, draft-simple (our draft model), "
                        "draft-eagle3 (our EAGLE-3 head), each with options after a colon, e.g. "
                        "draft-eagle3:p_min=0.6,n_max=3 or plain:threads=1 (docs/llamacpp.md)")
    p.add_argument("--verify-sizes", default=None, help="n for the verify-cost curve, e.g. 1,2,4,8 (0 to skip)")
    p.add_argument("--context-len", type=int, default=256, help="cached tokens before each timed verify forward")
    p.add_argument("--bandwidth-mb", type=int, default=256, help="size of the tensor copied to measure memory bandwidth")
    p.add_argument("--quick", action="store_true", help=f"cost curve at n = {','.join(map(str, QUICK_SIZES))} only, fewer repeats")
    p.add_argument("--allow-mismatch", action="store_true", help="exit 0 even when outputs differ from `none` at temperature 0")
    p.add_argument("--json-out", default=None, help="write the report as one JSON document")
    p.add_argument("--md-out", default=None, help="write the report as Markdown tables (it is printed either way)")
    return p


def settings_from_args(args) -> BenchSettings:
    base = quick_settings() if args.quick else BenchSettings()
    sizes = base.verify_sizes
    if args.verify_sizes is not None:
        try:
            sizes = tuple(int(s) for s in args.verify_sizes.split(",") if s.strip() and int(s) > 0)
        except ValueError:
            raise SpecvizError(f"--verify-sizes takes comma-separated integers, got {args.verify_sizes!r}") from None
    return replace(
        base,
        drafters=tuple(s.strip() for s in args.drafters.split(",") if s.strip()),
        **decode_settings(args),
        repeats=args.repeats,
        peers=not args.no_peers,
        llama_cpp=not args.no_llama_cpp,
        vllm=tuple(parse_lanes(args.vllm)),
        llama_server=tuple(label for label, _, _ in parse_configs(args.llama_server)),
        verify_sizes=sizes,
        k_policies=tuple(check_k_policy(s.strip()) for s in args.k_policy.split(",") if s.strip()),
        context_len=args.context_len,
        bandwidth_mb=args.bandwidth_mb,
    )


def _load_models(args):
    from specviz import models

    return models.load(args.model, draft_model=args.draft_model, device=args.device, dtype=args.dtype,
                       weights=args.weights)


def report_mismatches(report: dict, out=None) -> None:
    """Say loudly, on stderr, which drafters disagreed with `none` (and peers with generate) at temperature 0."""
    out = out or sys.stderr
    for name, d in report["drafters"].items():
        for x in d["mismatches"]:
            print(f"MISMATCH: drafter '{name}' differs from 'none' on prompt {x['prompt']} at token {x['index']} "
                  f"(none: {x['expected']}, {name}: {x['got']}; lengths {x['expected_tokens']} / {x['got_tokens']})", file=out)
        for x in d.get("numerics_events", []):
            print(f"note: drafter '{name}' parts from 'none' on prompt {x['prompt']} at token {x['index']} at a "
                  f"floating-point near-tie (logit gap {x['gap']:.3g}, within {x['tolerance']:.3g}): a numerics "
                  "event, not a failed drafter", file=out)
    for name, p in report["peers"].items():
        for x in p["mismatches"]:
            print(f"note: peer '{name}' differs from plain generate() on prompt {x['prompt']} at token {x['index']}", file=out)
    for x in (report.get("llama_cpp") or {}).get("methods", {}).get("llama_cpp_lookup", {}).get("mismatches", []):
        print(f"note: llama.cpp's prompt lookup differs from its plain decoding on prompt {x['prompt']} at token {x['index']}", file=out)
    if (llama := report.get("llama_cpp")) is not None and not llama["available"]:
        print(f"note: llama.cpp peers not run: {llama['reason']}", file=out)
    if report["outputs_match_none"] is False:
        print(f"MISMATCH: at temperature 0 every drafter must reproduce 'none' token for token; "
              f"{len(report['mismatching_prompts'])} prompt(s) differ: {', '.join(report['mismatching_prompts'])}", file=out)


def exit_code(report: dict, allow_mismatch: bool = False) -> int:
    """1 when a drafter's greedy output differed from `none`'s (unless allowed), else 0."""
    return 1 if report["outputs_match_none"] is False and not allow_mismatch else 0


def bench_main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_bench_parser().parse_args(argv)
    try:
        settings = settings_from_args(args)
        for path in (args.json_out, args.md_out):
            if path:
                check_writable(path)
        if args.threads is not None:
            if args.threads < 1:
                raise SpecvizError(f"--threads must be >= 1, got {args.threads}")
            torch.set_num_threads(args.threads)
        prompts = load_prompts(args.prompts, args.limit)

        def progress(done: int, total: int, label: str) -> None:
            print(f"[{done}/{total}] {label}", file=sys.stderr, flush=True)

        command = shlex.join(["python", "-m", "specviz", "bench", *argv])
        several = "," in args.weights
        if several:
            report = regimes.main(args, settings, prompts, command, progress)
        else:
            report = run_bench(_load_models(args), prompts, settings, progress, command=command)
            validate(report)
    except SpecvizError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    markdown = (regimes.to_markdown if several else to_markdown)(report)
    print(markdown)  # first: a run's result is never lost to an output file that fails after it
    if not several:
        report_mismatches(report)
    for path, text in ((args.json_out, json.dumps(report, indent=1) + "\n"), (args.md_out, markdown)):
        if path:
            try:
                write_atomically(path, text)
            except OSError as err:
                print(f"error: cannot write {path}: {err}", file=sys.stderr)
                return 2
    return exit_code(report, args.allow_mismatch)


# ----------------------------------------------------------------------------------------------- train


def register(sub) -> None:
    bc = sub.add_parser("batch-cost", help="the target's forward cost over B sequences x n new tokens each (the Cost page's batch surface)")
    bc.add_argument("--model", default="smollm2-135m", help="preset name, local folder or hub id (default: %(default)s)")
    bc.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    bc.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: bfloat16 on cuda, float32 elsewhere)")
    bc.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    add_weights_arg(bc)
    bc.add_argument("--batch-sizes", default="1,2,4,8,16,32", help="B, comma-separated (default: %(default)s)")
    bc.add_argument("--new-tokens", default="1,2,3,4,5,6,7,8", help="n per sequence, comma-separated, 1 included (default: %(default)s)")
    bc.add_argument("--context-len", type=int, default=256, help="cached tokens per sequence before each timed forward")
    bc.add_argument("--rounds", type=int, default=10, help="timed rounds over every cell, each shuffled; the median is kept")
    bc.add_argument("--seed", type=int, default=0)
    bc.add_argument("--out", default=None, help="write the surface as JSON (the Cost page loads it)")
    bc.set_defaults(run=cmd_batch_cost)
    be = sub.add_parser("bench", help="every drafter vs autoregressive and vs transformers (see `bench --help`)", add_help=False)
    be.add_argument("rest", nargs=argparse.REMAINDER)
    be.set_defaults(run=cmd_bench)

