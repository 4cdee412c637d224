"""The Python API: `stream` yields events, `generate` consumes them and returns the result."""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import Iterator

from specviz.decoding import engine
from specviz.decoding import events as ev
from specviz.decoding.settings import DECODE_FIELDS, DecodeSettings
from specviz.drafters import make_drafter
from specviz.errors import SpecvizError


@functools.lru_cache(maxsize=2)
def _load(model: str, draft_model: str | None, device: str):
    from specviz import models

    return models.load(model, draft_model=draft_model, device=device)


def encode_prompt(tokenizer, prompt: str | list[dict], chat: bool = True) -> list[int]:
    """Token ids of the prompt; instruct models get their chat template unless chat=False. `prompt` may also be
    a conversation, [{"role": "user" | "assistant" | "system", "content": "..."}, ...] (chat template required)."""
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in prompt):
            raise SpecvizError("a conversation is a non-empty list of {role, content} messages")
        if not getattr(tokenizer, "chat_template", None):
            raise SpecvizError("this model has no chat template: send a prompt string instead of messages")
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    if not isinstance(prompt, str) or not prompt.strip():
        raise SpecvizError("the prompt is empty")
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt)["input_ids"]


def stream(
    prompt: str,
    model: str | None = None,
    drafter: str = "ngram",
    *,
    settings: DecodeSettings | None = None,
    draft_model: str | None = None,
    models=None,
    chat: bool = True,
    device: str = "auto",
    drafter_options: dict | None = None,
    backend: str | None = None,
    **decode,
) -> Iterator[ev.Event]:
    """Decode `prompt` and yield a Start event, one Step per target forward and a Done event.

    The decode configuration is a specviz.decoding.settings.DecodeSettings: pass one as `settings`, or its fields by name
    (max_new_tokens, temperature, top_p, top_k, k, seed, n_top), which override those of `settings`.
    `models` takes already-loaded models (a specviz.models.LoadedModels, or `loaded(target, tokenizer, draft)`);
    otherwise `model`/`draft_model` name a preset, a local folder or a hub id. `backend="http://host:8000"`
    runs it on a `specviz serve` service instead (the token from $SPECVIZ_BACKEND_TOKEN) and yields the same
    events."""
    unknown = sorted(set(decode) - set(DECODE_FIELDS))
    if unknown:
        raise TypeError(f"stream() got unknown argument(s) {', '.join(unknown)}; the decode settings are: {', '.join(DECODE_FIELDS)}")
    settings = replace(settings or DecodeSettings(), **decode)
    if backend is not None:
        from specviz.serve.client import Client

        fields = {name: getattr(settings, name) for name in DECODE_FIELDS}
        chosen = {} if model is None else {"model": model}  # else the service's default model
        return Client(backend).stream(prompt, drafter=drafter, drafter_options=drafter_options or {}, chat=chat,
                                      **chosen, **fields)
    if models is None:
        models = _load(model or "smollm2-135m", draft_model, device)
    prompt_ids = encode_prompt(models.tokenizer, prompt, chat)
    the_drafter = make_drafter(drafter, models, k=settings.k, options=drafter_options)
    prompt_text = prompt if isinstance(prompt, str) else models.tokenizer.decode(prompt_ids)
    return engine.decode(
        models.target, models.tokenizer, the_drafter, prompt_ids, settings, models.name, prompt_text, models.vocab_size
    )


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
