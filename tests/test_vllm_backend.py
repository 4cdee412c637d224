"""The vLLM backend against a stand-in server that answers as vLLM 0.32 does (tests/fake_vllm.py; the real one is
exercised by tests/test_vllm.py where vLLM is installed): its steps, its statistics from vLLM's own per-request
metrics, every event valid against the schema, and a clear message for a server that is not there, refuses, or
dies mid-run."""
from __future__ import annotations

import socket

import pytest
from fake_vllm import SPEC, STEPS, Served, text_of

import specviz
from specviz.backends import COUNTS, Run, open_backend
from specviz.backends.vllm import VllmBackend, stats_of
from specviz.decoding import events as ev
from specviz.errors import SpecvizError


def test_a_run_is_one_step_per_chunk_with_vllms_own_counts():
    with Served() as server:
        backend = open_backend("vllm+" + server.url)
        assert isinstance(backend, VllmBackend) and backend.detail == COUNTS and backend.speculative is True
        assert not backend.capabilities.tree and not backend.capabilities.drafter_choice
        assert backend.drafters() == ["vllm"] and "no q or tree" in backend.where()
        events = list(backend.stream(Run.of("Say hello.", drafter="vllm", max_new_tokens=6, temperature=0.0)))
        body = server.app.state.requests[-1]
    for event in events:
        ev.validate(event)
    start, steps, done = events[0], events[1:-1], events[-1]
    assert start.detail == COUNTS and start.engine == "vllm" and start.prompt_token_ids == [1, 2, 3]
    assert [[c.token for c in s.committed] for s in steps] == STEPS
    assert [s.accepted for s in steps] == [0, 2, 1]
    assert [c.kind for c in steps[1].committed] == ["accepted", "accepted", "bonus"]
    assert [c.text for c in steps[1].committed] == [text_of(t) for t in STEPS[1]]
    assert steps[1].position == 3 + 1  # after the prompt and the first step's token
    assert done.token_ids == [t for ids in STEPS for t in ids] and done.stop_reason == "max_new_tokens"
    assert done.stats["source"] == "vllm" and done.stats["acceptance_histogram"] == SPEC["acceptance_histogram"]
    assert done.stats["per_position_acceptance"] == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert done.stats["tau"] == pytest.approx(2.0)
    assert body["messages"] == [{"role": "user", "content": "Say hello."}] and body["max_tokens"] == 6
    assert body["return_token_ids"] is True and body["stream_options"] == {"include_usage": True}


def test_the_api_streams_through_it_by_address():
    with Served() as server:
        result = specviz.generate("Say hello.", backend="vllm+" + server.url, drafter="vllm", max_new_tokens=6)
    assert result.text == "".join(text_of(t) for ids in STEPS for t in ids)


def test_without_vllms_metrics_the_stats_come_from_the_chunks():
    stats = stats_of(3, 6, 1.0, None)
    assert stats["source"] == "chunks" and stats["accepted"] == 3 and stats["tau"] == 2.0


def test_a_server_that_dies_mid_run_is_a_clear_error():
    with Served(die_after=1) as server:
        backend = VllmBackend.connect(server.url)
        got = []
        with pytest.raises(SpecvizError, match="vLLM server at .* (stopped answering|ended the run)"):
            for event in backend.stream(Run.of("Say hello.", max_new_tokens=6)):
                got.append(event)
    assert got and got[0].type == "start"  # what came before the failure was delivered, then a message


@pytest.mark.parametrize("finish", ["abort", "error"])
def test_a_run_the_server_aborts_is_a_clear_error_not_a_finished_run(finish):
    """vLLM ends a request its engine dropped (a dead engine core, a shutdown) with finish_reason "abort" and a
    failed one with "error"; neither is a run that finished."""
    with Served(last_finish=finish) as server:
        backend = VllmBackend.connect(server.url)
        got = []
        with pytest.raises(SpecvizError, match=f"vLLM server at .* ended the run with finish_reason '{finish}'"):
            for event in backend.stream(Run.of("Say hello.", max_new_tokens=6)):
                got.append(event)
    assert [e.type for e in got] == ["start", "step", "step", "step"]


@pytest.mark.parametrize("finish, reason", [("stop", "eos"), ("repetition", "eos"), ("length", "max_new_tokens")])
def test_a_finished_run_says_why_it_stopped(finish, reason):
    with Served(last_finish=finish) as server:
        done = list(VllmBackend.connect(server.url).stream(Run.of("Say hello.", max_new_tokens=6)))[-1]
    assert done.type == "done" and done.stop_reason == reason


def test_a_server_that_is_not_there_says_how_to_start_one():
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free, nobody listens
    asked = time.perf_counter()
    with pytest.raises(SpecvizError, match="no vLLM server answers at .*still starting.*docs/vllm.md"):
        open_backend(f"vllm+http://127.0.0.1:{port}")
    assert time.perf_counter() - asked < 2  # refused at once, not after a timeout


def test_a_server_that_takes_the_connection_but_does_not_answer_is_an_error_within_the_timeout():
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()  # accepts connections (the kernel does) and never answers
        url = "http://127.0.0.1:%d" % s.getsockname()[1]
        asked = time.perf_counter()
        with pytest.raises(SpecvizError, match="took the connection but did not answer /v1/models within 1 s"):
            VllmBackend.connect(url, timeout_s=1)
        assert time.perf_counter() - asked < 5


def test_a_stream_that_goes_silent_is_a_clear_error_within_its_bound():
    import time

    with Served(stall_after=1) as server:
        backend = VllmBackend.connect(server.url, silence_s=1)
        asked = time.perf_counter()
        with pytest.raises(SpecvizError, match="sent nothing for 1 s mid-run"):
            list(backend.stream(Run.of("Say hello.", max_new_tokens=6)))
        assert time.perf_counter() - asked < 5


def test_it_refuses_a_drafter_it_cannot_choose():
    with Served() as server:
        backend = VllmBackend.connect(server.url)
        with pytest.raises(SpecvizError, match="drafts with the method its server was started with"):
            list(backend.stream(Run.of("Say hello.", drafter="eagle2")))


def test_the_app_on_vllm_shows_its_step_timeline_and_says_what_it_cannot(monkeypatch):
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from app.state import ENV_BACKEND

    app_py = str(Path(__file__).resolve().parents[1] / "app.py")
    with Served() as server:
        monkeypatch.setenv(ENV_BACKEND, "vllm+" + server.url)
        at = AppTest.from_file(app_py, default_timeout=120)
        at.run()
        assert at.sidebar.selectbox(key="sb_drafter").options == ["vllm"]
        at.switch_page("app/pages/live.py")
        at.run()
        at.button(key="live_run").click()
        at.run()
        assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
        html = "".join(h.proto.body for h in at.html)
        assert html.count('class="specviz-token"') == sum(map(len, STEPS))
        assert any("exposes no q, no draft tree and no u" in i.value for i in at.info)
        assert len(at.get("plotly_chart")) == 2  # the step chart and vLLM's acceptance histogram
        for page in ("app/pages/tree.py", "app/pages/lab.py"):
            at.switch_page(page)
            at.run()
            assert not at.exception, page
            assert any("no draft tree" in i.value for i in at.info), page


def test_the_race_gets_a_vllm_lane_beside_ours(tiny_model_dir, monkeypatch):
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from app.state import ENV_MODEL

    app_py = str(Path(__file__).resolve().parents[1] / "app.py")
    with Served() as server:
        monkeypatch.setenv(ENV_MODEL, str(tiny_model_dir))
        monkeypatch.setenv("SPECVIZ_RACE_BACKEND", "vllm+" + server.url)
        at = AppTest.from_file(app_py, default_timeout=120)
        at.query_params["drafters"] = "none,vllm"
        at.query_params["max_tokens"] = "6"
        at.run()
        at.switch_page("app/pages/race.py")
        at.run()
        assert "vllm" in at.multiselect(key="race_drafters").options
        at.button(key="race_run").click()
        at.run()
        assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
        runs = {d: events for (_, d), events in at.session_state["race_cache"].items()}
        assert list(runs) == ["none", "vllm"]
        assert runs["vllm"][0]["engine"] == "vllm" and runs["vllm"][-1]["token_ids"] == [t for s in STEPS for t in s]
        assert len(at.get("iframe")) == 1  # the lanes, ours and vLLM's, replay together


def test_specviz_generate_runs_on_vllm_with_its_own_model_and_drafter(capsys):
    import json

    from specviz.cli import main as cli

    with Served() as server:
        code = cli.main(["generate", "--backend", "vllm+" + server.url, "--prompt", "Say hello.", "--json",
                         "--max-new-tokens", "6"])
        assert code == 0, capsys.readouterr().err
        out = json.loads(capsys.readouterr().out)
        assert out["token_ids"] == [t for s in STEPS for t in s] and out["stats"]["source"] == "vllm"
        assert server.app.state.requests[-1]["model"] == "fake-model"
        assert cli.main(["generate", "--backend", "vllm+" + server.url, "--prompt", "x", "--drafter", "eagle2"]) == 2
    assert "drafts with the method its server was started with" in capsys.readouterr().err
