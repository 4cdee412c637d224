"""A stand-in for a speculating server's Prometheus /metrics, in the exact text shapes of the two engines:

- llama-server (llama.cpp build 11434, tools/server/server-task.cpp's to_metrics): `# HELP` and `# TYPE` lines,
  `llamacpp:` names, doubles printed as a C++ stream prints them (six significant digits: 1234567 -> 1.23457e+06),
  the per-position counter only once a draft was verified, and its start time in a Process-Start-Time-Unix header;
- vLLM 0.32 (vllm/v1/spec_decode/metrics.py and v1/metrics/loggers.py, printed by prometheus_client): counters as
  `_total` beside `_created`, labelled model_name and engine, the per-position counter with a position label too, a
  histogram, and process_start_time_seconds.

Its counters advance by `steps_per_scrape` verify steps on every scrape, each step accepting draft position i in
exactly the share `accept[i]` of the steps (rounded), and by `steps_per_request` on each POST /v1/completions, a
dummy request that holds a slot for `hold_s`. `restart()` sets them back to zero with a new start time, as a
restarted server would. `mode` serves the faults: "off" (llama-server without --metrics: 501 and its message;
vLLM: 404), "garbage" (an HTML page), "foreign" (Prometheus text from neither engine). `token` asks for a bearer
token, as llama-server started with --api-key does."""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from serving import InThread

MODEL = "fake-model"
STEP_S = 0.02  # seconds of generation a verify step takes (llama.cpp's tokens_predicted_seconds)
FOREIGN = ("# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
           "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n"
           'http_requests_total{code="200",handler="/"} 3\n')
GARBAGE = "<!doctype html>\n<html><body><h1>Welcome</h1>\n<p>It works.</p></body></html>\n"


@dataclass
class Counters:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)
    generated: int = 0
    decode_s: float = 0.0
    requests: int = 0


class Fake:
    """The server's state: its counters and what its /metrics serves."""

    def __init__(self, engine: str = "llamacpp", accept: tuple[float, ...] = (0.8, 0.6, 0.4), steps_per_scrape: int = 100,
                 steps_per_request: int = 10, hold_s: float = 0.02, speculative: bool = True, token: str | None = None):
        self.engine, self.accept, self.speculative, self.token = engine, accept, speculative, token
        self.steps_per_scrape, self.steps_per_request, self.hold_s = steps_per_scrape, steps_per_request, hold_s
        self.mode = "ok"
        self.running = 0
        self.lock = threading.Lock()
        self.restart()

    def restart(self) -> None:
        with self.lock:
            self.counters = Counters()
            self.started = time.time()
            self.created = self.started + 0.5

    def advance(self, steps: int) -> None:
        """`steps` verify steps of K = len(accept) drafted tokens; position i accepted in round(steps · accept[i])
        of them (never more than position i − 1: a chain stops at its first rejection)."""
        with self.lock:
            c = self.counters
            if not self.speculative:
                c.generated += steps
                c.decode_s += steps * STEP_S
                return
            if not c.per_pos and steps:
                c.per_pos = [0] * len(self.accept)
            accepted, previous = [], steps
            for a in self.accept:
                previous = min(previous, round(steps * a))
                accepted.append(previous)
            c.drafts += steps
            c.draft_tokens += steps * len(self.accept)
            c.accepted += sum(accepted)
            c.per_pos = [n + m for n, m in zip(c.per_pos, accepted)] if steps else c.per_pos
            c.generated += steps + sum(accepted)
            c.decode_s += steps * STEP_S

    def text(self) -> str:
        with self.lock:
            return llamacpp_text(self.counters, self.running) if self.engine == "llamacpp" else vllm_text(self)


def cpp(value: float) -> str:
    """A double as a C++ ostream prints it by default (%g, six significant digits)."""
    return f"{value:g}"


def llamacpp_text(c: Counters, running: int) -> str:
    """server_task_result_metrics::to_metrics's text for these counters."""
    counters = [
        ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", 7.0 * c.requests),
        ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", 0.0),
        ("prompt_seconds_total", "Total time spent processing prompts", 0.01 * c.requests),
        ("tokens_predicted_total", "Number of generation tokens processed", c.generated),
        ("tokens_predicted_seconds_total", "Total time spent generating tokens", c.decode_s),
        ("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
         c.generated - c.accepted),
        ("n_tokens_max", "Largest observed sequence length (prompt + generation)", 64.0),
        ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", c.draft_tokens),
        ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model", c.accepted),
        ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps", c.drafts),
    ]
    gauges = [
        ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", 700.0 if c.requests else 0.0),
        ("predicted_tokens_seconds", "Average generation throughput in tokens/s", c.generated / c.decode_s if c.decode_s else 0.0),
        ("requests_processing", "Number of requests processing", running),
        ("requests_deferred", "Number of requests deferred", 0.0),
        ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call", 1.0),
    ]
    lines = []
    for kind, items in (("counter", counters), ("gauge", gauges)):
        for name, description, value in items:
            lines += [f"# HELP llamacpp:{name} {description}", f"# TYPE llamacpp:{name} {kind}",
                      f"llamacpp:{name} {cpp(value)}"]
    if c.per_pos:  # uint64 counts: printed whole
        lines += ["# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position",
                  "# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter"]
        lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {n}'
                  for i, n in enumerate(c.per_pos)]
    return "\n".join(lines) + "\n"


class VllmCollector:
    """vLLM's metric families for one engine (engine="0") of the served model, read from the Fake's counters."""

    def __init__(self, fake: Fake):
        self.fake = fake

    def collect(self):
        f, c = self.fake, self.fake.counters
        labels, values = ["model_name", "engine"], [MODEL, "0"]

        def counter(name: str, help_text: str, value: float, extra: tuple = ()) -> CounterMetricFamily:
            family = CounterMetricFamily(name, help_text, labels=labels + [k for k, _ in extra])
            family.add_metric(values + [v for _, v in extra], value, created=f.created)
            return family

        running = GaugeMetricFamily("vllm:num_requests_running", "Number of requests in model execution batches.",
                                    labels=labels)
        running.add_metric(values, f.running)
        yield running
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", 7.0 * c.requests)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", c.generated)
        lengths = HistogramMetricFamily("vllm:request_generation_tokens", "Histogram of number of generation tokens processed.",
                                        labels=labels)
        lengths.add_metric(values, [("1.0", 0), ("16.0", c.requests), ("+Inf", c.requests)], sum_value=16.0 * c.requests)
        yield lengths
        if f.speculative:
            yield counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", c.drafts)
            yield counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", c.draft_tokens)
            yield counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", c.accepted)
            per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                          "Accepted tokens per draft position.", labels=labels + ["position"])
            for i in range(len(f.accept)):  # vLLM makes one series per position at start-up
                per_pos.add_metric(values + [str(i)], c.per_pos[i] if c.per_pos else 0, created=f.created)
            yield per_pos
        start = GaugeMetricFamily("process_start_time_seconds", "Start time of the process since unix epoch in seconds.")
        start.add_metric([], f.started)
        yield start


def vllm_text(fake: Fake) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(VllmCollector(fake))
    return generate_latest(registry).decode()


def app(fake: Fake) -> FastAPI:
    api = FastAPI()

    @api.get("/metrics")
    async def metrics(request: Request):
        if fake.token and request.headers.get("authorization") != f"Bearer {fake.token}":
            return JSONResponse({"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}, 401)
        if fake.mode == "off":
            if fake.engine == "llamacpp":
                return JSONResponse({"error": {"code": 501, "message": "This server does not support metrics endpoint. "
                                               "Start it with `--metrics`", "type": "not_supported_error"}}, 501)
            return JSONResponse({"detail": "Not Found"}, 404)
        if fake.mode == "garbage":
            return HTMLResponse(GARBAGE)
        if fake.mode == "foreign":
            return PlainTextResponse(FOREIGN)
        fake.advance(fake.steps_per_scrape)
        headers = {"Process-Start-Time-Unix": str(int(fake.started))} if fake.engine == "llamacpp" else {}
        return PlainTextResponse(fake.text(), headers=headers, media_type="text/plain; version=0.0.4")

    @api.post("/v1/completions")
    async def completions() -> dict:
        """A dummy request: holds a slot for hold_s, then adds steps_per_request verify steps."""
        fake.running += 1
        try:
            await asyncio.sleep(fake.hold_s)
            fake.advance(fake.steps_per_request)
            with fake.lock:
                fake.counters.requests += 1
        finally:
            fake.running -= 1
        return {"object": "text_completion", "model": MODEL, "choices": [{"index": 0, "text": "ok"}]}

    return api


class Served(InThread):
    """The fake on a free loopback port, in a thread, for a `with` block; `fake` is its state."""

    def __init__(self, fake: Fake | None = None, **options):
        self.fake = fake or Fake(**options)
        super().__init__(app(self.fake), "the fake metrics server")
