"""`specviz generate`, `drafters`, `models` and `fetch`: decode one prompt, and what there is to decode with."""
from __future__ import annotations

import json
import os
import sys

from specviz.arguments import DEFAULT_MODEL, add_decoding_args, add_model_args, decode_settings
from specviz.atomic import check_writable
from specviz.decoding.settings import DecodeSettings
from specviz.errors import SpecvizError


def cmd_generate(args) -> int:
    from specviz import api
    from specviz.backends import Run, open_backend

    if args.trace:
        check_writable(args.trace)  # before the decode, not after it
    run = Run.of(args.prompt, args.drafter, settings=DecodeSettings(**decode_settings(args)), chat=not args.raw)
    if run.drafter is not None and (not args.backend or args.backend.startswith("local:")):
        from specviz.drafters import spec_of

        spec_of(run.drafter)  # an unknown name is said before the model loads (a remote engine has its own names)
    backend = open_backend(args.backend or f"local:{args.model}", token=os.environ.get(api.TOKEN_ENV),
                           model=args.model if args.backend and args.model != DEFAULT_MODEL else None,
                           **local_options(args))
    stream = backend.stream(run)
    collected = []
    for event in stream:
        collected.append(event)
        if event.type == "step" and not args.json:
            print(event.text_delta, end="", flush=True)
    done = collected[-1]
    if args.trace:
        from specviz.decoding import events

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
            f"[{run.drafter_string() or collected[0].drafter}] {s['new_tokens']} tokens in {s['steps']} steps, τ = {s['tau']:.2f} (counts the "
            f"replacement/bonus token), acceptance {rate}, {s['tokens_per_s']:.1f} tokens/s",
            file=sys.stderr,
        )
    return 0


def local_options(args) -> dict:
    """The options of the model loaded here that differ from their defaults (a remote backend refuses them: it
    loads its own)."""
    given = {"device": (args.device, "auto"), "weights": (args.weights, "auto"), "draft_model": (args.draft_model, None)}
    return {name: value for name, (value, default) in given.items() if value != default}


def cmd_models(args) -> int:
    from specviz import models

    print(models.format_models_table(models.list_models()))
    return 0


def cmd_fetch(args) -> int:
    from specviz import models
    from specviz.models import quantized

    if args.name not in models.PRESETS:
        raise SpecvizError(f"unknown preset '{args.name}'; choose one of: {', '.join(models.PRESETS)}")
    preset = models.PRESETS[args.name]
    for model_file in (preset.target, preset.draft):
        if model_file is not None:
            print(f"{model_file.key}: {models.fetch(model_file)}", file=sys.stderr)
            if model_file.gguf_name.endswith(".gguf"):  # a folder fetched before fetches kept it: its default weights
                quantized.fetch_gguf(model_file)
    return 0



def cmd_drafters(args) -> int:
    from specviz.drafters import REGISTRY
    from specviz.drafters.spec import to_markdown, to_table

    if args.markdown or args.table:
        print((to_markdown if args.markdown else to_table)(REGISTRY.values()))
        return 0
    for spec in REGISTRY.values():
        needs = f" (needs {spec.needs})" if spec.needs else ""
        print(f"{spec.name}{needs}: {spec.help}")
        for o in spec.options:
            print(f"    {o.name}: {o.takes()}; default {o.default if o.type is not object else '(see the API)'}")
    return 0


def register(sub) -> None:
    gen = sub.add_parser("generate", help="decode a prompt and print the text (or JSON)")
    gen.add_argument("--prompt", required=True)
    add_model_args(gen)
    add_decoding_args(gen)
    gen.add_argument("--trace", help="write every event as JSONL to this file")
    gen.add_argument("--json", action="store_true", help='print one JSON object {"text", "token_ids", "stats"}')
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    gen.add_argument("--backend", default=os.environ.get("SPECVIZ_BACKEND"),
                     help="the engine's address: local:MODEL (in this process), http://host:port (a `specviz serve` "
                          "service; --model picks among its models) or vllm+http://host:port (a vLLM server, which "
                          "drafts as it was started) (default: $SPECVIZ_BACKEND, else local:MODEL with --model)")
    gen.set_defaults(run=cmd_generate)

    mod = sub.add_parser("models", help="list the presets, their sizes and whether each is fetched")
    mod.set_defaults(run=cmd_models)

    fe = sub.add_parser("fetch", help="download, check and convert a preset's weights into the cache")
    fe.add_argument("name", nargs="?", default="smollm2-135m")
    fe.set_defaults(run=cmd_fetch)
    dr = sub.add_parser("drafters", help="the drafters, what each needs and its options (name:key=value)")
    dr.add_argument("--markdown", action="store_true", help="as docs/drafters.md")
    dr.add_argument("--table", action="store_true", help="as the README's drafter table")
    dr.set_defaults(run=cmd_drafters)
