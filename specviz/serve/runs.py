"""Runs and the queue: a run is one decode a client asked for; one engine worker per device takes queued runs
in order and appends each event of the run, numbered, for any number of listeners to read.

A run belongs to the client that made it (its owner): only the owner's streams keep it alive, and a run whose
owner has not listened for a grace period is cancelled; a share id lets any number of viewers read it too. The
worker checks a run's cancel flag between events, and the engine between a long prompt's prefill chunks, so a
cancelled run frees the device within one step or one chunk.

Memory is bounded by design: a run keeps its events as their JSON bytes (about a quarter of the memory of the
parsed events); finished runs are kept for late listeners under a byte budget and a time to live; one reaper
thread cancels the runs nobody listens to and forgets the expired ones."""
from __future__ import annotations

import json
import secrets
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

from specviz.backends.request import Run as RunRequest  # what a client asked for, checked (serve/validate.py)
from specviz.decoding import events as ev
from specviz.errors import SpecvizError
from specviz.serve.metrics import ServiceMetrics

QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"
FINISHED = (DONE, FAILED, CANCELLED)
RUN_BYTES = 2048  # what a run costs besides its prompt and events (the objects around them), for the budget
EVENT_BYTES = 40  # what one kept event costs besides its JSON (the bytes object and its slot in the list)
REAPER_IDLE_S = 1.0  # the reaper looks at least this often, and sooner when a deadline comes


class QueueFull(SpecvizError):
    """The queue (or this client's share of it) is full: try again later."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


def new_id(kind: str) -> str:
    """An id nobody can guess: 128 random bits."""
    return f"{kind}-{secrets.token_urlsafe(16)}"


def encoded(event: dict) -> bytes:
    """An event as it is kept and sent: compact JSON, UTF-8."""
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "backslashreplace")


@dataclass(eq=False)
class Run:
    id: str
    request: RunRequest
    owner: str  # who asked (their address and X-Specviz-Client name): the only one who reads or cancels it by id
    share_id: str | None = None  # a read-only handle for viewers, once shared
    created: float = field(default_factory=time.monotonic)
    started: float | None = None
    finished: float | None = None
    state: str = QUEUED
    error: str | None = None
    refused: bool = False  # failed because the engine refused the request (a SpecvizError), not an engine bug
    events: list[bytes] = field(default_factory=list)  # each schema-v1 event's JSON; events[i] has sequence i
    size: int = 0  # bytes it holds, counted against the finished runs' budget
    listeners: int = 0  # the owner's open streams (a viewer's stream neither keeps it alive nor ends it)
    deadline: float | None = None  # time.monotonic() at which it is cancelled unless its owner listens by then
    cancel_requested: bool = False
    _changed: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _waiters: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def __post_init__(self):
        prompt = self.request.prompt
        texts = [prompt] if isinstance(prompt, str) else [m["content"] for m in prompt]
        self.size = RUN_BYTES + sum(len(t) for t in texts)

    @property
    def done(self) -> bool:
        return self.state in FINISHED

    def append(self, data: bytes) -> None:
        with self._changed:
            self.events.append(data)
            self.size += len(data) + EVENT_BYTES
            self._notify()

    def finish(self, state: str, error: str | None = None, refused: bool = False) -> bool:
        """End the run; False if it had ended already."""
        with self._changed:
            if self.done:
                return False
            self.state, self.error, self.refused, self.finished = state, error, refused, time.monotonic()
            self._notify()
            return True

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

    def off_change(self, wake: Callable[[], None]) -> None:
        """No longer call wake() (its listener left, or stopped waiting): a client that reconnects in a loop to a
        run that waits long leaves nothing behind."""
        with self._changed:
            if wake in self._waiters:
                self._waiters.remove(wake)


class Scheduler:
    """The bounded queue, one engine worker thread per device, and the reaper.

    `decode(run)` is what a worker runs for a run: it yields the run's events (as objects) and is closed early
    when the run is cancelled."""

    def __init__(self, decode: Callable[[Run], Iterator[ev.Event]], devices: list[str], metrics: ServiceMetrics,
                 max_queue: int = 16, max_per_client: int = 3, disconnect_grace_s: float = 1.0,
                 unclaimed_grace_s: float = 30.0, keep_bytes: int = 256 * 2**20, keep_s: float = 600.0):
        self.decode = decode
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_per_client = max_per_client  # one running plus a few queued
        self.disconnect_grace_s = disconnect_grace_s  # an owner who drops its stream may resume within this
        self.unclaimed_grace_s = unclaimed_grace_s  # a run its owner never listens to is cancelled after this
        self.keep_bytes = keep_bytes  # finished runs are kept (for late listeners) within this many bytes ...
        self.keep_s = keep_s  # ... and this many seconds
        self.runs: dict[str, Run] = {}  # every run it knows, by id: active and kept
        self.active: dict[str, Run] = {}  # preparing, queued or running
        self.kept: OrderedDict[str, Run] = OrderedDict()  # finished, oldest first
        self.kept_bytes = 0
        self.shared: dict[str, Run] = {}  # share id -> run
        self.preparing = 0  # admitted runs not yet queued (their prompt being checked)
        self.queues: dict[str, deque[Run]] = {device: deque() for device in devices}
        self.lock = threading.Condition()
        self.stopping = False
        self.workers = [threading.Thread(target=self._work, args=(device,), name=f"specviz-engine-{device}",
                                         daemon=True) for device in devices]
        self.reaper = threading.Thread(target=self._reap, name="specviz-reaper", daemon=True)

    def start(self) -> None:
        for thread in (*self.workers, self.reaper):
            thread.start()

    def stop(self) -> None:
        """Cancel what is queued and running, and let the threads end (the running run within one step)."""
        with self.lock:
            self.stopping = True
            for queue in self.queues.values():
                for run in queue:
                    self._end(run, CANCELLED)
                queue.clear()
            for run in self.active.values():
                run.cancel_requested = True
            self.lock.notify_all()
        for thread in (*self.workers, self.reaper):
            if thread.is_alive():
                thread.join(timeout=5)

    # --------------------------------------------------------------------------------------- clients

    def submit(self, request: RunRequest, owner: str, device: str, prepare: Callable[[RunRequest], None] | None = None,
               share: bool = False) -> Run:
        """Admit a run (QueueFull when the queue or the owner's share of it is full), then `prepare(request)`
        (which may refuse it by raising), then queue it."""
        with self.lock:
            waiting = self._waiting() + self.preparing
            if waiting >= self.max_queue:
                raise QueueFull(f"the queue is full ({waiting} runs waiting); try again shortly", retry_after_s=5)
            mine = sum(1 for r in self.active.values() if r.owner == owner)
            if mine >= self.max_per_client:
                raise QueueFull(f"this client already has {mine} runs running or queued (at most "
                                f"{self.max_per_client}); wait for one to finish or cancel it", retry_after_s=2)
            run = Run(id=new_id("run"), request=request, owner=owner,
                      deadline=time.monotonic() + self.unclaimed_grace_s)
            self.runs[run.id] = self.active[run.id] = run
            self.preparing += 1
        try:
            if prepare is not None:
                prepare(request)
        except BaseException:
            with self.lock:
                self.preparing -= 1
                del self.runs[run.id], self.active[run.id]
            raise
        with self.lock:
            self.preparing -= 1
            if share:
                self._share(run)
            if self.stopping:
                self._end(run, CANCELLED)
                return run
            self.queues[device].append(run)
            self.metrics.queue_length.set(self._waiting())
            self.lock.notify_all()
        return run

    def get(self, run_id: str, owner: str) -> Run | None:
        """The run, for its owner only (anyone else gets None, as for a run that does not exist)."""
        run = self.runs.get(run_id)
        return run if run is not None and run.owner == owner else None

    def watched(self, share_id: str) -> Run | None:
        return self.shared.get(share_id)

    def share(self, run: Run) -> str | None:
        """The run's share id (made on first call); None once the run is forgotten."""
        with self.lock:
            return self._share(run) if run.id in self.runs else None

    def _share(self, run: Run) -> str:
        if run.share_id is None:
            run.share_id = new_id("watch")
            self.shared[run.share_id] = run
        return run.share_id

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
                    self._end(run, CANCELLED)
                    self._queue_changed()
        run.touch()

    def listen(self, run: Run, owner: bool = True) -> None:
        if owner:
            with self.lock:
                run.listeners += 1
                run.deadline = None

    def leave(self, run: Run, owner: bool = True) -> None:
        """A listener left; when it was the owner's last stream, the run is cancelled unless the owner listens
        again within the grace period (a client resuming a dropped stream with Last-Event-ID)."""
        if owner:
            with self.lock:
                run.listeners -= 1
                if run.listeners == 0 and not run.done:
                    run.deadline = time.monotonic() + self.disconnect_grace_s
                    self.lock.notify_all()  # the reaper's next deadline may be this one

    def queue_length(self) -> int:
        with self.lock:
            return self._waiting()

    def kept_runs(self) -> tuple[int, int]:
        """(finished runs kept, their bytes)."""
        with self.lock:
            return len(self.kept), self.kept_bytes

    # ------------------------------------------------------------------------------------- lifetimes

    def _waiting(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def _end(self, run: Run, state: str, error: str | None = None, refused: bool = False) -> None:
        """Finish the run and keep it for late listeners, within the budget."""
        if run.finish(state, error, refused):
            with self.lock:
                self.active.pop(run.id, None)
                self.kept[run.id] = run
                self.kept_bytes += run.size
                self._forget(time.monotonic())

    def _forget(self, now: float) -> None:
        """Drop the oldest finished runs while they are over the byte budget or older than the time to live
        (their open streams read on to the end: a listener holds its run)."""
        while self.kept:
            oldest = next(iter(self.kept.values()))
            if self.kept_bytes <= self.keep_bytes and oldest.finished + self.keep_s > now:
                return
            self.kept.popitem(last=False)
            self.kept_bytes -= oldest.size
            self.runs.pop(oldest.id, None)
            if oldest.share_id is not None:
                self.shared.pop(oldest.share_id, None)

    def _reap(self) -> None:
        """The one thread that acts on time: cancels the runs whose owner has not listened within their grace,
        and forgets the finished runs past their time to live."""
        with self.lock:
            while not self.stopping:
                now = time.monotonic()
                for run in [r for r in self.active.values() if r.deadline is not None and r.deadline <= now]:
                    run.deadline = None
                    if run.listeners == 0:
                        self.cancel(run)
                self._forget(now)
                wake = [r.deadline for r in self.active.values() if r.deadline is not None]
                if self.kept:
                    wake.append(next(iter(self.kept.values())).finished + self.keep_s)
                self.lock.wait(timeout=min([REAPER_IDLE_S] + [max(w - now, 0.005) for w in wake]))

    # ------------------------------------------------------------------------------------------ worker

    def _queue_changed(self) -> None:
        self.metrics.queue_length.set(self._waiting())
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
                self._end(run, FAILED, f"the service failed ({type(err).__name__}): {err}")

    def _run(self, run: Run) -> None:
        stream, ended = None, False
        try:
            stream = self.decode(run)
            for event in stream:
                data = ev.to_dict(event)
                if run.cancel_requested and data["type"] != "done":
                    self._end(run, CANCELLED)
                    return
                run.append(encoded(data))
                if data["type"] == "step":
                    self.metrics.observe_step(data)
                elif data["type"] == "done":
                    self.metrics.observe_done(run.request.model, run.request.drafter, data)
                    ended = True
            # no done event: the engine saw the cancel flag between a long prompt's prefill chunks
            self._end(run, CANCELLED if run.cancel_requested and not ended else DONE)
        except SpecvizError as err:  # a request the engine refuses (a prompt past the context, ...)
            self._end(run, FAILED, str(err), refused=True)
        except Exception as err:  # an engine bug: the run fails, the service goes on
            self._end(run, FAILED, f"the engine failed ({type(err).__name__}): {err}")
        finally:
            if stream is not None and hasattr(stream, "close"):
                try:
                    stream.close()
                except Exception:  # closing a failed generator: nothing more to free
                    pass
