"""Command line: every subcommand is a thin layer over the library; errors a user can cause print one line."""
from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
from dataclasses import fields, replace
from pathlib import Path

import torch

from specviz.atomic import check_writable, write_atomically
from specviz.bench import (
    QUICK_SIZES,
    BenchSettings,
    load_prompts,
    quick_settings,
    run_bench,
    to_markdown,
    validate,
)
from specviz.errors import SpecvizError
from specviz.settings import DECODE_FIELDS, DecodeSettings
from specviz.train.common import default_data_dir, default_model_path
from specviz.train.data import DataConfig, build_dataset
from specviz.train.loop import TrainConfig


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m", help="preset name, local folder or hub id (default: %(default)s)")
    parser.add_argument("--draft-model", default=None, help="draft model for --drafter draft (preset's own by default)")
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    parser.add_argument("--weights", default="fp32", choices=("fp32", "q4"),
                        help="the target's projections: fp32 (dequantized at fetch), or q4: the preset GGUF's 4-bit "
                             "blocks kept 4-bit (CPU, float32; default: %(default)s)")


def add_decoding_args(parser: argparse.ArgumentParser, defaults: DecodeSettings = DecodeSettings(), drafter: bool = True) -> None:
    """The fields of DecodeSettings as options (n_top stays the library's default)."""
    if drafter:
        parser.add_argument("--drafter", default="ngram", help="none | draft | ngram | medusa | eagle2 | eagle3, optionally with options: eagle2:total_tokens=16:draft_vocab=full, eagle3:head=FOLDER")
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    parser.add_argument("--temperature", type=float, default=defaults.temperature, help="0 = greedy, where outputs must equal `none`'s")
    parser.add_argument("--top-p", type=float, default=defaults.top_p)
    parser.add_argument("--top-k", type=int, default=defaults.top_k, help="0 = no top-k cut")
    parser.add_argument("--k", type=int, default=defaults.k, help="draft length of the chain drafters (for the bench also "
                        "num_assistant_tokens and prompt_lookup_num_tokens)")
    parser.add_argument("--seed", type=int, default=defaults.seed)


def decode_settings(args) -> dict:
    """The DecodeSettings fields parsed by add_decoding_args, by name (their options are named after them)."""
    return {name: getattr(args, name) for name in DECODE_FIELDS if name != "n_top"}


def cmd_generate(args) -> int:
    from specviz import api
    from specviz.decoding import events

    if args.trace:
        check_writable(args.trace)  # before the decode, not after it
    loaded = None
    if args.weights != "fp32":
        from specviz import models

        if args.backend:
            raise SpecvizError("--weights is the local target's: a --backend service loads its own")
        loaded = models.load(args.model, draft_model=args.draft_model, device=args.device, weights=args.weights)
    stream = api.stream(
        args.prompt,
        model=args.model,
        drafter=args.drafter,
        settings=DecodeSettings(**decode_settings(args)),
        draft_model=args.draft_model,
        chat=not args.raw,
        device=args.device,
        backend=args.backend,
        models=loaded,
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


TOKEN_ENV = "SPECVIZ_TOKEN"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def service_token(token_file: str | None) -> str | None:
    """The bearer token from --token-file, else $SPECVIZ_TOKEN; at least 16 characters."""
    if token_file:
        try:
            token, where = open(token_file, encoding="utf-8").read().strip(), token_file
        except OSError as err:
            raise SpecvizError(f"cannot read the token file {token_file}: {err}") from err
    else:
        token, where = os.environ.get(TOKEN_ENV, "").strip(), f"${TOKEN_ENV}"
        if not token:
            return None
    if len(token) < 16:
        raise SpecvizError(f"the token in {where} is shorter than 16 characters; use a long random one "
                           "(python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return token


def cmd_serve(args) -> int:
    import uvicorn

    from specviz import models as m
    from specviz.serve.http import Limits, Service

    token = service_token(args.token_file)
    if args.host not in LOOPBACK and token is None and not args.insecure_no_auth:
        raise SpecvizError(f"--host {args.host} exposes the service beyond this machine: give --token-file FILE "
                           f"(or ${TOKEN_ENV}), or --insecure-no-auth to do it without one")
    if args.max_queue < 1 or args.max_new_tokens_limit < 1:
        raise SpecvizError("--max-queue and --max-new-tokens-limit must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = {}
    for name in args.model or ["smollm2-135m"]:
        key = name if name in m.PRESETS else Path(name).expanduser().name
        loaded[key] = m.load(name, device=args.device)
    service = Service(loaded, token=token, limits=Limits(max_new_tokens=args.max_new_tokens_limit),
                      max_queue=args.max_queue)
    print("specviz serve: warming up (the verify-cost curve, one short run per drafter) …", file=sys.stderr)
    service.warm()
    for row in service.describe():
        print(f"specviz serve: {row['name']} on {row['device']} ({row['dtype']}), drafters: {', '.join(row['drafters'])}",
              file=sys.stderr)
    ready = f"specviz serve: ready on http://{args.host}:{args.port}" + (" (bearer token required)" if token else "")

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if self.started:  # listening now: only then is it ready
                print(ready, file=sys.stderr, flush=True)

    # open event streams get a few seconds to end on Ctrl-C, then the service stops (cancelling what is queued)
    Server(uvicorn.Config(service.app(), host=args.host, port=args.port, log_level="warning",
                          timeout_graceful_shutdown=3)).run()
    return 0


def cmd_load_bench(args) -> int:
    from specviz.serve import loadbench

    try:
        clients = [int(c) for c in args.clients.split(",") if c.strip()]
    except ValueError:
        raise SpecvizError(f"--clients takes comma-separated numbers, got {args.clients!r}") from None
    if args.json_out:
        check_writable(args.json_out)
    report = loadbench.run(args.url, os.environ.get("SPECVIZ_BACKEND_TOKEN"), clients, args.runs,
                           args.max_new_tokens, args.drafter, args.local_rounds)
    report["command"] = shlex.join(["specviz", *sys.argv[1:]])
    print(loadbench.to_markdown(report))
    if args.json_out:
        write_atomically(args.json_out, json.dumps(report, indent=1) + "\n")
    return 0


def int_list(text: str, flag: str) -> tuple[int, ...]:
    """Comma-separated positive integers (a SpecvizError naming the flag otherwise)."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise SpecvizError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SpecvizError(f"{flag} takes integers >= 1, got {text!r}")
    return values


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
    loaded = models.load(args.model, device=args.device, dtype=args.dtype)
    options = ("model", "device", "dtype", "threads", "batch_sizes", "new_tokens", "context_len", "rounds", "seed")
    command = shlex.join(["python", "-m", "specviz", "batch-cost", *[word for name in options if getattr(args, name) is not None
                                                                     for word in (f"--{name.replace('_', '-')}", str(getattr(args, name)))]])
    surface = batch.measure_surface(
        loaded.target, settings, loaded.name, command + (f" --out {shlex.quote(args.out)}" if args.out else ""),
        progress=lambda done, total, label: print(f"[{done}/{total}] {label}", file=sys.stderr, flush=True))
    print(batch.to_markdown(surface))
    if args.out:
        write_atomically(args.out, json.dumps(surface, indent=1) + "\n")
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
    return train_main(args.rest)


def cmd_bench(args) -> int:
    return bench_main(args.rest)


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
    gen.add_argument("--backend", default=os.environ.get("SPECVIZ_BACKEND"),
                     help="URL of a `specviz serve` service to decode on (default: $SPECVIZ_BACKEND, else in this process)")
    gen.set_defaults(run=cmd_generate)

    srv = sub.add_parser("serve", help="the engine as a service: load models once, stream runs' events over HTTP")
    srv.add_argument("--model", action="append", default=None,
                     help="preset name or local folder; repeat for several (default: smollm2-135m)")
    srv.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--token-file", default=None, help="file holding the bearer token clients must send "
                     f"(default: ${TOKEN_ENV} when set); required to bind a non-loopback address")
    srv.add_argument("--insecure-no-auth", action="store_true", help="listen on a non-loopback address without a token")
    srv.add_argument("--max-queue", type=int, default=16, help="runs waiting at most; past it new runs get 429")
    srv.add_argument("--max-new-tokens-limit", type=int, default=512, help="the most new tokens one run may ask for")
    srv.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    srv.set_defaults(run=cmd_serve)

    lb = sub.add_parser("load-bench", help="N clients x M runs against a running specviz serve, and its overhead")
    lb.add_argument("--url", default="http://127.0.0.1:8000")
    lb.add_argument("--clients", default="1,4,16", help="comma-separated numbers of clients at once")
    lb.add_argument("--runs", type=int, default=4, help="runs per client, one after another")
    lb.add_argument("--max-new-tokens", type=int, default=64)
    lb.add_argument("--drafter", default=None, help="default: the service's default drafter")
    lb.add_argument("--local-rounds", type=int, default=6,
                    help="runs alternated in this process and through the service, one client (0: skip)")
    lb.add_argument("--json-out", default=None)
    lb.set_defaults(run=cmd_load_bench)

    bc = sub.add_parser("batch-cost", help="the target's forward cost over B sequences x n new tokens each (the Cost page's batch surface)")
    bc.add_argument("--model", default="smollm2-135m", help="preset name, local folder or hub id (default: %(default)s)")
    bc.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    bc.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: bfloat16 on cuda, float32 elsewhere)")
    bc.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    bc.add_argument("--batch-sizes", default="1,2,4,8,16,32", help="B, comma-separated (default: %(default)s)")
    bc.add_argument("--new-tokens", default="1,2,3,4,5,6,7,8", help="n per sequence, comma-separated, 1 included (default: %(default)s)")
    bc.add_argument("--context-len", type=int, default=256, help="cached tokens per sequence before each timed forward")
    bc.add_argument("--rounds", type=int, default=10, help="timed rounds over every cell, each shuffled; the median is kept")
    bc.add_argument("--seed", type=int, default=0)
    bc.add_argument("--out", default=None, help="write the surface as JSON (the Cost page loads it)")
    bc.set_defaults(run=cmd_batch_cost)

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


# ----------------------------------------------------------------------------------------------- bench


def build_bench_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specviz bench",
                                description="Every drafter against `none` and against transformers' generate(), side by side.")
    add_model_args(p)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: bfloat16 on cuda, float32 elsewhere)")
    p.add_argument("--drafters", default="", help="comma-separated, e.g. none,ngram,draft,medusa,eagle2 (default: all available); a drafter may carry options: eagle2:draft_vocab=full:total_tokens=16")
    p.add_argument("--prompts", default=None, help="JSONL with `turns` (first turn used) or `instruction` (default: the built-in set)")
    p.add_argument("--limit", type=int, default=None, help="use the first N prompts")
    add_decoding_args(p, BenchSettings(), drafter=False)
    p.add_argument("--repeats", type=int, default=1, help="decodes of each (prompt, method); the median time is kept")
    p.add_argument("--no-peers", action="store_true", help="skip transformers' generate() baselines")
    p.add_argument("--no-llama-cpp", action="store_true",
                   help="skip llama.cpp's plain decoding and prompt lookup (run when llama-cpp-python is installed: `make peers`)")
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
        verify_sizes=sizes,
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
        models = _load_models(args)

        def progress(done: int, total: int, label: str) -> None:
            print(f"[{done}/{total}] {label}", file=sys.stderr, flush=True)

        report = run_bench(models, prompts, settings, progress, command=shlex.join(["python", "-m", "specviz", "bench", *argv]))
        validate(report)
    except SpecvizError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    markdown = to_markdown(report)
    print(markdown)  # first: a run's result is never lost to an output file that fails after it
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

TRAIN_DOC = """`train {data,eagle,eagle3,medusa,draft}`: self-distillation data, then the trained draft topologies for one
target.

    specviz train data  [--n-prompts 2400] [--max-minutes 38] [--aux-layers eagle3]
    specviz train eagle --out assets/eagle-smollm2-135m [--steps N] [--max-minutes M] [--resume]
    specviz train eagle3 --data-dir DATA_MADE_WITH_AUX_LAYERS [--unroll 3] [--max-minutes M] [--resume]
"""

DEFAULT_OUT = {"eagle": "assets/eagle-smollm2-135m", "eagle3": "assets/eagle3-smollm2-135m", "medusa": "assets/medusa-smollm2-135m",
               "draft": "assets/draft-smollm2-135m"}


def build_train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specviz train", description=TRAIN_DOC,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="kind", required=True)
    d = sub.add_parser("data", help="generate the target's responses and cache its features")
    add_train_common(d)
    d.add_argument("--n-prompts", type=int, default=DataConfig.n_prompts)
    d.add_argument("--n-val", type=int, default=DataConfig.n_val)
    d.add_argument("--max-new-tokens", type=int, default=DataConfig.max_new_tokens)
    d.add_argument("--batch-size", type=int, default=DataConfig.batch_size)
    d.add_argument("--shard-size", type=int, default=DataConfig.shard_size)
    d.add_argument("--first-train-shard", type=int, default=0,
                   help="make train shards from this one on (a later run can fill in the earlier ones)")
    d.add_argument("--prompts", default=DataConfig.prompts_path)
    d.add_argument("--aux-layers", default="",
                   help="also cache the inputs of these decoder layers (comma-separated, or 'eagle3': layers 2, "
                        "N/2 and N-3 of an N-layer target, the EAGLE-3 default), for `train eagle3`")
    for kind in ("eagle", "eagle3", "medusa", "draft"):
        t = sub.add_parser(kind, help=f"train the {kind} drafter from the cached data")
        add_train_common(t)
        t.add_argument("--out", default=DEFAULT_OUT[kind])
        t.add_argument("--work-dir", default="runs")
        t.add_argument("--steps", type=int, default=2000)
        t.add_argument("--batch-seqs", type=int, default=8)
        t.add_argument("--max-len", type=int, default=TrainConfig.max_len)
        t.add_argument("--lr", type=float, default=None)
        t.add_argument("--warmup", type=int, default=TrainConfig.warmup)
        t.add_argument("--eval-seqs", type=int, default=TrainConfig.eval_seqs)
        t.add_argument("--draft-vocab-size", type=int, default=8192 if kind == "eagle3" else TrainConfig.draft_vocab_size)
        t.add_argument("--ckpt-minutes", type=float, default=TrainConfig.ckpt_minutes)
        t.add_argument("--resume", action="store_true", help="continue from the checkpoint in --work-dir")
        if kind == "eagle":
            t.add_argument("--noise", type=float, default=TrainConfig.noise)
            t.add_argument("--p-weight", type=float, default=TrainConfig.p_weight)
            t.add_argument("--unroll", type=int, default=TrainConfig.unroll, choices=(1, 2))
            t.add_argument("--loss-vocab", type=int, default=TrainConfig.loss_vocab,
                           help="soft CE over the N most frequent draft-vocabulary tokens (0: all); the drafter "
                                "drafts from the 4096 most frequent by default, and 4096 makes a step about 2x faster")
            t.add_argument("--init", default=None,
                           help="start from this EAGLE asset folder (keeps its draft vocabulary), e.g. to go on "
                                "training the shipped head on newly made data")
        if kind == "eagle3":
            t.add_argument("--unroll", type=int, default=3,
                           help="training-time test: draft steps, each fed the head's own output from the step before")
            t.add_argument("--step-decay", type=float, default=TrainConfig.step_decay,
                           help="loss weight of draft step k is this to the power k")
            t.add_argument("--loss-vocab", type=int, default=4096,
                           help="soft CE over the N most frequent draft-vocabulary tokens (0: all); the LM head "
                                "rows are the target's and stay fixed, so only the head's output is shaped by it")
            t.add_argument("--bf16", action="store_true",
                           help="run the products under bf16 autocast (about 1.6x faster on a CPU with native bf16)")
            t.add_argument("--init", default=None, help="go on training the EAGLE-3 head in this folder")
        if kind == "medusa":
            t.add_argument("--medusa-heads", type=int, default=TrainConfig.medusa_heads)
            t.add_argument("--medusa-layers", type=int, default=TrainConfig.medusa_layers)
        if kind == "draft":
            t.add_argument("--draft-layers", type=int, nargs="+", default=list(TrainConfig.draft_layers),
                           help="target layers copied into the draft (their count is the draft's depth)")
    return p


def aux_layer_ids(spec: str, model_path: str) -> tuple[int, ...]:
    """'' -> (); '2,15,27' -> (2, 15, 27); 'eagle3' -> EAGLE-3's default layers for the target's depth."""
    if not spec:
        return ()
    if spec == "eagle3":
        from transformers import AutoConfig

        from specviz.models.eagle3 import default_aux_layers

        return default_aux_layers(AutoConfig.from_pretrained(model_path).num_hidden_layers)
    try:
        return tuple(int(x) for x in spec.split(","))
    except ValueError:
        raise SpecvizError(f"--aux-layers takes layer numbers like 2,15,27 or 'eagle3', got {spec!r}") from None


def add_train_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-path", default=str(default_model_path()))
    p.add_argument("--data-dir", default=str(default_data_dir()))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-minutes", type=float, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


def train_config(args, argv: list[str]) -> TrainConfig:
    names = {f.name for f in fields(TrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in names and v is not None}
    if "draft_layers" in values:
        values["draft_layers"] = tuple(values["draft_layers"])
    command = "python -m specviz train " + " ".join(shlex.quote(a) for a in argv)
    return TrainConfig(command=command, **values)


def train_main(argv: list[str]) -> int:
    args = build_train_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.kind == "data":
        cfg = DataConfig(model_path=args.model_path, out_dir=args.data_dir, prompts_path=args.prompts,
                         n_prompts=args.n_prompts, n_val=args.n_val, seed=args.seed,
                         max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                         shard_size=args.shard_size, max_minutes=args.max_minutes,
                         first_train_shard=args.first_train_shard,
                         aux_layers=aux_layer_ids(args.aux_layers, args.model_path))
        build_dataset(cfg)
        return 0
    cfg = train_config(args, argv)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    if args.kind == "eagle":
        from specviz.train.eagle import train_eagle as run
    elif args.kind == "eagle3":
        from specviz.train.eagle3 import train_eagle3 as run
    elif args.kind == "medusa":
        from specviz.train.medusa import train_medusa as run
    else:
        from specviz.train.draft import train_draft as run
    run(cfg)
    return 0
