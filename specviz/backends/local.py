"""The local backend: our engine in this process, one run at a time per loaded model."""
from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any, Callable

from specviz.backends.base import FULL, Events, OnWait, Prompt, events, run, settings_of
from specviz.decoding import engine
from specviz.decoding.prompt import encode_prompt
from specviz.decoding.settings import DecodeSettings
from specviz.drafters import available, make_drafter, variants
from specviz.models.quantized import WEIGHT_WORDS

if TYPE_CHECKING:
    from specviz.models.loading import LoadedModels


class LocalBackend:
    """specviz.models.LoadedModels behind the Backend protocol, with a lock so that runs never overlap (the
    app's sessions share one; the service's scheduler runs one per device anyway). A run holds the lock from its
    first event until its generator is exhausted, closed or raises."""

    remote = False
    detail = FULL

    def __init__(self, models: LoadedModels):
        self.models = models  # a specviz.models.LoadedModels; read-only once loaded
        self.lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.models.name

    @property
    def device(self) -> str:
        return str(self.models.device)

    @property
    def dtype(self) -> str:
        return str(self.models.dtype).removeprefix("torch.")

    @property
    def weights(self) -> str:
        return self.models.weights  # what load() gave the target: specviz.models.quantized

    def drafters(self) -> list[str]:
        return available(self.models)

    def variants(self) -> list[str]:
        return variants(self.models)

    def where(self) -> str:
        return f"in this process on {self.device} ({self.dtype}; {WEIGHT_WORDS[self.weights]})"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "engine": "specviz", "device": self.device, "dtype": self.dtype,
                "weights": self.weights,
                "detail": self.detail, "drafters": self.drafters() + self.variants(), "where": self.where()}

    def stream(self, prompt: Prompt, on_wait: OnWait | None = None, *,
               drafter: str = "ngram", settings: DecodeSettings | None = None,
               drafter_options: dict[str, Any] | None = None, chat: bool = True, client_id: str | None = None,
               cancelled: Callable[[], bool] | None = None, **decode: Any) -> Events:
        """The run, holding the lock; on_wait(None) is called once if another run holds it, before waiting.
        Close the generator when you stop early: closing is what releases the lock at once. `cancelled` is read
        between the prompt's prefill chunks, where no event comes for long: True ends the run there (no done
        event)."""
        settings = settings_of(settings, decode)
        models = self.models
        if not self.lock.acquire(blocking=False):
            if on_wait is not None:
                on_wait(None)
            self.lock.acquire()
        try:  # making a drafter may measure the verify-cost curve: never beside another run
            prompt_ids = encode_prompt(models.tokenizer, prompt, chat)
            the_drafter = make_drafter(drafter, models, k=settings.k, options=drafter_options)
            prompt_text = prompt if isinstance(prompt, str) else models.tokenizer.decode(prompt_ids)
            yield from engine.decode(models.target, models.tokenizer, the_drafter, prompt_ids, settings, models.name,
                                     prompt_text, models.vocab_size, cancelled)
        finally:
            self.lock.release()

    def events(self, prompt: Prompt, on_wait: OnWait | None = None, **kwargs: Any) -> contextlib.closing[Events]:
        return events(self, prompt, on_wait=on_wait, **kwargs)

    def run(self, prompt: Prompt, **kwargs: Any) -> list[dict[str, Any]]:
        return run(self, prompt, **kwargs)


def as_local(models: LocalBackend | LoadedModels) -> LocalBackend:
    """A LocalBackend as it is, or loaded models (specviz.models.LoadedModels) behind a new one."""
    return models if isinstance(models, LocalBackend) else LocalBackend(models)
