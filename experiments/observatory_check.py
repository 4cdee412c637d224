"""Does the observatory keep up with a busy llama-server, and does its predicted speedup match the measured one?

    .venv/bin/python experiments/observatory_check.py --clients 16 --prompts 32 --max-new-tokens 64 \
        --out docs/results/observatory-check.md

Starts llama-server (`make llamacpp`) on the embedded model's GGUF, plain and speculating (ngram-mod, and
draft-simple with our draft model), and for each:
1. sends the prompts from `--clients` threads at once (each takes the next prompt until none is left) while a
   specviz.observatory.Watcher polls /metrics every second: every poll's latency is recorded;
2. reads the window over the whole load: acceptance, per-position acceptance, K, the plain share, and the decode
   speed (llamacpp:tokens_predicted_total ÷ tokens_predicted_seconds_total: time spent generating, queueing out);
3. predicts the speedup from the window alone, as the page does (specviz.observatory.predict_window), with:
   - c(n), the target's cost of verifying n tokens relative to one, measured on the plain server: the prompt time
     of n new tokens on top of a cached prefix (`timings.prompt_ms`), over the prompt time of one;
   - d, the draft's cost per drafted token relative to one target forward: 0 for n-gram lookup; for the draft
     model, its own plain decode time per token (the draft GGUF served alone) over the target's;
4. compares with the measured speedup: the speculating server's decode speed ÷ the plain server's, on the same
   prompts and load.
The goal: every poll ≤ 2 s under 16 clients, and predicted within 15 % of measured.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specviz import observatory  # noqa: E402
from specviz.llamacpp.build import installed  # noqa: E402
from specviz.llamacpp.files import ggufs  # noqa: E402
from specviz.llamacpp.server import LlamaServer  # noqa: E402

MT_BENCH = ROOT.parent / "shared" / "data" / "mt_bench.jsonl"


def prompts(limit: int) -> list[str]:
    rows = [json.loads(line) for line in MT_BENCH.read_text().splitlines() if line.strip()]
    return [r["turns"][0] for r in rows[:limit]]


def load(server: LlamaServer, texts: list[str], clients: int, max_new: int) -> tuple[observatory.Window, list[float]]:
    """The texts sent by `clients` threads at once while a watcher polls: the window over the load and each poll's
    latency in seconds."""
    watcher = observatory.Watcher(server.url)
    before = watcher.poll()
    queue = list(enumerate(texts))
    lock, latencies, stop = threading.Lock(), [], threading.Event()

    def client() -> None:
        while True:
            with lock:
                if not queue:
                    return
                _, text = queue.pop(0)
            prompt = httpx.post(f"{server.url}/apply-template", json={"messages": [{"role": "user", "content": text}]},
                                timeout=60).json()["prompt"]
            httpx.post(f"{server.url}/completion", timeout=600,
                       json={"prompt": prompt, "n_predict": max_new, "temperature": 0.0, "top_k": 1,
                             "cache_prompt": False}).raise_for_status()

    def poll() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            watcher.poll()
            latencies.append(time.perf_counter() - started)
            stop.wait(1.0)

    poller = threading.Thread(target=poll)
    poller.start()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    poller.join()
    after = watcher.poll()
    return observatory.window(before, after), latencies


def verify_curve(server: LlamaServer, sizes: range, repeats: int = 7) -> dict[int, float]:
    """ms of a forward over n new tokens after a cached 64-token prefix, median of `repeats`."""
    prefix = list(range(1000, 1064))
    curve = {}
    for n in sizes:
        times = []
        for r in range(repeats + 1):
            body = {"n_predict": 1, "temperature": 0.0, "top_k": 1, "cache_prompt": True}
            httpx.post(f"{server.url}/completion", json={**body, "prompt": prefix}, timeout=60).raise_for_status()
            answer = httpx.post(f"{server.url}/completion", timeout=60,
                                json={**body, "prompt": prefix + list(range(2000 + 7 * r, 2000 + 7 * r + n))}).json()
            if r:  # the first is a warm-up
                times.append(answer["timings"]["prompt_ms"])
        curve[n] = statistics.median(times)
    return curve


def decode_ms_per_token(server: LlamaServer, texts: list[str], max_new: int) -> float:
    """Plain decode ms per token of the server's model, one stream."""
    window, _ = load(server, texts, 1, max_new)
    return 1e3 / window.decode_tokens_per_s if window.decode_tokens_per_s else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    binary = installed()
    if binary is None:
        sys.exit("llama-server is not built: make llamacpp")
    files = ggufs("smollm2-135m", ["draft-simple"])
    texts = prompts(args.prompts)
    common = dict(threads=args.threads, ctx=4096)
    rows, polls = [], {}
    with LlamaServer(binary, files["target"], **common) as plain:
        curve = verify_curve(plain, range(1, 10))
        base, polls["plain"] = load(plain, texts, args.clients, args.max_new_tokens)
        target_ms = decode_ms_per_token(plain, texts[:4], args.max_new_tokens)
    with LlamaServer(binary, files["draft"], **common) as alone:
        draft_ms = decode_ms_per_token(alone, texts[:4], args.max_new_tokens)
    cost = observatory.relative_cost(curve)
    for label, spec_type, draft, d in (("ngram-mod", "ngram-mod", None, 0.0),
                                       ("draft-simple (n_max 4)", "draft-simple", files["draft"], draft_ms / target_ms)):
        with LlamaServer(binary, files["target"], spec_type=spec_type, draft=draft,
                         draft_max=4 if draft else None, **common) as server:
            w, polls[label] = load(server, texts, args.clients, args.max_new_tokens)
        predicted = observatory.predict_window(w, cost, d)
        measured = (w.decode_tokens_per_s or 0) / (base.decode_tokens_per_s or float("nan"))
        rows.append((label, w, predicted, measured, d))
        print(label, w.acceptance_rate, predicted and predicted.speedup, measured, flush=True)
    lines = ["# The observatory against llama-server under load", "",
             f"`.venv/bin/python experiments/observatory_check.py --clients {args.clients} --prompts {args.prompts} "
             f"--max-new-tokens {args.max_new_tokens}` ({time.strftime('%Y-%m-%d')}; llama.cpp build 11434, "
             f"{args.threads} threads, one slot: the clients queue; the first {args.prompts} MT-bench questions, "
             "T = 0).", "",
             "Verify cost c(n) measured on the plain server (ms over n new tokens after a cached prefix): "
             + ", ".join(f"{n}: {ms:.2f}" for n, ms in curve.items()) + ".", "",
             f"Plain decode: target {target_ms:.2f} ms/token, our draft model alone {draft_ms:.2f} ms/token "
             f"(d = {draft_ms / target_ms:.3f}).", "",
             "| server | acceptance | L̂ | K | plain share | c(K+1) | d | predicted | measured | predicted ÷ measured |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, w, p, measured, d in rows:
        if p is None:
            lines.append(f"| {label} | – (no drafts) | | | | | | | {measured:.2f}× | |")
            continue
        lines.append(f"| {label} | {w.acceptance_rate:.3f} | {p.mean_length:.2f} | {p.k:.2f} | {p.plain_share:.2f} | "
                     f"{p.verify_cost:.2f} | {d:.3f} | {p.speedup:.2f}× | {measured:.2f}× | "
                     f"{p.speedup / measured:.2f} |")
    lines += ["", "Observatory polls of /metrics under the load (seconds):", "",
              "| server | polls | median | max |", "|---|---|---|---|"]
    lines += [f"| {label} | {len(v)} | {statistics.median(v):.3f} | {max(v):.3f} |" for label, v in polls.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
