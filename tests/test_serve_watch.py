"""A watch link: the presenter's run gets a read-only share id, and any number of viewers stream the same run
(one decode), late ones replayed from the first event; a viewer can neither cancel the run nor keep it alive."""
from __future__ import annotations

import threading
import time

import httpx
import pytest
from serving import Running, post

from specviz.backends.client import Client
from specviz.decoding import events as ev
from specviz.errors import SpecvizError
from specviz.serve.http import Service

VIEWERS = 30


@pytest.fixture(scope="module")
def served(tiny_models):
    with Running(Service({"tiny": tiny_models}, max_queue=8, disconnect_grace_s=0.5)) as running:
        yield running


def runs_done(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("specviz:runs_total{"))


def test_thirty_viewers_watch_one_decode_and_late_ones_replay_it(served):
    before = runs_done(served.url)
    presenter = Client(served.url, client_id="presenter")
    shared, got, errors = [], [None] * (VIEWERS + 1), []
    ready = threading.Event()

    def watch(i: int) -> None:
        ready.wait(30)
        try:
            got[i] = [ev.to_dict(e) for e in Client(served.url, client_id=f"viewer-{i}").watch(shared[0])]
        except Exception as err:  # collected: a failure in a thread must fail the test
            errors.append(err)

    threads = [threading.Thread(target=watch, args=(i,)) for i in range(VIEWERS)]
    for t in threads:
        t.start()
    events = []
    for event in presenter.stream("abc abc abc", model="tiny", max_new_tokens=120, temperature=1.0, seed=3,
                                  on_shared=lambda share_id: (shared.append(share_id), ready.set())):
        events.append(ev.to_dict(event))
    for t in threads:
        t.join(60)
    late = [ev.to_dict(e) for e in Client(served.url, client_id="late").watch(shared[0])]  # after the end
    assert not errors and all(g == events for g in got[:VIEWERS]) and late == events
    assert events[-1]["type"] == "done" and len(events[-1]["token_ids"]) == 120
    assert runs_done(served.url) == before + 1  # one decode for all of them


def test_a_viewer_cannot_cancel_or_keep_alive_and_a_share_id_is_not_a_run_id(served):
    mine = {"X-Specviz-Client": "presenter-2"}
    started = post(served.url, {"prompt": "abc", "model": "tiny", "max_new_tokens": 512, "share": True}, headers=mine).json()
    run_id, share_id = started["run_id"], started["share_id"]
    assert share_id.startswith("watch-") and share_id != run_id
    assert httpx.delete(f"{served.url}/v1/runs/{share_id}").status_code == 404
    assert httpx.get(f"{served.url}/v1/watch/{run_id}").status_code == 404  # a run id is not a share link
    viewer = httpx.get(f"{served.url}/v1/watch/{share_id}").json()
    assert viewer["run_id"] is None and viewer["state"] in ("queued", "running")
    with httpx.stream("GET", f"{served.url}/v1/watch/{share_id}/events", timeout=30) as response:
        assert response.status_code == 200
        next(response.iter_lines())  # a viewer listens, then leaves
    # the owner never listened: the run is cancelled after its grace, whoever watched (the grace cut short here,
    # and the reaper woken at once, as the scheduler wakes it for a new deadline: a fast host decodes the tiny
    # model's 512 tokens within the reaper's idle second)
    scheduler = served.service.scheduler
    with scheduler.lock:
        assert scheduler.runs[run_id].state in ("queued", "running"), "the run ended before the test could cut its grace"
        scheduler.runs[run_id].deadline = time.monotonic()
        scheduler.lock.notify_all()
    deadline = time.monotonic() + 10
    while httpx.get(f"{served.url}/v1/runs/{run_id}", headers=mine).json()["state"] != "cancelled":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(SpecvizError, match="cancelled"):
        list(Client(served.url).watch(share_id))


def test_the_owner_shares_a_run_after_starting_it_and_nobody_else_can(served):
    mine = {"X-Specviz-Client": "presenter-3"}
    run_id = post(served.url, {"prompt": "abc abc", "model": "tiny", "max_new_tokens": 8}, headers=mine).json()["run_id"]
    assert httpx.post(f"{served.url}/v1/runs/{run_id}/share").status_code == 404
    share_id = httpx.post(f"{served.url}/v1/runs/{run_id}/share", headers=mine).json()["share_id"]
    assert httpx.post(f"{served.url}/v1/runs/{run_id}/share", headers=mine).json()["share_id"] == share_id
    owned = list(Client(served.url, client_id="presenter-3").events(run_id))
    watched = [ev.to_dict(e) for e in Client(served.url).watch(share_id)]
    assert watched == owned
    assert httpx.get(f"{served.url}/v1/watch/watch-nope/events").status_code == 404


def test_the_live_page_shares_a_run_and_a_watch_link_follows_it(served, monkeypatch):
    """The presenter ticks "Share with viewers" and runs; the Live page opened with ?watch= shows that run."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SPECVIZ_BACKEND", served.url)
    app = str(Path(__file__).resolve().parents[1] / "app.py")
    presenter = AppTest.from_file(app, default_timeout=120)
    presenter.run()
    presenter.switch_page("app/pages/live.py")
    presenter.run()
    presenter.sidebar.slider(key="sb_max_new").set_value(12)
    presenter.checkbox(key="live_share").check()
    presenter.button(key="live_run").click()
    presenter.run()
    assert not presenter.exception and not presenter.error, [e.value for e in presenter.error]
    link = presenter.session_state["live_watch_link"]
    share_id = link.rsplit("?watch=", 1)[1]
    shown = "".join(h.proto.body for h in presenter.html)

    viewer = AppTest.from_file(app, default_timeout=120)
    viewer.run()
    viewer.switch_page("app/pages/live.py")
    viewer.query_params["watch"] = share_id
    viewer.run()
    assert not viewer.exception and not viewer.error, [e.value for e in viewer.error]
    assert any("Watching a shared run" in i.value for i in viewer.info)
    watched = "".join(h.proto.body for h in viewer.html)
    assert watched.count('class="specviz-token"') == 12 and shown.count('class="specviz-token"') == 12
    tokens = lambda html: html[html.index('class="specviz-output"'):]  # noqa: E731 (the run's text, not the legend)
    assert tokens(watched) == tokens(shown)
    assert not viewer.button  # read-only: no Run button

    viewer.query_params["watch"] = "not-a-link"
    viewer.run()
    assert any("not a watch link" in e.value for e in viewer.error)
