"""The backend base class and what every backend shares (see specviz/backends/__init__.py)."""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Generator, Optional

from specviz.backends.request import Prompt, Run, RunPrompt, settings_of
from specviz.decoding import events as ev
from specviz.errors import SpecvizError

if TYPE_CHECKING:
    from specviz.models.loading import LoadedModels

FULL = ev.FULL  # every step's tree, p, q, u, residual and replacement or bonus (our engine)
COUNTS = ev.COUNTS  # per step only the drafted and accepted counts, the committed tokens and timing

__all__ = ["COUNTS", "FULL", "Backend", "Capabilities", "Events", "OnWait", "Prompt", "Run", "RunPrompt", "events",
           "no_options", "run", "settings_of"]

OnWait = Callable[[Optional[int]], None]  # called while a run waits: its place in a queue, None where unknown
Events = Generator[ev.Event, None, None]  # a run: closing it early ends the run


@dataclass(frozen=True)
class Capabilities:
    """What a backend can show and do; the pages, the race, the bench and the CLI read these, never the class."""

    detail: str = FULL  # what its Step events carry: FULL or COUNTS
    tree: bool = True  # its steps carry the draft tree (nodes, the target's rows, the tests)
    q_values: bool = True  # its tests carry the draft's q (a COUNTS backend's have none)
    drafter_choice: bool = True  # a run picks its drafter (False: the engine drafts as it was started, one method)
    watch: bool = False  # a run can get a read-only watch link, followed with `watch`
    bench: bool = False  # the bench can time it in this process (`exclusive`, `models_here`)
    bandwidth_probe: bool = False  # its weights are in this process's memory, so copying them can be timed here
    batching: bool = False  # the engine decodes several clients' runs in one batch
    verify_cost: bool = False  # it knows its verify-cost curve (the tree drafters' "auto" budget)


class Backend(ABC):
    """One model on one engine. A subclass declares `engine` and `capabilities`, says what it is (`name`,
    `drafters`, `variants`, `where`, `describe`) and streams a run (`stream`): a Start, one Step per target forward,
    a Done. `events` and `run` are written here once, for every backend. Its `open(address, model, token,
    **options)` classmethod is what specviz.backends.open_backend calls for the addresses it is registered for."""

    engine: ClassVar[str]  # what decodes its runs ("specviz", "vllm"): its Start events' engine
    capabilities: ClassVar[Capabilities]
    hooks: ClassVar[tuple[str, ...]] = ()  # keyword arguments its stream takes besides the run (a service's on_shared)

    @property
    def detail(self) -> str:
        return self.capabilities.detail

    @property
    @abstractmethod
    def name(self) -> str: ...

    @abstractmethod
    def drafters(self) -> list[str]: ...

    @abstractmethod
    def variants(self) -> list[str]: ...

    @abstractmethod
    def where(self) -> str:
        """One line for the sidebar: where the engine runs and on what."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """name, engine, device, dtype, detail, drafters (variants among them), where."""

    @abstractmethod
    def stream(self, run: Run, on_wait: OnWait | None = None) -> Events:
        """The run's events (a specviz.backends.Run: build it with Run.of). run.drafter None: the backend's own
        default (the method it was started with, where it has no choice). run.client_id names the viewer to a
        remote engine's per-client limits. on_wait(position) is called while the run waits for the engine.
        Closing the generator early frees the engine. A backend may take keyword arguments of its own after
        these (`hooks` names them)."""

    def events(self, prompt: RunPrompt | Run, on_wait: OnWait | None = None,
               **kwargs: Any) -> contextlib.closing[Events]:
        """`with backend.events(prompt, ...) as stream:` the run's events; leaving closes the stream at once (a
        local run releases the model, a remote one is cancelled on its server). kwargs: Run.of's (drafter,
        settings, drafter_options, chat, client_id, decode settings by name) and the backend's `hooks`; or a
        ready Run as `prompt`, with only the hooks."""
        hooks = {name: kwargs.pop(name) for name in self.hooks if name in kwargs}
        if isinstance(prompt, Run):
            if kwargs:
                raise TypeError(f"a ready Run takes no other arguments, got {', '.join(sorted(kwargs))}")
            return contextlib.closing(self.stream(prompt, on_wait, **hooks))
        return contextlib.closing(self.stream(Run.of(prompt, **kwargs), on_wait, **hooks))

    def run(self, prompt: RunPrompt | Run, **kwargs: Any) -> list[dict[str, Any]]:
        """A whole run, as the list of its events in JSON form (the arguments of `events`)."""
        with self.events(prompt, **kwargs) as stream:
            return [ev.to_dict(e) for e in stream]

    def served(self) -> list[str]:
        """The models its address serves (open_backend(address, model=name) opens another); this one's first."""
        return [self.name]

    def watch(self, share_id: str, on_wait: OnWait | None = None, client_id: str | None = None) -> Events:
        """Another client's shared run, read-only (capabilities.watch)."""
        raise SpecvizError(f"the engine {self.where()} has no watch links")

    def models_here(self) -> LoadedModels:
        """The loaded models, where they are in this process (capabilities.bench or bandwidth_probe)."""
        raise SpecvizError(f"the weights are not in this process: the engine runs {self.where()}")

    def exclusive(self, on_wait: OnWait | None = None) -> contextlib.AbstractContextManager[Backend]:
        """Hold the engine for a series of runs that nothing else may interleave with (a bench): a backend on the
        same engine whose runs do not wait again (capabilities.bench)."""
        raise SpecvizError(f"a bench times the engine where it runs: here it runs {self.where()}")


def no_options(engine: str, options: dict[str, Any], why: str) -> None:
    """A SpecvizError naming the options an opener was given that its engine does not take."""
    if options:
        raise SpecvizError(f"the {engine} backend takes no {', '.join(sorted(options))}: {why}")


def events(backend: Backend, prompt: RunPrompt | Run, on_wait: OnWait | None = None, **kwargs: Any) -> contextlib.closing[Events]:
    """backend.events(...), as a function."""
    return backend.events(prompt, on_wait=on_wait, **kwargs)


def run(backend: Backend, prompt: RunPrompt | Run, **kwargs: Any) -> list[dict[str, Any]]:
    """backend.run(...), as a function."""
    return backend.run(prompt, **kwargs)

