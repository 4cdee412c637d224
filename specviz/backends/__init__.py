"""Backends: what the API, the pages, the bench and the service decode through. Each is one engine behind one
base class (base.py), so a page never knows which it has, only what it can show (`Backend.capabilities`):

    request.py  the Run every backend decodes: the prompt, the drafter (parsed and checked once), the settings
    local.py    our engine in this process (full detail: the tree, p, q, u, residual of every step)
    service.py  a `specviz serve` service over HTTP (the same events, the same detail), through client.py,
                the service's Python client (`specviz.Client`)
    vllm.py     an unmodified `vllm serve` over its OpenAI API (per step only accepted counts and tokens)
    llamacpp.py an unmodified llama-server over its native API (per step drafted and accepted counts and tokens)

`open_backend(address)` is the only way to get one: "local:MODEL" (a preset or a model folder),
"http://host:port" (a specviz service), "vllm+http://host:port" (a vLLM server), "llama+http://host:port" (a
llama-server). A new engine is one module here
(a Backend subclass with an `open` classmethod) and one `register` line below.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Union

from specviz.backends.base import COUNTS, FULL, Backend, Capabilities, events, run
from specviz.backends.request import Run
from specviz.errors import SpecvizError

__all__ = ["COUNTS", "FULL", "Backend", "Capabilities", "Run", "events", "open_backend", "register", "run",
           "unregister"]

# opener(address, model=None, token=None, **options) -> Backend; or "module:Class.method", imported on first use
Opener = Callable[..., Backend]
OPENERS: dict[str, Union[Opener, str]] = {}  # address prefix -> its opener


def register(prefix: str, opener: Union[Opener, str]) -> None:
    """Addresses that start with `prefix` open through `opener`."""
    if prefix in OPENERS:
        raise SpecvizError(f"a backend is already registered for addresses {prefix!r}")
    OPENERS[prefix] = opener


def unregister(prefix: str) -> None:
    OPENERS.pop(prefix, None)


register("local:", "specviz.backends.local:LocalBackend.open")
register("http://", "specviz.backends.service:ServiceBackend.open")
register("https://", "specviz.backends.service:ServiceBackend.open")
register("vllm+http://", "specviz.backends.vllm:VllmBackend.open")
register("vllm+https://", "specviz.backends.vllm:VllmBackend.open")
register("llama+http://", "specviz.backends.llamacpp:LlamaCppBackend.open")
register("llama+https://", "specviz.backends.llamacpp:LlamaCppBackend.open")


def open_backend(address: str, model: str | None = None, token: str | None = None, **options: Any) -> Backend:
    """The backend at `address` (its registered prefix picks the engine, the longest that matches). `model`: which
    of a server's models (default: its first); `token`: a remote engine's bearer token; `options`: the engine's own
    (a local model's device, weights, draft_model, progress, warm; a vLLM server's silence_s, detokenize)."""
    prefix = max((p for p in OPENERS if address.startswith(p)), key=len, default=None)
    if prefix is None:
        raise SpecvizError(f"unknown backend address {address!r}: give local:MODEL (a preset or a model folder), the "
                           "URL of a `specviz serve` service (http://host:port) or of a vLLM server "
                           f"(vllm+http://host:port) or of a llama-server (llama+http://host:port); addresses start with {', '.join(sorted(OPENERS))}")
    return _opener(OPENERS[prefix])(address, model=model, token=token, **options)


def _opener(opener: Union[Opener, str]) -> Opener:
    if not isinstance(opener, str):
        return opener
    module, _, path = opener.partition(":")
    found: Any = importlib.import_module(module)
    for part in path.split("."):
        found = getattr(found, part)
    return found  # type: ignore[no-any-return]
