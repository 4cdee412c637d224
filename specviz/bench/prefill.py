"""`specviz prefill-bench`: how fast a prompt is read, by its length, in specviz and in llama-server on the same GGUF.

Ours: the target's prefill as the engine runs it (engine.prefill_slices' chunks, sized by their times, into one
cache), on random token ids of each length; tokens/s over the whole prompt, each chunk's time against the first
chunk's, and its time per token against the first's (a token's attention grows with what is cached before it; its
products do not). llama-server: the same ids as a
prompt with one token to generate (`n_predict` 1, no prompt cache), timed by llama.cpp itself (its response's
`timings.prompt_per_second`). Each length is measured `rounds` times, ours and llama.cpp's alternated; medians.
"""
from __future__ import annotations

import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from specviz.arguments import int_list
from specviz.errors import SpecvizError

LENGTHS = (512, 2048, 4096, 8000)


def prompt_ids(length: int, vocab: int, seed: int = 0) -> list[int]:
    return torch.randint(vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def prefill_ours(target, ids: list[int], clock: Callable[[], float] = time.perf_counter) -> list[tuple[int, float]]:
    """(tokens, seconds) of each forward of one prefill of `ids`, chunked as the engine chunks a prompt, by `clock`."""
    from specviz.decoding.engine import prefill_slices

    cache = target.new_cache()
    reserve = getattr(cache, "reserve", None)
    if reserve is not None:
        reserve(len(ids))
    chunks = []
    for part in prefill_slices(len(ids), clock):
        started = clock()
        target.forward(ids[part], cache, logits=False)
        chunks.append((part.stop - part.start, clock() - started))
    return chunks


def summary(length: int, chunks: list[tuple[int, float]]) -> dict[str, float]:
    """One prefill's figures: tokens/s, chunks, the first and the slowest chunk's ms, the slowest chunk's time and the
    slowest time per token against the first chunk's."""
    seconds = [s for _, s in chunks]
    per_token = [s / n for n, s in chunks]
    return {"ours_tokens_per_s": length / sum(seconds), "chunks": len(chunks), "first_chunk_ms": 1e3 * seconds[0],
            "slowest_chunk_ms": 1e3 * max(seconds), "slowest_chunk_vs_first": max(seconds) / seconds[0],
            "slowest_token_vs_first": max(per_token) / per_token[0]}


def prefill_llama(server, ids: list[int]) -> float:
    """llama.cpp's own prompt tokens/s for `ids` (one token generated, the prompt not cached)."""
    timings: dict[str, Any] = server.complete(ids, max_tokens=1).get("timings") or {}
    if not timings.get("prompt_per_second"):
        raise SpecvizError(f"llama-server's response has no prompt timing: {timings}")
    return float(timings["prompt_per_second"])


def measure(model: str, lengths: tuple[int, ...], rounds: int, llama_threads: tuple[int, ...] | None,
            seed: int = 0) -> dict:
    """Ours on the default weights and, with llama_threads, llama-server at each thread count, per length."""
    from contextlib import ExitStack

    from specviz import models
    from specviz.decoding.target import Target

    loaded = models.load(model, device="cpu")
    target = Target(loaded.target)
    limit = target.max_positions
    if max(lengths) >= limit:
        raise SpecvizError(f"prompt lengths must be below this model's {limit} positions, got {max(lengths)}")
    prefill_ours(target, prompt_ids(256, loaded.vocab_size, seed))  # warm-up
    rows = []
    with ExitStack() as stack:
        servers = {}
        if llama_threads:
            from specviz.llamacpp.build import installed
            from specviz.llamacpp.export import target_gguf
            from specviz.llamacpp.server import LlamaServer

            binary = installed()
            if binary is None:
                raise SpecvizError("no llama-server installed: run `make llamacpp` (or set SPECVIZ_LLAMA_SERVER)")
            gguf = target_gguf(model)
            for threads in llama_threads:
                servers[threads] = stack.enter_context(LlamaServer(binary, gguf, threads=threads, ctx=limit))
                prefill_llama(servers[threads], prompt_ids(256, loaded.vocab_size, seed))  # warm-up
        for length in lengths:
            ids = prompt_ids(length, loaded.vocab_size, seed)
            ours: list[list[tuple[int, float]]] = []
            theirs: dict[int, list[float]] = {t: [] for t in servers}
            for r in range(rounds):
                print(f"prefill {length} tokens: round {r + 1}/{rounds}", file=sys.stderr, flush=True)
                ours.append(prefill_ours(target, ids))
                for threads, server in servers.items():
                    theirs[threads].append(prefill_llama(server, ids))
            per_round = [summary(length, chunks) for chunks in ours]  # chunk sizes follow timings: summed per round
            rows.append({"tokens": length, **{key: statistics.median(r[key] for r in per_round) for key in per_round[0]},
                         "llama_tokens_per_s": {t: statistics.median(v) for t, v in theirs.items()}})
    return {"model": model, "weights": loaded.weights, "rounds": rounds, "threads": torch.get_num_threads(),
            "rows": rows}


def to_markdown(result: dict, command: str) -> str:
    threads = sorted({t for row in result["rows"] for t in row["llama_tokens_per_s"]})
    head = ["prompt tokens", "specviz tokens/s"] + [f"llama-server tokens/s ({t} thread{'s' * (t > 1)})" for t in threads]
    head += ["chunks", "first chunk ms", "slowest chunk ms", "slowest chunk / first", "slowest token / first"]
    lines = [f"Prefill of {result['model']} ({result['weights']} weights, {result['threads']} torch threads), median of "
             f"{result['rounds']} rounds. `{command}`", "", "| " + " | ".join(head) + " |",
             "|" + " --- |" * len(head)]
    for row in result["rows"]:
        cells = [str(row["tokens"]), f"{row['ours_tokens_per_s']:.0f}"]
        cells += [f"{row['llama_tokens_per_s'][t]:.0f}" for t in threads]
        cells += [f"{row['chunks']:.0f}", f"{row['first_chunk_ms']:.0f}", f"{row['slowest_chunk_ms']:.0f}",
                  f"{row['slowest_chunk_vs_first']:.2f}", f"{row['slowest_token_vs_first']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "specviz: the engine's prefill (256 tokens, then chunks sized to the first one's time), wall time; "
              "a cancel waits at most about the slowest chunk. llama-server: its own `timings.prompt_per_second` for "
              "the same ids. Slowest chunk / first: time; slowest token / first: time per token (a token's attention "
              "grows with the positions before it)."]
    return "\n".join(lines) + "\n"


def cmd_prefill_bench(args) -> int:
    lengths = int_list(args.lengths, "--lengths")
    if args.threads:
        torch.set_num_threads(args.threads)
    llama = int_list(args.llama_server_threads, "--llama-server-threads") if args.llama_server_threads else None
    result = measure(args.model, lengths, args.rounds, llama)
    command = "python -m specviz prefill-bench " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["prefill-bench"] else [])
    text = to_markdown(result, command.strip())
    print(text)
    if args.out:
        from specviz.atomic import write_atomically

        out = Path(args.out)
        write_atomically(out, (out.read_text() if out.exists() else "") + "\n" + text)
    return 0


def register(sub) -> None:
    parser = sub.add_parser("prefill-bench", help="prompt tokens/s by prompt length, specviz beside llama-server")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="prompt lengths in tokens")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--llama-server-threads", default="",
                        help="also time llama-server (`make llamacpp`) at these thread counts, e.g. 1,2")
    parser.add_argument("--out", default=None, help="append the Markdown table to this file")
    parser.set_defaults(run=cmd_prefill_bench)
