"""Running the bench: every method on every prompt, interleaved, after a warm-up; then the cost curves."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

import torch

from specviz.backends.base import Backend, OnWait
from specviz.backends.local import as_local
from specviz.backends.request import Run as RunRequest  # the run a backend decodes (Run here: a timed one)
from specviz.bench import llamacpp
from specviz.bench.llamaserver import LlamaServerLanes, parse_configs
from specviz.bench.peers import peer_arguments, run_peer
from specviz.bench.probes import BandwidthProbe
from specviz.bench.prompts import Prompt, check_unique_ids
from specviz.bench.report import build_report
from specviz.bench.runs import Run
from specviz.bench.settings import BenchSettings
from specviz.bench.vllm import VllmLanes
from specviz.decoding.costs import synchronize, verify_costs
from specviz.decoding.prompt import encode_prompt
from specviz.drafters import PLAIN, available, drafter_name, make_drafter, variants
from specviz.errors import SpecvizError

# progress(done, total, label): called after each unit of work (a decode, a cost curve)
ProgressCallback = Callable[[int, int, str], None]


def run_drafter(backend, name: str, prompt: Prompt, prompt_ids: list[int], settings: BenchSettings,
                repeat: int = 0) -> Run:
    """Decode with our engine through its backend, consuming its event stream like every other client; time the
    whole stream. backend: one whose capabilities include the bench, or loaded models."""
    backend = as_local(backend)
    device = backend.models_here().target.device
    stream = backend.stream(RunRequest.of(prompt_ids, name, settings=settings.decode_settings()))
    start = next(stream)  # the drafter is built and the prompt taken: the decode's own time starts here
    synchronize(device)
    started = time.perf_counter()
    events = [start, *stream]
    synchronize(device)
    wall = time.perf_counter() - started
    stats = events[-1].stats
    return Run(name, prompt.id, repeat, list(events[-1].token_ids), wall, steps=stats["steps"],
               drafted=stats["drafted"], accepted=stats["accepted"], draft_s=stats["draft_s"],
               verify_s=stats["verify_s"], reached=stats["reached"], accepted_at=stats["accepted_at"],
               tree=any(node.parent != node.id - 1 for step in events[1:-1] for node in step.nodes))


# ----------------------------------------------------------------------------------------- the bench


def method_order(methods: list[str], turn: int) -> list[str]:
    """The methods rotated by `turn`, so each runs first, second, ... equally often."""
    shift = turn % len(methods)
    return methods[shift:] + methods[:shift]


def chosen_drafters(models, requested: tuple[str, ...], k_policies: tuple[str, ...] = ()) -> list[str]:
    """`none` first (the baseline), then the requested drafters, or every available one; with k_policies, each
    drafter once under each draft-length policy ('ngram:k_policy=cost', 'ngram:k_policy=fixed')."""
    names = list(requested) or available(models) + variants(models)
    ready = available(models)
    for name in names:
        if drafter_name(name) not in ready:
            raise SpecvizError(f"drafter '{name}' is not available for '{models.name}'; available: {', '.join(ready)}")
    if k_policies:
        names = [f"{n}:k_policy={kind}" if n != PLAIN and "k_policy=" not in n else n for n in names for kind in k_policies]
    return [PLAIN] + [n for n in dict.fromkeys(names) if n != PLAIN]


def run_bench(backend, prompts: list[Prompt], settings: BenchSettings | None = None,
              progress: ProgressCallback | None = None, command: str = "", on_wait: OnWait | None = None) -> dict:
    """Run the whole benchmark on our engine in this process and return the report. backend: a backend whose
    capabilities include the bench (its engine is held for the whole bench: on_wait(None) is called if another
    run holds it first), or loaded models (specviz.models.LoadedModels). The peers run on the same model
    objects; vLLM lanes (settings.vllm) on running servers."""
    backend = as_local(backend)
    if not backend.capabilities.bench:
        raise SpecvizError(f"a bench times the engine where it runs: run `specviz bench` on the machine of the engine "
                           f"{backend.where()}")
    settings = settings or BenchSettings()
    if settings.repeats < 1:
        raise SpecvizError(f"repeats must be >= 1, got {settings.repeats}")
    if settings.bandwidth_mb < 1:
        raise SpecvizError(f"the bandwidth probe needs at least 1 MB, got {settings.bandwidth_mb}")
    if not prompts:
        raise SpecvizError("no prompts to run")
    check_unique_ids(prompts)
    with backend.exclusive(on_wait) as held:  # no other run in between to skew the timings
        return _bench(held, prompts, settings, progress, command)


def _bench(backend: Backend, prompts: list[Prompt], settings: BenchSettings, progress: ProgressCallback | None,
           command: str) -> dict:
    models = backend.models_here()
    drafters = chosen_drafters(models, settings.drafters, settings.k_policies)
    for name in drafters:
        make_drafter(name, models, k=settings.k)  # fail before measuring anything
    lanes = VllmLanes(list(settings.vllm)) if settings.vllm else None  # so does a vLLM server that is not there
    peers = peer_arguments(models, settings) if settings.peers else {}
    encoded = [encode_prompt(models.tokenizer, p.text) for p in prompts]
    n_ctx = max(map(len, encoded)) + settings.max_new_tokens + settings.k + 16  # room for a last draft past the budget
    llama, llama_info = llamacpp.llama_cpp_peers(models, settings, n_ctx)
    theirs = list(llamacpp.NAMES) if llama is not None else []
    servers = None
    if settings.llama_server:  # started here, stopped when the bench ends (or fails)
        servers = LlamaServerLanes(parse_configs(settings.llama_server), models.name, torch.get_num_threads(),
                                   n_ctx + 64)
    try:
        return _measure(backend, models, prompts, encoded, settings, progress, command, drafters, peers, lanes,
                        llama, llama_info, theirs, servers)
    finally:
        if servers is not None:
            servers.close()


def _measure(backend, models, prompts, encoded, settings, progress, command, drafters, peers, lanes, llama,
             llama_info, theirs, servers) -> dict:
    methods = drafters + list(peers) + theirs + (lanes.names if lanes else []) + (servers.names if servers else [])
    total = (len(methods) if settings.warmup else 0) + len(prompts) * settings.repeats * len(methods) + bool(settings.verify_sizes)
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, label)

    def decode(method: str, prompt: Prompt, ids: list[int], run_settings: BenchSettings, peer_args: dict, repeat: int) -> Run:
        if method in theirs:
            return llama.run(method, prompt, ids, run_settings, repeat)
        if lanes and method in lanes.backends:
            return lanes.run(method, prompt, ids, run_settings, repeat)
        if servers and method in servers.backends:
            return servers.run(method, prompt, ids, run_settings, repeat)
        if method in peer_args:
            return run_peer(models, method, peer_args[method], prompt, ids, run_settings, repeat)
        return run_drafter(backend, method, prompt, ids, run_settings, repeat)

    if settings.warmup:  # every method once, on a short decode: kernels, allocators and caches warmed alike
        short = replace(settings, max_new_tokens=min(16, settings.max_new_tokens))
        short_peers = peer_arguments(models, short) if settings.peers else {}
        for method in methods:
            decode(method, prompts[0], encoded[0], short, short_peers, 0)
            tick(f"warm-up {method}")
    runs: list[Run] = []
    probe = BandwidthProbe(models.target.device, settings.bandwidth_mb, settings.bandwidth_repeats)
    bandwidth: dict[str, list[float]] = {}  # GB/s measured right before each `none` run, by prompt
    for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
        for r in range(settings.repeats):
            for method in method_order(methods, i * settings.repeats + r):
                if method == PLAIN:
                    bandwidth.setdefault(prompt.id, []).append(probe.measure())
                runs.append(decode(method, prompt, ids, settings, peers, r))
                tick(f"{prompt.id} · {method}")
    del probe
    costs = {"chain": {}, "tree": {}}
    if settings.verify_sizes:
        costs = verify_costs(models.target, settings.verify_sizes, settings.context_len, settings.cost_repeats,
                             settings.tree_branching)
        tick("verify cost")
    return build_report(models, prompts, encoded, settings, drafters, list(peers), runs, costs["chain"], costs["tree"],
                        bandwidth, command, llama_info, lanes, servers)
