"""A load benchmark of a running `specviz serve`: N clients at once, each doing M runs one after another, for
each N asked for; and the service's overhead on one client against the same runs decoded in this process.

    specviz load-bench --url http://127.0.0.1:8000 --clients 1,4,16 --runs 4 --max-new-tokens 64

It reports, per N: aggregate tokens/s (every token of every run ÷ the phase's wall time), time to first event
(submission to the first message, a `queued` one or the start event) and queue wait (submission to the start
event, which the engine sends when the run starts), p50 and p95. The local comparison loads the same model in this
process and alternates local and remote runs of the same prompts, one at a time, so both see the same machine."""
from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

from specviz.backends.client import Client
from specviz.bench.prompts import load_prompts
from specviz.drafters import DEFAULT
from specviz.errors import SpecvizError


@dataclass
class Timed:
    tokens: int
    wall_s: float
    first_event_s: float
    queue_wait_s: float


def timed_run(client: Client, prompt: str, **parameters) -> Timed:
    """One run; first event: submission to the first message (a queued one, or the start event); queue wait:
    submission to the start event, sent when the run starts on the engine."""
    submitted = time.perf_counter()
    first_message: list[float] = []
    start = done = None
    for event in client.stream(prompt, on_queued=lambda position: first_message.append(time.perf_counter()),
                               **parameters):
        if start is None:
            start = time.perf_counter()
        done = event
    end = time.perf_counter()
    first = min(first_message + [start])
    return Timed(len(done.token_ids), end - submitted, first - submitted, start - submitted)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def phase(url: str, token: str | None, n_clients: int, runs: int, prompts: list[str], parameters: dict) -> dict:
    results: list[Timed] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client_work(c: int) -> None:
        client = Client(url, token=token, client_id=f"load-{c}")
        for r in range(runs):
            try:
                got = timed_run(client, prompts[(c * runs + r) % len(prompts)], **parameters)
                with lock:
                    results.append(got)
            except Exception as err:  # reported in the table, not raised from a thread
                with lock:
                    errors.append(str(err))

    started = time.perf_counter()
    threads = [threading.Thread(target=client_work, args=(c,)) for c in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    tokens = sum(r.tokens for r in results)
    return {
        "clients": n_clients, "runs": len(results), "errors": errors, "wall_s": wall,
        "aggregate_tokens_per_s": tokens / wall if wall else 0.0,
        "first_event_p50_s": percentile([r.first_event_s for r in results], 0.5) if results else None,
        "first_event_p95_s": percentile([r.first_event_s for r in results], 0.95) if results else None,
        "queue_wait_p50_s": percentile([r.queue_wait_s for r in results], 0.5) if results else None,
        "queue_wait_p95_s": percentile([r.queue_wait_s for r in results], 0.95) if results else None,
    }


def overhead(url: str, token: str | None, model: str, prompts: list[str], parameters: dict, rounds: int) -> dict:
    """Tokens/s of one client against the same runs in this process, alternated (local, remote, local, ...)."""
    from specviz import api
    from specviz import models as m

    local_models = m.load(model)
    client = Client(url, token=token, client_id="load-overhead")
    local, remote = [], []
    api.generate(prompts[0], models=local_models, **parameters)  # warm-up, as the service warmed itself
    for r in range(rounds):
        prompt = prompts[r % len(prompts)]
        started = time.perf_counter()
        result = api.generate(prompt, models=local_models, **parameters)
        local.append(len(result.token_ids) / (time.perf_counter() - started))
        served = timed_run(client, prompt, model=model, **parameters)
        remote.append(served.tokens / served.wall_s)
    return {"local_tokens_per_s": statistics.median(local), "remote_tokens_per_s": statistics.median(remote),
            "remote_over_local": statistics.median(r / loc for r, loc in zip(remote, local)), "rounds": rounds}


def run(url: str, token: str | None, clients: list[int], runs: int, max_new_tokens: int, drafter: str | None,
        local_rounds: int) -> dict:
    info = Client(url, token=token).models()[0]
    parameters = {"model": info["name"], "drafter": drafter or info["default_drafter"] or DEFAULT,
                  "max_new_tokens": max_new_tokens, "temperature": 0.0}
    prompts = [p.text for p in load_prompts()]
    report = {"url": url, "model": info["name"], "device": info["device"], "dtype": info["dtype"],
              "drafter": parameters["drafter"], "max_new_tokens": max_new_tokens, "runs_per_client": runs,
              "phases": [phase(url, token, n, runs, prompts, parameters) for n in clients]}
    if local_rounds:
        local_parameters = {k: v for k, v in parameters.items() if k != "model"}
        try:
            report["overhead"] = overhead(url, token, info["name"], prompts, local_parameters, local_rounds)
        except SpecvizError as err:  # the service's model is not one this process can load by name
            report["overhead_skipped"] = f"the local comparison needs {info['name']} here: {err}"
    return report


def to_markdown(report: dict) -> str:
    lines = [f"Service at {report['url']}: `{report['model']}` on {report['device']} ({report['dtype']}), drafter "
             f"`{report['drafter']}`, {report['max_new_tokens']} new tokens a run, temperature 0, "
             f"{report['runs_per_client']} runs per client.", "",
             "| clients | runs | aggregate tokens/s | first event p50 / p95 (s) | queue wait p50 / p95 (s) | errors |",
             "|---:|---:|---:|---:|---:|---:|"]
    def pair(p, name):
        low, high = p[f"{name}_p50_s"], p[f"{name}_p95_s"]
        return "–" if low is None else f"{low:.2f} / {high:.2f}"

    for p in report["phases"]:
        lines.append(f"| {p['clients']} | {p['runs']} | {p['aggregate_tokens_per_s']:.1f} | {pair(p, 'first_event')} | "
                     f"{pair(p, 'queue_wait')} | {len(p['errors'])} |")
    if "overhead_skipped" in report:
        lines += ["", f"No local comparison: {report['overhead_skipped']}"]
    if "overhead" in report:
        o = report["overhead"]
        lines += ["", f"One client, the same {o['rounds']} runs alternated: in this process "
                      f"{o['local_tokens_per_s']:.1f} tokens/s, through the service {o['remote_tokens_per_s']:.1f} "
                      f"tokens/s (median remote ÷ local: {o['remote_over_local']:.3f})."]
    return "\n".join(lines) + "\n"
