"""The Python API: `stream` yields events, `generate` consumes them and returns the result."""
from __future__ import annotations

import functools
import os
from typing import Iterator

from specviz.backends import Run, open_backend
from specviz.backends.local import LocalBackend
from specviz.decoding import engine
from specviz.decoding import events as ev
from specviz.decoding.prompt import encode_prompt
from specviz.decoding.settings import DecodeSettings

__all__ = ["encode_prompt", "generate", "loaded", "result_of", "stream"]
TOKEN_ENV = "SPECVIZ_BACKEND_TOKEN"  # the bearer token for a `specviz serve` backend


@functools.lru_cache(maxsize=2)
def _load(model: str, draft_model: str | None, device: str, weights: str):
    from specviz import models

    return models.load(model, draft_model=draft_model, device=device, weights=weights)


def stream(
    prompt: str,
    model: str | None = None,
    drafter: str | None = None,
    *,
    settings: DecodeSettings | None = None,
    draft_model: str | None = None,
    models=None,
    chat: bool = True,
    device: str = "auto",
    weights: str = "auto",
    drafter_options: dict | None = None,
    backend=None,
    **decode,
) -> Iterator[ev.Event]:
    """Decode `prompt` and yield a Start event, one Step per target forward and a Done event.

    The decode configuration is a specviz.decoding.settings.DecodeSettings: pass one as `settings`, or its fields by name
    (max_new_tokens, temperature, top_p, top_k, k, seed, n_top), which override those of `settings`.
    `models` takes already-loaded models (a specviz.models.LoadedModels, or `loaded(target, tokenizer, draft)`);
    otherwise `model`/`draft_model` name a preset, a local folder or a hub id, loaded with `weights` (see
    specviz.models.load: "auto" runs a preset's own 4-bit GGUF blocks on the CPU). `backend` runs it elsewhere: a
    specviz.backends.Backend, or an address for specviz.backends.open_backend ("http://host:8000" for a `specviz
    serve` service, the token from $SPECVIZ_BACKEND_TOKEN; "vllm+http://host:8000" for a vLLM server); the events
    are the same. drafter None: the backend's own default (ngram on our engine). The run is a
    specviz.backends.Run, built here once (its drafter parsed and checked once) whatever the backend."""
    run = Run.of(prompt, drafter, drafter_options, settings, chat, **decode)
    if isinstance(backend, str):
        backend = open_backend(backend, model=model, token=os.environ.get(TOKEN_ENV))
    elif backend is None:
        backend = LocalBackend(models if models is not None else _load(model or "smollm2-135m", draft_model, device, weights))
    return backend.stream(run)


def generate(prompt: str, **kwargs) -> engine.Result:
    """Same arguments as `stream`; returns text, token_ids, stats and stop_reason."""
    done = None
    for event in stream(prompt, **kwargs):
        done = event
    return result_of(done)


def result_of(done: ev.Done) -> engine.Result:
    return engine.Result(text=done.text, token_ids=done.token_ids, stats=done.stats, stop_reason=done.stop_reason)


def loaded(target, tokenizer, draft=None, name: str = "custom", draft_tokenizer=None):
    """Wrap already-loaded transformers models for `stream(models=...)`; checks the vocabularies match."""
    from specviz import models as m

    if draft is not None:
        m.check_same_vocabulary(target, draft, tokenizer, draft_tokenizer or tokenizer)
    return m.LoadedModels(name=name, target=target, draft=draft, tokenizer=tokenizer, device=target.device, dtype=target.dtype)
