"""`specviz llamacpp build` and `specviz llamacpp serve`: llama-server built for this CPU, and started on a
preset's GGUF speculating as asked, with our drafters exported for it where the method drafts with ours (a
pretrained pair's draft-simple drafts with the pair's own draft GGUF).

    specviz llamacpp serve --spec-type draft-eagle3 --port 8080     # then: llama+http://127.0.0.1:8080
"""
from __future__ import annotations

import argparse
import os

from specviz.errors import SpecvizError

SPEC_TYPES = ("none", "ngram-simple", "ngram-mod", "ngram-map-k", "ngram-cache", "draft-simple", "draft-eagle3")


def cmd_build(args: argparse.Namespace) -> int:
    from specviz.llamacpp import build

    return build.main([*(["--jobs", str(args.jobs)] if args.jobs else []),
                       *(["--probe", args.probe] if args.probe else [])])


def cmd_serve(args: argparse.Namespace) -> int:
    from specviz.llamacpp.build import installed
    from specviz.llamacpp.files import DRAFT_FILES, ggufs
    from specviz.llamacpp.server import LlamaServer

    binary = installed()
    if binary is None:
        raise SpecvizError("llama-server is not built here: run `make llamacpp` (about 10 minutes on 2 cores), or "
                           "name one with SPECVIZ_LLAMA_SERVER")
    files = ggufs(args.model, [args.spec_type])
    draft = files.get(DRAFT_FILES[args.spec_type]) if args.spec_type in DRAFT_FILES else None
    if args.spec_type in DRAFT_FILES and draft is None:
        raise SpecvizError(f"{args.model} ships no drafter for --spec-type {args.spec_type}")
    server = LlamaServer(binary, files["target"], threads=args.threads, ctx=args.ctx, spec_type=args.spec_type,
                         draft=draft, draft_max=args.n_max, draft_min=args.n_min, p_min=args.p_min,
                         host=args.host, port=args.port, extra=("--api-key", args.api_key) if args.api_key else ())
    server.start()
    print(f"llama-server ready: llama+{server.url}  (log: {server.log})", flush=True)
    print(" ".join(server.args), flush=True)
    try:
        return server.wait()
    except KeyboardInterrupt:
        server.stop()
        return 130


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("llamacpp", help="llama.cpp's llama-server: build it, or serve a preset with our drafters")
    commands = p.add_subparsers(dest="llamacpp_command", required=True)
    b = commands.add_parser("build", help="build llama-server for this CPU into the cache (what `make llamacpp` runs)")
    b.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: every core)")
    b.add_argument("--probe", default=None, help="a GGUF to decode with the build (checks ggml's AMX kernels)")
    b.set_defaults(run=cmd_build)
    s = commands.add_parser("serve", help="start llama-server on a preset's GGUF, speculating as asked")
    s.add_argument("--model", default="smollm2-135m", help="a preset with a GGUF target (default: smollm2-135m)")
    s.add_argument("--spec-type", default="none", choices=SPEC_TYPES,
                   help="llama.cpp's method: draft-simple drafts with our draft model, draft-eagle3 with our EAGLE-3 "
                        "head (both exported on first use; a pair such as qwen2.5-coder drafts with its own draft "
                        "GGUF); none decodes plainly")
    s.add_argument("--n-max", type=int, default=None, help="drafted tokens a step at most (--spec-draft-n-max)")
    s.add_argument("--n-min", type=int, default=None,
                   help="a shorter draft is dropped, so that step drafts nothing (--spec-draft-n-min)")
    s.add_argument("--p-min", type=float, default=None, help="stop drafting below this draft probability")
    s.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads (default: every core)")
    s.add_argument("--ctx", type=int, default=4096, help="context size in tokens")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--api-key", default=None, help="a token clients must send (SPECVIZ_BACKEND_TOKEN in the app)")
    s.set_defaults(run=cmd_serve)
