"""The llama.cpp backend against the llama-server stand-in (tests/fake_llamacpp.py): a run's tokens become verify
steps by their stamps, with llama.cpp's drafted and accepted counts; the sampling fields turn llama.cpp's own
samplers off; a chat prompt goes through the server's template; every fault is a clear SpecvizError in time."""
from __future__ import annotations

import concurrent.futures

import fake_llamacpp
import fake_vllm
import pytest
from serving import free_port

from specviz.backends import open_backend
from specviz.backends.llamacpp import LlamaCppBackend
from specviz.decoding import events as ev
from specviz.decoding.settings import DecodeSettings
from specviz.errors import SpecvizError

NEW = 9  # the prefill's token, then steps of 3, 2, 1, 2 (cut at the budget)


def run(backend, prompt="a b c d", **kwargs):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(backend.run, prompt, **{"max_new_tokens": NEW, "temperature": 0.0, **kwargs}).result(60)


def test_tokens_group_into_the_steps_the_server_verified():
    with fake_llamacpp.Served() as server:
        backend = open_backend("llama+" + server.url)
        events = run(backend, [5, 6, 7, 8])
    steps = [e for e in events if e["type"] == "step"]
    done = events[-1]
    assert [len(s["committed"]) for s in steps] == [1, 3, 2, 1, 2]
    assert [s["drafted"] for s in steps] == [0, 3, 3, 3, 3]
    assert [s["accepted"] for s in steps] == [0, 2, 1, 0, 1]
    assert [c["kind"] for c in steps[1]["committed"]] == ["accepted", "accepted", "replacement"]  # 2 of 3
    assert steps[0]["committed"][0]["kind"] == "autoregressive"
    assert steps[3]["committed"][0]["kind"] == "replacement"
    assert [s["position"] for s in steps] == [4, 5, 8, 10, 11]
    assert done["token_ids"] == fake_llamacpp.continuation([5, 6, 7, 8], NEW)
    assert done["text"] == "".join(map(fake_llamacpp.text_of, done["token_ids"]))
    assert "".join(s["text_delta"] for s in steps) == done["text"]
    stats = done["stats"]
    assert stats["source"] == "llamacpp" and stats["drafted"] == 12 and stats["accepted"] == 4
    assert stats["acceptance_rate"] == pytest.approx(4 / 12)
    assert stats["mean_acceptance_length"] == pytest.approx(1 + 4 / 4)  # llama.cpp's: per verify step
    assert stats["per_position_acceptance"] == pytest.approx([3 / 4, 1 / 4, 0 / 4])
    assert stats["tau"] == pytest.approx(NEW / 5)
    assert done["stop_reason"] == "max_new_tokens"
    for event in events:
        ev.validate(event)


def test_a_plain_server_gives_one_token_steps_and_no_acceptance():
    with fake_llamacpp.Served(speculative=False) as server:
        backend = open_backend("llama+" + server.url)
        events = run(backend)
    steps = [e for e in events if e["type"] == "step"]
    assert len(steps) == NEW and all(s["drafted"] == 0 and s["accepted"] == 0 for s in steps)
    assert events[-1]["stats"]["acceptance_rate"] is None and backend.speculative is False


def test_greedy_turns_every_other_sampler_off_and_chat_goes_through_the_template():
    with fake_llamacpp.Served() as server:
        backend = open_backend("llama+" + server.url)
        run(backend, "hello there")
        run(backend, "hello there", chat=False, temperature=0.7, top_k=5, top_p=0.9)
        chat, plain = server.app.state.requests
    assert chat["prompt"] == "<|user|>hello there<|assistant|>"
    assert chat["temperature"] == 0.0 and chat["top_k"] == 1 and chat["min_p"] == 0.0
    assert chat["repeat_penalty"] == 1.0 and chat["dry_multiplier"] == 0.0 and chat["cache_prompt"] is False
    assert chat["timings_per_token"] is True and chat["return_tokens"] is True and chat["n_predict"] == NEW
    assert plain["prompt"] == "hello there"
    assert (plain["temperature"], plain["top_k"], plain["top_p"]) == (0.7, 5, 0.9)


def test_the_server_is_described_with_its_build_and_speculation():
    with fake_llamacpp.Served() as server:
        backend = open_backend("llama+" + server.url)
        row = backend.describe()
    assert row["engine"] == "llamacpp" and row["name"] == fake_llamacpp.MODEL and row["build"] == "b11434-fake"
    assert backend.speculative is True and "speculative" in backend.where()
    assert backend.drafters() == ["llamacpp"] and not backend.capabilities.drafter_choice


def test_without_metrics_speculation_is_unknown_and_runs_still_work():
    with fake_llamacpp.Served(metrics=False) as server:
        backend = open_backend("llama+" + server.url)
        events = run(backend)
    assert backend.speculative is None and "--metrics" in backend.where()
    assert events[-1]["type"] == "done"


@pytest.mark.parametrize("fault, match", [
    ({"die_after": 4}, "stopped answering mid-run|ended the run's stream"),
    ({"garbage": True}, "not JSON"),
])
def test_a_server_that_fails_mid_run_says_so(fault, match):
    with fake_llamacpp.Served(**fault) as server:
        backend = open_backend("llama+" + server.url)
        with pytest.raises(SpecvizError, match=match):
            run(backend)


def test_a_stuck_server_is_given_up_on():
    with fake_llamacpp.Served(stall_after=2) as server:
        backend = open_backend("llama+" + server.url, silence_s=1.0)
        with pytest.raises(SpecvizError, match="sent nothing for 1 s"):
            run(backend)


def test_nothing_listening_and_another_engine_are_told_apart():
    with pytest.raises(SpecvizError, match="no llama.cpp server answers"):
        open_backend(f"llama+http://127.0.0.1:{free_port()}")
    with fake_vllm.Served() as vllm, pytest.raises(SpecvizError, match="not a llama-server"):
        open_backend("llama+" + vllm.url)


def test_a_drafter_or_a_local_option_is_refused():
    with fake_llamacpp.Served() as server:
        backend = open_backend("llama+" + server.url)
        with pytest.raises(SpecvizError, match="started with"):
            run(backend, drafter="eagle2")
        with pytest.raises(SpecvizError, match="takes no weights"):
            open_backend("llama+" + server.url, weights="q4")
        with pytest.raises(SpecvizError, match="no model 'other'"):
            open_backend("llama+" + server.url, model="other")


def test_sampling_fields_follow_the_settings():
    greedy = LlamaCppBackend.sampling(DecodeSettings(temperature=0.0, max_new_tokens=7, seed=3))
    assert greedy["top_k"] == 1 and greedy["n_predict"] == 7 and greedy["seed"] == 3
    sampled = LlamaCppBackend.sampling(DecodeSettings(temperature=0.5, top_k=0, top_p=0.8))
    assert sampled["top_k"] == 0 and sampled["top_p"] == 0.8 and sampled["min_p"] == 0.0
