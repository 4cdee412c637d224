"""llama.cpp's own speculation as bench lanes: llama-server (built by `make llamacpp`) started by the bench on the
GGUF our target was converted from, once per configuration, each a lane in the same interleaved run as our
drafters, fed the same prompt token ids, budget, sampling and seed through specviz's llama.cpp backend.

    specviz bench --llama-server plain ngram-simple ngram-mod draft-simple draft-eagle3 draft-eagle3:p_min=0.6

A configuration is llama-server's `--spec-type` (or `plain`), with options after a colon: n_max (drafted tokens a
step, `--spec-draft-n-max`), n_min, p_min (`--spec-draft-p-min`: the draft stops where its top probability falls
below it) and threads (default: the threads our engine uses). draft-simple drafts with our draft model and
draft-eagle3 with our EAGLE-3 head, exported to GGUF (`specviz export llamacpp`) into the cache on first use; for a
pretrained pair (qwen2.5-coder) draft-simple drafts with the pair's own draft GGUF, the file our `draft` reads.

Each lane is timed as a user waits for it: the whole stream, prefill and HTTP included. τ counts every target
forward that committed tokens (the prefill's included), as ours does; llama.cpp's mean length is its own
definition, 1 + accepted ÷ verify steps that drafted. At T = 0 its output is compared with our `none`'s for
information: llama.cpp quantizes activations to 8 bits and sums in its own order, so the two may part at a
near-tie.
"""
from __future__ import annotations

import contextlib
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specviz.bench.prompts import Prompt
from specviz.bench.runs import MethodRuns, Run, acceptance, fmt, spread, summary, table
from specviz.bench.vllm import lane_report as vllm_lane_report
from specviz.bench.vllm import lanes_report, timed_lane
from specviz.errors import SpecvizError
from specviz.llamacpp.files import DRAFT_FILES, ggufs

if TYPE_CHECKING:
    from specviz.bench.settings import BenchSettings

PREFIX = "llama.cpp:"  # a lane's method name in the runs: llama.cpp:<configuration>
TYPES = ("plain", "ngram-simple", "ngram-mod", "ngram-map-k", "ngram-cache", "draft-simple", "draft-eagle3")
SHOWN_DEPTH = 8  # per-position columns in the Markdown table (ngram-mod drafts up to 64 tokens a step)
OPTIONS = {"n_max": int, "n_min": int, "p_min": float, "threads": int}


def parse_configs(items: list[str] | tuple[str, ...]) -> list[tuple[str, str, dict[str, Any]]]:
    """["draft-eagle3:p_min=0.6,n_max=3", ...] -> [(label, spec type, options)]."""
    configs = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        kind, _, rest = item.partition(":")
        if kind not in TYPES:
            raise SpecvizError(f"unknown llama-server configuration {kind!r}; one of {', '.join(TYPES)}")
        options: dict[str, Any] = {}
        for pair in filter(None, (p.strip() for p in rest.split(","))):
            key, _, value = pair.partition("=")
            if key not in OPTIONS:
                raise SpecvizError(f"{item}: unknown option {key!r}; llama-server lanes take {', '.join(OPTIONS)}")
            try:
                options[key] = OPTIONS[key](value)
            except ValueError:
                raise SpecvizError(f"{item}: {key} takes a number, got {value!r}") from None
        configs.append((item, kind, options))
    labels = [label for label, _, _ in configs]
    if len(set(labels)) != len(labels):
        raise SpecvizError(f"a llama-server configuration is given twice: {', '.join(labels)}")
    return configs


def lane_files(model: str, configs: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Path]:
    """The GGUFs the lanes load: the preset's, and where a lane drafts our drafters exported for llama-server (or a
    pretrained pair's own draft GGUF)."""
    return ggufs(model, [kind for _, kind, _ in configs])


def server_binary() -> Path:
    from specviz.llamacpp.build import installed

    binary = installed()
    if binary is None:
        raise SpecvizError("llama-server lanes need llama-server: build it with `make llamacpp` (about 10 minutes on "
                           "2 cores), or name one with SPECVIZ_LLAMA_SERVER")
    return binary


class LlamaServerLanes:
    """One running llama-server per configuration; the bench calls `run` for each decode, `close` at the end. A
    server that fails to start fails here, before any decode, with the end of its log."""

    def __init__(self, configs: list[tuple[str, str, dict[str, Any]]], model: str, threads: int, n_ctx: int):
        from specviz.backends import open_backend
        from specviz.llamacpp.server import LlamaServer

        binary = server_binary()
        files = lane_files(model, configs)
        self.stack = contextlib.ExitStack()
        self.backends, self.info = {}, {}
        try:
            for label, kind, options in configs:
                draft = files.get(DRAFT_FILES[kind]) if kind in DRAFT_FILES else None
                if kind in DRAFT_FILES and draft is None:
                    raise SpecvizError(f"{label}: {model} ships no drafter for {kind}")
                lane_threads = options.get("threads", threads)
                server = self.stack.enter_context(LlamaServer(
                    binary, files["target"], threads=lane_threads, ctx=n_ctx,
                    spec_type="none" if kind == "plain" else kind, draft=draft, draft_max=options.get("n_max"),
                    draft_min=options.get("n_min"), p_min=options.get("p_min")))
                name = PREFIX + label
                self.backends[name] = open_backend("llama+" + server.url)
                self.info[name] = {"spec_type": kind, "options": options, "threads": lane_threads,
                                   "command": " ".join(Path(a).name if a.endswith(".gguf") or a == str(binary)
                                                       else a for a in server.args)}
        except BaseException:
            self.stack.close()
            raise

    @property
    def names(self) -> list[str]:
        return list(self.backends)

    def close(self) -> None:
        self.stack.close()

    def run(self, name: str, prompt: Prompt, prompt_ids: list[int], settings: BenchSettings, repeat: int = 0) -> Run:
        return timed_lane(self.backends[name], name, prompt, prompt_ids, settings, repeat)


def lane_report(info: dict, method: MethodRuns, none: MethodRuns, greedy: bool) -> dict:
    """A vLLM lane's numbers (specviz.bench.vllm.lane_report) and llama.cpp's mean length."""
    counts = acceptance(method)
    drafting = sum(r.reached[0] for r in method.firsts() if r.reached)  # verify steps that drafted something
    return {**vllm_lane_report(info, method, none, greedy),
            "llamacpp_mean_length": 1 + counts["accepted"] / drafting if drafting else None,
            "server_tokens_per_s": own_timing(method, "server_tokens_per_s"),
            "server_prompt_tokens_per_s": own_timing(method, "server_prompt_tokens_per_s")}


def own_timing(method: MethodRuns, field: str) -> dict | None:
    """llama.cpp's own tokens/s (its response's `timings`: decode, or prompt processing) per prompt, median
    (min–max) over the prompts, each the median of its repeats; None where the server reported none."""
    per_prompt = []
    for runs in method.by_prompt.values():
        values = [v for r in runs if (v := getattr(r, field)) is not None]
        if values:
            per_prompt.append(statistics.median(values))
    return summary(per_prompt)


def llama_server_report(lanes: LlamaServerLanes, grouped: dict[str, MethodRuns], drafters: list[str],
                        greedy: bool) -> dict:
    return lanes_report(lanes.names, lanes.info, PREFIX, lane_report, grouped, drafters, greedy)


def llama_server_markdown(section: dict | None) -> list[str]:
    if not section:
        return []
    lanes = section["lanes"]
    lines = ["", "## llama.cpp's llama-server (started by the bench, the same GGUF and prompt tokens)", "",
             "τ counts every target forward that committed tokens; mean length is llama.cpp's (1 + accepted ÷ "
             "verify steps that drafted). tokens/s is the client's wall time (prefill, HTTP and streaming included); "
             "decode and prompt tokens/s are llama.cpp's own timing of the same requests (its response's `timings`), "
             "median per prompt (min–max).", ""]
    lines += table(["lane", "threads", "τ", "mean length", "acceptance", "tokens/s", "decode tokens/s (llama.cpp)",
                    "prompt tokens/s (llama.cpp)", "over `none`", "output = none"],
                   [[f"`{label}`", str(lane["threads"]), fmt(lane["tau"]), fmt(lane["llamacpp_mean_length"]),
                     fmt(lane["acceptance_rate"]), fmt(lane["tokens_per_s"], ".1f"),
                     spread(lane.get("server_tokens_per_s"), ".1f", ""),
                     spread(lane.get("server_prompt_tokens_per_s"), ".1f", ""), spread(lane["speedup_vs_none"]),
                     "–" if lane["outputs_equal_none"] is None else f"{lane['outputs_equal_none']} of "
                     f"{lane['outputs_equal_none'] + len(lane['parted_from_none'])}"] for label, lane in lanes.items()])
    depth = min(max((len(lane["per_position_acceptance"]) for lane in lanes.values()), default=0), SHOWN_DEPTH)
    if depth:
        lines += ["", f"llama.cpp's per-position acceptance (accepted at depth d ÷ steps that drafted to d; the first "
                  f"{SHOWN_DEPTH} depths at most, the JSON report has all):", ""]
        lines += table(["lane"] + [f"d={d + 1}" for d in range(depth)],
                       [[f"`{label}`"] + [fmt(a) for a in lane["per_position_acceptance"][:depth]]
                        + ["–"] * (depth - len(lane["per_position_acceptance"][:depth]))
                        for label, lane in lanes.items() if lane["per_position_acceptance"]])
    lines += ["", "Ours over each llama-server lane, tokens/s per prompt (median, min–max):", ""]
    lines += table(["ours"] + [f"over `{label}`" for label in lanes],
                   [[f"`{ours}`"] + [spread(s) for s in over.values()] for ours, over in section["ours_over"].items()])
    lines += ["", "The servers' command lines:", ""] + [f"- `{label}`: `{lane['command']}`" for label, lane in lanes.items()]
    return lines
