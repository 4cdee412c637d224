"""A run's life on `specviz serve`: it belongs to the client that made it, its id cannot be guessed, its events
are kept compactly and only while the service's byte budget and time to live allow, one reaper thread acts on
time, nothing is built for a request that the queue refuses, and a whole chat completion stops when its client
leaves."""
from __future__ import annotations

import importlib
import json
import re
import sys
import threading
import time

import httpx
import pytest
from serving import Running, post

from specviz.serve.http import Service


def owner(name: str) -> dict:
    return {"X-Specviz-Client": name}


def state(url: str, run_id: str, who: str) -> str:
    return httpx.get(f"{url}/v1/runs/{run_id}", headers=owner(who), timeout=10).json()["state"]


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture(scope="module")
def served(tiny_models):
    with Running(Service({"tiny": tiny_models}, max_queue=32, max_per_client=8, disconnect_grace_s=0.5)) as running:
        yield running


def test_another_client_gets_404_for_a_run_and_cannot_cancel_it(served):
    run_id = post(served.url, {"prompt": "abc", "model": "tiny", "max_new_tokens": 300}, headers=owner("alice")).json()["run_id"]
    assert re.fullmatch(r"run-[A-Za-z0-9_-]{22}", run_id)  # 128 random bits, no counter
    from_elsewhere = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"))  # another address
    for client, headers in ((httpx, owner("bob")), (httpx, {}), (from_elsewhere, owner("alice"))):
        for method, path in (("GET", ""), ("GET", "/events"), ("GET", "/events.jsonl"), ("DELETE", ""),
                             ("POST", "/share")):
            response = client.request(method, f"{served.url}/v1/runs/{run_id}{path}", headers=headers, timeout=10)
            assert response.status_code == 404 and "of yours" in response.json()["error"]["message"], (method, path)
    time.sleep(served.service.scheduler.disconnect_grace_s + 0.5)  # a stranger's stream did not cancel it
    assert state(served.url, run_id, "alice") in ("queued", "running", "done")
    assert httpx.delete(f"{served.url}/v1/runs/{run_id}", headers=owner("alice")).status_code == 200


def test_one_reaper_thread_instead_of_a_timer_per_run(served):
    before = threading.active_count()
    for i in range(30):  # each of them once started a 30-s timer thread
        run_id = post(served.url, {"prompt": "abc", "model": "tiny", "max_new_tokens": 200},
                      headers=owner(f"churn-{i}")).json()["run_id"]
        httpx.delete(f"{served.url}/v1/runs/{run_id}", headers=owner(f"churn-{i}"))
    assert threading.active_count() <= before + 2


def deep_size(value) -> int:
    """Bytes held by a structure of dicts, lists, strings and numbers."""
    if isinstance(value, dict):
        return sys.getsizeof(value) + sum(deep_size(k) + deep_size(v) for k, v in value.items())
    if isinstance(value, list):
        return sys.getsizeof(value) + sum(deep_size(v) for v in value)
    return sys.getsizeof(value)


def test_events_are_kept_compactly(served):
    run_id = post(served.url, {"prompt": "abc abc abc", "model": "tiny", "max_new_tokens": 24, "n_top": 20},
                  headers=owner("compact")).json()["run_id"]
    lines = httpx.get(f"{served.url}/v1/runs/{run_id}/events.jsonl", headers=owner("compact"), timeout=60).text
    json_bytes = sum(len(json.dumps(json.loads(line), ensure_ascii=False, separators=(",", ":")).encode())
                     for line in lines.splitlines())
    run = served.service.scheduler.runs[run_id]
    assert deep_size(run.events) < 1.3 * json_bytes  # parsed events took about 4 times their JSON


def test_finished_runs_are_kept_within_a_byte_budget_and_a_time_to_live(tiny_models):
    service = Service({"tiny": tiny_models}, max_per_client=50, keep_bytes=150_000, keep_s=3.0)
    with Running(service) as running:
        body = {"prompt": "abc abc abc", "model": "tiny", "max_new_tokens": 16, "n_top": 20}
        ids = []
        for _ in range(8):
            ids.append(post(running.url, body).json()["run_id"])
            httpx.get(f"{running.url}/v1/runs/{ids[-1]}/events.jsonl", timeout=60)
            kept, kept_bytes = service.scheduler.kept_runs()
            assert kept_bytes <= 150_000
        assert 0 < kept < 8
        assert httpx.get(f"{running.url}/v1/runs/{ids[0]}").status_code == 404  # the oldest went first
        assert httpx.get(f"{running.url}/v1/runs/{ids[-1]}").json()["state"] == "done"
        wait_for(lambda: httpx.get(f"{running.url}/v1/runs/{ids[-1]}").status_code == 404, 3.0 + 3,
                 "a finished run outlived its time to live")
        assert service.scheduler.kept_runs() == (0, 0)


def counting(monkeypatch, name: str, modules: list[str]) -> list:
    """Count the calls of `name` wherever these modules import it."""
    calls = []
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # not in this layout of the service
            continue
        real = getattr(module, name, None)
        if real is not None:
            def counted(*args, _real=real, **kwargs):
                calls.append(args)
                return _real(*args, **kwargs)
            monkeypatch.setattr(module, name, counted)
    return calls


SERVICE_MODULES = ["specviz.serve.http", "specviz.serve.validate", "specviz.backends.local"]


def test_nothing_is_built_for_a_refused_request_and_nothing_twice_for_a_taken_one(tiny_models, monkeypatch):
    encoded = counting(monkeypatch, "encode_prompt", SERVICE_MODULES)
    built = counting(monkeypatch, "build_drafter", SERVICE_MODULES)
    service = Service({"tiny": tiny_models}, max_queue=1, max_per_client=10)
    with Running(service) as running:
        body = {"prompt": "abc abc abc", "model": "tiny", "max_new_tokens": 300, "drafter": "ngram"}
        first = post(running.url, body).json()["run_id"]
        wait_for(lambda: httpx.get(f"{running.url}/v1/runs/{first}").json()["state"] == "running", 20, "no start")
        second = post(running.url, body).json()["run_id"]  # waits in the queue
        encoded.clear(), built.clear()
        assert post(running.url, body).status_code == 429
        assert (encoded, built) == ([], [])  # refused by the queue: nothing tokenized or built
        for run_id in (first, second):
            httpx.delete(f"{running.url}/v1/runs/{run_id}")
        wait_for(lambda: service.scheduler.queue_length() == 0 and not service.scheduler.active, 20, "not cancelled")
        encoded.clear(), built.clear()
        run_id = post(running.url, {**body, "max_new_tokens": 4}).json()["run_id"]
        httpx.get(f"{running.url}/v1/runs/{run_id}/events.jsonl", timeout=60)
        assert (len(encoded), len(built)) == (1, 1)  # once each, by the engine worker


def test_a_whole_chat_completion_stops_when_its_client_leaves(served):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "abc"}], "max_tokens": 512, "temperature": 1.0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(served.url + "/v1/chat/completions", json=body, headers=owner("leaver"), timeout=1.0)
    runs = [r for r in list(served.service.scheduler.runs.values())
            if r.request.settings.max_new_tokens == 512 and r.request.settings.temperature == 1.0]
    assert len(runs) == 1
    wait_for(lambda: runs[0].done, 10, "the run went on without its client")
    assert runs[0].state == "cancelled" and len(runs[0].events) < 400
