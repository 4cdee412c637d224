"""One loaded model shared by every browser session, with a lock so engine runs never overlap; and fetches
that run in a background thread, so that a page rerun (a touched widget, another page) cannot stop them.

A run holds the lock from its first event until its generator is exhausted, closed (a session stopped or
rerun mid-run) or raises, so a session that goes away never leaves the model locked for the others.
No streamlit here: the concurrency tests drive it from plain threads.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

import specviz
from specviz import models as m
from specviz.decoding import events as ev
from specviz.drafters import available, variants
from specviz.errors import SpecvizError


class SharedModels:
    """The local backend: the engine in this process."""

    remote = False

    def __init__(self, models):
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

    def drafters(self) -> list[str]:
        return available(self.models)

    def variants(self) -> list[str]:
        return variants(self.models)

    def where(self) -> str:
        return f"in this process on {self.device} ({self.dtype})"

    def stream(self, prompt: str, on_wait: Callable[[int | None], None] | None = None, **kwargs) -> Iterator[ev.Event]:
        """specviz.stream(prompt, models=..., **kwargs), run while holding the lock.

        on_wait(None) is called once if another run holds the lock, before waiting for it. Close the generator
        (or use `events(...)` below) when you stop early: closing is what releases the lock at once."""
        if not self.lock.acquire(blocking=False):
            if on_wait is not None:
                on_wait(None)
            self.lock.acquire()
        try:
            yield from specviz.stream(prompt, models=self.models, **kwargs)
        finally:
            self.lock.release()

    def events(self, prompt: str, on_wait: Callable[[int | None], None] | None = None, **kwargs):
        """Context manager over `stream` that closes it on leaving: `with shared.events(...) as evs: ...`."""
        return contextlib.closing(self.stream(prompt, on_wait=on_wait, **kwargs))

    def run(self, prompt: str, **kwargs) -> list[dict]:
        """A whole run, as the list of its events in JSON form."""
        with self.events(prompt, **kwargs) as evs:
            return [ev.to_dict(e) for e in evs]


class RemoteModels:
    """The remote backend: one model of a `specviz serve` service, with SharedModels' interface, so every page
    streams its runs' events the same way. What needs the weights in this process (the Overview's bandwidth
    measurement, running a bench) is not offered. The service queues the runs of every viewer itself."""

    remote = True
    lock = None
    models = None

    def __init__(self, url: str, row: dict, token: str | None = None):
        self.url, self.row, self.token = url, row, token

    @property
    def name(self) -> str:
        return self.row["name"]

    @property
    def device(self) -> str:
        return self.row["device"]

    @property
    def dtype(self) -> str:
        return self.row["dtype"]

    def drafters(self) -> list[str]:
        return [d for d in self.row["drafters"] if ":" not in d]

    def variants(self) -> list[str]:
        return [d for d in self.row["drafters"] if ":" in d]

    def where(self) -> str:
        return f"on the service at {self.url}, on {self.device} ({self.dtype})"

    def stream(self, prompt: str, on_wait: Callable[[int | None], None] | None = None, client_id: str | None = None,
               settings=None, **kwargs) -> Iterator[ev.Event]:
        """The run on the service; on_wait(position) is called while it waits in the service's queue."""
        from specviz.serve.client import Client

        fields = asdict(settings.decode_settings()) if settings is not None else {}
        client = Client(self.url, token=self.token, client_id=client_id)
        yield from client.stream(prompt, on_queued=on_wait, model=self.name, **{**fields, **kwargs})

    def events(self, prompt: str, on_wait=None, **kwargs):
        return contextlib.closing(self.stream(prompt, on_wait=on_wait, **kwargs))

    def run(self, prompt: str, **kwargs) -> list[dict]:
        with self.events(prompt, **kwargs) as evs:
            return [ev.to_dict(e) for e in evs]


@dataclass
class FetchJob:
    """A preset's missing files fetched one after the other in a daemon thread; pages poll its fields."""

    preset: str
    stage: str = "starting"
    done: float = 0.0
    total: float = 0.0
    error: str | None = None
    finished: bool = False  # True when every file is in the cache, or when it failed (then `error` says why)
    thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return not self.finished

    def _progress(self, stage: str, done: float, total: float) -> None:
        self.stage, self.done, self.total = stage, done, total

    def _run(self, files: list) -> None:
        try:
            for model_file in files:
                m.fetch(model_file, self._progress)  # its own lock and temp folder: a failure leaves the cache clean
        except SpecvizError as err:
            self.error = str(err)
        except BaseException as err:  # whatever a broken download raises, the page shows it instead of hanging
            self.error = f"{type(err).__name__}: {err}"
        finally:
            if self.error is None and not all(m.is_fetched(f.key) for f in files):
                self.error = "the fetch ended but the model is not in the cache"
            self.finished = True


class Fetches:
    """At most one running fetch per preset for the whole process, however many sessions ask."""

    def __init__(self):
        self.jobs: dict[str, FetchJob] = {}
        self.lock = threading.Lock()

    def get(self, preset: str) -> FetchJob | None:
        return self.jobs.get(preset)

    def start(self, preset: str) -> FetchJob:
        """The running fetch of `preset`, or a new one (after none, or after a finished or failed one)."""
        with self.lock:
            job = self.jobs.get(preset)
            if job is not None and job.running:
                return job
            files = m.missing_files(m.PRESETS[preset])
            job = FetchJob(preset)
            job.thread = threading.Thread(target=job._run, args=(files,), name=f"fetch-{preset}", daemon=True)
            self.jobs[preset] = job
            job.thread.start()
            return job
