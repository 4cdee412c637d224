"""A live service against what a room does to it: thirty viewers of one run with a few that never read, an owner
that reconnects in a loop, a run forgotten while a viewer reads it, and OpenAI fields that would change a
completion."""
from __future__ import annotations

import threading
import time

import httpx
import pytest
from serving import Running, post
from test_serve_connections import raw, small_send_buffers, watch_request

from specviz import Client
from specviz.decoding import events as ev
from specviz.serve.http import Limits, Service

VIEWERS, STALLED = 30, 4


@pytest.mark.slow  # thirty clients parsing a 300-step run: 10-20 s on two cores
def test_a_room_of_viewers_is_served_while_a_few_never_read(tiny_models):
    service = Service({"tiny": tiny_models}, limits=Limits(max_new_tokens=300))
    with small_send_buffers(Running(service, max_connections=VIEWERS + STALLED + 3, write_timeout_s=1.0)) as running:
        port = int(running.url.rsplit(":", 1)[1])
        created = post(running.url, {"prompt": "abc abc abc", "model": "tiny", "max_new_tokens": 300, "temperature": 1.0,
                                     "seed": 3, "n_top": 20, "share": True}, headers={"X-Specviz-Client": "presenter"})
        share_id, run_id = created.json()["share_id"], created.json()["run_id"]
        stalled = [raw(port, watch_request(share_id), rcvbuf=4096) for _ in range(STALLED)]
        got, errors = [None] * VIEWERS, []

        def watch(i: int) -> None:
            try:
                got[i] = [ev.to_dict(e) for e in Client(running.url, client_id=f"viewer-{i}").watch(share_id)]
            except Exception as err:  # collected: a failure in a thread must fail the test
                errors.append(err)

        threads = [threading.Thread(target=watch, args=(i,)) for i in range(VIEWERS)]
        for t in threads:
            t.start()
        owner = list(Client(running.url, client_id="presenter").events(run_id))
        for t in threads:
            t.join(120)
        assert not errors and all(g == owner for g in got) and owner[-1]["type"] == "done"
        time.sleep(1.5)  # past the write timeout: the viewers that never read are closed
        connections = running.server.server_state.connections
        assert len(connections) <= 1, f"{len(connections)} connections left open"
        for s in stalled:
            s.close()


def test_an_owner_reconnecting_in_a_loop_leaves_nothing_behind(tiny_models):
    service = Service({"tiny": tiny_models})
    with Running(service) as running:
        service.backends["tiny"].lock.acquire()  # the engine busy: the run below waits in the queue
        try:
            first = post(running.url, {"prompt": "abc", "model": "tiny", "max_new_tokens": 2}).json()["run_id"]
            run_id = post(running.url, {"prompt": "abc", "model": "tiny", "max_new_tokens": 2}).json()["run_id"]
            run = service.scheduler.runs[run_id]
            with httpx.Client(base_url=running.url, timeout=10) as client:
                for _ in range(60):  # read the queue position, drop the stream, come back
                    with client.stream("GET", f"/v1/runs/{run_id}/events") as response:
                        next(response.iter_lines())
            time.sleep(0.3)  # within the grace: the run is still the owner's
            assert run.state == "queued" and run.listeners == 0
            assert len(run._waiters) == 0, f"{len(run._waiters)} waiters of gone listeners kept"
        finally:
            service.backends["tiny"].lock.release()
        for rid in (first, run_id):
            assert list(Client(running.url).events(rid))  # both run to their end


def test_a_viewer_reads_a_run_to_its_end_though_the_run_is_forgotten_meanwhile(tiny_models):
    service = Service({"tiny": tiny_models}, keep_bytes=1)  # a finished run is forgotten at once
    with Running(service) as running:
        created = post(running.url, {"prompt": "abc abc", "model": "tiny", "max_new_tokens": 200, "n_top": 20,
                                     "share": True}).json()
        with httpx.stream("GET", f"{running.url}/v1/watch/{created['share_id']}/events", timeout=30) as viewer:
            lines = viewer.iter_lines()
            first = next(lines)
            events = list(Client(running.url).events(created["run_id"]))  # the owner reads it to the end; it finishes
            assert events[-1]["type"] == "done"
            post(running.url, {"prompt": "abc", "model": "tiny", "max_new_tokens": 2})  # forgotten by now
            rest = list(lines)
        ids = [line for line in [first, *rest] if line.startswith("id: ")]
        assert len(ids) == len(events) and any('"type":"done"' in line for line in rest)
        gone = httpx.get(f"{running.url}/v1/watch/{created['share_id']}", timeout=10)
        assert gone.status_code == 404 and "finished long ago" in gone.json()["error"]["message"]


@pytest.mark.parametrize("field,value", [("n", 2), ("stop", ["\n"]), ("logit_bias", {"50": 100}),
                                         ("presence_penalty", 0.5), ("frequency_penalty", 1.0), ("logprobs", True),
                                         ("top_logprobs", 3), ("tools", [{"type": "function"}]),
                                         ("response_format", {"type": "json_object"})])
def test_openai_fields_that_would_change_the_completion_are_refused(tiny_models, field, value, served):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, field: value}
    response = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400 and field in response.json()["error"]["message"]


def test_openai_fields_that_change_nothing_are_taken(served):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": 1, "stop": None,
            "user": "someone", "stream_options": {"include_usage": True}, "presence_penalty": 0, "logprobs": False,
            "response_format": {"type": "text"}, "metadata": {"a": "b"}}
    response = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.fixture(scope="module")
def served(tiny_models):
    with Running(Service({"tiny": tiny_models})) as running:
        yield running


@pytest.mark.parametrize("top_p", [1e-46, 5e-324, 1e-40])
def test_a_top_p_so_small_only_the_likeliest_token_stays_decodes_as_greedy(served, top_p):
    """Below float32's smallest number top_p rounded to 0 in the cut and removed every token: the run then failed
    blaming the model's weights for NaN logits."""
    sampled = list(Client(served.url).stream("abc abc", model="tiny", max_new_tokens=6, temperature=1.0, top_p=top_p,
                                             seed=5, drafter="ngram"))
    greedy = list(Client(served.url).stream("abc abc", model="tiny", max_new_tokens=6, temperature=0.0, drafter="ngram"))
    assert sampled[-1].type == "done" and sampled[-1].token_ids == greedy[-1].token_ids


def test_client_names_that_differ_past_64_characters_are_two_clients(served):
    first, second = "viewer-" + "x" * 60 + "-1", "viewer-" + "x" * 60 + "-2"
    created = post(served.url, {"prompt": "abc", "model": "tiny", "max_new_tokens": 2}, headers={"X-Specviz-Client": first})
    run_id = created.json()["run_id"]
    assert httpx.get(f"{served.url}/v1/runs/{run_id}", headers={"X-Specviz-Client": first}).status_code == 200
    for other in (second, first[:64], first + "-and-more"):
        assert httpx.get(f"{served.url}/v1/runs/{run_id}", headers={"X-Specviz-Client": other}).status_code == 404
        assert httpx.delete(f"{served.url}/v1/runs/{run_id}", headers={"X-Specviz-Client": other}).status_code == 404
