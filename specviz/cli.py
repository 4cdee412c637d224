"""Command line: every subcommand is a thin layer over the library; errors a user can cause print one line."""
from __future__ import annotations

import argparse
import json
import sys

from specviz.errors import SpecvizError


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m", help="preset name, local folder or hub id (default: %(default)s)")
    parser.add_argument("--draft-model", default=None, help="draft model for --drafter draft (preset's own by default)")
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")


def add_decoding_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--drafter", default="ngram", help="none | draft | ngram | medusa | eagle2, optionally with options: eagle2:total_tokens=16:draft_vocab=full")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--k", type=int, default=4, help="draft length for chain drafters")
    parser.add_argument("--seed", type=int, default=0)


def cmd_generate(args) -> int:
    from specviz import api, events
    from specviz.atomic import check_writable

    if args.trace:
        check_writable(args.trace)  # before the decode, not after it
    stream = api.stream(
        args.prompt,
        model=args.model,
        drafter=args.drafter,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        k=args.k,
        seed=args.seed,
        draft_model=args.draft_model,
        chat=not args.raw,
        device=args.device,
    )
    collected = []
    for event in stream:
        collected.append(event)
        if event.type == "step" and not args.json:
            print(event.text_delta, end="", flush=True)
    done = collected[-1]
    if args.trace:
        try:
            events.write_trace(collected, args.trace)
        except OSError as err:
            raise SpecvizError(f"cannot write the trace to {args.trace}: {err}") from err
    if args.json:
        print(json.dumps({"text": done.text, "token_ids": done.token_ids, "stats": done.stats}))
    else:
        print(done.text_delta)
        s = done.stats
        rate = "n/a" if s["acceptance_rate"] is None else f"{s['acceptance_rate']:.2f}"
        print(
            f"[{args.drafter}] {s['new_tokens']} tokens in {s['steps']} steps, τ = {s['tau']:.2f} (counts the "
            f"replacement/bonus token), acceptance {rate}, {s['tokens_per_s']:.1f} tokens/s",
            file=sys.stderr,
        )
    return 0


def cmd_models(args) -> int:
    from specviz import models

    print(models.format_models_table(models.list_models()))
    return 0


def cmd_fetch(args) -> int:
    from specviz import models

    if args.name not in models.PRESETS:
        raise SpecvizError(f"unknown preset '{args.name}'; choose one of: {', '.join(models.PRESETS)}")
    preset = models.PRESETS[args.name]
    for model_file in (preset.target, preset.draft):
        if model_file is not None:
            print(f"{model_file.key}: {models.fetch(model_file)}", file=sys.stderr)
    return 0


def cmd_train(args) -> int:
    from specviz import train

    return train.main(args.rest)


def cmd_bench(args) -> int:
    from specviz import bench

    return bench.main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specviz", description="Speculative decoding you can watch.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="decode a prompt and print the text (or JSON)")
    gen.add_argument("--prompt", required=True)
    add_model_args(gen)
    add_decoding_args(gen)
    gen.add_argument("--trace", help="write every event as JSONL to this file")
    gen.add_argument("--json", action="store_true", help='print one JSON object {"text", "token_ids", "stats"}')
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    gen.set_defaults(run=cmd_generate)

    mod = sub.add_parser("models", help="list the presets, their sizes and whether each is fetched")
    mod.set_defaults(run=cmd_models)

    fe = sub.add_parser("fetch", help="download, check and convert a preset's weights into the cache")
    fe.add_argument("name", nargs="?", default="smollm2-135m")
    fe.set_defaults(run=cmd_fetch)

    tr = sub.add_parser("train", help="train draft heads / the draft model (see `train --help`)", add_help=False)
    tr.add_argument("rest", nargs=argparse.REMAINDER)
    tr.set_defaults(run=cmd_train)
    be = sub.add_parser("bench", help="every drafter vs autoregressive and vs transformers (see `bench --help`)", add_help=False)
    be.add_argument("rest", nargs=argparse.REMAINDER)
    be.set_defaults(run=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, extra = build_parser().parse_known_args(argv)
    if extra and args.command not in ("train", "bench"):
        build_parser().parse_args(argv)  # reports the unknown arguments and exits
    if extra:
        args.rest = [*extra, *args.rest]  # options such as --help before any positional argument
    try:
        return args.run(args)
    except SpecvizError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
