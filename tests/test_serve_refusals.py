"""What a refusal costs and says: a prompt that cannot fit is refused from cheap bounds before it is tokenized,
and no error message repeats more than 60 characters of what the client sent, whatever the error."""
from __future__ import annotations

import re

import httpx
import pytest
from serving import Running, post

from specviz.serve import validate
from specviz.serve.guard import ECHO_CHARS
from specviz.serve.http import Service

SENT = "Q"  # the client's text in every case below: no message of the service's own has a run of it


@pytest.fixture(scope="module")
def served(tiny_models):
    with Running(Service({"tiny": tiny_models}, max_queue=64, max_per_client=64)) as running:
        yield running


def echoed(response: httpx.Response) -> int:
    """How many of the client's characters the error message repeats, in all."""
    return sum(len(run) for run in re.findall(f"{SENT}+", response.json()["error"]["message"]))


LONG = SENT * 1000
RUN_BODIES = {
    "an unknown drafter": {"drafter": SENT * 250},
    "a drafter string too long": {"drafter": LONG},
    "a drafter option that is not KEY=VALUE": {"drafter": "ngram:" + SENT * 240},
    "many unknown options in the drafter string": {"drafter": "ngram:" + ":".join(f"{SENT * 28}{i}=1" for i in range(7))},  # 229 characters
    "many unknown drafter_options": {"drafter_options": {f"{SENT * 30}{i:02}": 1 for i in range(20)}},
    "a drafter option name too long": {"drafter_options": {LONG: 1}},
    "a drafter option value too long": {"drafter_options": {"k": LONG}},
    "a drafter option of the wrong type": {"drafter": "ngram:k=" + SENT * 30},
    "an unknown model": {"model": LONG},
    "an unknown field": {LONG: 1},
    "many unknown fields": {f"{SENT * 100}{i}": 1 for i in range(6)},
    "a field of the wrong type": {"max_new_tokens": LONG},
    "a message of an unknown role": {"prompt": None, "messages": [{"role": LONG, "content": "hi"}]},
}


@pytest.mark.parametrize("case", list(RUN_BODIES))
def test_a_run_refused_repeats_at_most_60_characters_of_the_request(served, case):
    response = post(served.url, {"prompt": "abc", "model": "tiny", "max_new_tokens": 2, **RUN_BODIES[case]})
    assert 400 <= response.status_code < 500 and response.status_code != 429, response.text
    assert 0 < echoed(response) <= ECHO_CHARS or SENT not in response.text, response.json()["error"]["message"]


CHAT_BODIES = {
    "an unknown drafter": {"specviz": {"drafter": SENT * 250}},
    "a drafter that is not text": {"specviz": {"drafter": 5, SENT * 30: 1}},
    "k that is not a number": {"specviz": {"k": LONG}},
    "many unknown options": {"specviz": {f"{SENT * 30}{i:02}": 1 for i in range(20)}},
    "a message of an unknown role": {"messages": [{"role": LONG, "content": "hi"}]},
    "max_tokens of the wrong type": {"max_tokens": LONG},
}


@pytest.mark.parametrize("case", list(CHAT_BODIES))
def test_a_chat_completion_refused_repeats_at_most_60_characters(served, case):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **CHAT_BODIES[case]}
    response = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=30)
    assert 400 <= response.status_code < 500, response.text
    assert echoed(response) <= ECHO_CHARS, response.json()["error"]["message"]


@pytest.mark.parametrize("path,headers", [
    (f"/v1/runs/{LONG}", {}), (f"/v1/runs/{LONG}/events", {}), (f"/v1/watch/{LONG}", {}),
    (f"/v1/watch/{LONG}/events", {}), ("/healthz", {"Host": LONG}),
])
def test_a_refused_address_repeats_at_most_60_characters(served, path, headers):
    response = httpx.get(served.url + path, headers=headers, timeout=30)
    assert 400 <= response.status_code < 500 and echoed(response) <= ECHO_CHARS, response.text


def test_a_bad_last_event_id_repeats_at_most_60_characters(served):
    run_id = post(served.url, {"prompt": "abc", "model": "tiny", "max_new_tokens": 2}).json()["run_id"]
    response = httpx.get(f"{served.url}/v1/runs/{run_id}/events", headers={"Last-Event-ID": LONG}, timeout=30)
    assert response.status_code == 400 and echoed(response) <= ECHO_CHARS


def test_a_conversation_that_cannot_fit_is_refused_without_tokenizing(served, monkeypatch):
    tokenized = []
    encode = validate.encode_prompt
    monkeypatch.setattr(validate, "encode_prompt", lambda *a, **k: tokenized.append(len(a[1])) or encode(*a, **k))
    many = [{"role": "user", "content": "x"}] * 8500  # 255 KB of JSON; each message costs its template's tokens
    response = post(served.url, {"messages": many, "model": "tiny", "max_new_tokens": 2})
    assert response.status_code == 400 and "8,500 messages" in response.json()["error"]["message"]
    assert tokenized == []
    # where the bounds cannot tell (at least 2,040 tokens, at most 2,896), it is tokenized, then refused
    response = post(served.url, {"messages": many[:340], "model": "tiny", "max_new_tokens": 2})
    assert response.status_code == 400 and "exceeds tiny's context" in response.json()["error"]["message"]
    assert tokenized == [340]
