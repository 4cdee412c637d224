"""What a refusal costs and says: a prompt that cannot fit is refused from cheap bounds before it is tokenized,
and no error message repeats more than 60 characters of what the client sent, whatever the error."""
from __future__ import annotations

import json
import random
import re
import threading
import time

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


# ------------------------------------------------------------------------------- numbers past any bound

HUGE = "1" + "0" * 309  # past the largest float: math.isfinite(int) raised OverflowError on it
RUN_HUGE = {  # the field, as the JSON body sends it; what the 400 must name
    "k": ('"k": %s', "k", "from 1 to 16"),
    "a tree option": ('"drafter": "eagle2", "drafter_options": {"depth": %s}', "depth", "from 1 to 12"),
    "an ngram option": ('"drafter": "ngram", "drafter_options": {"max_ngram": %s}', "max_ngram", "from 1 to 8"),
    "a float option": ('"drafter": "medusa", "drafter_options": {"epsilon": %s}', "epsilon", "between 0 and 1"),
    "max_new_tokens": ('"max_new_tokens": %s', "max_new_tokens", "from 1 to 512"),
    "a negative max_new_tokens": ('"max_new_tokens": -%s', "max_new_tokens", "from 1 to 512"),
    "seed": ('"seed": %s', "seed", "from 0 to 18,446,744,073,709,551,615"),
    "top_k": ('"top_k": %s', "top_k", "from 0 to 1,000,000"),
    "n_top": ('"n_top": %s', "n_top", "from 0 to 20"),
}
CHAT_HUGE = {
    "specviz.k": ('"specviz": {"k": %s}', "k", "from 1 to 16"),
    "a drafter option": ('"specviz": {"drafter": "ngram", "max_ngram": %s}', "max_ngram", "from 1 to 8"),
    "max_tokens": ('"max_tokens": %s', "max_tokens", "from 1 to 512"),
    "max_completion_tokens": ('"max_completion_tokens": %s', "max_tokens", "from 1 to 512"),
    "seed": ('"seed": %s', "seed", "from 0 to"),
}


def sent(url: str, path: str, fields: str) -> httpx.Response:
    base = ('{"prompt": "abc", "model": "tiny", %s}' if path == "/v1/runs" else
            '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, %s}')
    return httpx.post(url + path, content=(base % fields).encode(), headers={"Content-Type": "application/json"}, timeout=30)


@pytest.mark.parametrize("path,case", [("/v1/runs", c) for c in RUN_HUGE] + [("/v1/chat/completions", c) for c in CHAT_HUGE])
def test_a_number_past_any_bound_is_a_400_naming_the_option_and_its_bounds(served, path, case):
    field, name, bounds = (RUN_HUGE if path == "/v1/runs" else CHAT_HUGE)[case]
    response = sent(served.url, path, field % HUGE)
    assert response.status_code == 400, response.text[:300]
    message = response.json()["error"]["message"]
    assert name in message and bounds in message, message
    assert max(len(d) for d in re.findall(r"\d+", message)) <= ECHO_CHARS, message


@pytest.mark.parametrize("drafter", ["eagle2:depth=" + "9" * 240, "ngram:max_ngram=" + "9" * 240, "ngram:k=" + "9" * 240])
def test_a_long_number_in_a_drafter_string_is_echoed_cut_short(served, drafter):
    response = post(served.url, {"prompt": "abc", "model": "tiny", "max_new_tokens": 2, "drafter": drafter})
    assert response.status_code == 400, response.text[:300]
    message = response.json()["error"]["message"]
    assert "9" * 20 in message and "…" in message and max(len(d) for d in re.findall("9+", message)) <= ECHO_CHARS


# ---------------------------------------------------------------------- prompts the bounds must refuse

EMOJI = "\U0001F600" * 32_000  # 128,000 bytes, 96,000 tokens: the longest token (162 bytes) bounded it at 791


def test_an_emoji_prompt_past_the_context_is_refused_without_tokenizing(served, monkeypatch):
    tokenized = []
    encode = validate.encode_prompt
    monkeypatch.setattr(validate, "encode_prompt", lambda *a, **k: tokenized.append(len(a[1])) or encode(*a, **k))
    for body in ({"prompt": EMOJI}, {"messages": [{"role": "user", "content": EMOJI}]}, {"prompt": EMOJI, "chat": False}):
        response = httpx.post(served.url + "/v1/runs", timeout=30, headers={"Content-Type": "application/json"},
                              content=json.dumps({**body, "model": "tiny", "max_new_tokens": 2}, ensure_ascii=False))
        assert response.status_code == 400, response.text[:300]
        assert "is at least 64,0" in response.json()["error"]["message"]  # 64,005 with the template's tokens
    assert tokenized == []
    tokenizer = served.service.models["tiny"].tokenizer
    bound = fastest(lambda: validate.fewest_tokens(validate.token_bounds(tokenizer), EMOJI))
    print(f"\n32,000 emoji: their fewest tokens bounded in {bound * 1e3:.1f} ms, tokenized in "
          f"{fastest(lambda: encode(tokenizer, EMOJI, False)) * 1e3:.0f} ms (the fastest of 5 each)")


def fastest(work, times: int = 5) -> float:
    took = []
    for _ in range(times):
        started = time.perf_counter()
        work()
        took.append(time.perf_counter() - started)
    return min(took)


SAMPLED = [*"aeiou tnrsAB  \n\t0123456789.,;!?-_'\"", "\U0001F600", "\U0001F44D\U0001F3FD", "漢", "字", "é", "ß", "Ω",
           "\u200b", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "\r\n", "e\u0301"]


def test_the_fewest_tokens_of_a_text_are_never_more_than_the_tokenizer_gives(tiny_models):
    tokenizer = tiny_models.tokenizer
    bounds = validate.token_bounds(tokenizer)
    assert bounds.byte_weight is not None  # SmolLM2's tokenizer is byte-level BPE: the byte bounds apply
    rng = random.Random(0)
    for _ in range(1500):
        text = "".join(rng.choice(SAMPLED) for _ in range(rng.randint(1, 120)))
        if rng.random() < 0.3:
            text = "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0x80, 0x7FF), rng.randint(0x800, 0xD7FF),
                                           rng.randint(0x10000, 0x10FFFF)])) for _ in range(rng.randint(1, 60)))
        actual = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        assert validate.fewest_tokens(bounds, text) <= actual, text


TOKENIZE_S = 0.4  # each tokenizing made this slow, so that what waits behind it shows


def test_prompts_that_must_be_tokenized_do_not_hold_up_other_clients(tiny_models, monkeypatch):
    """A room of clients sending prompts that only tokenizing can refuse (bounded near the context, past it in
    fact) once held every other client's submit behind them in the threads that admit runs."""
    encode = validate.encode_prompt

    def slow(*args, **kwargs):
        time.sleep(TOKENIZE_S)
        return encode(*args, **kwargs)

    monkeypatch.setattr(validate, "encode_prompt", slow)
    near = "\U0001F600" * 700  # at least 1,400 tokens, at most 2,800 bytes: 2,100 tokens in fact, past 2,048
    with Running(Service({"tiny": tiny_models}, max_queue=64, max_per_client=64)) as running:
        stop, answers = threading.Event(), []

        def flood(i: int) -> None:
            while not stop.is_set():
                answers.append(post(running.url, {"prompt": near, "model": "tiny", "max_new_tokens": 2},
                                    headers={"X-Specviz-Client": f"room-{i}"}).status_code)

        threads = [threading.Thread(target=flood, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        try:
            time.sleep(2 * TOKENIZE_S)  # the flood has filled the threads that tokenize
            took = []
            for i in range(5):
                started = time.monotonic()
                response = post(running.url, {"prompt": "abc", "model": "tiny", "max_new_tokens": 2},
                                headers={"X-Specviz-Client": f"polite-{i}"})
                took.append(time.monotonic() - started)
                assert response.status_code == 201, response.text
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        assert 400 in answers and set(answers) <= {400, 429}, set(answers)
        print(f"\nwith 6 clients looping prompts that take {TOKENIZE_S * 1e3:.0f} ms to tokenize: a short prompt's "
              f"submit took {sorted(took)[2] * 1e3:.0f} ms (median of 5), {answers.count(400)} of theirs refused")
        assert sorted(took)[2] < TOKENIZE_S / 2, took  # the median submit did not wait for even one tokenizing
