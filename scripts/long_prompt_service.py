"""A long prompt against `specviz serve`: how soon a cancel frees the engine, and the server's resident memory
over many long-prompt runs.

    python scripts/long_prompt_service.py --model smollm2-135m --tokens 5331 --cancels 1 --runs 0
    python scripts/long_prompt_service.py --model smollm2-135m --tokens 5000 --cancels 0 --runs 20

A cancel: one client starts a run of the long prompt and follows its stream, a second client queues a short run
behind it, and once the long run has been running `--cancel-after` seconds its owner sends DELETE. Reported: from
the DELETE to the long run's state `cancelled` (the engine worker let it go) and to the short run's `start` event
(the engine is decoding the next run). Memory: `--runs` long-prompt runs one after another, the server's RSS
after each. It starts its own service (or takes --url and --pid) and prints a JSON report."""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import httpx
import psutil
from soak_service import served  # run as a file from the repository root: scripts/ is on the path

SENTENCE = "The committee met on a Tuesday to read the minutes of the previous meeting, line by line. "


def long_prompt(model_dir: str, tokens: int) -> str:
    """Text of exactly `tokens` tokens (without a chat template) for this model's tokenizer, as near as re-encoding
    allows."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    per = len(tokenizer.encode(SENTENCE))
    text = tokenizer.decode(tokenizer.encode(SENTENCE * (tokens // per + 2))[:tokens])
    for _ in range(20):  # decoding and encoding again may merge tokens: top the text up until it counts right
        missing = tokens - len(tokenizer.encode(text))
        if missing <= 0:
            break
        text += tokenizer.decode(tokenizer.encode(SENTENCE * (missing // per + 1))[:missing])
    return text


def wait_state(client: httpx.Client, run_id: str, states: tuple[str, ...], timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if client.get(f"/v1/runs/{run_id}").json()["state"] in states:
            return time.monotonic()
        time.sleep(0.05)
    raise TimeoutError(f"run {run_id} not {states} within {timeout_s} s")


def follow(url: str, path: str, client_id: str, seen: dict) -> None:
    """Read an event stream to its end, noting when the start event and the end arrived."""
    with httpx.Client(base_url=url, timeout=600, headers={"X-Specviz-Client": client_id}) as client:
        with client.stream("GET", path) as response:
            for line in response.iter_lines():
                if line.startswith("data:") and '"type":"start"' in line:
                    seen["start"] = time.monotonic()
                    seen["prompt_tokens"] = len(json.loads(line[5:])["prompt_token_ids"])
    seen["end"] = time.monotonic()


def cancel_once(url: str, prompt: str, cancel_after_s: float) -> dict:
    owner = httpx.Client(base_url=url, timeout=60, headers={"X-Specviz-Client": "long"})
    run = {"prompt": prompt, "chat": False, "drafter": "ngram", "max_new_tokens": 8, "temperature": 0}
    long_id = owner.post("/v1/runs", json=run).json()["run_id"]
    long_seen: dict = {}
    threading.Thread(target=follow, args=(url, f"/v1/runs/{long_id}/events", "long", long_seen), daemon=True).start()
    running = wait_state(owner, long_id, ("running",), 600)
    other = httpx.Client(base_url=url, timeout=60, headers={"X-Specviz-Client": "short"})
    short_id = other.post("/v1/runs", json={"prompt": "Say hello.", "drafter": "ngram", "max_new_tokens": 4}).json()["run_id"]
    short_seen: dict = {}
    threading.Thread(target=follow, args=(url, f"/v1/runs/{short_id}/events", "short", short_seen), daemon=True).start()
    time.sleep(max(0.0, cancel_after_s - (time.monotonic() - running)))
    deleted = time.monotonic()
    owner.delete(f"/v1/runs/{long_id}")
    freed = wait_state(owner, long_id, ("cancelled", "done", "failed"), 600)
    state = owner.get(f"/v1/runs/{long_id}").json()["state"]
    wait_state(other, short_id, ("done", "failed", "cancelled"), 600)
    return {"prompt_tokens": long_seen.get("prompt_tokens"), "running_before_delete_s": round(deleted - running, 2),
            "long_run_state": state, "delete_to_long_run_ended_s": round(freed - deleted, 2),
            "delete_to_next_run_started_s": round(short_seen["start"] - deleted, 2) if "start" in short_seen else None}


def memory(url: str, pid: int, prompt: str, runs: int) -> dict:
    process = psutil.Process(pid)
    rss = [round(process.memory_info().rss / 2**20, 1)]
    times = []
    with httpx.Client(base_url=url, timeout=900, headers={"X-Specviz-Client": "memory"}) as client:
        for _ in range(runs):
            started = time.monotonic()
            run_id = client.post("/v1/runs", json={"prompt": prompt, "chat": False, "drafter": "ngram",
                                                   "max_new_tokens": 16, "temperature": 0}).json()["run_id"]
            with client.stream("GET", f"/v1/runs/{run_id}/events") as response:
                for _ in response.iter_lines():
                    pass
            times.append(round(time.monotonic() - started, 1))
            rss.append(round(process.memory_info().rss / 2**20, 1))
            print(f"run {len(times)}: {times[-1]} s, RSS {rss[-1]} MB", file=sys.stderr, flush=True)
    return {"runs": runs, "rss_mb": rss, "run_s": times}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="preset (when it starts its own service)")
    parser.add_argument("--url", default=None, help="a running service (give --pid too)")
    parser.add_argument("--pid", type=int, default=None)
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--serve-args", default="", help="more `specviz serve` flags")
    parser.add_argument("--tokens", type=int, default=5331, help="the long prompt's length in tokens")
    parser.add_argument("--cancels", type=int, default=1)
    parser.add_argument("--cancel-after", type=float, default=5.0, help="seconds the long run runs before DELETE")
    parser.add_argument("--runs", type=int, default=0, help="long-prompt runs for the memory figures")
    args = parser.parse_args()
    from specviz import models

    prompt = long_prompt(str(models.model_dir(args.model)), args.tokens)
    with served(args):
        report = {"tokens": args.tokens, "cancels": [cancel_once(args.url, prompt, args.cancel_after)
                                                     for _ in range(args.cancels)]}
        if args.runs:
            report["memory"] = memory(args.url, args.pid, prompt, args.runs)
        print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
