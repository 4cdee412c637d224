"""The backend protocol and what every backend shares (see specviz/backends/__init__.py)."""
from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any, Callable, Generator, Optional, Protocol, Union

from specviz.decoding import events as ev
from specviz.decoding.settings import DECODE_FIELDS, DecodeSettings

FULL = "full"  # every step's tree, p, q, u, residual and replacement or bonus (our engine)
COUNTS = "counts"  # per step only the drafted and accepted counts, the committed tokens and timing

Prompt = Union[str, list[dict[str, str]]]  # a text, or chat messages ({"role": ..., "content": ...})
OnWait = Callable[[Optional[int]], None]  # called while a run waits: its place in a queue, None where unknown
Events = Generator[ev.Event, None, None]  # a run: closing it early ends the run


class Backend(Protocol):
    """One model on one engine. `stream` takes specviz.stream's arguments (drafter=, settings=,
    drafter_options=, chat=) and yields Start, one Step per target forward, and Done."""

    remote: bool  # the weights are not in this process (what needs them, a bench or a bandwidth probe, is not offered)
    detail: str  # FULL or COUNTS: what its Step events carry

    @property
    def name(self) -> str: ...

    def drafters(self) -> list[str]: ...

    def variants(self) -> list[str]: ...

    def where(self) -> str: ...

    def describe(self) -> dict[str, Any]: ...

    def stream(self, prompt: Prompt, on_wait: OnWait | None = None, **kwargs: Any) -> Events: ...


def events(backend: Backend, prompt: Prompt, on_wait: OnWait | None = None, **kwargs: Any) -> contextlib.closing[Events]:
    """`with events(backend, prompt, ...) as stream:` the run's events; leaving closes the stream at once (a
    local run releases the model, a remote one is cancelled on the service)."""
    return contextlib.closing(backend.stream(prompt, on_wait=on_wait, **kwargs))


def run(backend: Backend, prompt: Prompt, **kwargs: Any) -> list[dict[str, Any]]:
    """A whole run, as the list of its events in JSON form."""
    with events(backend, prompt, **kwargs) as stream:
        return [ev.to_dict(e) for e in stream]


def settings_of(settings: DecodeSettings | None, decode: dict[str, Any]) -> DecodeSettings:
    """`settings` (default: DecodeSettings()) with any of its fields given by name in `decode` replaced."""
    unknown = sorted(set(decode) - set(DECODE_FIELDS))
    if unknown:
        raise TypeError(f"unknown argument(s) {', '.join(unknown)}; the decode settings are: {', '.join(DECODE_FIELDS)}")
    return replace(settings or DecodeSettings(), **decode)
