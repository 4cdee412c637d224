"""What a client of `specviz serve` cannot do to it: pin memory, read or cancel another client's runs, get a 5xx
or an unbounded echo from any input, or reach the API through a name it does not answer to."""
from __future__ import annotations

import json

import httpx
import pytest
import torch
from serving import Running, post

from specviz.backends.client import Client
from specviz.kernels import fastlinear
from specviz.models.heads import EagleHead
from specviz.models.loading import LoadedModels
from specviz.serve.http import Service

from tiny import TinyTokenizer, tiny_llama


@pytest.fixture(scope="module")
def headed():
    """A tiny target with a random EAGLE head whose trained draft vocabulary is in frequency order."""
    target = tiny_llama(vocab_size=64, scale=3.0)
    torch.manual_seed(0)
    eagle = EagleHead(target.config).eval()
    for p in eagle.parameters():
        p.data.normal_(0, 0.3)
    eagle.draft_vocab = torch.randperm(64, generator=torch.Generator().manual_seed(1))
    return LoadedModels("tiny-eagle", target, None, TinyTokenizer(64), target.device, target.dtype, eagle=eagle)


def test_a_client_cannot_pin_memory_with_a_drafter_option(headed):
    """Each distinct draft_vocab once built a packed LM-head copy kept for the life of the process."""
    with Running(Service({"tiny": headed}, max_queue=64, max_per_client=64)) as running:
        before = len(fastlinear._projections)
        for n in range(5, 25):
            for body in ({"drafter": "eagle2", "drafter_options": {"draft_vocab": n}}, {"drafter": f"eagle2:draft_vocab={n}"}):
                response = post(running.url, {"prompt": "abc", "chat": False, "max_new_tokens": 2, **body})
                assert response.status_code == 400 and "not offered" in response.json()["error"]["message"]
        assert len(fastlinear._projections) <= before + 1


def test_the_row_projection_cache_is_bounded():
    weight = torch.randn(64, 8)
    held = [fastlinear.rows_projection(weight, torch.arange(n)) for n in range(1, 41)]  # drafters holding them
    assert sum(key[0] == id(weight) for key in fastlinear._projections) <= fastlinear.MAX_PROJECTIONS
    assert fastlinear.rows_projection(weight, torch.arange(40)) is held[-1]  # the most recent are reused


# ------------------------------------------------------------------------------------------ bad inputs

@pytest.fixture(scope="module")
def served(tiny_models):
    with Running(Service({"tiny": tiny_models}, max_queue=32, max_per_client=8, disconnect_grace_s=0.5)) as running:
        yield running


def raw_post(url: str, path: str, body, headers: dict | None = None) -> httpx.Response:
    """JSON as json.dumps writes it: a lone surrogate goes as the escape \\ud800, as any JSON may carry it."""
    return httpx.post(url + path, content=json.dumps(body).encode(), timeout=60,
                      headers={"Content-Type": "application/json", **(headers or {})})


def refused(response: httpx.Response, status: int | None = None, says: str = "") -> str:
    """A 4xx with the one error shape, a short message that says `says`; the message."""
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    assert status is None or response.status_code == status, (response.status_code, response.text[:300])
    message = response.json()["error"]["message"]
    assert len(message) <= 700 and says in message, message[:300]
    return message


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
BAD_INPUTS = [  # path, body, what the message says
    ("/v1/runs", {"prompt": "hi", "drafter": "ngram:\ud800"}, "Unicode"),
    ("/v1/runs", {"prompt": "hi \ud800 there"}, "Unicode"),
    ("/v1/runs", {"messages": [{"role": "user", "content": "\udfff"}]}, "Unicode"),
    ("/v1/runs", {"prompt": "hi", "drafter_options": {"\ud800": 1}}, "Unicode"),
    ("/v1/runs", {"prompt": "hi", "seed": 2**70}, "seed"),
    ("/v1/runs", {"prompt": "hi", "seed": -1}, "seed"),
    ("/v1/runs", {"prompt": "hi", "temperature": 1e-45}, "temperature"),
    ("/v1/runs", {"prompt": "hi", "top_k": 2**70}, "top_k"),
    ("/v1/runs", {"prompt": "hi", "drafter_options": {"x" * 100_000: 1}}, "at most 32"),
    ("/v1/runs", {"prompt": "hi", "y" * 100_000: 1}, "bad request"),
    ("/v1/runs", {"prompt": "hi", "model": "m" * 100_000}, "not loaded"),
    ("/v1/runs", {"prompt": "hi", "drafter": "ngram:" + "k" * 100_000}, "at most 256"),
    ("/v1/runs", {"prompt": "hi", "drafter": "ngram:" + "k" * 200}, "KEY=VALUE"),
    ("/v1/runs", {"prompt": "   "}, "empty"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "seed": 2**70}, "seed"),
    ("/v1/chat/completions", {**CHAT, "temperature": 1e-45}, "temperature"),
    ("/v1/chat/completions", {**CHAT, "specviz": {"drafter": "ngram:\ud800"}}, "Unicode"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "\ud800"}]}, "Unicode"),
]


@pytest.mark.parametrize("path,body,says", BAD_INPUTS, ids=[str(i) for i in range(len(BAD_INPUTS))])
def test_every_bad_input_is_a_4xx_with_a_short_message(served, path, body, says):
    message = refused(raw_post(served.url, path, body), says=says)
    assert "TypeError" not in message and "TextEncodeInput" not in message  # no engine internals


def test_json_nan_and_a_long_last_event_id_are_refused_shortly(served):
    for field in ("temperature", "top_p"):
        response = httpx.post(served.url + "/v1/runs", content=b'{"prompt": "hi", "%s": NaN}' % field.encode(),
                              headers={"Content-Type": "application/json"})
        refused(response, says=field)
    run_id = post(served.url, {"prompt": "abc", "model": "tiny", "max_new_tokens": 2}).json()["run_id"]
    for header in ("9" * 70_000, "1e3", "-1", "x"):
        refused(httpx.get(f"{served.url}/v1/runs/{run_id}/events", headers={"Last-Event-ID": header}), 400,
                "Last-Event-ID")


def test_the_widest_seed_and_the_temperature_floor_are_taken(served):
    for body in ({"seed": 2**64 - 1, "temperature": 1.0}, {"temperature": 0.01}, {"temperature": 0.0}):
        events = list(Client(served.url).stream("abc abc", model="tiny", max_new_tokens=4, **body))
        assert events[-1].type == "done" and len(events[-1].token_ids) == 4


def test_a_chat_request_without_k_gets_the_decode_settings_default(monkeypatch):
    from specviz.decoding.settings import DecodeSettings
    from specviz.serve.validate import ChatBody, Limits, chat_run_body

    body = ChatBody(messages=[{"role": "user", "content": "hi"}])
    monkeypatch.setattr(DecodeSettings, "k", 6)  # the default, wherever it is set, not a number written again here
    assert chat_run_body(body, "ngram", Limits()).k == 6
    assert chat_run_body(body.model_copy(update={"specviz": {"k": 3}}), "ngram", Limits()).k == 3


def test_chat_max_tokens_is_what_it_says(served):
    whole = httpx.post(served.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 3}, timeout=60).json()
    assert whole["usage"]["completion_tokens"] <= 3


# -------------------------------------------------------------------------------------------- exposure

TOKEN = "a-long-random-token-for-tests"


def test_the_schema_is_behind_the_token_and_there_is_no_docs_page(tiny_models):
    with Running(Service({"tiny": tiny_models}, token=TOKEN)) as running:
        assert httpx.get(running.url + "/openapi.json").status_code == 401
        schema = httpx.get(running.url + "/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"})
        assert schema.status_code == 200 and "/v1/runs" in schema.json()["paths"]
        for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            assert httpx.get(running.url + page, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 404


def test_only_the_allowed_host_names_are_answered(tiny_models):
    """A web page that points its own domain at 127.0.0.1 (DNS rebinding) sends its domain as the Host."""
    with Running(Service({"tiny": tiny_models}, allowed_hosts=("gpu-box",))) as running:
        port = running.url.rsplit(":", 1)[1]
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "", "[::2]:80"):
            refused(httpx.get(running.url + "/v1/models", headers={"Host": host}), 400, "does not answer")
        refused(httpx.post(running.url + "/v1/runs", json={"prompt": "hi"}, headers={"Host": "evil.example"}), 400)
        for host in (f"localhost:{port}", "LOCALHOST", f"127.0.0.1:{port}", "127.0.0.7", "[::1]:8000", "gpu-box:8000",
                     "gpu-box."):
            assert httpx.get(running.url + "/v1/models", headers={"Host": host}).status_code == 200, host
