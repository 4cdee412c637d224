"""The `specviz` command: the parser every command family registers into, and one line for an error a user
can cause."""
from __future__ import annotations

import argparse
import sys

from specviz.bench import cli as bench_cli
from specviz.bench import prefill as prefill_bench
from specviz.cli import export, generate
from specviz.errors import SpecvizError
from specviz.llamacpp import cli as llamacpp_cli
from specviz.serve import cli as serve_cli
from specviz.train import cli as train_cli

PASS_THROUGH = ("train", "bench")  # commands with their own parser: the rest of the line goes to it


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specviz", description="Speculative decoding you can watch.")
    sub = parser.add_subparsers(dest="command", required=True)
    for family in (generate, serve_cli, bench_cli, prefill_bench, train_cli, export, llamacpp_cli):
        family.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, extra = build_parser().parse_known_args(argv)
    if extra and args.command not in PASS_THROUGH:
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


# ----------------------------------------------------------------------------------------------- bench
