"""Watch a running server speculate, from its Prometheus `/metrics`: an unmodified vLLM (metrics named `vllm:...`)
or llama.cpp's llama-server started with `--metrics` (`llamacpp:...`). The app's Server observatory page draws what
this module computes; nothing here imports streamlit.

A scrape becomes a Snapshot: the server's cumulative counters at one moment. Two snapshots make a Window, what
happened between them, and from it (p = target, q = draft; a draft is one request's drafted tokens checked in one
verify step: both engines count one per request per verify step, so a batched step over B requests adds B):

    acceptance rate           = accepted / drafted tokens
    mean acceptance length    = 1 + accepted / drafts     (both engines' name and definition: over the steps that
                                                           drafted, the bonus token counted; specviz's τ divides by
                                                           every target forward instead, and is smaller where some
                                                           steps draft nothing)
    acceptance at position i  = accepted_at[i] / drafts   (over every draft, as both engines divide; specviz's
                                                           per-depth acceptance divides by the drafts reaching i)

Counters only grow while a server runs; one that goes back (or a new process start time) means the server
restarted, and a Watcher's history starts again there.

Where the counters come from, summed over every label set but `position` (vLLM labels each series with
model_name and engine; prometheus_client prints a counter `x` as `x_total`, beside a `x_created` timestamp):

    quantity                vLLM 0.32 (v1/spec_decode/metrics.py,          llama.cpp build 11434
                            v1/metrics/loggers.py)                         (tools/server/server-task.cpp, to_metrics)
    drafts (per request     vllm:spec_decode_num_drafts_total              llamacpp:spec_decode_num_drafts_total
      per verify step)
    drafted tokens          vllm:spec_decode_num_draft_tokens_total        llamacpp:spec_decode_num_draft_tokens_total
    accepted tokens         vllm:spec_decode_num_accepted_tokens_total     llamacpp:spec_decode_num_accepted_tokens_total
    accepted at position i  vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}   (the same, llamacpp:)
    generated tokens        vllm:generation_tokens_total                   llamacpp:tokens_predicted_total
    requests running        vllm:num_requests_running                      llamacpp:requests_processing
    seconds generating      -                                              llamacpp:tokens_predicted_seconds_total

llama-server adds a request's counts when the request finishes, so its windows move in steps, one finished request
at a time; vLLM adds them every engine step.
"""
from __future__ import annotations

import collections
import json
import re
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import httpx

from specviz.decoding.costs import interpolate
from specviz.errors import SpecvizError

Series = tuple[str, tuple[tuple[str, str], ...]]  # a metric name and its (label, value) pairs, sorted
Samples = dict[Series, float]

ENGINES = {"vllm": "vLLM", "llamacpp": "llama.cpp (llama-server)"}  # engine -> its name for people
PREFIXES = ("vllm+", "llamacpp+", "llama+")  # the app's engine addresses: the prefix names the engine, the rest is HTTP
TIMEOUT_S = 2.0  # one scrape's limit: a page that refreshes every second or two must not wait longer
KEEP = 600  # snapshots a Watcher keeps: 10 minutes at one a second

# quantity -> metric name (counters without their `_total`, which `counter` adds)
METRICS = {
    "vllm": {"drafts": "vllm:spec_decode_num_drafts", "draft_tokens": "vllm:spec_decode_num_draft_tokens",
             "accepted": "vllm:spec_decode_num_accepted_tokens",
             "accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos",
             "generated": "vllm:generation_tokens", "running": "vllm:num_requests_running"},
    "llamacpp": {"drafts": "llamacpp:spec_decode_num_drafts", "draft_tokens": "llamacpp:spec_decode_num_draft_tokens",
                 "accepted": "llamacpp:spec_decode_num_accepted_tokens",
                 "accepted_per_pos": "llamacpp:spec_decode_num_accepted_tokens_per_pos",
                 "generated": "llamacpp:tokens_predicted", "running": "llamacpp:requests_processing",
                 "decode_seconds": "llamacpp:tokens_predicted_seconds"},
}
METRICS_OFF = ("llama-server serves /metrics only when started with `--metrics`; vLLM always serves it, so check "
               "the address")

# ----------------------------------------------------------------------------------------------------- parsing
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?")  # name{labels} value [timestamp]
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_metrics(text: str) -> Samples:
    """Prometheus text exposition -> {(name, ((label, value), ...)): value}. Comments (# HELP, # TYPE, # EOF) and
    blank lines are skipped; a line that is not a sample raises ValueError naming it."""
    samples: Samples = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.fullmatch(line)
        try:
            if match is None:
                raise ValueError
            value = float(match[3])
            labels = _labels(match[2] or "")
        except ValueError:
            raise ValueError(f"line {number} is not a Prometheus sample: {line[:80]!r}") from None
        samples[match[1], labels] = value
    return samples


def _labels(text: str) -> tuple[tuple[str, str], ...]:
    pairs, at = [], 0
    while at < len(text.rstrip()):
        match = _LABEL.match(text, at)
        if match is None or match.end() == at:
            raise ValueError
        value = re.sub(r'\\[\\"n]', lambda m: _ESCAPES[m[0]], match[2])
        pairs.append((match[1], value))
        at = match.end()
    return tuple(sorted(pairs))


def counter(samples: Samples, name: str) -> float | None:
    """The sum of counter `name` over its label sets (its `name_total` series, else plain `name`); None: absent."""
    for series in (f"{name}_total", name):
        values = [v for (n, _), v in samples.items() if n == series]
        if values:
            return sum(values)
    return None


def per_position(samples: Samples, name: str) -> tuple[float, ...]:
    """Counter `name` by its `position` label (0, 1, ...), summed over the other labels; () where absent."""
    by_position: dict[int, float] = collections.defaultdict(float)
    for series in (f"{name}_total", name):
        for (n, labels), value in samples.items():
            position = dict(labels).get("position")
            if n == series and position is not None and position.isdigit():
                by_position[int(position)] += value
        if by_position:
            break
    return tuple(by_position.get(i, 0.0) for i in range(max(by_position) + 1)) if by_position else ()


def detect_engine(samples: Samples) -> str | None:
    """"vllm" or "llamacpp" from the metric prefixes; None for a server that is neither."""
    names = {name for name, _ in samples}
    for engine in ("vllm", "llamacpp"):
        if any(name.startswith(engine + ":") for name in names):
            return engine
    return None


# -------------------------------------------------------------------------------------------------- snapshots
@dataclass(frozen=True)
class Snapshot:
    """One server's cumulative counters at one moment (what one scrape of /metrics says)."""

    engine: str  # "vllm" or "llamacpp"
    at: float  # time.monotonic() when it was read: windows' durations
    wall: float  # time.time() then: the charts' time axis
    speculative: bool  # whether the server reports speculative counters at all (vLLM: only with a speculative config)
    drafts: float  # verify steps that checked drafted tokens
    draft_tokens: float
    accepted: float
    accepted_per_pos: tuple[float, ...]  # verify steps that accepted draft position i (a chain: non-increasing in i)
    generated: float  # tokens generated, every request together
    running: float  # requests being decoded now (a gauge)
    decode_seconds: float | None = None  # llama.cpp: seconds spent generating, summed over requests
    started: float | None = None  # the server process's start (Unix time), where the server says


def snapshot(samples: Samples, at: float | None = None, wall: float | None = None,
             started: float | None = None) -> Snapshot:
    """The Snapshot in parsed /metrics `samples`; SpecvizError for metrics of neither engine."""
    engine = detect_engine(samples)
    if engine is None:
        shown = ", ".join(sorted({name for name, _ in samples})[:5])
        raise SpecvizError(f"these metrics are neither vLLM's (vllm:...) nor llama.cpp's (llamacpp:...); they "
                           f"name {shown or 'nothing'}")
    names = METRICS[engine]
    drafts = counter(samples, names["drafts"])
    running = [v for (n, _), v in samples.items() if n == names["running"]]
    if started is None:  # prometheus_client's process collector, where the server runs it (vLLM does)
        started = next((v for (n, _), v in samples.items() if n == "process_start_time_seconds"), None)
    return Snapshot(
        engine=engine, at=time.monotonic() if at is None else at, wall=time.time() if wall is None else wall,
        speculative=drafts is not None, drafts=drafts or 0.0,
        draft_tokens=counter(samples, names["draft_tokens"]) or 0.0,
        accepted=counter(samples, names["accepted"]) or 0.0,
        accepted_per_pos=per_position(samples, names["accepted_per_pos"]),
        generated=counter(samples, names["generated"]) or 0.0, running=sum(running),
        decode_seconds=counter(samples, names["decode_seconds"]) if "decode_seconds" in names else None,
        started=started)


def restarted(before: Snapshot, after: Snapshot) -> bool:
    """Whether `after` comes from a new server process: another engine, another start time, or a counter that
    went back."""
    if before.engine != after.engine:
        return True
    if before.started is not None and after.started is not None and before.started != after.started:
        return True
    pairs = [(before.drafts, after.drafts), (before.draft_tokens, after.draft_tokens),
             (before.accepted, after.accepted), (before.generated, after.generated),
             (before.decode_seconds or 0.0, after.decode_seconds or 0.0)]
    if len(after.accepted_per_pos) < len(before.accepted_per_pos):
        return True
    pairs += list(zip(before.accepted_per_pos, after.accepted_per_pos))
    return any(b < a for a, b in pairs)


# ---------------------------------------------------------------------------------------------------- windows
@dataclass(frozen=True)
class Window:
    """What a server did between two snapshots: the differences of its counters, and the ratios and rates of them."""

    engine: str
    seconds: float
    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: tuple[float, ...]
    generated: float
    running: float  # requests running at the window's end
    end_wall: float  # time.time() at the window's end
    decode_seconds: float | None = None  # llama.cpp: seconds requests spent generating in the window

    @property
    def speculative(self) -> bool:
        """Whether any verify step checked a draft in this window (else its ratios are None)."""
        return self.drafts > 0 and self.draft_tokens > 0

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted tokens."""
        return self.accepted / self.draft_tokens if self.speculative else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted / drafts: tokens per draft verified, counting the bonus (vLLM's and llama.cpp's mean
        acceptance length, over the steps that drafted; not specviz's τ, which divides by every target forward)."""
        return 1.0 + self.accepted / self.drafts if self.speculative else None

    @property
    def per_position(self) -> tuple[float, ...]:
        """Acceptance at each draft position: the share of all drafts that accepted position i (both engines'
        denominator; a draft that stopped short of i counts as not accepting it)."""
        return tuple(a / self.drafts for a in self.accepted_per_pos) if self.speculative else ()

    @property
    def draft_length(self) -> float | None:
        """K: drafted tokens per verify step (a chain that always drafts K tokens: exactly K)."""
        return self.draft_tokens / self.drafts if self.speculative else None

    @property
    def plain_share(self) -> float:
        """The share of decode steps that verified no draft: generated tokens not made by a verify step (each makes
        1 + its accepted tokens), counting each request's first token, which its prefill makes."""
        plain = max(0.0, self.generated - self.drafts - self.accepted)
        return plain / (plain + self.drafts) if plain + self.drafts > 0 else 0.0

    def per_second(self, count: float) -> float:
        return count / self.seconds if self.seconds > 0 else 0.0

    @property
    def drafted_per_s(self) -> float:
        return self.per_second(self.draft_tokens)

    @property
    def accepted_per_s(self) -> float:
        return self.per_second(self.accepted)

    @property
    def generated_per_s(self) -> float:
        """Generated tokens per wall-clock second, every request together (idle time included)."""
        return self.per_second(self.generated)

    @property
    def decode_tokens_per_s(self) -> float | None:
        """llama.cpp: generated tokens per second a request spent generating (one stream's speed); else None."""
        return self.generated / self.decode_seconds if self.decode_seconds else None

    def speed(self) -> tuple[float, str]:
        """The tokens/s a measured speedup divides: one stream's decode speed where the server reports the time
        spent generating (llama.cpp), else the wall-clock rate; and which it is."""
        decode = self.decode_tokens_per_s
        if decode is not None:
            return decode, "per-request decode tokens/s (tokens_predicted ÷ tokens_predicted_seconds)"
        return self.generated_per_s, "wall-clock generated tokens/s, every request together"


def window(before: Snapshot, after: Snapshot) -> Window:
    """The Window from `before` to `after`; ValueError when the server restarted in between."""
    if restarted(before, after):
        raise ValueError("the server restarted between these snapshots: its counters start again from zero")
    n = len(after.accepted_per_pos)
    earlier = before.accepted_per_pos + (0.0,) * (n - len(before.accepted_per_pos))  # llama.cpp: none before its first draft
    decode = None if after.decode_seconds is None else after.decode_seconds - (before.decode_seconds or 0.0)
    return Window(engine=after.engine, seconds=after.at - before.at, drafts=after.drafts - before.drafts,
                  draft_tokens=after.draft_tokens - before.draft_tokens, accepted=after.accepted - before.accepted,
                  accepted_per_pos=tuple(b - a for a, b in zip(earlier, after.accepted_per_pos)),
                  generated=after.generated - before.generated, running=after.running, end_wall=after.wall,
                  decode_seconds=decode)


def no_speculation(latest: Snapshot) -> str:
    """Why a window holds no speculation, from what the server's counters say."""
    if not latest.speculative:
        return ("No speculation: this vLLM server reports no spec_decode counters (it was started without "
                "--speculative-config).")
    if latest.drafts == 0:
        return ("No speculation yet: the server has verified no draft since it started (llama-server drafts with "
                "--spec-type or -md, vLLM with --speculative-config), or no request has run.")
    return ("No speculation in this window: no verify step checked a draft between these reads (the server was idle, "
            "or, for llama-server, which adds a request's counts when it finishes, no request finished).")


# ------------------------------------------------------------------------------------------------- prediction
def flat_cost(n: float) -> float:
    """c(n) = 1: verifying n tokens costs one plain forward (a forward bound by reading the weights)."""
    return 1.0


def relative_cost(curve: Mapping[str | int, float]) -> Callable[[float], float]:
    """c(n) = cost(n) / cost(1) from a measured verify-cost curve {n: seconds or ms} (specviz.decoding.costs'
    interpolation: linear between measured sizes, extended past the last)."""
    cost = interpolate({int(n): float(v) for n, v in curve.items()})
    one = cost(1)
    return lambda n: cost(n) / one  # type: ignore[arg-type]  # the interpolation is linear: a fractional n works


@dataclass(frozen=True)
class Prediction:
    """The speedup a chain's measured per-position acceptance predicts under a cost model:

        speedup = (f + (1 − f) · L̂) / (f + (1 − f) · (c(K + 1) + d · K)),   L̂ = 1 + Σᵢ aᵢ

    aᵢ: acceptance at draft position i; K: drafted tokens per verify step; c(n): the target's cost of verifying n
    tokens in one forward, relative to one token; d: the draft's cost per drafted token, relative to one target
    forward (0 for n-gram lookup); f: the share of steps that verified no draft (one token for one plain forward).
    L̂ is the predicted mean acceptance length (tokens per draft verified), not specviz's τ. With f = 0 it is
    L̂ / (c(K + 1) + d · K)."""

    mean_length: float  # L̂: tokens per draft verified
    k: float
    verify_cost: float  # c(K + 1)
    draft_cost: float  # d
    plain_share: float  # f
    speedup: float


def predict(per_position: Sequence[float], k: float, verify_cost: Callable[[float], float] = flat_cost,
            draft_cost: float = 0.0, plain_share: float = 0.0) -> Prediction:
    """Prediction's formula for acceptance `per_position` (a chain of K = `k` drafted tokens)."""
    length = 1.0 + sum(per_position)
    c = verify_cost(k + 1)
    f = plain_share
    speedup = (f + (1 - f) * length) / (f + (1 - f) * (c + draft_cost * k))
    return Prediction(mean_length=length, k=k, verify_cost=c, draft_cost=draft_cost, plain_share=f, speedup=speedup)


def predict_window(w: Window, verify_cost: Callable[[float], float] = flat_cost,
                   draft_cost: float = 0.0) -> Prediction | None:
    """The window's predicted speedup (its per-position acceptance, K and plain share); None without speculation."""
    if not w.speculative or w.draft_length is None:
        return None
    return predict(w.per_position, w.draft_length, verify_cost, draft_cost, w.plain_share)


def measured_speedup(tokens_per_s: float, baseline_tokens_per_s: float | None) -> float | None:
    """tokens/s ÷ a plain (non-speculative) baseline's tokens/s; None without a baseline."""
    return tokens_per_s / baseline_tokens_per_s if baseline_tokens_per_s else None


# ---------------------------------------------------------------------------------------------------- watcher
def server_url(address: str) -> str:
    """http(s)://host:port from what a user types: `http://host:port`, `vllm+http://...`, `llama+http://...`,
    `host:port`, with or without a trailing /metrics."""
    url = address.strip()
    for prefix in PREFIXES:
        url = url.removeprefix(prefix)
    if "://" not in url:
        url = "http://" + url
    scheme, rest = url.split("://", 1)
    rest = rest.rstrip("/").removesuffix("/metrics").rstrip("/")
    if scheme not in ("http", "https") or not rest:
        raise SpecvizError(f"not a server address: {address!r}; give http://host:port (or vllm+http://..., "
                           "llama+http://...)")
    return f"{scheme}://{rest}"


class Watcher:
    """Polls one server's /metrics and keeps its last `keep` snapshots since it (re)started."""

    def __init__(self, url: str, token: str | None = None, keep: int = KEEP, timeout_s: float = TIMEOUT_S):
        self.url = server_url(url)
        self.token = token or None  # a bearer token: llama-server started with --api-key asks for it on /metrics
        self.timeout_s = timeout_s
        self.history: collections.deque[Snapshot] = collections.deque(maxlen=keep)
        self.restarts: list[float] = []  # time.time() of each restart seen; the history starts again at the last

    def scrape(self) -> Snapshot:
        """Read /metrics once; SpecvizError saying what is wrong and what to do."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        where = f"{self.url}/metrics"
        try:
            response = httpx.get(where, headers=headers, timeout=self.timeout_s)
        except httpx.ConnectError as err:
            raise SpecvizError(f"nothing listens at {self.url} ({err}): start the server (docs/observatory.md), or "
                               "check the address and port") from None
        except httpx.TimeoutException:
            raise SpecvizError(f"the server at {self.url} did not answer /metrics within {self.timeout_s:g} s: "
                               "busy or stuck; see its log") from None
        except httpx.HTTPError as err:
            raise SpecvizError(f"could not read {where} ({type(err).__name__}: {err})") from None
        if response.status_code in (404, 501):
            raise SpecvizError(f"the server at {self.url} has its /metrics off (HTTP {response.status_code}: "
                               f"{_message(response)}): {METRICS_OFF}")
        if response.status_code in (401, 403):
            raise SpecvizError(f"the server at {self.url} refused /metrics (HTTP {response.status_code}: "
                               f"{_message(response)}): give its API key as the token")
        if response.status_code != 200:
            raise SpecvizError(f"the server at {self.url} answered /metrics with HTTP {response.status_code}: "
                               f"{_message(response)}")
        try:
            samples = parse_metrics(response.text)
        except ValueError as err:
            raise SpecvizError(f"the server at {self.url} answered /metrics with something that is not Prometheus "
                               f"text ({err}): is this a vLLM or llama-server address?") from None
        started = response.headers.get("Process-Start-Time-Unix")  # llama-server's own start time
        try:
            return snapshot(samples, started=float(started) if started else None)
        except SpecvizError as err:
            raise SpecvizError(f"the server at {self.url} is neither vLLM nor llama.cpp: {err}") from None

    def poll(self) -> Snapshot:
        """Scrape, and keep the snapshot; a restarted server (its counters went back) starts a new history."""
        latest = self.scrape()
        if self.history and restarted(self.history[-1], latest):
            self.history.clear()
            self.restarts.append(latest.wall)
        self.history.append(latest)
        return latest

    def windows(self) -> list[Window]:
        """The window between each two consecutive snapshots kept, oldest first."""
        kept = list(self.history)
        return [window(a, b) for a, b in zip(kept, kept[1:])]

    def recent(self, seconds: float) -> Window | None:
        """The window from the oldest snapshot at most `seconds` before the latest (at least the one before it) to
        the latest; None with fewer than two snapshots."""
        kept = list(self.history)
        if len(kept) < 2:
            return None
        latest = kept[-1]
        start = next((s for s in kept[:-1] if latest.at - s.at <= seconds), kept[-2])
        return window(start, latest)


def _message(response: httpx.Response) -> str:
    """The error a server put in its body: llama-server's {"error": {"message"}}, FastAPI's {"detail"}, or text."""
    try:
        body = response.json()
        error = body.get("error") if isinstance(body, dict) else None
        text = (error.get("message") if isinstance(error, dict) else error) or body.get("detail") or body
    except (ValueError, AttributeError):
        text = response.text
    text = text if isinstance(text, str) else json.dumps(text)
    return " ".join(text.split())[:200] or "no message"
