"""The server observatory (specviz/observatory.py and its page): /metrics text of both engines parsed as they print
it, windows between two reads (a restarted server, a window without speculation), the predicted speedup on numbers
worked by hand, the Watcher against a stand-in server (tests/fake_metrics.py) for each engine and each fault, while
16 clients keep that server busy, and the page through streamlit's AppTest."""
import json
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from fake_metrics import Served
from streamlit.testing.v1 import AppTest

from app.state import ENV_MODEL
from specviz import observatory as obs
from specviz.errors import SpecvizError

ROOT = Path(__file__).resolve().parent.parent
PAGE = str(ROOT / "app/pages/observatory.py")
APP = str(ROOT / "app.py")
TIMEOUT = 120  # as tests/test_app.py: a 2-core CPU under load

# llama-server build 11434 with a draft model, K = 4, after some requests: to_metrics's text, counters as a C++
# stream prints a double (six significant digits), per-position counts as integers
LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1234
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 1.23457e+06
# HELP llamacpp:tokens_predicted_seconds_total Total time spent generating tokens
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 8765.43
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 2000
# HELP llamacpp:spec_decode_num_accepted_tokens_total Speculative: Total draft tokens accepted by the target model
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 1100
# HELP llamacpp:spec_decode_num_drafts_total Speculative: Total speculative decoding verification steps
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 500
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 140.8
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 400
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 300
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 250
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="3"} 150
"""

# vLLM 0.32 with two engines (data parallel), as prometheus_client prints it: _total and _created, a histogram,
# labels in any order, a model name with an escaped quote
VLLM = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1234.0
process_start_time_seconds 1.7e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m \\"x\\""} 3.0
vllm:num_requests_running{engine="1",model_name="m \\"x\\""} 1.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m \\"x\\""} 700.0
vllm:generation_tokens_total{engine="1",model_name="m \\"x\\""} 300.0
vllm:generation_tokens_created{engine="0",model_name="m \\"x\\""} 1.7000001e+09
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_bucket{engine="0",le="1.0",model_name="m \\"x\\""} 0.0
vllm:request_generation_tokens_bucket{engine="0",le="+Inf",model_name="m \\"x\\""} 4.0
vllm:request_generation_tokens_sum{engine="0",model_name="m \\"x\\""} 700.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="m \\"x\\""} 150.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m \\"x\\""} 50.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m \\"x\\""} 1.7000001e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m \\"x\\""} 450.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m \\"x\\""} 150.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m \\"x\\""} 240.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m \\"x\\""} 60.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m \\"x\\"",position="0"} 120.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m \\"x\\"",position="1"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m \\"x\\"",position="2"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",position="0",model_name="m \\"x\\""} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m \\"x\\"",position="1"} 20.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m \\"x\\"",position="2"} 10.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="1",model_name="m \\"x\\"",position="2"} 1.7000001e+09
"""


def snap(at: float, drafts=0.0, draft_tokens=0.0, accepted=0.0, per_pos=(), generated=0.0, decode=None,
         started=None, engine="vllm", speculative=True) -> obs.Snapshot:
    return obs.Snapshot(engine=engine, at=at, wall=1000.0 + at, speculative=speculative, drafts=drafts,
                        draft_tokens=draft_tokens, accepted=accepted, accepted_per_pos=tuple(per_pos),
                        generated=generated, running=1.0, decode_seconds=decode, started=started)


# ------------------------------------------------------------------------------------------------ parsing
def test_llamacpp_text_parses_as_llama_server_prints_it():
    samples = obs.parse_metrics(LLAMACPP)
    assert samples["llamacpp:tokens_predicted_total", ()] == 1234570.0  # six significant digits, as printed
    s = obs.snapshot(samples, at=0.0, wall=0.0)
    assert (s.engine, s.speculative) == ("llamacpp", True)
    assert (s.drafts, s.draft_tokens, s.accepted) == (500, 2000, 1100)
    assert s.accepted_per_pos == (400, 300, 250, 150)
    assert (s.generated, s.decode_seconds, s.running) == (1234570.0, 8765.43, 2)


def test_vllm_text_is_summed_over_engines_but_not_over_positions():
    samples = obs.parse_metrics(VLLM)
    assert samples["vllm:num_requests_running", (("engine", "0"), ("model_name", 'm "x"'))] == 3.0  # unescaped
    assert samples["vllm:request_generation_tokens_bucket", (("engine", "0"), ("le", "+Inf"), ("model_name", 'm "x"'))] == 4
    s = obs.snapshot(samples, at=0.0, wall=0.0)
    assert (s.engine, s.drafts, s.draft_tokens, s.accepted) == ("vllm", 200, 600, 300)  # the _created are not counted
    assert s.accepted_per_pos == (150, 100, 50)
    assert (s.generated, s.running, s.decode_seconds, s.started) == (1000, 4, None, 1.7e9)


def test_a_vllm_server_without_speculation_and_a_foreign_server():
    plain = obs.snapshot(obs.parse_metrics('vllm:generation_tokens_total{engine="0"} 5.0\n'), at=0.0, wall=0.0)
    assert not plain.speculative and plain.drafts == 0 and plain.accepted_per_pos == ()
    assert "--speculative-config" in obs.no_speculation(plain)
    with pytest.raises(SpecvizError, match="neither vLLM's"):
        obs.snapshot(obs.parse_metrics("process_cpu_seconds_total 1.5\n"))


@pytest.mark.parametrize("line", ["<html><body>It works</body></html>", "hello world", '{"error": "x"}',
                                  'a{b="1" c="2"} 1', 'a{b=1} 1', "a 1 2 3"])
def test_what_is_not_a_prometheus_sample_is_named(line):
    with pytest.raises(ValueError, match="line 2 is not a Prometheus sample"):
        obs.parse_metrics("# HELP a x\n" + line + "\n")


def test_timestamps_infinities_and_empty_labels_parse():
    samples = obs.parse_metrics('a{} +Inf\nb{x="1",} NaN 1700000000000\nc -2.5e-3\n')
    assert samples["a", ()] == float("inf") and samples["c", ()] == -0.0025
    assert ("b", (("x", "1"),)) in samples


# ------------------------------------------------------------------------------------------------ windows
def test_a_window_is_the_difference_of_two_reads():
    a = snap(10.0, drafts=100, draft_tokens=300, accepted=150, per_pos=(70, 50, 30), generated=260)
    b = snap(12.0, drafts=300, draft_tokens=900, accepted=510, per_pos=(190, 190, 130), generated=1110)
    w = obs.window(a, b)
    assert w.speculative and w.seconds == 2.0
    assert w.acceptance_rate == 360 / 600 and w.mean_acceptance_length == 1 + 360 / 200
    assert w.per_position == (120 / 200, 140 / 200, 100 / 200) and w.draft_length == 3
    assert (w.drafted_per_s, w.accepted_per_s, w.generated_per_s) == (300, 180, 425)
    assert w.plain_share == (850 - 200 - 360) / (850 - 200 - 360 + 200)  # 290 tokens came from steps without a draft
    assert w.speed() == (425, "wall-clock generated tokens/s, every request together")


def test_llamacpp_positions_appear_with_the_first_draft_and_the_speed_is_per_request():
    a = snap(0.0, generated=10, decode=1.0, engine="llamacpp")
    b = snap(5.0, drafts=10, draft_tokens=40, accepted=20, per_pos=(9, 6, 4, 1), generated=40, decode=1.5,
             engine="llamacpp")
    w = obs.window(a, b)
    assert w.per_position == (0.9, 0.6, 0.4, 0.1) and w.mean_acceptance_length == 3.0
    assert w.decode_tokens_per_s == 60.0 and w.speed()[0] == 60.0 and w.generated_per_s == 6.0


def test_a_window_without_drafts_says_so_instead_of_dividing_by_zero():
    a = snap(0.0, drafts=50, draft_tokens=200, accepted=80, per_pos=(40, 20, 15, 5), generated=130, engine="llamacpp")
    w = obs.window(a, snap(1.0, drafts=50, draft_tokens=200, accepted=80, per_pos=(40, 20, 15, 5), generated=130,
                           engine="llamacpp"))
    assert not w.speculative
    assert (w.acceptance_rate, w.mean_acceptance_length, w.per_position, w.draft_length) == (None, None, (), None)
    assert obs.predict_window(w) is None and w.drafted_per_s == 0
    assert obs.no_speculation(a).startswith("No speculation in this window")
    assert obs.no_speculation(snap(0.0, engine="llamacpp")).startswith("No speculation yet")
    assert obs.window(a, a).seconds == 0 and obs.window(a, a).generated_per_s == 0  # two reads at one moment


@pytest.mark.parametrize("after", [
    snap(1.0, drafts=5, draft_tokens=20, accepted=9, per_pos=(5, 3, 1), generated=30),  # the counters went back
    snap(1.0, drafts=100, draft_tokens=400, accepted=90, per_pos=(50, 30, 10), generated=300, started=2.0),  # new start
    snap(1.0, drafts=100, draft_tokens=400, accepted=90, per_pos=(50, 30), generated=300),  # fewer positions
    snap(1.0, drafts=100, draft_tokens=400, accepted=90, per_pos=(50, 30, 10), generated=300, engine="llamacpp"),
])
def test_a_restarted_server_is_seen(after):
    before = snap(0.0, drafts=10, draft_tokens=40, accepted=20, per_pos=(10, 7, 3), generated=40, started=1.0)
    assert obs.restarted(before, after)
    with pytest.raises(ValueError, match="restarted"):
        obs.window(before, after)
    same = snap(1.0, drafts=10, draft_tokens=40, accepted=20, per_pos=(10, 7, 3), generated=40, started=1.0)
    assert not obs.restarted(before, same)


def test_the_recent_window_spans_the_reads_within_its_seconds():
    watcher = obs.Watcher("http://h:1")
    for t in range(5):
        watcher.history.append(snap(float(t), drafts=10 * t, draft_tokens=40 * t, accepted=20 * t, generated=30 * t))
    assert [watcher.recent(s).seconds for s in (2.5, 10, 0.5)] == [2.0, 4.0, 1.0]
    assert watcher.recent(2.5).drafts == 20 and [w.drafts for w in watcher.windows()] == [10] * 4


# --------------------------------------------------------------------------------------------- prediction
def test_the_predicted_speedup_on_numbers_worked_by_hand():
    a = (0.8, 0.6, 0.4)  # L̂ = 1 + 0.8 + 0.6 + 0.4 = 2.8
    flat = obs.predict(a, 3)
    assert (flat.mean_length, flat.verify_cost, flat.speedup) == pytest.approx((2.8, 1.0, 2.8))
    assert obs.predict(a, 3, draft_cost=0.05).speedup == pytest.approx(2.8 / 1.15)  # 1 + 0.05 · 3
    assert obs.predict(a, 3, lambda n: 1.3, 0.1).speedup == pytest.approx(2.8 / 1.6)  # 1.3 + 0.1 · 3 = 1.6
    half = obs.predict(a, 3, lambda n: 1.3, 0.1, plain_share=0.5)
    assert half.speedup == pytest.approx((0.5 + 0.5 * 2.8) / (0.5 + 0.5 * 1.6))  # = 1.9 / 1.3
    assert obs.predict((), 3, lambda n: 1.5).speedup == pytest.approx(1 / 1.5)  # nothing accepted: a loss


def test_a_measured_verify_cost_curve_is_taken_relative_to_one_token():
    c = obs.relative_cost({"1": 10.0, "2": 12.0, "4": 16.0})  # ms, as a bench surface stores them
    assert (c(1), c(2), c(3), c(5)) == pytest.approx((1.0, 1.2, 1.4, 1.8))  # 3: between 2 and 4; 5: past the last
    assert c(3.5) == pytest.approx(1.5)  # K = drafted ÷ drafts need not be whole
    assert obs.predict((0.5, 0.25), 2, c).speedup == pytest.approx(1.75 / 1.4)
    w = obs.window(snap(0.0), snap(1.0, drafts=4, draft_tokens=8, accepted=3, per_pos=(2, 1), generated=7))
    p = obs.predict_window(w, c, 0.25)
    assert (p.k, p.mean_length, p.plain_share) == (2.0, 1.75, 0.0)
    assert p.speedup == pytest.approx(1.75 / (1.4 + 0.5))
    assert obs.measured_speedup(150.0, 50.0) == 3.0 and obs.measured_speedup(150.0, None) is None


# -------------------------------------------------------------------------------------------------- watcher
@pytest.mark.parametrize("address", ["http://h:1", "vllm+http://h:1", "llama+http://h:1/", "h:1", "http://h:1/metrics"])
def test_server_addresses(address):
    assert obs.server_url(address) == "http://h:1"


@pytest.mark.parametrize("address", ["", "ftp://h:1", "vllm+http://"])
def test_bad_server_addresses(address):
    with pytest.raises(SpecvizError, match="not a server address"):
        obs.server_url(address)


@pytest.mark.parametrize("engine", ["llamacpp", "vllm"])
def test_the_watcher_reads_each_engine(engine):
    with Served(engine=engine, accept=(0.8, 0.6, 0.4), steps_per_scrape=100) as server:
        watcher = obs.Watcher("llama+" + server.url if engine == "llamacpp" else "vllm+" + server.url)
        assert watcher.recent(30) is None
        first, second = watcher.poll(), watcher.poll()
        assert first.engine == second.engine == engine and second.drafts == 200
        w = watcher.recent(30)
        assert w.acceptance_rate == pytest.approx(0.6) and w.mean_acceptance_length == pytest.approx(2.8)
        assert w.per_position == pytest.approx((0.8, 0.6, 0.4)) and w.draft_length == 3
        assert w.generated == 280 and w.plain_share == 0
        assert (w.decode_tokens_per_s == pytest.approx(140.0)) if engine == "llamacpp" else w.decode_seconds is None
        watcher.poll()
        assert len(watcher.windows()) == 2 and watcher.recent(30).drafts == 200
        assert watcher.recent(0).drafts == 100  # the last two reads at least

        server.fake.restart()
        watcher.poll()  # counters from zero again: a new history
        assert len(watcher.history) == 1 and len(watcher.restarts) == 1
        watcher.poll()
        assert watcher.recent(30).drafts == 100 and watcher.recent(30).acceptance_rate == pytest.approx(0.6)


def test_the_history_is_bounded():
    with Served(steps_per_scrape=1) as server:
        watcher = obs.Watcher(server.url, keep=5)
        for _ in range(8):
            watcher.poll()
        assert len(watcher.history) == 5 and watcher.history[-1].drafts == 8 and len(watcher.windows()) == 4


def test_a_vllm_server_without_speculation():
    with Served(engine="vllm", speculative=False) as server:
        watcher = obs.Watcher(server.url)
        watcher.poll()
        latest = watcher.poll()
        w = watcher.recent(30)
        assert not latest.speculative and not w.speculative and w.generated == 100
        assert "without --speculative-config" in obs.no_speculation(latest)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket closes


@pytest.mark.parametrize("engine, mode, message", [
    ("llamacpp", "off", r"has its /metrics off \(HTTP 501: This server does not support metrics endpoint. Start it with "
                        r"`--metrics`\): llama-server serves /metrics only when started with `--metrics`"),
    ("vllm", "off", r"has its /metrics off \(HTTP 404: Not Found\)"),
    ("llamacpp", "garbage", r"not Prometheus text \(line 1 is not a Prometheus sample: '<!doctype html>'\)"),
    ("vllm", "foreign", r"is neither vLLM nor llama.cpp: .* name http_requests_total, process_cpu_seconds_total"),
])
def test_each_fault_is_a_clear_message(engine, mode, message):
    with Served(engine=engine) as server:
        server.fake.mode = mode
        with pytest.raises(SpecvizError, match=message):
            obs.Watcher(server.url).poll()
        server.fake.mode = "ok"
        assert obs.Watcher(server.url).poll().engine == engine  # the same server, its metrics on


def test_nothing_listening_and_a_token():
    with pytest.raises(SpecvizError, match="nothing listens at http://127.0.0.1:"):
        obs.Watcher(f"http://127.0.0.1:{closed_port()}").poll()
    with Served(token="s3cret-token") as server:
        with pytest.raises(SpecvizError, match=r"refused /metrics \(HTTP 401: Invalid API Key\): give its API key"):
            obs.Watcher(server.url).poll()
        assert obs.Watcher(server.url, token="s3cret-token").poll().drafts == 100


def test_a_server_that_does_not_answer_in_time():
    """A listener that accepts the connection and never answers: the poll gives up at its timeout."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        started = time.perf_counter()
        with pytest.raises(SpecvizError, match="did not answer /metrics within 0.5 s"):
            obs.Watcher(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.5).poll()
        assert time.perf_counter() - started < 2.0


def test_the_watcher_keeps_up_with_a_busy_server():
    """16 clients keep the stand-in busy with requests for a few seconds while the watcher polls it: every poll
    returns within 2 s, and the last read counts every request the clients finished."""
    clients, run_s, per_request = 16, 4.0, 10
    with Served(engine="vllm", steps_per_scrape=0, steps_per_request=per_request, hold_s=0.01) as server:
        watcher = obs.Watcher(server.url)
        done, errors, stop = [0] * clients, [], threading.Event()

        def client(i: int) -> None:
            with httpx.Client(timeout=10) as http:
                while not stop.is_set():
                    try:
                        http.post(f"{server.url}/v1/completions", json={"prompt": "x"}).raise_for_status()
                        done[i] += 1
                    except httpx.HTTPError as err:
                        errors.append(err)

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
        for t in threads:
            t.start()
        polls, running = [], []
        deadline = time.perf_counter() + run_s
        try:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                running.append(watcher.poll().running)
                polls.append(time.perf_counter() - started)
                time.sleep(0.2)
        finally:
            stop.set()
            for t in threads:
                t.join(15)
        assert not errors and all(not t.is_alive() for t in threads)
        assert len(polls) >= 5 and max(polls) < 2.0, polls
        assert sum(done) >= clients and max(running) > 0  # the clients did run, and the watcher saw them running
        last = watcher.poll()
        assert last.drafts == per_request * sum(done) and last.running == 0
        assert watcher.recent(60).acceptance_rate == pytest.approx(0.6)


# ----------------------------------------------------------------------------------------------------- page
def ok(at):
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics_of(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def charts_of(at) -> dict[str, dict]:
    specs = (json.loads(chart.proto.spec) for chart in at.get("plotly_chart"))
    return {spec["layout"]["title"]["text"]: spec["data"] for spec in specs}


def test_the_page_shows_the_numbers_the_server_reports():
    with Served(engine="llamacpp", accept=(0.8, 0.6, 0.4), steps_per_scrape=100) as server:
        at = ok(AppTest.from_file(PAGE, default_timeout=TIMEOUT).run())
        assert [t.value for t in at.title] == ["Server observatory"] and at.info  # asks for an address
        at.text_input(key="obs_url").set_value("llama+" + server.url)
        ok(at.run())
        assert "one read so far" in at.info[0].value
        at.number_input(key="obs_plain").set_value(50.0)
        at.number_input(key="obs_d").set_value(0.1)
        ok(at.run())
        assert not at.error, [e.value for e in at.error]
        shown = metrics_of(at)
        assert shown["engine"] == "llama.cpp (llama-server)"
        assert shown["acceptance rate"] == "0.600" and shown["mean acceptance length"] == "2.80"
        assert shown["L̂ = 1 + Σ aᵢ"] == "2.80" and shown["K (drafted tokens per draft)"] == "3.00"
        assert not any("τ" in label for label in shown)  # τ is committed ÷ every forward on the other pages
        assert any("one per request per verify step" in c.value for c in at.caption)  # vLLM's num_drafts
        assert shown["predicted speedup"] == "2.15×"  # 2.8 / (1 + 0.1 · 3)
        assert shown["measured speedup"] == "2.80×"  # 140 tokens/s of generation (280 tokens in 2 s) ÷ 50
        charts = charts_of(at)
        bars = charts["Acceptance at each draft position (this window)"][0]
        assert bars["x"] == ["1", "2", "3"] and bars["y"] == pytest.approx([0.8, 0.6, 0.4])
        assert charts["Acceptance rate of each 1 s window (1 with speculation)"][0]["x"] == pytest.approx([0.6])
        rates = charts["Tokens per second, between each two reads"]
        assert [trace["name"] for trace in rates] == ["drafted tokens/s", "accepted tokens/s", "generated tokens/s"]
        captions = " ".join(c.value for c in at.caption)
        assert "`llamacpp:spec_decode_num_draft_tokens_total` (drafted)" in captions
        assert "which /metrics, a running total, does not carry" in captions
        assert "per-request decode tokens/s" in captions and "the plain tokens/s, 50.0 (entered)" in captions

        at.button(key="obs_keep").click()
        ok(at.run())
        at.radio(key="obs_baseline_from").set_value("kept from a window")
        ok(at.run())
        assert metrics_of(at)["measured speedup"] == "1.00×"  # the same server's speed over itself
        assert f"kept from {server.url} at " in " ".join(c.value for c in at.caption)

        server.fake.mode = "off"
        ok(at.run())
        assert "Start it with `--metrics`" in at.error[0].value
        assert metrics_of(at)["acceptance rate"] == "0.600"  # the reads that succeeded before, still shown


def test_the_page_is_in_the_app_and_reports_a_bad_address(monkeypatch):
    monkeypatch.setenv(ENV_MODEL, "/no/such/model")  # the sidebar loads nothing: this page needs no model
    at = ok(AppTest.from_file(APP, default_timeout=TIMEOUT).run())
    at.switch_page("app/pages/observatory.py")
    ok(at.run())
    assert [t.value for t in at.title] == ["Server observatory"]
    at.text_input(key="obs_url").set_value("ftp://somewhere")
    ok(at.run())
    assert "not a server address" in at.main.error[0].value
    at.text_input(key="obs_url").set_value(f"http://127.0.0.1:{closed_port()}")
    ok(at.run())
    assert at.main.error[0].value.startswith("nothing listens at http://127.0.0.1:")
