"""`specviz serve` (the engine as a service) and `specviz load-bench` (clients against a running one)."""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import torch

from specviz.arguments import add_weights_arg
from specviz.atomic import check_writable, write_atomically
from specviz.errors import SpecvizError

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
    if min(args.max_queue, args.max_new_tokens_limit, args.max_connections) < 1:
        raise SpecvizError("--max-queue, --max-new-tokens-limit and --max-connections must be >= 1")
    if args.keep_mb < 0 or args.keep_s < 0 or min(args.header_timeout_s, args.body_timeout_s, args.write_timeout_s) <= 0:
        raise SpecvizError("--keep-mb and --keep-s must be >= 0, --header-timeout-s, --body-timeout-s and "
                           "--write-timeout-s > 0")
    if args.min_body_rate < 0:
        raise SpecvizError("--min-body-rate must be >= 0 (0: no floor)")
    hosts = tuple(args.allowed_host or ())
    if args.host not in ("0.0.0.0", "::", ""):
        hosts += (args.host,)  # the address it listens on is a name its clients may use
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = {}
    for name in args.model or ["smollm2-135m"]:
        key = name if name in m.PRESETS else Path(name).expanduser().name
        loaded[key] = m.load(name, device=args.device, weights=args.weights)
    service = Service(loaded, token=token, limits=Limits(max_new_tokens=args.max_new_tokens_limit),
                      max_queue=args.max_queue, keep_bytes=int(args.keep_mb * 2**20), keep_s=args.keep_s,
                      allowed_hosts=hosts)
    print("specviz serve: warming up (the verify-cost curve, one short run per drafter) …", file=sys.stderr)
    service.warm()
    for row in service.describe():
        print(f"specviz serve: {row['name']} on {row['device']} ({row['dtype']}, {row['weights']} weights), "
              f"drafters: {', '.join(row['drafters'])}",
              file=sys.stderr)
    ready = f"specviz serve: ready on http://{args.host}:{args.port}" + (" (bearer token required)" if token else "")

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if self.started:  # listening now: only then is it ready
                print(ready, file=sys.stderr, flush=True)

    # open event streams get a few seconds to end on Ctrl-C, then the service stops (cancelling what is queued)
    Server(service.server_config(args.host, args.port, max_connections=args.max_connections,
                                 header_timeout_s=args.header_timeout_s, body_timeout_s=args.body_timeout_s,
                                 min_body_rate=args.min_body_rate, write_timeout_s=args.write_timeout_s,
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



def register(sub) -> None:
    srv = sub.add_parser("serve", help="the engine as a service: load models once, stream runs' events over HTTP")
    srv.add_argument("--model", action="append", default=None,
                     help="preset name or local folder; repeat for several (default: smollm2-135m)")
    srv.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    add_weights_arg(srv)
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--token-file", default=None, help="file holding the bearer token clients must send "
                     f"(default: ${TOKEN_ENV} when set); required to bind a non-loopback address")
    srv.add_argument("--insecure-no-auth", action="store_true", help="listen on a non-loopback address without a token")
    srv.add_argument("--max-queue", type=int, default=16, help="runs waiting at most; past it new runs get 429")
    srv.add_argument("--max-new-tokens-limit", type=int, default=512, help="the most new tokens one run may ask for")
    srv.add_argument("--keep-mb", type=float, default=256, help="finished runs' events kept for late listeners "
                     "and watch links, at most this many MB (oldest dropped first; default 256)")
    srv.add_argument("--keep-s", type=float, default=600, help="a finished run is kept this many seconds (default 600)")
    srv.add_argument("--max-connections", type=int, default=512, help="open connections at most; past it the one "
                     "waiting longest without a request is closed (default 512)")
    srv.add_argument("--header-timeout-s", type=float, default=10, help="a connection whose request headers have "
                     "not all arrived this long after they began is closed (default 10)")
    srv.add_argument("--body-timeout-s", type=float, default=10, help="a request whose body has not all arrived "
                     "this long after its headers is answered 408 and closed (default 10)")
    srv.add_argument("--min-body-rate", type=float, default=1024, help="bytes/s: a request body arriving slower "
                     "than this on average (after its first second) is answered 408 and closed (default 1024)")
    srv.add_argument("--write-timeout-s", type=float, default=30, help="a response (an event stream) whose client "
                     "has read nothing for this long is closed; a viewer resumes with Last-Event-ID (default 30)")
    srv.add_argument("--allowed-host", action="append", default=None, metavar="NAME",
                     help="a Host name clients may use besides the loopback names and --host; repeat for several; "
                          "* for any (default: loopback only)")
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

