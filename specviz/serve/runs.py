"""Runs and the queue: a run is one decode a client asked for; one engine worker per device takes queued runs
in order and appends each event of the run, numbered, for any number of listeners to read.

The worker checks a run's cancel flag between events, so a cancelled run (or one whose last listener left)
frees the device within one step."""
from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

from specviz.decoding import events as ev
from specviz.decoding.settings import DecodeSettings
from specviz.errors import SpecvizError
from specviz.serve.metrics import ServiceMetrics

QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"
FINISHED = (DONE, FAILED, CANCELLED)


class QueueFull(SpecvizError):
    """The queue (or this client's share of it) is full: try again later."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class RunRequest:
    """What a client asked for, already checked against the service's limits (see serve/http.py)."""

    prompt: str | list[dict]  # a prompt, or a conversation of {role, content} messages
    model: str
    drafter: str
    drafter_options: dict
    settings: DecodeSettings
    detail: bool = True  # False: no tree-building stages and no top-N lists in the events (throughput runs)
    chat: bool = True


@dataclass
class Run:
    id: str
    request: RunRequest
    client: str  # who asked (their token's or address's name), for the per-client limit
    created: float = field(default_factory=time.monotonic)
    started: float | None = None
    finished: float | None = None
    state: str = QUEUED
    error: str | None = None
    refused: bool = False  # failed because the engine refused the request (a SpecvizError), not an engine bug
    events: list[dict] = field(default_factory=list)  # the schema-v1 events so far; events[i] has sequence i
    listeners: int = 0
    unheard: int = 0  # counts the times it was left with no listener: a grace timer acts only on its own count
    cancel_requested: bool = False
    _changed: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _waiters: list[Callable[[], None]] = field(default_factory=list, repr=False)

    @property
    def done(self) -> bool:
        return self.state in FINISHED

    def append(self, event: dict) -> None:
        with self._changed:
            self.events.append(event)
            self._notify()

    def finish(self, state: str, error: str | None = None, refused: bool = False) -> None:
        with self._changed:
            if self.done:
                return
            self.state, self.error, self.refused, self.finished = state, error, refused, time.monotonic()
            self._notify()

    def touch(self) -> None:
        """Wake the listeners (the queue position changed)."""
        with self._changed:
            self._notify()

    def _notify(self) -> None:
        self._changed.notify_all()
        waiters, self._waiters = self._waiters, []
        for wake in waiters:
            try:
                wake()
            except RuntimeError:  # its event loop has closed (the service is stopping): nobody to wake
                pass

    def on_change(self, wake: Callable[[], None]) -> None:
        """Call wake() once at the next change (an asyncio listener passes loop.call_soon_threadsafe(...))."""
        with self._changed:
            self._waiters.append(wake)

    def wait(self, seen: int, timeout: float | None = None) -> bool:
        """Block until there are more than `seen` events or the run has finished; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self.events) > seen or self.done, timeout)


class Scheduler:
    """The bounded queue and one engine worker thread per device.

    `decode(run)` is what a worker runs for a run: it yields the run's events (as objects) and is closed early
    when the run is cancelled."""

    def __init__(self, decode: Callable[[Run], Iterator[ev.Event]], devices: list[str], metrics: ServiceMetrics,
                 max_queue: int = 16, max_per_client: int = 3, disconnect_grace_s: float = 1.0,
                 unclaimed_grace_s: float = 30.0):
        self.decode = decode
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_per_client = max_per_client  # one running plus a few queued
        self.disconnect_grace_s = disconnect_grace_s
        self.unclaimed_grace_s = unclaimed_grace_s  # a run nobody ever listens to is cancelled after this
        self.runs: dict[str, Run] = {}
        self.queues: dict[str, deque[Run]] = {device: deque() for device in devices}
        self.lock = threading.Condition()
        self.stopping = False
        self.workers = [threading.Thread(target=self._work, args=(device,), name=f"specviz-engine-{device}",
                                         daemon=True) for device in devices]
        self._ids = itertools.count(1)

    def start(self) -> None:
        for worker in self.workers:
            worker.start()

    def stop(self) -> None:
        """Cancel what is queued and running, and let the workers end (the running run within one step)."""
        with self.lock:
            self.stopping = True
            for queue in self.queues.values():
                for run in queue:
                    run.finish(CANCELLED)
                queue.clear()
            for run in self.runs.values():
                run.cancel_requested = True
            self.lock.notify_all()
        for worker in self.workers:
            worker.join(timeout=5)

    # --------------------------------------------------------------------------------------- clients

    def submit(self, request: RunRequest, client: str, device: str) -> Run:
        with self.lock:
            queued = sum(len(q) for q in self.queues.values())
            if queued >= self.max_queue:
                raise QueueFull(f"the queue is full ({queued} runs waiting); try again shortly", retry_after_s=5)
            mine = sum(1 for r in self.runs.values() if r.client == client and not r.done)
            if mine >= self.max_per_client:
                raise QueueFull(f"this client already has {mine} runs running or queued (at most "
                                f"{self.max_per_client}); wait for one to finish or cancel it", retry_after_s=2)
            run = Run(id=f"run-{next(self._ids)}-{secrets.token_hex(4)}", request=request, client=client)
            self.runs[run.id] = run
            self.queues[device].append(run)
            self.metrics.queue_length.set(queued + 1)
            self.lock.notify_all()
        self._forget_old()
        self._cancel_later(run, self.unclaimed_grace_s)  # unless someone listens by then
        return run

    def get(self, run_id: str) -> Run | None:
        return self.runs.get(run_id)

    def position(self, run: Run) -> int | None:
        """1 for the next run to start, 2 after it ...; None once it runs or has finished."""
        with self.lock:
            for queue in self.queues.values():
                if run in queue:
                    return list(queue).index(run) + 1
        return None

    def cancel(self, run: Run) -> None:
        with self.lock:
            run.cancel_requested = True
            for queue in self.queues.values():
                if run in queue:
                    queue.remove(run)
                    run.finish(CANCELLED)
                    self._queue_changed()
        run.touch()

    def listen(self, run: Run) -> None:
        with self.lock:
            run.listeners += 1
            run.unheard += 1  # any grace timer running for this run is now stale

    def leave(self, run: Run) -> None:
        """A listener left; when it was the last one, cancel the run unless another listens within the grace
        period (a client resuming a dropped stream with Last-Event-ID)."""
        with self.lock:
            run.listeners -= 1
            if run.listeners > 0 or run.done:
                return
        self._cancel_later(run, self.disconnect_grace_s)

    def _cancel_later(self, run: Run, grace_s: float) -> None:
        """Cancel `run` after grace_s unless a listener has come (or come and gone) since."""
        with self.lock:
            run.unheard += 1
            count = run.unheard
        if grace_s <= 0:
            self._cancel_if_unheard(run, count)
            return
        timer = threading.Timer(grace_s, self._cancel_if_unheard, args=(run, count))
        timer.daemon = True
        timer.start()

    def _cancel_if_unheard(self, run: Run, count: int) -> None:
        with self.lock:
            stale = run.unheard != count or run.listeners > 0 or run.done
        if not stale:
            self.cancel(run)

    def queue_length(self) -> int:
        with self.lock:
            return sum(len(q) for q in self.queues.values())

    # ------------------------------------------------------------------------------------------ worker

    def _queue_changed(self) -> None:
        self.metrics.queue_length.set(sum(len(q) for q in self.queues.values()))
        for queue in self.queues.values():
            for waiting in queue:
                waiting.touch()  # their position moved

    def _next(self, device: str) -> Run | None:
        with self.lock:
            while not self.queues[device] and not self.stopping:
                self.lock.wait()
            if self.stopping:
                return None
            run = self.queues[device].popleft()
            run.state, run.started = RUNNING, time.monotonic()
            self._queue_changed()
            return run

    def _work(self, device: str) -> None:
        while (run := self._next(device)) is not None:
            try:
                self.metrics.queue_wait.observe(run.started - run.created)
                self._run(run)
                self.metrics.run_latency.observe(run.finished - run.started)
            except Exception as err:  # whatever happens, the worker lives on and the run ends
                run.finish(FAILED, f"the service failed ({type(err).__name__}): {err}")

    def _run(self, run: Run) -> None:
        stream = None
        try:
            stream = self.decode(run)
            for event in stream:
                data = ev.to_dict(event)
                if not run.request.detail and data["type"] == "step":
                    data["build"] = []
                if run.cancel_requested and data["type"] != "done":
                    run.finish(CANCELLED)
                    return
                run.append(data)
                if data["type"] == "step":
                    self.metrics.observe_step(data)
                elif data["type"] == "done":
                    self.metrics.observe_done(run.request.model, run.request.drafter, data)
            run.finish(DONE)
        except SpecvizError as err:  # a request the engine refuses (a prompt past the context, ...)
            run.finish(FAILED, str(err), refused=True)
        except Exception as err:  # an engine bug: the run fails, the service goes on
            run.finish(FAILED, f"the engine failed ({type(err).__name__}): {err}")
        finally:
            if stream is not None and hasattr(stream, "close"):
                try:
                    stream.close()
                except Exception:  # closing a failed generator: nothing more to free
                    pass

    def _forget_old(self, keep: int = 64) -> None:
        """Keep the events of at most `keep` finished runs (oldest dropped first)."""
        with self.lock:
            finished = [r for r in self.runs.values() if r.done]
            for run in finished[: max(0, len(finished) - keep)]:
                del self.runs[run.id]
