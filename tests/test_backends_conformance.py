"""Every registered backend, opened by its address through open_backend, runs the same cases: it describes itself,
streams a short greedy run whose events are the engine's event types, fails with a clear SpecvizError for a
drafter it does not have and for an address where nothing answers, decodes a ready Run handed to its stream, frees
its engine when the stream is closed early, and its events carry what its capabilities declare and no more. The
remote ones run against their stand-ins: a `specviz serve` in this process (tests/serving.py), the vLLM stand-in
(tests/fake_vllm.py) and the llama-server stand-in (tests/fake_llamacpp.py).

A new engine adds its case to ENGINES (tests/test_toy_backend.py shows one that lives outside the package)."""
from __future__ import annotations

import concurrent.futures
import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager

import fake_llamacpp
import pytest
from fake_vllm import Served
from serving import Running, free_port

from specviz import bench
from specviz.backends import COUNTS, OPENERS, Backend, Run, open_backend
from specviz.decoding import events as ev
from specviz.errors import SpecvizError
from specviz.serve.http import Service

PROMPT = "one two one two one two one two"  # repeats: prompt lookup drafts from it
NEW = 6  # tokens per run (the vLLM stand-in's chat run commits 6)
PATIENCE_S = 60  # a run that takes longer than this here is a run that hangs


@dataclass
class Engine:
    """A backend's case: `up(tmp_path)` starts its stand-in (none for the local engine) and gives its address and
    the options to open it with; `nowhere(tmp_path)` is an address of its kind where nothing answers."""

    up: Callable[..., ContextManager[tuple[str, dict]]]
    nowhere: Callable[..., str]


@contextlib.contextmanager
def local_engine(tiny_model_dir, tiny_models):
    yield f"local:{tiny_model_dir}", {"device": "cpu"}


@contextlib.contextmanager
def service_engine(tiny_model_dir, tiny_models):
    with Running(Service({"tiny": tiny_models})) as running:
        yield running.url, {}


@contextlib.contextmanager
def vllm_engine(tiny_model_dir, tiny_models):
    with Served() as server:
        yield "vllm+" + server.url, {}


@contextlib.contextmanager
def llamacpp_engine(tiny_model_dir, tiny_models):
    with fake_llamacpp.Served() as server:
        yield "llama+" + server.url, {}


ENGINES = {
    "local": Engine(local_engine, lambda tmp: f"local:{tmp / 'no-model-here'}"),
    "service": Engine(service_engine, lambda tmp: f"http://127.0.0.1:{free_port()}"),
    "vllm": Engine(vllm_engine, lambda tmp: f"vllm+http://127.0.0.1:{free_port()}"),
    "llamacpp": Engine(llamacpp_engine, lambda tmp: f"llama+http://127.0.0.1:{free_port()}"),
}


def opener_of(address: str):
    return OPENERS[max((p for p in OPENERS if address.startswith(p)), key=len)]


# ------------------------------------------------------------------------------------------------ the cases


def in_time(call: Callable, *args, **kwargs):
    """call(*args, **kwargs), failing the test instead of hanging it."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(call, *args, **kwargs).result(timeout=PATIENCE_S)


def drafting(backend: Backend) -> str | None:
    """A drafter that drafts on PROMPT where the backend lets a run choose; else its own (None)."""
    if not backend.capabilities.drafter_choice:
        return None
    return "ngram" if "ngram" in backend.drafters() else next(d for d in backend.drafters() if d != "none")


def check_describe(backend: Backend) -> None:
    row = backend.describe()
    assert {"name", "engine", "device", "dtype", "detail", "drafters", "where"} <= set(row)
    assert row["name"] == backend.name and row["detail"] == backend.detail
    assert backend.detail == backend.capabilities.detail
    assert backend.drafters() and set(backend.drafters()) <= set(row["drafters"])
    assert backend.name in backend.served() and backend.where()


def check_greedy_run(backend: Backend) -> list[dict]:
    """A short greedy run: a Start, Steps, a Done, each valid and each the engine's own type once parsed; the same
    tokens a second time."""
    events = in_time(backend.run, PROMPT, drafter=drafting(backend), max_new_tokens=NEW, temperature=0.0)
    parsed = [ev.from_dict(e) for e in events]
    for event in events:
        ev.validate(event)
    assert isinstance(parsed[0], ev.Start) and isinstance(parsed[-1], ev.Done)
    assert parsed[1:-1] and all(isinstance(e, ev.Step) for e in parsed[1:-1])
    assert parsed[0].engine == backend.engine and parsed[0].detail == backend.detail
    assert 0 < len(parsed[-1].token_ids) <= NEW
    again = in_time(backend.run, PROMPT, drafter=drafting(backend), max_new_tokens=NEW, temperature=0.0)
    assert again[-1]["token_ids"] == events[-1]["token_ids"]
    return events


def check_a_ready_run(backend: Backend, events: list[dict]) -> None:
    """A Run built once (Run.of) and handed to stream gives the run that the convenience arguments give."""
    run = Run.of(PROMPT, drafter=drafting(backend), max_new_tokens=NEW, temperature=0.0)
    streamed = in_time(lambda: [ev.to_dict(e) for e in backend.stream(run)])
    assert streamed[0]["type"] == "start" and streamed[-1]["type"] == "done"
    assert streamed[-1]["token_ids"] == events[-1]["token_ids"]


def check_capabilities_match_events(backend: Backend, events: list[dict]) -> None:
    """What the events carry is what the capabilities say: no tree where it shows none, no q where it has none,
    counts where its detail is COUNTS; watch links, the bench and the models only where declared."""
    caps = backend.capabilities
    steps = [e for e in events if e["type"] == "step"]
    nodes = [n for s in steps for n in s.get("nodes") or []]
    tests = [t for s in steps for t in s.get("tests") or []]
    if caps.tree:
        assert nodes, "it says it shows the tree, and no step carries one"
    else:
        assert not nodes and not tests and not any(s.get("target") for s in steps)
    if not caps.q_values:
        assert all(t.get("q") is None for t in tests) and all(n.get("q") is None for n in nodes)
    if caps.detail == COUNTS:
        assert all(s["accepted"] is not None for s in steps)
    if caps.watch:
        shared: list[str] = []
        run = in_time(backend.run, PROMPT, drafter=drafting(backend), max_new_tokens=NEW, temperature=0.0,
                      on_shared=shared.append)
        watched = in_time(lambda: [ev.to_dict(e) for e in backend.watch(shared[0])])
        assert [e["type"] for e in watched] == [e["type"] for e in run]
    else:
        with pytest.raises(SpecvizError):
            in_time(lambda: list(backend.watch("no-such-run")))
    if caps.bench:
        assert backend.models_here() is not None
        with backend.exclusive() as held:
            assert in_time(held.run, PROMPT, drafter="none", max_new_tokens=2)[-1]["type"] == "done"
    else:
        with pytest.raises(SpecvizError, match="where it runs"):
            bench.run_bench(backend, bench.load_prompts(limit=1))
    if not caps.bandwidth_probe:
        with pytest.raises(SpecvizError, match="not in this process"):
            backend.models_here()
    if not caps.drafter_choice:
        assert len(backend.drafters()) == 1


def check_bad_drafter(backend: Backend) -> None:
    with pytest.raises(SpecvizError, match="no-such-drafter"):
        in_time(backend.run, PROMPT, drafter="no-such-drafter", max_new_tokens=2)


def check_unreachable(address: str, options: dict) -> None:
    with pytest.raises(SpecvizError):
        in_time(open_backend, address, **options)


def check_cancel_by_closing(backend: Backend) -> None:
    """Closing the stream after its first step frees the engine: the next run finishes."""
    with backend.events(PROMPT, drafter=drafting(backend), max_new_tokens=NEW, temperature=0.0) as stream:
        first = [next(stream), next(stream)]
    assert [e.type for e in first] == ["start", "step"]
    assert in_time(backend.run, PROMPT, drafter=drafting(backend), max_new_tokens=2)[-1]["type"] == "done"


def conform(engine: Engine, tmp_path, tiny_model_dir, tiny_models) -> None:
    """Every case, on one engine."""
    with engine.up(tiny_model_dir, tiny_models) as (address, options):
        backend = open_backend(address, **options)
        assert isinstance(backend, Backend)
        check_describe(backend)
        events = check_greedy_run(backend)
        check_a_ready_run(backend, events)
        check_capabilities_match_events(backend, events)
        check_bad_drafter(backend)
        check_cancel_by_closing(backend)
    check_unreachable(engine.nowhere(tmp_path), options)


# ------------------------------------------------------------------------------------------------ the tests


@pytest.mark.parametrize("name", list(ENGINES))
def test_every_backend_conforms(name, tmp_path, tiny_model_dir, tiny_models):
    conform(ENGINES[name], tmp_path, tiny_model_dir, tiny_models)


def test_every_registered_opener_has_a_case(tmp_path, tiny_model_dir, tiny_models):
    covered = set()
    for engine in ENGINES.values():
        covered.add(opener_of(engine.nowhere(tmp_path)))
    assert set(OPENERS.values()) == covered, "a registered backend has no case in ENGINES"


def test_an_unknown_address_names_the_ones_there_are():
    with pytest.raises(SpecvizError, match="unknown backend address 'ftp://x'.*local:MODEL"):
        open_backend("ftp://x")


def test_a_remote_backend_refuses_a_local_models_options():
    with Served() as server, pytest.raises(SpecvizError, match="vllm backend takes no weights"):
        open_backend("vllm+" + server.url, weights="q4")


def test_a_false_capability_is_caught(tmp_path, tiny_model_dir, tiny_models, monkeypatch):
    """The check can fail: the vLLM backend claiming the tree is caught by its events, the local one denying its
    models by models_here."""
    from specviz.backends.base import Capabilities
    from specviz.backends.local import LocalBackend
    from specviz.backends.vllm import VllmBackend

    monkeypatch.setattr(VllmBackend, "capabilities", Capabilities(detail=COUNTS, drafter_choice=False))
    with pytest.raises(AssertionError, match="no step carries one"):
        conform(ENGINES["vllm"], tmp_path, tiny_model_dir, tiny_models)
    monkeypatch.setattr(LocalBackend, "capabilities", Capabilities(bench=True, bandwidth_probe=False))
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        conform(ENGINES["local"], tmp_path, tiny_model_dir, tiny_models)
