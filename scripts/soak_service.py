"""Soak `specviz serve`: many runs with varied options through every route a client uses (event streams read
to the end or dropped, cancels, whole and streamed chat completions, watch links, bad requests), several clients
at once, while the server's resident memory, threads and open files are sampled.

    python scripts/soak_service.py --model smollm2-135m --runs 1000            # starts its own service
    python scripts/soak_service.py --url http://127.0.0.1:8000 --pid 1234      # one already running
    python scripts/soak_service.py --model smollm2-135m --half-open 1000        # slow clients instead

It prints a JSON report: RSS, threads and open files before the first request, after the warm-up (the
baseline), at the end, at their largest and once settled; what each kind of request got; and the time it took. tests/test_serve_soak.py runs it on the tiny test model."""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Iterator

import httpx
import psutil

DRAFTERS = ["none", "ngram", "ngram:k=2", "ngram:max_ngram=2", "ngram:k=6:min_ngram=2"]
KINDS = ["stream"] * 12 + ["drop", "cancel", "chat", "chat-stream", "watch", "trace", "bad"]


def body(rng: random.Random, model: str) -> dict:
    """A run's parameters, drawn: drafter, sampling, seed, length, detail."""
    return {"prompt": rng.choice(["abc abc abc", "Say hello.", "count: 1 2 3 4", "the cat sat on the mat. the"]),
            "model": model, "drafter": rng.choice(DRAFTERS), "max_new_tokens": rng.randint(1, 16),
            "temperature": rng.choice([0.0, 0.0, 0.7, 1.0, 1.5]), "top_p": rng.choice([1.0, 0.9]),
            "top_k": rng.choice([0, 0, 20]), "seed": rng.getrandbits(64), "n_top": rng.choice([0, 5, 20]),
            "detail": rng.random() < 0.7, "chat": rng.random() < 0.5}


def one(client: httpx.Client, rng: random.Random, model: str, kind: str) -> str:
    """One request of `kind`; what came of it ("ok", "429", "4xx" ...)."""
    run = body(rng, model)
    if kind == "bad":
        field, value = rng.choice([("seed", 2**70), ("temperature", 1e-45), ("max_new_tokens", 0), ("drafter", "ngram:\ud800"),
                                   ("top_p", 0.0), ("drafter", "ngram:max_ngram=99")])
        run[field] = value
        response = client.post("/v1/runs", content=json.dumps(run).encode(), headers={"Content-Type": "application/json"})
        return "refused" if 400 <= response.status_code < 500 and response.status_code != 429 else f"{response.status_code}!"
    if kind.startswith("chat"):
        chat = {"model": model, "messages": [{"role": "user", "content": run["prompt"]}], "stream": kind == "chat-stream",
                "max_tokens": run["max_new_tokens"], "temperature": run["temperature"], "seed": run["seed"],
                "specviz": {"drafter": run["drafter"]}}
        with client.stream("POST", "/v1/chat/completions", json=chat) as response:
            response.read()
            return "ok" if response.status_code == 200 else str(response.status_code)
    started = client.post("/v1/runs", json={**run, "share": kind == "watch"})
    if started.status_code != 201:
        return str(started.status_code)
    run_id, share_id = started.json()["run_id"], started.json()["share_id"]
    if kind == "cancel":
        return "ok" if client.delete(f"/v1/runs/{run_id}").status_code == 200 else "cancel!"
    if kind == "trace":
        return "ok" if client.get(f"/v1/runs/{run_id}/events.jsonl").status_code == 200 else "trace!"
    if kind == "watch":
        viewer = httpx.get(f"{str(client.base_url).rstrip('/')}/v1/watch/{share_id}/events", timeout=60)  # then the owner
        owner = client.get(f"/v1/runs/{run_id}/events")
        same = events_of(viewer.text) == events_of(owner.text)
        return "ok" if viewer.status_code == owner.status_code == 200 and same else "watch!"
    with client.stream("GET", f"/v1/runs/{run_id}/events") as response:
        for i, _ in enumerate(response.iter_lines()):
            if kind == "drop" and i == 3:
                return "ok"  # the owner left: the run is cancelled after the grace
    return "ok" if response.status_code == 200 else str(response.status_code)


def events_of(sse: str) -> list[str]:
    """A stream's numbered events (the queue positions between them differ from one listener to another)."""
    lines = sse.splitlines()
    return [line for i, line in enumerate(lines) if line.startswith("id:") or (i and lines[i - 1].startswith("id:"))]


def sample(process: psutil.Process) -> dict:
    with process.oneshot():
        return {"rss_mb": process.memory_info().rss / 2**20, "threads": process.num_threads(), "fds": process.num_fds()}


def soak(url: str, pid: int, model: str, runs: int, clients: int = 4, warmup: int = 100, settle_s: float = 60.0,
         seed: int = 0) -> dict:
    """`runs` requests from `clients` threads; the first `warmup` before the baseline is taken."""
    process, outcomes, errors, lock = psutil.Process(pid), Counter(), [], threading.Lock()
    before = sample(process)
    peak = dict(before)

    def work(index: int, count: int) -> None:
        rng = random.Random(seed * 1000 + index)
        with httpx.Client(base_url=url, timeout=60, headers={"X-Specviz-Client": f"soak-{index}"}) as client:
            for _ in range(count):
                kind = rng.choice(KINDS)
                try:
                    outcome = one(client, rng, model, kind)
                except Exception as err:  # counted: the soak goes on, and the report says what failed
                    outcome = f"{type(err).__name__}!"
                with lock:
                    outcomes[f"{kind}:{outcome}"] += 1
                    if outcome.endswith("!") or outcome.startswith("5"):
                        errors.append(f"{kind}: {outcome}")

    def phase(total: int) -> None:
        threads = [threading.Thread(target=work, args=(i, total // clients + (i < total % clients)))
                   for i in range(clients)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            now = sample(process)
            peak.update({k: max(peak[k], now[k]) for k in now})
            time.sleep(0.5)

    started = time.monotonic()
    phase(warmup)
    time.sleep(3)  # the warm-up's last runs end and their streams close
    baseline = sample(process)
    phase(runs - warmup)
    elapsed = time.monotonic() - started
    end = sample(process)
    settled, waited = end, 0.0
    while waited < settle_s and (settled["threads"] > baseline["threads"] or settled["fds"] > baseline["fds"]):
        time.sleep(1)
        waited += 1
        settled = sample(process)
    return {"runs": runs, "clients": clients, "elapsed_s": round(elapsed, 1), "before": before, "baseline": baseline,
            "end": end,
            "peak": peak, "settled": settled, "settled_after_s": waited,
            "rss_growth_mb": round(end["rss_mb"] - baseline["rss_mb"], 1), "outcomes": dict(sorted(outcomes.items())),
            "errors": errors[:20]}


def half_open(url: str, pid: int, connections: int = 1000, header_timeout_s: float = 10.0) -> dict:
    """Open `connections` sockets that each send half a request's headers and stop; then time a new client's
    request, and watch the server's open files until the header deadline has closed the half-open ones."""
    import socket

    host, port = url.split("//")[1].split(":")
    process, sockets = psutil.Process(pid), []
    before = process.num_fds()
    try:
        for _ in range(connections):
            s = socket.create_connection((host, int(port)))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half")
            sockets.append(s)
        time.sleep(1.0)
        held = process.num_fds()
        started = time.monotonic()
        status = httpx.get(url + "/healthz", timeout=30).status_code
        served_s = time.monotonic() - started
        deadline = time.monotonic() + header_timeout_s + 10
        while process.num_fds() > before + 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        return {"half_open": connections, "fds_before": before, "fds_held": held, "new_client_status": status,
                "new_client_s": round(served_s, 3), "fds_after_deadline": process.num_fds(),
                "closed_within_s": round(time.monotonic() - started, 1)}
    finally:
        for s in sockets:
            s.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="preset or folder (when it starts its own service)")
    parser.add_argument("--url", default=None, help="a running service (give --pid too)")
    parser.add_argument("--pid", type=int, default=None)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--serve-args", default="--threads 1", help="more `specviz serve` flags")
    parser.add_argument("--half-open", type=int, default=0, metavar="N",
                        help="instead of runs: N connections that send half a header, and a new client's wait")
    args = parser.parse_args()
    with served(args):
        model = httpx.get(args.url + "/v1/models").json()["models"][0]["name"]
        report = half_open(args.url, args.pid, args.half_open) if args.half_open else \
            soak(args.url, args.pid, model, args.runs, args.clients)
        print(json.dumps(report, indent=1))
    return 0


@contextlib.contextmanager
def served(args) -> Iterator[None]:
    """args.url and args.pid of the service to measure: the one given, else a `specviz serve` started here on
    args.port with args.model and args.serve_args, stopped on the way out."""
    server = None
    if args.url is None:
        server = subprocess.Popen([sys.executable, "-m", "specviz", "serve", "--model", args.model, "--port",
                                   str(args.port), *args.serve_args.split()], stderr=subprocess.PIPE, text=True)
        for line in server.stderr:
            if "ready on" in line:
                break
        args.url, args.pid = f"http://127.0.0.1:{args.port}", server.pid
    try:
        yield
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
