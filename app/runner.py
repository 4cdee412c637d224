"""Fetches that run in a background thread, so that a page rerun (a touched widget, another page) cannot stop
them. (The model every session shares is a specviz.backends.local.LocalBackend, whose lock keeps runs from
overlapping.) No streamlit here: the tests drive it from plain threads.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from specviz import models as m
from specviz.errors import SpecvizError


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
