"""One loaded model shared by every browser session, with a lock so engine runs never overlap.

A run holds the lock from its first event until its generator is exhausted, closed (a session stopped or
rerun mid-run) or raises, so a session that goes away never leaves the model locked for the others.
No streamlit here: the concurrency test drives it from plain threads.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

import specviz
from specviz import events as ev


class SharedModels:
    def __init__(self, models):
        self.models = models  # a specviz.models.LoadedModels; read-only once loaded
        self.lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.models.name

    def stream(self, prompt: str, on_wait: Callable[[], None] | None = None, **kwargs) -> Iterator[ev.Event]:
        """specviz.stream(prompt, models=..., **kwargs), run while holding the lock.

        on_wait() is called once if another run holds the lock, before waiting for it. Close the generator
        (or use `events(...)` below) when you stop early: closing is what releases the lock at once."""
        if not self.lock.acquire(blocking=False):
            if on_wait is not None:
                on_wait()
            self.lock.acquire()
        try:
            yield from specviz.stream(prompt, models=self.models, **kwargs)
        finally:
            self.lock.release()

    def events(self, prompt: str, on_wait: Callable[[], None] | None = None, **kwargs):
        """Context manager over `stream` that closes it on leaving: `with shared.events(...) as evs: ...`."""
        return contextlib.closing(self.stream(prompt, on_wait=on_wait, **kwargs))

    def run(self, prompt: str, **kwargs) -> list[dict]:
        """A whole run, as the list of its events in JSON form."""
        with self.events(prompt, **kwargs) as evs:
            return [ev.to_dict(e) for e in evs]
