"""The local backend: our engine in this process, one run at a time per loaded model."""
from __future__ import annotations

import contextlib
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Iterator

from specviz.backends.base import Backend, Capabilities, Events, OnWait, Run
from specviz.decoding import engine
from specviz.decoding import events as ev
from specviz.decoding.costs import verify_curve
from specviz.decoding.prompt import encode_prompt
from specviz.drafters import DEFAULT, available, build_drafter, reads_verify_cost, variants
from specviz.errors import SpecvizError
from specviz.models.quantized import WEIGHT_WORDS

if TYPE_CHECKING:
    from specviz.models.loading import LoadedModels
    from specviz.models.wheels import ProgressCallback

PREFIX = "local:"


class LocalBackend(Backend):
    """specviz.models.LoadedModels behind the Backend base, with a lock so that runs never overlap (the
    app's sessions share one; the service's scheduler runs one per device anyway). A run holds the lock from its
    first event until its generator is exhausted, closed or raises."""

    engine = "specviz"
    capabilities = Capabilities(bench=True, bandwidth_probe=True, verify_cost=True)
    hooks = ("cancelled",)

    def __init__(self, models: LoadedModels):
        self.models = models  # a specviz.models.LoadedModels; read-only once loaded
        self.lock = threading.Lock()

    @classmethod
    def open(cls, address: str, model: str | None = None, token: str | None = None, *, device: str = "auto",
             weights: str = "auto", draft_model: str | None = None, progress: ProgressCallback | None = None,
             warm: bool = False) -> LocalBackend:
        """"local:MODEL": a preset, a model folder or a hub id, loaded (and fetched) here (specviz.models.load).
        warm: measure the verify-cost curve now where a tree drafter reads it, not in the first run. A token is
        not needed here."""
        name = address.removeprefix(PREFIX)
        if not name:
            raise SpecvizError(f"{PREFIX} names a model: {PREFIX}smollm2-135m (a preset) or {PREFIX}/path/to/model")
        if model is not None and model != name:
            raise SpecvizError(f"{address} loads the model {name!r}, not {model!r}")
        from specviz.models import load

        loaded = load(name, draft_model=draft_model, device=device, weights=weights, progress=progress)
        if warm and reads_verify_cost(loaded):
            verify_curve(loaded)
        return cls(loaded)

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
        return {"name": self.name, "engine": self.engine, "device": self.device, "dtype": self.dtype,
                "weights": self.weights,
                "detail": self.detail, "drafters": self.drafters() + self.variants(), "where": self.where()}

    def models_here(self) -> LoadedModels:
        return self.models

    @contextlib.contextmanager
    def exclusive(self, on_wait: OnWait | None = None) -> Iterator[LocalBackend]:
        """Holds the lock for the whole block; the backend it gives decodes on the same models with a lock of its
        own, which no one else sees (so its runs never wait for the one held here)."""
        self._acquire(on_wait)
        try:
            yield LocalBackend(self.models)
        finally:
            self.lock.release()

    def _acquire(self, on_wait: OnWait | None) -> None:
        """The lock; on_wait(None) is called once if another run holds it, before waiting."""
        if not self.lock.acquire(blocking=False):
            if on_wait is not None:
                on_wait(None)
            self.lock.acquire()

    def stream(self, run: Run, on_wait: OnWait | None = None, *,
               cancelled: Callable[[], bool] | None = None) -> Events:
        """The run, holding the lock. Close the generator when you stop early: closing is what releases the lock
        at once. `cancelled` is read between the prompt's prefill chunks, where no event comes for long: True ends
        the run there (no done event). run.client_id: one process, one viewer; not used. run.model: the service
        picks this backend by it; a local backend has one model."""
        models = self.models
        self._acquire(on_wait)
        try:  # making a drafter may measure the verify-cost curve: never beside another run
            prompt_ids = encode_prompt(models.tokenizer, run.prompt, run.chat)
            the_drafter = build_drafter(run.drafter or DEFAULT, models, k=run.settings.k,
                                        options=run.drafter_options)
            prompt_text = run.prompt if isinstance(run.prompt, str) else models.tokenizer.decode(prompt_ids)
            for event in engine.decode(models.target, models.tokenizer, the_drafter, prompt_ids, run.settings,
                                       models.name, prompt_text, models.vocab_size, cancelled):
                yield event if run.detail or not isinstance(event, ev.Step) else replace(event, build=[])
        finally:
            self.lock.release()


def as_local(models: Backend | LoadedModels) -> Backend:
    """A backend as it is, or loaded models (specviz.models.LoadedModels) behind a new LocalBackend."""
    return models if isinstance(models, Backend) else LocalBackend(models)
