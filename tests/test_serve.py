"""`specviz serve` on a free localhost port with the tiny model: remote runs give the same events as local ones,
streams resume and cancel, the queue is bounded, bad requests get a 4xx that says what is wrong, and the
OpenAI-compatible route streams the same text."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from serving import Running, free_port, post

from specviz import api
from specviz.backends.client import Client
from specviz.cli import main as cli
from specviz.decoding import events as ev
from specviz.errors import SpecvizError
from specviz.serve.http import Service

TIMING = {"timing", "wall_s", "tokens_per_s", "draft_s", "verify_s"}


@pytest.fixture(scope="module")
def served(tiny_models):
    with Running(Service({"tiny": tiny_models}, max_queue=32, max_per_client=3, disconnect_grace_s=0.5)) as running:
        yield running


def stripped(event: dict) -> dict:
    """An event without its timings (the only fields that differ between two runs of the same request)."""
    event = {k: v for k, v in event.items() if k not in TIMING}
    if "stats" in event:
        event["stats"] = {k: v for k, v in event["stats"].items() if k not in TIMING}
    return event


# fixed K: under the default cost-aware policy which steps draft depends on each run's own timings
# (specviz.decoding.policy.StepRates), so two runs of one request need not draft alike
@pytest.mark.parametrize("drafter,temperature", [("none", 0.0), ("ngram:k_policy=fixed", 0.0),
                                                 ("ngram:k_policy=fixed", 1.0)])
def test_a_remote_run_gives_the_events_of_the_same_local_run(served, tiny_models, drafter, temperature):
    kwargs = dict(drafter=drafter, max_new_tokens=24, temperature=temperature, seed=5)
    local = [stripped(ev.to_dict(e)) for e in api.stream("abc abc abc abc", models=tiny_models, **kwargs)]
    remote = [stripped(ev.to_dict(e)) for e in Client(served.url).stream("abc abc abc abc", model="tiny", **kwargs)]
    assert remote == local
    via_api = list(api.stream("abc abc abc abc", model="tiny", backend=served.url, **kwargs))
    assert [stripped(ev.to_dict(e)) for e in via_api] == local  # specviz.stream(backend=...) is the same client
    assert [type(e) for e in via_api] == [ev.Start] + [ev.Step] * (len(via_api) - 2) + [ev.Done]


def read_events(url: str, run_id: str, last: int | None = None, stop_after: int | None = None,
                client: str | None = None) -> list[tuple]:
    """(sse event type, id, data) read from the stream, optionally dropping the connection after some events.
    client: the X-Specviz-Client name the run was submitted with (a run is its owner's to read)."""
    headers = {} if last is None else {"Last-Event-ID": str(last)}
    if client is not None:
        headers["X-Specviz-Client"] = client
    got = []
    with httpx.stream("GET", f"{url}/v1/runs/{run_id}/events", headers=headers, timeout=30) as response:
        assert response.status_code == 200
        from specviz.backends.client import _sse

        for item in _sse(response.iter_lines()):
            got.append(item)
            if stop_after is not None and sum(i[1] is not None for i in got) >= stop_after:
                break  # leaving the block drops the connection
    return got


def test_a_dropped_stream_resumes_with_every_event_once(served, monkeypatch):
    # resuming is what this tests, not the grace: a busy host may take longer than the fixture's 0.5 s to reconnect
    monkeypatch.setattr(served.service.scheduler, "disconnect_grace_s", 30.0)
    run_id = post(served.url, {"prompt": "abc abc abc", "model": "tiny", "max_new_tokens": 60}).json()["run_id"]
    first = read_events(served.url, run_id, stop_after=3)
    last = max(i[1] for i in first if i[1] is not None)
    rest = read_events(served.url, run_id, last=last)
    ids = [i[1] for i in first + rest if i[1] is not None]
    assert ids == list(range(len(ids)))  # no gap, no duplicate
    assert (first + rest)[-1][2]["type"] == "done"
    trace = httpx.get(f"{served.url}/v1/runs/{run_id}/events.jsonl", timeout=30).text.splitlines()
    assert [json.loads(line) for line in trace] == [i[2] for i in first + rest if i[1] is not None]


def test_cancelling_or_leaving_frees_the_device_within_a_step(served):
    client = Client(served.url, client_id="cancel-test")
    mine = {"X-Specviz-Client": "cancel-test"}
    long = client.submit("abc", model="tiny", max_new_tokens=500)
    state = lambda run: httpx.get(f"{served.url}/v1/runs/{run}", headers=mine, timeout=10).json()["state"]  # noqa: E731
    deadline = time.monotonic() + 20
    while state(long) == "queued":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert httpx.delete(f"{served.url}/v1/runs/{long}", headers=mine, timeout=10).status_code == 200
    started = time.monotonic()
    while state(long) != "cancelled":
        assert time.monotonic() - started < 2, "a cancelled run kept the device"
        time.sleep(0.01)
    # a listener that leaves: the run is cancelled once the grace period passes with nobody listening
    left = client.submit("abc", model="tiny", max_new_tokens=500)
    read_events(served.url, left, stop_after=2, client="cancel-test")
    started = time.monotonic()
    while state(left) != "cancelled":
        assert time.monotonic() - started < served.service.scheduler.disconnect_grace_s + 2
        time.sleep(0.02)
    events = list(client.stream("abc abc", model="tiny", max_new_tokens=8))  # the device is free again
    assert events[-1].type == "done"


def test_the_queue_is_bounded_and_every_accepted_run_completes(tiny_models):
    service = Service({"tiny": tiny_models}, max_queue=8, max_per_client=100)
    with Running(service) as running:
        results = [None] * 64

        def submit(i):
            results[i] = post(running.url, {"prompt": f"count {i} {i} {i}", "model": "tiny", "max_new_tokens": 40},
                              headers={"X-Specviz-Client": f"c{i}"})

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = [r.status_code for r in results]
        assert set(codes) <= {201, 429} and codes.count(429) > 0 and codes.count(201) >= 8
        assert all(r.headers.get("retry-after") for r in results if r.status_code == 429)
        for r in results:
            if r.status_code == 201:
                got = read_events(running.url, r.json()["run_id"], client=r.request.headers["X-Specviz-Client"])
                ids = [i[1] for i in got if i[1] is not None]
                assert ids == list(range(len(ids))) and got[-1][2]["type"] == "done"


def test_one_client_holds_at_most_one_running_and_a_few_queued_runs(tiny_models):
    service = Service({"tiny": tiny_models}, max_queue=50, max_per_client=3)
    with Running(service) as running:
        codes = [post(running.url, {"prompt": "abc", "model": "tiny", "max_new_tokens": 400},
                      headers={"X-Specviz-Client": "greedy"}).status_code for _ in range(5)]
        assert codes[:3] == [201, 201, 201] and codes[3:] == [429, 429]
        other = post(running.url, {"prompt": "abc", "model": "tiny", "max_new_tokens": 4}, headers={"X-Specviz-Client": "polite"})
        assert other.status_code == 201


def test_sixteen_clients_at_once_each_get_their_solo_output(served, tiny_models):
    prompts = [f"{'abc ' * (1 + i % 4)}{i}" for i in range(16)]
    alone = [api.generate(p, models=tiny_models, drafter="ngram", max_new_tokens=16, temperature=1.0, seed=i).token_ids
             for i, p in enumerate(prompts)]
    got, errors = [None] * 16, []

    def one(i):
        try:
            events = list(Client(served.url, client_id=f"viewer-{i}").stream(
                prompts[i], model="tiny", drafter="ngram", max_new_tokens=16, temperature=1.0, seed=i))
            got[i] = events[-1].token_ids
        except Exception as err:  # collected: a failure in a thread must fail the test
            errors.append(err)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and got == alone


BAD = [
    ({"prompt": ""}, 400, "prompt is empty"),
    ({"prompt": "hi", "model": "nope"}, 404, "not loaded here"),
    ({"prompt": "hi", "model": "/etc"}, 404, "never loads a path"),
    ({"prompt": "hi", "drafter": "magic"}, 400, "not available"),
    ({"prompt": "hi", "drafter": "ngram", "drafter_options": {"head": "/tmp/x"}}, 400, "head="),
    ({"prompt": "x" * 40_000}, 413, "characters"),
    ({"prompt": "hi", "max_new_tokens": 0}, 400, "max_new_tokens"),
    ({"prompt": "hi", "max_new_tokens": 100_000}, 400, "max_new_tokens"),
    ({"prompt": "abc " * 2500, "max_new_tokens": 10, "model": "tiny"}, 400, "context"),
    ({"prompt": "hi", "temperature": -1.0}, 400, "temperature"),
    ({"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ({"prompt": "hi", "max_new_tokens": "5"}, 422, "max_new_tokens"),
    ({"prompt": "hi", "k": 99}, 400, "k must be"),
    ({"prompt": "hi", "surprise": 1}, 422, "surprise"),
    ({"prompt": "hi", "drafter": "ngram:max_ngram=1000000000000"}, 400, "max_ngram"),
    ({"prompt": "hi", "drafter": "ngram", "drafter_options": {"tree": "x"}}, 400, "not offered"),
    ({"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}, 400, "not both"),
    ([1, 2, 3], 422, "bad request"),
]


@pytest.mark.parametrize("body,status,message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_a_bad_request_gets_a_4xx_that_says_what_is_wrong(served, body, status, message):
    response = post(served.url, body)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]["message"]


def test_malformed_bodies_and_unknown_runs_get_a_4xx(served):
    not_json = httpx.post(served.url + "/v1/runs", content=b"{not json", headers={"Content-Type": "application/json"})
    assert not_json.status_code == 422 and "JSON" in not_json.json()["error"]["message"]
    huge = httpx.post(served.url + "/v1/runs", content=b"x" * 300_000, headers={"Content-Type": "application/json"})
    assert huge.status_code == 413
    chunked = httpx.post(served.url + "/v1/runs", content=iter([b"x" * 100_000] * 3),
                         headers={"Content-Type": "application/json"})  # no Content-Length: counted as it is read
    assert chunked.status_code == 413 and "larger than" in chunked.json()["error"]["message"]
    run_id = post(served.url, {"prompt": "abc", "model": "tiny", "max_new_tokens": 4}).json()["run_id"]
    resumed = httpx.get(f"{served.url}/v1/runs/{run_id}/events", headers={"Last-Event-ID": "-5"})
    assert resumed.status_code == 400 and "Last-Event-ID" in resumed.json()["error"]["message"]
    read_events(served.url, run_id)
    assert httpx.get(served.url + "/v1/runs/run-404/events").status_code == 404
    assert httpx.delete(served.url + "/v1/runs/run-404").status_code == 404
    with pytest.raises(SpecvizError, match="not loaded here"):
        list(Client(served.url).stream("hi", model="elsewhere"))


def test_a_token_is_required_and_compared(tiny_models):
    service = Service({"tiny": tiny_models}, token="a-long-random-token-for-tests")
    with Running(service) as running:
        body = {"prompt": "hi", "max_new_tokens": 2}
        assert post(running.url, body).status_code == 401
        assert post(running.url, body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(running.url + "/metrics").status_code == 401
        assert httpx.get(running.url + "/healthz").status_code == 200  # liveness tells nothing about runs
        good = Client(running.url, token="a-long-random-token-for-tests")
        assert list(good.stream("hi", max_new_tokens=2))[-1].type == "done"


def test_the_cli_will_not_expose_the_service_without_a_token(capsys, monkeypatch):
    monkeypatch.delenv("SPECVIZ_TOKEN", raising=False)
    assert cli.main(["serve", "--host", "0.0.0.0", "--model", "does-not-matter"]) == 2
    assert "--token-file" in capsys.readouterr().err


def test_models_health_and_metrics(served):
    client = Client(served.url)
    (row,) = client.models()
    assert row["name"] == "tiny" and row["device"] == "cpu" and "ngram" in row["drafters"]
    assert client.health()["status"] == "ok"
    list(client.stream("abc abc abc abc abc", model="tiny", drafter="ngram", max_new_tokens=16))
    text = httpx.get(served.url + "/metrics").text
    for name in ("specviz:spec_decode_num_drafts_total", "specviz:spec_decode_num_draft_tokens_total",
                 "specviz:spec_decode_num_accepted_tokens_total", "specviz:num_requests_waiting",
                 "specviz:run_latency_seconds_bucket", "specviz:queue_wait_seconds_count"):
        assert name in text
    drafts = next(float(line.split()[-1]) for line in text.splitlines()
                  if line.startswith("specviz:spec_decode_num_drafts_total"))
    assert drafts > 0


def test_openai_chat_completions_stream_the_same_text(served, tiny_models):
    messages = [{"role": "user", "content": "abc abc abc"}]
    local = api.generate(messages, models=tiny_models, drafter="ngram", max_new_tokens=20, temperature=0.0)
    body = {"model": "tiny", "messages": messages, "max_tokens": 20, "temperature": 0.0, "stream": True,
            "specviz": {"drafter": "ngram"}}
    chunks = []
    with httpx.stream("POST", served.url + "/v1/chat/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    parsed = [json.loads(c) for c in chunks[:-1]]
    assert parsed[0]["choices"][0]["delta"] == {"role": "assistant"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in parsed)
    assert text == local.text
    final = parsed[-1]
    assert final["choices"][0]["finish_reason"] in ("stop", "length")
    assert final["usage"]["completion_tokens"] == len(local.token_ids) and "tau" in final["specviz"]
    whole = httpx.post(served.url + "/v1/chat/completions", json={**body, "stream": False}, timeout=30).json()
    assert whole["choices"][0]["message"]["content"] == local.text and whole["object"] == "chat.completion"


def test_the_app_streams_its_pages_from_a_service(served, monkeypatch):
    """SPECVIZ_BACKEND points the app at the service: the sidebar says where the engine runs, and live decoding,
    the tree explorer, the race and the losslessness check run there."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SPECVIZ_BACKEND", served.url)
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "app.py"), default_timeout=120)
    at.run()
    assert not at.exception
    assert any(served.url in c.value for c in at.sidebar.caption)
    at.switch_page("app/pages/live.py")
    at.run()
    at.sidebar.slider(key="sb_max_new").set_value(8)
    at.run()
    at.button(key="live_run").click()
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "".join(h.proto.body for h in at.html).count('class="specviz-token"') == 8
    at.switch_page("app/pages/tree.py")
    at.run()
    assert not at.exception and len(at.get("plotly_chart")) == 2
    at.switch_page("app/pages/race.py")
    at.run()
    at.number_input(key="race_max_new").set_value(4)
    at.button(key="race_run").click()
    at.run()
    assert not at.exception and not at.error and len(at.dataframe) >= 1
    at.switch_page("app/pages/lossless.py")
    at.run()
    at.number_input(key="ll_n").set_value(10)
    at.button(key="ll_run").click()
    at.run()
    assert not at.exception and at.metric[0].value == "10 / 10"
    at.switch_page("app/pages/overview.py")
    at.run()
    assert not at.exception and any("service at" in i.value for i in at.info)


def test_a_service_killed_mid_stream_is_a_readable_error_and_keeps_what_arrived(tiny_model_dir):
    """`specviz serve` as its own process; killed while a client streams, the client raises a SpecvizError that
    says what happened, after the events that did arrive."""
    import subprocess
    import sys

    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "specviz", "serve", "--model", str(tiny_model_dir), "--port",
                                str(port), "--threads", "1"], stderr=subprocess.PIPE, text=True)
    try:
        for line in process.stderr:  # it says ready once loaded and warmed
            if "ready on" in line:
                break
        assert process.poll() is None, "the service did not start"
        client = Client(f"http://127.0.0.1:{port}", retries=1)
        arrived = []
        with pytest.raises(SpecvizError, match="lost the stream|cannot reach|ended the run's stream"):
            for event in client.stream("abc abc abc", model=tiny_model_dir.name, max_new_tokens=500):
                arrived.append(event)
                if len(arrived) == 5:
                    process.kill()
        assert len(arrived) >= 5 and arrived[0].type == "start"
    finally:
        process.kill()
        process.wait(timeout=10)


def test_a_listener_waits_without_spinning_once_its_run_leaves_the_queue(tiny_models, monkeypatch):
    """A listener of a run that waited in the queue sleeps between events after the run starts (it once spun
    on a stale queue position, holding the GIL the engine needs and slowing every run 10-fold)."""
    service = Service({"tiny": tiny_models}, max_queue=8, max_per_client=8)
    calls = [0]
    real = service.scheduler.position

    def counted(run):
        calls[0] += 1
        return real(run)

    monkeypatch.setattr(service.scheduler, "position", counted)
    with Running(service) as running:
        first = post(running.url, {"prompt": "abc", "model": "tiny", "max_new_tokens": 150}).json()["run_id"]
        second = post(running.url, {"prompt": "abc abc", "model": "tiny", "max_new_tokens": 150}).json()["run_id"]
        calls[0] = 0
        got = read_events(running.url, second)
        events = sum(i[1] is not None for i in got)
        assert got[-1][2]["type"] == "done"
        assert calls[0] < 4 * (events + 150 + 10), f"{calls[0]} position checks for {events} events"
        read_events(running.url, first)


def test_a_run_nobody_listens_to_is_cancelled(tiny_models):
    service = Service({"tiny": tiny_models}, max_queue=8)
    service.scheduler.unclaimed_grace_s = 0.3
    with Running(service) as running:
        run_id = post(running.url, {"prompt": "abc", "model": "tiny", "max_new_tokens": 500}).json()["run_id"]
        deadline = time.monotonic() + 10
        while httpx.get(f"{running.url}/v1/runs/{run_id}").json()["state"] != "cancelled":
            assert time.monotonic() < deadline, "an unclaimed run kept the device"
            time.sleep(0.05)


def test_a_client_may_ask_for_either_draft_length_policy(served):
    """k_policy is every drafter's option, a service's clients' too; a value it does not know is a 400."""
    events = list(Client(served.url).stream("abc abc abc abc", model="tiny", drafter="ngram:k_policy=fixed",
                                            max_new_tokens=4))
    assert events[0].k_policy == "fixed"
    with pytest.raises(SpecvizError, match="k_policy must be one of cost, fixed") as refused:
        list(Client(served.url).stream("abc", model="tiny", drafter="ngram:k_policy=sometimes", max_new_tokens=2))
    assert "sometimes" in str(refused.value)
    with pytest.raises(SpecvizError, match="k_policy must be one of cost, fixed") as refused:  # echoed, cut short
        list(Client(served.url).stream("abc", model="tiny", drafter="ngram:k_policy=" + "9" * 200, max_new_tokens=2))
    assert "9" * 80 not in str(refused.value)
    plain = list(Client(served.url).stream("abc", model="tiny", drafter="none:k_policy=fixed", max_new_tokens=2))
    assert plain[0].k_policy == "fixed" and plain[-1].type == "done"  # `none` takes it too, as a local run does
