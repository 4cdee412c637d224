"""The service's Python client where every connection of the service is busy: a 503 (the service read nothing of
the request) is asked again after its Retry-After, a bounded number of times, for requests and event streams."""
import contextlib
import json

import httpx
import pytest

from specviz.backends import client as client_module
from specviz.backends.client import Client
from specviz.errors import SpecvizError

BUSY = httpx.Response(503, headers={"Retry-After": "0"}, json={"error": {"message": "all busy", "status": 503}})


def scripted(responses: list[httpx.Response], calls: list):
    def request(method, url, **kwargs):
        calls.append((method, url))
        return responses.pop(0)
    return request


def test_a_request_refused_as_busy_is_sent_again_after_retry_after(monkeypatch):
    calls, slept = [], []
    monkeypatch.setattr(client_module.time, "sleep", slept.append)
    monkeypatch.setattr(httpx, "request", scripted([BUSY, BUSY, httpx.Response(200, json={"models": [{"name": "m"}]})],
                                                   calls))
    assert Client("http://127.0.0.1:9", retries=3).models() == [{"name": "m"}]
    assert len(calls) == 3 and slept == [0.0, 0.0]


def test_busy_past_the_retries_is_a_clear_error_and_retry_after_is_bounded(monkeypatch):
    calls, slept = [], []
    monkeypatch.setattr(client_module.time, "sleep", slept.append)
    long_wait = httpx.Response(503, headers={"Retry-After": "3600"}, json={"error": {"message": "all busy"}})
    monkeypatch.setattr(httpx, "request", scripted([long_wait, long_wait], calls))
    with pytest.raises(SpecvizError, match=r"refused the request \(503\): all busy"):
        Client("http://127.0.0.1:9", retries=1).models()
    assert len(calls) == 2 and slept == [client_module.BUSY_WAIT_MAX_S]


def test_other_refusals_are_not_sent_again(monkeypatch):
    calls = []
    monkeypatch.setattr(httpx, "request", scripted([httpx.Response(429, json={"error": {"message": "queue full"}})],
                                                   calls))
    with pytest.raises(SpecvizError, match="429"):
        Client("http://127.0.0.1:9").models()
    assert len(calls) == 1


class StreamResponse:
    def __init__(self, status: int, lines=(), headers=None):
        self.status_code, self.lines = status, list(lines)
        self.headers = httpx.Headers(headers or {})

    def iter_lines(self):
        return iter(self.lines)

    def read(self):
        return b""

    def json(self):
        return {"error": {"message": "all busy"}}


def test_an_event_stream_refused_as_busy_is_opened_again(monkeypatch):
    done = {"type": "done", "text": "hi", "token_ids": [1], "stop_reason": "eos", "stats": {}, "text_delta": ""}
    answers = [StreamResponse(503, headers={"Retry-After": "0"}),
               StreamResponse(200, ["id: 0", f"data: {json.dumps(done)}", ""])]
    opened = []

    @contextlib.contextmanager
    def stream(method, url, **kwargs):
        opened.append(url)
        yield answers.pop(0)

    monkeypatch.setattr(client_module.time, "sleep", lambda s: None)
    monkeypatch.setattr(httpx, "stream", stream)
    events = list(Client("http://127.0.0.1:9").events("run1"))
    assert [e["type"] for e in events] == ["done"] and len(opened) == 2
