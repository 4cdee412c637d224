"""vLLM as a bench peer: running `vllm serve`s, each started with its own speculative method (plain, ngram, our
draft model, our EAGLE-3 head; docs/vllm.md), as lanes in the same interleaved run as our drafters.

    specviz bench --vllm http://127.0.0.1:8001=plain,http://127.0.0.1:8002=eagle3 --limit 8 --max-new-tokens 64

Each lane decodes the prompt token ids our engine decodes (vLLM's /v1/completions, the chat template already
applied), with the same budget, sampling and seed, through specviz's vLLM backend (specviz.backends.vllm), timed
as a user waits for it: the whole stream, prefill and HTTP included. τ counts every target forward that committed
tokens, the prefill's included, as ours does; acceptance and per-position acceptance come from vLLM's own
per-request counts (`--per-request-spec-decode-metrics detailed`). At T = 0 its output is compared with our
`none`'s for information: vLLM's kernels round differently from ours, so the two may part at a near-tie (like
llama.cpp's, not a failed drafter). A lane runs on the model its server loaded: give it the same target.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from specviz.backends.request import Run as RunRequest  # the run a backend decodes (Run here: a timed one)
from specviz.bench.prompts import Prompt
from specviz.bench.runs import MethodRuns, Run, acceptance, fmt, mismatches, ratios, speed, spread, summary, table
from specviz.drafters.base import PLAIN
from specviz.errors import SpecvizError

if TYPE_CHECKING:
    from specviz.bench.settings import BenchSettings

PREFIX = "vllm:"  # a lane's method name in the runs: vllm:<label>
DECODING = {True: "speculative", False: "plain", None: "not known"}  # a lane's server: whether its /metrics count drafts


def parse_lanes(text: str) -> list[tuple[str, str]]:
    """"URL[=label],..." -> [(label, URL)]; a lane without a label is named by its host and port."""
    lanes = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        url, _, label = item.partition("=")
        url = url.strip().removeprefix("vllm+").rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise SpecvizError(f"--vllm takes URL[=label],... with http(s) URLs of running vLLM servers, got {item!r}")
        lanes.append((label.strip() or url.split("://", 1)[1], url))
    labels = [label for label, _ in lanes]
    if len(set(labels)) != len(labels):
        raise SpecvizError(f"two --vllm lanes share a label: {', '.join(labels)}; name each (URL=label)")
    return lanes


class VllmLanes:
    """The lanes, connected: a server that is not there, or is still starting, fails here, before any decode."""

    def __init__(self, lanes: list[tuple[str, str]]):
        from specviz.backends import open_backend  # httpx: only where vLLM lanes are asked for

        # no /detokenize requests inside a timed run: the bench needs only the ids
        self.backends = {PREFIX + label: open_backend(f"vllm+{url}", detokenize=False) for label, url in lanes}
        self.info = {name: {"url": b.url, "model": b.model, "speculative": b.speculative}
                     for name, b in self.backends.items()}

    @property
    def names(self) -> list[str]:
        return list(self.backends)

    def run(self, name: str, prompt: Prompt, prompt_ids: list[int], settings: BenchSettings, repeat: int = 0) -> Run:
        return timed_lane(self.backends[name], name, prompt, prompt_ids, settings, repeat)


def timed_lane(backend, name: str, prompt: Prompt, prompt_ids: list[int], settings: BenchSettings,
               repeat: int = 0) -> Run:
    """One decode of a server's lane (vLLM, llama-server) from our prompt token ids with the bench's settings,
    timed as its client waits for it: the whole stream, prefill and HTTP included."""
    run = RunRequest.of(list(prompt_ids), max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                        top_p=settings.top_p, top_k=settings.top_k, seed=settings.seed)
    started = time.perf_counter()
    done = None
    for done in backend.stream(run):
        pass
    wall = time.perf_counter() - started
    stats = done.stats
    return Run(name, prompt.id, repeat, list(done.token_ids), wall, steps=stats["steps"],
               drafted=stats["drafted"], accepted=stats["accepted"], reached=list(stats.get("reached", [])),
               accepted_at=list(stats.get("accepted_at", [])), server_tokens_per_s=stats.get("server_tokens_per_s"),
               server_prompt_tokens_per_s=stats.get("server_prompt_tokens_per_s"))


def lane_report(info: dict, method: MethodRuns, none: MethodRuns, greedy: bool) -> dict:
    apart = mismatches(method, none) if greedy else []
    return {**info, **speed(method), **acceptance(method), "speedup_vs_none": summary(ratios(method, none)),
            "outputs_equal_none": len(method.by_prompt) - len(apart) if greedy else None, "parted_from_none": apart}


def vllm_report(lanes: VllmLanes, grouped: dict[str, MethodRuns], drafters: list[str], greedy: bool) -> dict:
    return lanes_report(lanes.names, lanes.info, PREFIX, lane_report, grouped, drafters, greedy)


def lanes_report(names: list[str], info: dict, prefix: str, report_lane, grouped: dict[str, MethodRuns],
                 drafters: list[str], greedy: bool) -> dict:
    """Each lane (a method named prefix + label) beside `none`, as `report_lane(info, runs, none's, greedy)` says,
    and every drafter of ours over each lane, per prompt."""
    return {
        "lanes": {name.removeprefix(prefix): report_lane(info[name], grouped[name], grouped[PLAIN], greedy)
                  for name in names},
        "ours_over": {ours: {name.removeprefix(prefix): summary(ratios(grouped[ours], grouped[name]))
                             for name in names} for ours in drafters},
    }


def vllm_markdown(section: dict | None) -> list[str]:
    if not section:
        return []
    lanes = section["lanes"]
    lines = ["", "## vLLM (running servers, the same prompt tokens, each with the method it was started with)", "",
             "τ counts every target forward that committed tokens; acceptance and per position are vLLM's own counts.", ""]
    lines += table(["lane", "server", "τ", "acceptance", "tokens/s", "ms/token", "over `none`", "output = none"],
                   [[f"`{label}`", f"{lane['url']} ({DECODING[lane['speculative']]})", fmt(lane["tau"]),
                     fmt(lane["acceptance_rate"]), fmt(lane["tokens_per_s"], ".1f"), fmt(lane["ms_per_token"], ".1f"),
                     spread(lane["speedup_vs_none"]),
                     "–" if lane["outputs_equal_none"] is None else f"{lane['outputs_equal_none']} of "
                     f"{lane['outputs_equal_none'] + len(lane['parted_from_none'])}"] for label, lane in lanes.items()])
    depth = max((len(lane["per_position_acceptance"]) for lane in lanes.values()), default=0)
    if depth:
        lines += ["", "vLLM's per-position acceptance:", ""]
        lines += table(["lane"] + [f"d={d + 1}" for d in range(depth)],
                       [[f"`{label}`"] + [fmt(a) for a in lane["per_position_acceptance"]]
                        + ["–"] * (depth - len(lane["per_position_acceptance"]))
                        for label, lane in lanes.items() if lane["per_position_acceptance"]])
    lines += ["", "Ours over each vLLM lane, tokens/s per prompt (median, min–max):", ""]
    lines += table(["ours"] + [f"over `{label}`" for label in lanes],
                   [[f"`{ours}`"] + [spread(s) for s in over.values()] for ours, over in section["ours_over"].items()])
    return lines
