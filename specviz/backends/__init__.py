"""Backends: what the API, the pages, the bench and the service decode through. Each is one engine behind one
small protocol, so a page never knows which it has:

    local.py    our engine in this process (full detail: the tree, p, q, u, residual of every step)
    service.py  a `specviz serve` service over HTTP (the same events, the same detail), through client.py,
                the service's Python client (`specviz.Client`)
    vllm.py     an unmodified `vllm serve` over its OpenAI API (per step only accepted counts and tokens)

A backend says what it is and what detail its events carry (`describe`), and streams a run as events (`stream`).
A new engine is one new file here that implements `Backend` and one line in `open_backend`.
"""
from __future__ import annotations

from specviz.backends.base import COUNTS, FULL, Backend, events, run
from specviz.errors import SpecvizError

__all__ = ["COUNTS", "FULL", "Backend", "events", "open_backend", "run"]


def open_backend(where: str, model: str | None = None, token: str | None = None) -> Backend:
    """A backend by address: "http://host:8000" (or https) is a `specviz serve` service, "vllm+http://host:8000"
    an unmodified `vllm serve`; of either, the model `model` (default: its first) is used."""
    if where.startswith("vllm+"):
        from specviz.backends.vllm import VllmBackend

        return VllmBackend.connect(where, model=model, token=token)
    if where.startswith(("http://", "https://")):
        from specviz.backends.service import ServiceBackend

        return ServiceBackend.connect(where, model=model, token=token)
    raise SpecvizError(f"unknown backend {where!r}: give the URL of a `specviz serve` service (http://host:port) "
                       "or of a vLLM server (vllm+http://host:port)")
