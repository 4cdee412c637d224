"""The benchmark: every drafter against `none`, and against what a user would run instead (transformers'
`generate()`), measured side by side in one run.

    python -m specviz bench --limit 4 --max-new-tokens 64 --json-out bench.json --md-out bench.md

  - Decoding: every method runs on every prompt, interleaved (prompt by prompt, methods in turn, the order
    rotated per prompt so that machine drift cancels), after a warm-up. At temperature 0 every drafter's output
    must equal `none`'s token for token; a mismatch is reported loudly and fails the run.
  - Peers: generate(), generate(assistant_model=draft) with the same K and a constant schedule, and
    generate(prompt_lookup_num_tokens=K), on the same model objects, prompts and token budget.
  - The verify-cost curve: one target forward over n new tokens after a KV cache of a realistic context, as a
    chain (causal) and as a tree (4D mask); with it, the speedup predicted from measured τ and costs.
  - The weight-streaming floor: bytes of target weights / memory bandwidth measured in the same run.

`run_bench(models, prompts, settings)` is the Python entry point (the page and the tests use it) and returns
one JSON-ready dict that validates against `BENCH_SCHEMA`; `main(argv)` is `python -m specviz bench`.
docs/bench.md explains every field.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch
from transformers import GenerationConfig

from specviz import engine, fastdecoder, fastlinear
from specviz.api import encode_prompt
from specviz.atomic import check_writable, write_atomically
from specviz.cli import add_model_args
from specviz.costs import fitting_context, interpolate, synchronize, verify_costs
from specviz.drafters import available, make_drafter, parse_spec, variants
from specviz.errors import SpecvizError
from specviz.sampling import Sampling

PROMPTS_FILE = Path(__file__).parent / "benchdata" / "prompts.jsonl"
SCHEMA_VERSION = 1
PEERS = ("generate", "generate_assisted", "generate_prompt_lookup")
# ours vs theirs: the pairs a user chooses between
HEAD_TO_HEAD = (("none", "generate"), ("draft", "generate_assisted"), ("ngram", "generate_prompt_lookup"))
FULL_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64)  # dense where the CPU curve is not smooth (see costs.AUTO_SIZES)
QUICK_SIZES = (1, 4, 16)

# progress(done, total, label): called after each unit of work (a decode, a cost curve)
ProgressCallback = Callable[[int, int, str], None]


# ------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class BenchSettings:
    drafters: tuple[str, ...] = ()  # empty: every drafter available for the models; `none` always runs
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    repeats: int = 1  # decodes of each (prompt, method); the median time is kept
    k: int = 4  # draft length of chain drafters; also num_assistant_tokens and prompt_lookup_num_tokens
    peers: bool = True
    warmup: bool = True
    verify_sizes: tuple[int, ...] = FULL_SIZES  # () skips the cost curves and the prediction
    context_len: int = 256  # cached tokens before the timed forward: a prompt plus part of an answer
    cost_repeats: int = 5  # timed forwards per size, median kept (after one untimed)
    tree_branching: int = 4  # the tree curve's shape: a full tree, this many children per node, breadth first
    bandwidth_mb: int = 256  # size of the tensor copied to measure memory bandwidth
    bandwidth_repeats: int = 5

    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p)


def quick_settings(**overrides) -> BenchSettings:
    """Fewer cost-curve sizes and repeats: a smoke run."""
    return BenchSettings(**{"verify_sizes": QUICK_SIZES, "cost_repeats": 3, "bandwidth_repeats": 3, **overrides})


# -------------------------------------------------------------------------------------------- prompts


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


def load_prompts(path: str | os.PathLike | None = None, limit: int | None = None) -> list[Prompt]:
    """JSONL rows with `turns` (the first turn is used) or `instruction`; the built-in set when path is None."""
    path = Path(path) if path else PROMPTS_FILE
    try:
        lines = path.read_text(encoding="utf-8").split("\n")  # JSONL: not splitlines(), which also splits inside strings at U+2028 and the like
    except OSError as err:
        raise SpecvizError(f"cannot read the prompts file {path}: {err}") from err
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise SpecvizError(f"{path}:{number} is not JSON: {err}") from err
        turns = row.get("turns") if isinstance(row, dict) else None
        text = turns[0] if isinstance(turns, list) and turns else row.get("instruction") if isinstance(row, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise SpecvizError(f"{path}:{number} needs a non-empty 'turns' list or an 'instruction'")
        prompts.append(Prompt(str(row.get("id", row.get("question_id", number))), text))
    if limit is not None:
        if limit < 1:
            raise SpecvizError(f"--limit must be >= 1, got {limit}")
        prompts = prompts[:limit]
    if not prompts:
        raise SpecvizError(f"no prompts to run from {path}")
    check_unique_ids(prompts)
    return prompts


def check_unique_ids(prompts: list[Prompt]) -> None:
    """Results are grouped by prompt id, so two prompts may not share one."""
    seen = set()
    for prompt in prompts:
        if prompt.id in seen:
            raise SpecvizError(f"two prompts have the id {prompt.id!r}; give each row its own `id`")
        seen.add(prompt.id)


# -------------------------------------------------------------------------------------------- decodes


@dataclass
class Run:
    """One decode of one prompt by one method (a drafter through our engine, or a peer)."""

    method: str
    prompt: str
    repeat: int
    token_ids: list[int]
    wall_s: float  # the whole call, prefill included, as a user waits for it
    steps: int = 0  # target forwards after the prefill (engine runs only)
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    reached: list[int] = field(default_factory=list)  # per depth d (index d - 1): steps whose draft reached d
    accepted_at: list[int] = field(default_factory=list)  # ... and steps that accepted a token at depth d
    tree: bool = False  # some step drafted a tree that is not a chain

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.wall_s if self.wall_s > 0 else 0.0


def run_drafter(models, name: str, prompt: Prompt, prompt_ids: list[int], settings: BenchSettings, repeat: int = 0) -> Run:
    """Decode with our engine, consuming its event stream like every other client; time the whole stream."""
    drafter = make_drafter(name, models, k=settings.k)
    run_settings = engine.RunSettings(settings.max_new_tokens, settings.sampling(), settings.seed)
    device = models.target.device
    synchronize(device)
    started = time.perf_counter()
    events = list(engine.decode(models.target, models.tokenizer, drafter, prompt_ids, run_settings, models.name,
                                prompt.text, models.vocab_size))
    synchronize(device)
    wall = time.perf_counter() - started
    done = events[-1]
    run = Run(name, prompt.id, repeat, list(done.token_ids), wall, steps=done.stats["steps"],
              drafted=done.stats["drafted"], accepted=done.stats["accepted"],
              draft_s=done.stats["draft_s"], verify_s=done.stats["verify_s"])
    for step in events[1:-1]:
        depth = max((node.depth for node in step.nodes), default=0)
        while len(run.reached) < depth:
            run.reached.append(0)
            run.accepted_at.append(0)
        for d in range(depth):
            run.reached[d] += 1
        for d in range(sum(c.kind == "accepted" for c in step.committed)):  # past an EOS cut: not committed
            run.accepted_at[d] += 1
        run.tree |= any(node.parent != node.id - 1 for node in step.nodes)
    return run


def generation_config(models, settings: BenchSettings) -> GenerationConfig:
    """generate()'s settings matched to our engine's: the same end-of-sequence ids (and no min_new_tokens, so
    both stop there), the same sampling, and none of the processors a model's defaults may add (top-k 50,
    repetition penalty ...) that our engine does not apply. A fresh object: nothing shared is mutated."""
    eos = sorted(engine.eos_ids(models.target, models.tokenizer))
    pad = getattr(models.tokenizer, "pad_token_id", None)
    sampled = not settings.sampling().greedy
    config = GenerationConfig(
        max_new_tokens=settings.max_new_tokens,
        min_length=0,
        do_sample=sampled,
        typical_p=1.0,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        num_beams=1,
        eos_token_id=eos or None,
        pad_token_id=pad if pad is not None else (eos[0] if eos else None),
    )
    if sampled:  # set only when sampling: generate() warns about sampling flags given to greedy decoding
        config.update(temperature=settings.temperature, top_p=settings.top_p, top_k=0)  # top_k 0: no cut, like ours
    return config


def assistant_of(draft, k: int):
    """The draft model as generate()'s assistant, drafting exactly k tokens a step like our `draft` drafter.

    transformers reads K and its schedule from the assistant's own generation_config, so the assistant is a
    shallow copy of the draft (the same weights, no memory) carrying its own config: the shared draft object,
    which other sessions may be using, is never mutated."""
    assistant = copy.copy(draft)
    config = copy.deepcopy(draft.generation_config)
    config.num_assistant_tokens = k
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = 0.0  # no early stop on low draft confidence: always k tokens
    assistant.generation_config = config
    return assistant


def peer_arguments(models, settings: BenchSettings) -> dict[str, dict]:
    """generate() keyword arguments of each peer that applies to these models."""
    base = generation_config(models, settings)
    peers = {"generate": {"generation_config": base}}
    if getattr(models, "draft", None) is not None:
        peers["generate_assisted"] = {"generation_config": base, "assistant_model": assistant_of(models.draft, settings.k)}
    lookup = copy.deepcopy(base)
    lookup.prompt_lookup_num_tokens = settings.k  # max_matching_ngram_size stays transformers' default (2)
    peers["generate_prompt_lookup"] = {"generation_config": lookup}
    return peers


def run_peer(models, name: str, arguments: dict, prompt: Prompt, prompt_ids: list[int], settings: BenchSettings,
             repeat: int = 0) -> Run:
    device = models.target.device
    ids = torch.tensor([prompt_ids], device=device)
    # generate() samples from torch's global generator: seed it for this call, and give its state back afterwards
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.inference_mode():
        torch.manual_seed(settings.seed)
        synchronize(device)
        started = time.perf_counter()
        out = models.target.generate(ids, attention_mask=torch.ones_like(ids), **arguments)
        synchronize(device)
        wall = time.perf_counter() - started
    return Run(name, prompt.id, repeat, out[0, len(prompt_ids):].tolist(), wall)


# --------------------------------------------------------------------------------- costs of the machine


class BandwidthProbe:
    """Memory bandwidth measured whenever asked, on two `megabytes` MB buffers kept for the whole bench (allocated
    and written once, so no timing pays for page faults). A copy reads and writes every byte, so bandwidth =
    2 × size / median time of `repeats` copies after a warm-up one. On a shared machine the figure moves with
    the other tenants, so the bench measures it right before every `none` run and sets each prompt's floor by it."""

    def __init__(self, device: torch.device, megabytes: int = 256, repeats: int = 5):
        self.device, self.repeats = device, repeats
        n = megabytes * 1_000_000 // 4  # float32 elements
        self.source = torch.ones(n, dtype=torch.float32, device=device)
        self.destination = torch.zeros_like(self.source)

    def measure(self) -> float:
        times = []
        for _ in range(self.repeats + 1):  # the first is a warm-up
            synchronize(self.device)
            started = time.perf_counter()
            self.destination.copy_(self.source)
            synchronize(self.device)
            times.append(time.perf_counter() - started)
        return 2 * self.source.numel() * 4 / statistics.median(times[1:]) / 1e9


def streamed_weight_bytes(model) -> int:
    """Bytes of weights one decoding step must read: every parameter once (tied ones once), except the input
    embedding, of which a step reads one row, unless the LM head shares it (then the head reads all of it)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is None or head.weight.data_ptr() != embedding.data_ptr():
        total -= embedding.numel() * embedding.element_size()
    return total


# ----------------------------------------------------------------------------------------- the bench


def method_order(methods: list[str], turn: int) -> list[str]:
    """The methods rotated by `turn`, so each runs first, second, ... equally often."""
    shift = turn % len(methods)
    return methods[shift:] + methods[:shift]


def chosen_drafters(models, requested: tuple[str, ...]) -> list[str]:
    """`none` first (the baseline), then the requested drafters, or every available one."""
    names = list(requested) or available(models) + variants(models)
    ready = available(models)
    for name in names:
        if parse_spec(name)[0] not in ready:
            raise SpecvizError(f"drafter '{name}' is not available for '{models.name}'; available: {', '.join(ready)}")
    return ["none"] + [n for n in dict.fromkeys(names) if n != "none"]


def run_bench(models, prompts: list[Prompt], settings: BenchSettings | None = None,
              progress: ProgressCallback | None = None, command: str = "") -> dict:
    """Run the whole benchmark on already-loaded models (a specviz.models.LoadedModels) and return the report."""
    settings = settings or BenchSettings()
    if settings.repeats < 1:
        raise SpecvizError(f"repeats must be >= 1, got {settings.repeats}")
    if settings.bandwidth_mb < 1:
        raise SpecvizError(f"the bandwidth probe needs at least 1 MB, got {settings.bandwidth_mb}")
    if not prompts:
        raise SpecvizError("no prompts to run")
    check_unique_ids(prompts)
    drafters = chosen_drafters(models, settings.drafters)
    for name in drafters:
        make_drafter(name, models, k=settings.k)  # fail before measuring anything
    peers = peer_arguments(models, settings) if settings.peers else {}
    methods = drafters + list(peers)
    encoded = [encode_prompt(models.tokenizer, p.text) for p in prompts]
    total = (len(methods) if settings.warmup else 0) + len(prompts) * settings.repeats * len(methods) + bool(settings.verify_sizes)
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, label)

    def decode(method: str, prompt: Prompt, ids: list[int], run_settings: BenchSettings, peer_args: dict, repeat: int) -> Run:
        if method in peer_args:
            return run_peer(models, method, peer_args[method], prompt, ids, run_settings, repeat)
        return run_drafter(models, method, prompt, ids, run_settings, repeat)

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
                if method == "none":
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
                        bandwidth, command)


# ------------------------------------------------------------------------------------------ the report


def summary(values: list[float]) -> dict | None:
    """median / min / max of per-prompt ratios (None when there are none)."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


@dataclass
class MethodRuns:
    """One method's runs grouped by prompt: repeat 0 for tokens and counts, the median time over repeats."""

    runs: list[Run]
    by_prompt: dict[str, list[Run]] = field(init=False)

    def __post_init__(self):
        self.by_prompt = {}
        for run in self.runs:
            self.by_prompt.setdefault(run.prompt, []).append(run)

    def first(self, prompt: str) -> Run:
        return self.by_prompt[prompt][0]

    def wall_s(self, prompt: str) -> float:
        return statistics.median(r.wall_s for r in self.by_prompt[prompt])

    def tokens_per_s(self, prompt: str) -> float:
        return len(self.first(prompt).token_ids) / self.wall_s(prompt)

    def firsts(self) -> list[Run]:
        return [runs[0] for runs in self.by_prompt.values()]

    def totals(self) -> tuple[int, float]:
        """Tokens and seconds summed over prompts."""
        return sum(len(r.token_ids) for r in self.firsts()), sum(self.wall_s(p) for p in self.by_prompt)


def ratios(ours: MethodRuns, theirs: MethodRuns) -> list[float]:
    """Per prompt: our tokens/s over theirs (on the tokens each actually produced)."""
    return [ours.tokens_per_s(p) / theirs.tokens_per_s(p) for p in ours.by_prompt if p in theirs.by_prompt]


def mismatches(ours: MethodRuns, reference: MethodRuns) -> list[dict]:
    """Prompts where our tokens differ from the reference's: where they first differ and what each had there."""
    found = []
    for prompt in ours.by_prompt:
        a, b = reference.first(prompt).token_ids, ours.first(prompt).token_ids
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            found.append({"prompt": prompt, "index": at, "expected": a[at] if at < len(a) else None,
                          "got": b[at] if at < len(b) else None, "expected_tokens": len(a), "got_tokens": len(b)})
    return found


def speed(method: MethodRuns) -> dict:
    tokens, seconds = method.totals()
    return {"new_tokens": tokens, "wall_s": seconds, "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
            "ms_per_token": 1e3 * seconds / tokens if tokens else None}


def drafter_report(method: MethodRuns, none: MethodRuns, greedy: bool) -> dict:
    firsts = method.firsts()
    steps, all_steps = sum(r.steps for r in firsts), sum(r.steps for r in method.runs)
    drafted, accepted = sum(r.drafted for r in firsts), sum(r.accepted for r in firsts)
    depth = max((len(r.reached) for r in firsts), default=0)
    reached = [sum(r.reached[d] for r in firsts if d < len(r.reached)) for d in range(depth)]
    accepted_at = [sum(r.accepted_at[d] for r in firsts if d < len(r.accepted_at)) for d in range(depth)]
    wall = sum(r.wall_s for r in method.runs)
    found = mismatches(method, none) if greedy else []
    return {
        **speed(method),
        "steps": steps,
        "tau": sum(len(r.token_ids) for r in firsts) / steps if steps else 0.0,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "per_position_acceptance": [a / n for a, n in zip(accepted_at, reached)],
        "draft_share": sum(r.draft_s for r in method.runs) / wall,
        "verify_share": sum(r.verify_s for r in method.runs) / wall,
        # over every repeat, as the wall time (median over repeats) is: the first repeat alone may be the slow one
        "draft_ms_per_step": 1e3 * sum(r.draft_s for r in method.runs) / all_steps if all_steps else 0.0,
        "verify_ms_per_step": 1e3 * sum(r.verify_s for r in method.runs) / all_steps if all_steps else 0.0,
        "inputs_per_step": 1 + drafted / steps if steps else 1.0,
        "tree": any(r.tree for r in firsts),
        "speedup_vs_none": summary(ratios(method, none)),
        "outputs_match_none": (not found) if greedy else None,
        "mismatches": found,
    }


def peer_report(method: MethodRuns, plain: MethodRuns, greedy: bool) -> dict:
    found = mismatches(method, plain) if greedy else []
    return {**speed(method), "speedup_vs_generate": summary(ratios(method, plain)),
            "outputs_match_generate": (not found) if greedy else None, "mismatches": found}


def predicted_speedup(drafter: dict, chain_curve: dict, tree_curve: dict) -> dict | None:
    """Speedup over `none` predicted from measured τ, draft cost and the verify-cost curve:
    τ · c(1) / (draft ms per step + c(inputs per step)), c the curve (the tree curve for tree drafters).
    None when the curves cannot say: c(1) not measured, or one size only where a step verifies more tokens."""
    curve = {int(n): ms for n, ms in (tree_curve if drafter["tree"] else chain_curve).items()}
    if "1" not in chain_curve or not curve or (len(curve) == 1 and drafter["inputs_per_step"] > min(curve)):
        return None
    one = chain_curve["1"]
    verify = interpolate(curve)(drafter["inputs_per_step"])
    step_ms = 1e3 * drafter["wall_s"] / drafter["steps"] if drafter["steps"] else 0.0
    measured = drafter["speedup_vs_none"]
    return {
        "tau": drafter["tau"],
        "inputs_per_step": drafter["inputs_per_step"],
        "draft_ms_per_step": drafter["draft_ms_per_step"],
        "verify_ms_per_step_curve": verify,
        "verify_ms_per_step_measured": drafter["verify_ms_per_step"],
        # prefill (spread over the steps), acceptance tests, events, cache surgery: what the model ignores
        "other_ms_per_step": step_ms - drafter["draft_ms_per_step"] - drafter["verify_ms_per_step"],
        "predicted": drafter["tau"] * one / (drafter["draft_ms_per_step"] + verify),
        "measured": measured["median"] if measured else None,
    }


def machine_info(device: torch.device, dtype: torch.dtype, bandwidth: float, packed: bool = False,
                 forward: str = "transformers") -> dict:
    import transformers

    return {
        "cpu": _cpu_name(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "linear": "oneDNN packed weights (specviz.fastlinear)" if packed else "torch default",
        "forward": forward,
        "bandwidth_gb_s": bandwidth,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def draft_dtypes(models) -> dict[str, str]:
    """The dtype each trained drafter runs in (specviz.models.draft_dtype; bf16 on CPUs with bf16 products)."""
    out = {}
    for drafter, part in (("draft", "draft"), ("medusa", "medusa"), ("eagle2", "eagle")):
        module = getattr(models, part, None)
        if module is not None:
            out[drafter] = str(next(module.parameters()).dtype).removeprefix("torch.")
    return out


def target_forward(model) -> str:
    """Which forward our engine runs the target with (transformers' peers always run transformers')."""
    if fastdecoder.for_model(model) is not None:
        return "specviz.fastdecoder (fused qkv and gate-up, in-place KV cache)"
    return f"transformers ({fastdecoder.unsupported_reason(model)})"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def floor_report(weight_bytes: int, bandwidth: dict[str, list[float]], none: MethodRuns) -> dict:
    """The weight-streaming floor (weight bytes ÷ bandwidth) against `none`'s time per token. Each prompt's floor
    uses the bandwidth measured right before its `none` runs (median over repeats), so a tenant who slows the
    machine down for a while moves both sides of that prompt's ratio; the headline share is the median of the
    per-prompt shares, beside the one from the run's totals and the median bandwidth."""
    samples = [gb_s for per_prompt in bandwidth.values() for gb_s in per_prompt]
    median_bandwidth = statistics.median(samples)
    floor_ms = 1e3 * weight_bytes / (median_bandwidth * 1e9)
    none_ms = speed(none)["ms_per_token"]
    # the floor's seconds per token × `none`'s tokens per second = the share of the floor's tokens/s reached
    shares = [weight_bytes / (statistics.median(gb_s) * 1e9) * none.tokens_per_s(prompt) for prompt, gb_s in bandwidth.items()
              if none.first(prompt).token_ids]
    return {
        "weight_bytes": weight_bytes,
        "bandwidth_gb_s": median_bandwidth,
        "bandwidth_gb_s_range": [min(samples), max(samples)],
        "bandwidth_samples": len(samples),
        "bandwidth_by_prompt": bandwidth,
        "floor_ms_per_token": floor_ms,
        "floor_tokens_per_s": 1e3 / floor_ms,
        "none_ms_per_token": none_ms,
        "none_share_of_floor": statistics.median(shares) if shares else None,
        "none_share_of_floor_per_prompt": summary(shares),
        "none_share_of_floor_totals": floor_ms / none_ms if none_ms else None,
    }


def build_report(models, prompts, encoded, settings, drafters, peers, runs, chain_curve, tree_curve, bandwidth, command) -> dict:
    """bandwidth: {prompt id: [GB/s measured before each of its `none` runs]}."""
    greedy = settings.sampling().greedy
    grouped = {m: MethodRuns([r for r in runs if r.method == m]) for m in drafters + peers}
    none = grouped["none"]
    drafter_reports = {name: drafter_report(grouped[name], none, greedy) for name in drafters}
    peer_reports = {name: peer_report(grouped[name], grouped["generate"], greedy) for name in peers}
    head_to_head = [{"ours": a, "peer": b, "speedup": summary(ratios(grouped[a], grouped[b]))}
                    for a, b in HEAD_TO_HEAD if a in grouped and b in grouped]
    bad = sorted({m["prompt"] for d in drafter_reports.values() for m in d["mismatches"]})

    floor = floor_report(streamed_weight_bytes(models.target), bandwidth, none)
    dtype = next(models.target.parameters()).dtype
    return {
        "schema_version": SCHEMA_VERSION,
        "machine": {**machine_info(models.target.device, dtype, floor["bandwidth_gb_s"], fastlinear.is_packed(models.target),
                                   target_forward(models.target)),
                    "draft_dtypes": draft_dtypes(models)},
        "config": {
            "command": command or "specviz.bench.run_bench (Python API)",
            "model": models.name,
            "draft_model": _model_path(models.draft) if getattr(models, "draft", None) is not None else None,
            "drafters": drafters,
            "peers": peers,
            "n_prompts": len(prompts),
            "max_new_tokens": settings.max_new_tokens,
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "seed": settings.seed,
            "repeats": settings.repeats,
            "k": settings.k,
            "warmup": settings.warmup,
            "assistant": {"num_assistant_tokens": settings.k, "schedule": "constant", "confidence_threshold": 0.0},
            "prompt_lookup": {"prompt_lookup_num_tokens": settings.k, "max_matching_ngram_size": 2},
            "verify_sizes": list(settings.verify_sizes),
            "context_len": fitting_context(models.target, settings.verify_sizes or (1,), settings.context_len),
            "cost_repeats": settings.cost_repeats,
            "tree_branching": settings.tree_branching,
        },
        "prompts": [
            {"id": p.id, "prompt_tokens": len(ids), "output_tokens": len(none.first(p.id).token_ids),
             "output_preview": models.tokenizer.decode(none.first(p.id).token_ids, skip_special_tokens=True)[:200]}
            for p, ids in zip(prompts, encoded)
        ],
        "drafters": drafter_reports,
        "peers": peer_reports,
        "head_to_head": head_to_head,
        "outputs_match_none": (not bad) if greedy else None,
        "mismatching_prompts": bad,
        "verify_cost_ms": chain_curve,
        "tree_verify_cost_ms": tree_curve,
        "predicted_speedup": {name: p for name, d in drafter_reports.items()
                              if (p := predicted_speedup(d, chain_curve, tree_curve)) is not None},
        "floor_ms_per_token": floor["floor_ms_per_token"],
        "floor": {**floor, "forward_1_ms": chain_curve.get("1")},
        "runs": [{"prompt": r.prompt, "method": r.method, "repeat": r.repeat, "new_tokens": len(r.token_ids),
                  "wall_s": r.wall_s, "tokens_per_s": r.tokens_per_s} for r in runs],
    }


def _model_path(model) -> str:
    return getattr(model.config, "_name_or_path", "") or "draft"


def per_prompt_rates(report: dict) -> dict[tuple[str, str], float]:
    """{(method, prompt): tokens/s} from a report's runs, as the summaries compute them (tokens of the first
    repeat over the median time of the repeats)."""
    rows: dict[tuple[str, str], list[dict]] = {}
    for run in report["runs"]:
        rows.setdefault((run["method"], run["prompt"]), []).append(run)
    return {key: min(runs, key=lambda r: r["repeat"])["new_tokens"] / statistics.median(r["wall_s"] for r in runs)
            for key, runs in rows.items()}


def none_against_bandwidth(report: dict) -> list[dict]:
    """Per prompt: the bandwidth measured right before its `none` runs (median) and `none`'s ms per token, for a
    chart of whether plain decoding follows the memory; empty for reports made before per-run bandwidth."""
    rate = per_prompt_rates(report)
    return [{"prompt": prompt, "bandwidth_gb_s": statistics.median(gb_s), "none_ms_per_token": 1e3 / rate["none", prompt]}
            for prompt, gb_s in (report["floor"].get("bandwidth_by_prompt") or {}).items()
            if gb_s and rate.get(("none", prompt))]


def per_prompt_speedups(report: dict, baseline: str, methods) -> dict[str, dict[str, float]]:
    """{method: {prompt: tokens/s over the baseline's}} from a report's runs, for charts of the spread."""
    rate = per_prompt_rates(report)
    return {m: {p: rate[m, p] / rate[baseline, p] for (name, p) in rate if name == m and (baseline, p) in rate}
            for m in methods}


def command_for(model: str, settings: BenchSettings, limit: int | None = None, quick: bool = False) -> str:
    """The `python -m specviz bench` command line that reruns these settings (for reports made by the app)."""
    words = ["python", "-m", "specviz", "bench", "--model", model]
    if settings.drafters:
        words += ["--drafters", ",".join(settings.drafters)]
    if limit is not None:
        words += ["--limit", str(limit)]
    words += ["--max-new-tokens", str(settings.max_new_tokens), "--temperature", str(settings.temperature),
              "--top-p", str(settings.top_p), "--seed", str(settings.seed), "--repeats", str(settings.repeats),
              "--k", str(settings.k)]
    words += ["--no-peers"] * (not settings.peers) + ["--quick"] * quick
    return shlex.join(words)


# -------------------------------------------------------------------------------------------- schema

_NUMBER = {"type": "number"}
_NULLABLE_NUMBER = {"type": ["number", "null"]}
_SUMMARY = {
    "type": ["object", "null"],
    "required": ["median", "min", "max", "n"],
    "properties": {"median": _NUMBER, "min": _NUMBER, "max": _NUMBER, "n": {"type": "integer", "minimum": 1}},
}
_MISMATCH = {
    "type": "object",
    "required": ["prompt", "index", "expected", "got", "expected_tokens", "got_tokens"],
    "properties": {"prompt": {"type": "string"}, "index": {"type": "integer"}, "expected": {"type": ["integer", "null"]},
                   "got": {"type": ["integer", "null"]}, "expected_tokens": {"type": "integer"}, "got_tokens": {"type": "integer"}},
}
_SPEED = {"new_tokens": {"type": "integer"}, "wall_s": _NUMBER, "tokens_per_s": _NUMBER, "ms_per_token": _NULLABLE_NUMBER}
_CURVE = {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"}, "additionalProperties": _NUMBER}

BENCH_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "specviz bench report",
    "type": "object",
    "required": ["schema_version", "machine", "config", "prompts", "drafters", "peers", "head_to_head",
                 "outputs_match_none", "mismatching_prompts", "verify_cost_ms", "tree_verify_cost_ms",
                 "predicted_speedup", "floor_ms_per_token", "floor", "runs"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "machine": {
            "type": "object",
            "required": ["cpu", "cores", "torch", "transformers", "device", "dtype", "bandwidth_gb_s", "date"],
            "properties": {"cpu": {"type": "string"}, "cores": {"type": ["integer", "null"]}, "torch_threads": {"type": "integer"},
                           "gpu": {"type": ["string", "null"]}, "torch": {"type": "string"}, "transformers": {"type": "string"},
                           "device": {"type": "string"}, "dtype": {"type": "string"}, "bandwidth_gb_s": _NUMBER,
                           "date": {"type": "string"},
                           "draft_dtypes": {"type": "object", "additionalProperties": {"type": "string"}}},
        },
        "config": {
            "type": "object",
            "required": ["command", "model", "drafters", "peers", "n_prompts", "max_new_tokens", "temperature", "top_p",
                         "seed", "repeats", "k", "verify_sizes", "context_len"],
            "properties": {"command": {"type": "string"}, "model": {"type": "string"},
                           "draft_model": {"type": ["string", "null"]},
                           "drafters": {"type": "array", "items": {"type": "string"}},
                           "peers": {"type": "array", "items": {"enum": list(PEERS)}},
                           "n_prompts": {"type": "integer", "minimum": 1}, "max_new_tokens": {"type": "integer"},
                           "temperature": _NUMBER, "top_p": _NUMBER, "seed": {"type": "integer"},
                           "repeats": {"type": "integer", "minimum": 1}, "k": {"type": "integer", "minimum": 1},
                           "verify_sizes": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                           "context_len": {"type": "integer"}},
        },
        "prompts": {
            "type": "array",
            "items": {"type": "object", "required": ["id", "prompt_tokens", "output_tokens", "output_preview"],
                      "properties": {"id": {"type": "string"}, "prompt_tokens": {"type": "integer"},
                                     "output_tokens": {"type": "integer"}, "output_preview": {"type": "string"}}},
        },
        "drafters": {
            "type": "object",
            "required": ["none"],
            "additionalProperties": {
                "type": "object",
                "required": ["tau", "acceptance_rate", "per_position_acceptance", "tokens_per_s", "ms_per_token",
                             "draft_share", "speedup_vs_none", "outputs_match_none", "mismatches"],
                "properties": {
                    **_SPEED,
                    "steps": {"type": "integer"}, "tau": _NUMBER, "drafted": {"type": "integer"}, "accepted": {"type": "integer"},
                    "acceptance_rate": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
                    "per_position_acceptance": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}},
                    "draft_share": _NUMBER, "verify_share": _NUMBER, "draft_ms_per_step": _NUMBER,
                    "verify_ms_per_step": _NUMBER, "inputs_per_step": _NUMBER, "tree": {"type": "boolean"},
                    "speedup_vs_none": _SUMMARY,
                    "outputs_match_none": {"type": ["boolean", "null"]},
                    "mismatches": {"type": "array", "items": _MISMATCH},
                },
            },
        },
        "peers": {
            "type": "object",
            "propertyNames": {"enum": list(PEERS)},
            "additionalProperties": {
                "type": "object",
                "required": ["tokens_per_s", "ms_per_token", "speedup_vs_generate", "outputs_match_generate", "mismatches"],
                "properties": {**_SPEED, "speedup_vs_generate": _SUMMARY, "outputs_match_generate": {"type": ["boolean", "null"]},
                               "mismatches": {"type": "array", "items": _MISMATCH}},
            },
        },
        "head_to_head": {
            "type": "array",
            "items": {"type": "object", "required": ["ours", "peer", "speedup"],
                      "properties": {"ours": {"type": "string"}, "peer": {"enum": list(PEERS)}, "speedup": _SUMMARY}},
        },
        "outputs_match_none": {"type": ["boolean", "null"]},
        "mismatching_prompts": {"type": "array", "items": {"type": "string"}},
        "verify_cost_ms": _CURVE,
        "tree_verify_cost_ms": _CURVE,
        "predicted_speedup": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["tau", "inputs_per_step", "draft_ms_per_step", "verify_ms_per_step_curve", "predicted", "measured"],
                "properties": {"tau": _NUMBER, "inputs_per_step": _NUMBER, "draft_ms_per_step": _NUMBER,
                               "verify_ms_per_step_curve": _NUMBER, "verify_ms_per_step_measured": _NUMBER,
                               "other_ms_per_step": _NUMBER, "predicted": _NUMBER, "measured": _NULLABLE_NUMBER},
            },
        },
        "floor_ms_per_token": _NUMBER,
        "floor": {
            "type": "object",
            "required": ["weight_bytes", "bandwidth_gb_s", "floor_ms_per_token", "floor_tokens_per_s", "none_ms_per_token"],
            "properties": {"weight_bytes": {"type": "integer"}, "bandwidth_gb_s": _NUMBER, "floor_ms_per_token": _NUMBER,
                           "floor_tokens_per_s": _NUMBER, "none_ms_per_token": _NULLABLE_NUMBER,
                           "forward_1_ms": _NULLABLE_NUMBER, "none_share_of_floor": _NULLABLE_NUMBER,
                           # since 2026-12-01 (older reports have one bandwidth figure for the whole run)
                           "bandwidth_gb_s_range": {"type": "array", "items": _NUMBER, "minItems": 2, "maxItems": 2},
                           "bandwidth_samples": {"type": "integer", "minimum": 1},
                           "bandwidth_by_prompt": {"type": "object", "additionalProperties": {"type": "array", "items": _NUMBER}},
                           "none_share_of_floor_per_prompt": _SUMMARY,
                           "none_share_of_floor_totals": _NULLABLE_NUMBER},
        },
        "runs": {
            "type": "array",
            "items": {"type": "object", "required": ["prompt", "method", "repeat", "new_tokens", "wall_s", "tokens_per_s"],
                      "properties": {"prompt": {"type": "string"}, "method": {"type": "string"},
                                     "repeat": {"type": "integer"}, "new_tokens": {"type": "integer"},
                                     "wall_s": _NUMBER, "tokens_per_s": _NUMBER}},
        },
    },
}


def validate(report: dict) -> None:
    """Raise jsonschema.ValidationError when the report does not match BENCH_SCHEMA."""
    import jsonschema

    jsonschema.validate(report, BENCH_SCHEMA)


def parse_report(text: str | bytes, source: str = "the report") -> dict:
    """A report from its JSON text, checked against the schema (SpecvizError when it is not one)."""
    import jsonschema

    try:
        report = json.loads(text)
        validate(report)
    except UnicodeDecodeError:
        raise SpecvizError(f"{source} is not a text file") from None
    except json.JSONDecodeError as err:
        raise SpecvizError(f"{source} is not JSON: {err}") from err
    except jsonschema.ValidationError as err:
        where = "/".join(map(str, err.absolute_path)) or "the top level"
        raise SpecvizError(f"{source} is not a specviz bench report (at {where}: {err.message})") from err
    return report


def load_report(path: str | os.PathLike) -> dict:
    """Read a saved report and check it against the schema (SpecvizError when it is not one)."""
    try:
        text = Path(path).read_bytes()
    except OSError as err:
        raise SpecvizError(f"cannot read the bench report {path}: {err}") from err
    return parse_report(text, str(path))


# ------------------------------------------------------------------------------------------- markdown


def _f(value, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _spread(s: dict | None) -> str:
    return "–" if s is None else f"{s['median']:.2f}× ({s['min']:.2f}–{s['max']:.2f})"


def _match(value) -> str:
    return {True: "yes", False: "**NO**", None: "not checked (T > 0)"}[value]


def floor_sentence(fl: dict) -> str:
    """The floor paragraph of the Markdown report and the Benchmarks page (older reports lack the per-prompt part)."""
    if fl.get("bandwidth_gb_s_range"):
        low, high = fl["bandwidth_gb_s_range"]
        measured = (f"{fl['bandwidth_gb_s']:.1f} GB/s (median of {fl['bandwidth_samples']} copy measurements, one right "
                    f"before each `none` run; {low:.1f}–{high:.1f})")
    else:
        measured = f"{fl['bandwidth_gb_s']:.1f} GB/s (copy, measured once in the run)"
    text = (f"{fl['weight_bytes'] / 1e6:,.1f} MB of target weights read per step ÷ {measured} = "
            f"**{fl['floor_ms_per_token']:.1f} ms per token** ({fl['floor_tokens_per_s']:.1f} tokens/s) at best for "
            f"autoregressive decoding. Measured: `none` {_f(fl['none_ms_per_token'], '.1f')} ms per token; ")
    per_prompt = fl.get("none_share_of_floor_per_prompt")
    if per_prompt:
        text += (f"per prompt, against the bandwidth measured just before it, `none` reaches **{100 * per_prompt['median']:.0f} %** "
                 f"of the floor's tokens/s (median; {100 * per_prompt['min']:.0f}–{100 * per_prompt['max']:.0f} %), "
                 f"{_f(None if fl.get('none_share_of_floor_totals') is None else 100 * fl['none_share_of_floor_totals'], '.0f', ' %')} "
                 f"from the totals and the median bandwidth")
    else:
        text += f"{_f(None if fl['none_share_of_floor'] is None else 100 * fl['none_share_of_floor'], '.0f', ' %')} of the floor's tokens/s"
    return text + f"; one target forward over 1 token: {_f(fl.get('forward_1_ms'), '.1f')} ms."


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def to_markdown(report: dict) -> str:
    m, c = report["machine"], report["config"]
    lines = [
        "# specviz bench",
        "",
        f"`{c['command']}`",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores ({m.get('torch_threads', '?')} torch threads)"
        + (f", GPU {m['gpu']}" if m.get("gpu") else "")
        + f"; {m['device']} {m['dtype']}, linear layers: {m.get('linear', 'torch default')}, "
        f"our engine's forward: {m.get('forward', 'transformers')}; "
        + (f"drafters in {', '.join(f'{k} {v}' for k, v in m['draft_dtypes'].items())}; " if m.get("draft_dtypes") else "")
        + f"torch {m['torch']}, transformers {m['transformers']}; "
        f"memory bandwidth {m['bandwidth_gb_s']:.1f} GB/s (copy, read + write); {m['date']}.",
        "",
        f"Model `{c['model']}`" + (f", draft `{c['draft_model']}`" if c.get("draft_model") else "")
        + f"; {c['n_prompts']} prompts, {c['max_new_tokens']} new tokens at most, temperature {c['temperature']}, "
        f"top-p {c['top_p']}, seed {c['seed']}, K = {c['k']}, {c['repeats']} repeat(s), warm-up {'on' if c.get('warmup') else 'off'}.",
        "",
    ]
    if report["outputs_match_none"] is False:
        lines += [f"**MISMATCH: at temperature 0 some drafters' outputs differ from `none` on: "
                  f"{', '.join(report['mismatching_prompts'])}. See the mismatch list below.**", ""]
    lines += ["## Drafters (our engine)", "",
              "τ counts the replacement/bonus token; speedup is per prompt over `none`, median (min–max).", ""]
    lines += _table(
        ["drafter", "τ", "acceptance", "tokens/s", "ms/token", "draft share", "speedup vs none", "output = none"],
        [[f"`{n}`", _f(d["tau"]), _f(d["acceptance_rate"]), _f(d["tokens_per_s"], ".1f"), _f(d["ms_per_token"], ".1f"),
          _f(100 * d["draft_share"], ".0f", " %"), _spread(d["speedup_vs_none"]), _match(d["outputs_match_none"])]
         for n, d in report["drafters"].items()],
    )
    depth = max((len(d["per_position_acceptance"]) for d in report["drafters"].values()), default=0)
    if depth:
        lines += ["", "Per-position acceptance (of the steps whose draft reached depth d, the share accepting there):", ""]
        lines += _table(["drafter"] + [f"d={d + 1}" for d in range(depth)],
                        [[f"`{n}`"] + [_f(a) for a in d["per_position_acceptance"]] + ["–"] * (depth - len(d["per_position_acceptance"]))
                         for n, d in report["drafters"].items() if d["per_position_acceptance"]])
    if report["peers"]:
        lines += ["", "## Peers (transformers `generate()`, same model objects)", ""]
        lines += _table(["peer", "tokens/s", "ms/token", "speedup vs generate", "output = generate"],
                        [[f"`{n}`", _f(p["tokens_per_s"], ".1f"), _f(p["ms_per_token"], ".1f"), _spread(p["speedup_vs_generate"]),
                          _match(p["outputs_match_generate"])] for n, p in report["peers"].items()])
    if report["head_to_head"]:
        lines += ["", "## Head to head (ours over theirs, per prompt)", ""]
        lines += _table(["ours", "peer", "speedup"], [[f"`{h['ours']}`", f"`{h['peer']}`", _spread(h["speedup"])]
                                                      for h in report["head_to_head"]])
    if report["verify_cost_ms"]:
        sizes = list(report["verify_cost_ms"])
        lines += ["", f"## Verify cost (ms of one target forward over n new tokens, {c['context_len']} tokens cached; median)", ""]
        rows = [["chain"] + [_f(report["verify_cost_ms"][n], ".1f") for n in sizes]]
        if report["tree_verify_cost_ms"]:
            rows.append([f"tree (branching {c.get('tree_branching')})"] + [_f(report["tree_verify_cost_ms"].get(n), ".1f") for n in sizes])
        rows.append([f"chain, relative to n={sizes[0]}"]
                    + [_f(report["verify_cost_ms"][n] / report["verify_cost_ms"][sizes[0]]) for n in sizes])
        lines += _table(["n"] + sizes, rows)
    if report["predicted_speedup"]:
        lines += ["", "## Predicted vs measured speedup over `none`", "",
                  "predicted = τ · c(1) / (draft ms + c(inputs per step)), c the verify-cost curve; "
                  "other ms = step time not spent drafting or verifying (prefill spread over steps, acceptance, events).", ""]
        lines += _table(["drafter", "τ", "inputs/step", "draft ms/step", "verify ms/step (curve)", "verify ms/step (measured)",
                         "other ms/step", "predicted", "measured"],
                        [[f"`{n}`", _f(p["tau"]), _f(p["inputs_per_step"]), _f(p["draft_ms_per_step"], ".1f"),
                          _f(p["verify_ms_per_step_curve"], ".1f"), _f(p["verify_ms_per_step_measured"], ".1f"),
                          _f(p["other_ms_per_step"], ".1f"), _f(p["predicted"], ".2f", "×"), _f(p["measured"], ".2f", "×")]
                         for n, p in report["predicted_speedup"].items()])
    lines += ["", "## Weight-streaming floor", "", floor_sentence(report["floor"])]
    bad = [(n, x) for n, d in report["drafters"].items() for x in d["mismatches"]]
    bad += [(n, x) for n, p in report["peers"].items() for x in p["mismatches"]]
    if bad:
        lines += ["", "## Mismatches", "", "Drafters are compared with `none`, peers with `generate`.", ""]
        lines += _table(["method", "prompt", "first differing token", "expected", "got", "lengths"],
                        [[f"`{n}`", x["prompt"], str(x["index"]), str(x["expected"]), str(x["got"]),
                          f"{x['expected_tokens']} / {x['got_tokens']}"] for n, x in bad])
    lines += ["", "## Prompts", ""]
    lines += _table(["prompt", "prompt tokens", "output tokens (`none`)", "output (`none`, start)"],
                    [[p["id"], str(p["prompt_tokens"]), str(p["output_tokens"]),
                      p["output_preview"][:80].replace("\n", " ").replace("|", "\\|")] for p in report["prompts"]])
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specviz bench",
                                description="Every drafter against `none` and against transformers' generate(), side by side.")
    add_model_args(p)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: bfloat16 on cuda, float32 elsewhere)")
    p.add_argument("--drafters", default="", help="comma-separated, e.g. none,ngram,draft,medusa,eagle2 (default: all available); a drafter may carry options: eagle2:draft_vocab=full:total_tokens=16")
    p.add_argument("--prompts", default=None, help="JSONL with `turns` (first turn used) or `instruction` (default: the built-in set)")
    p.add_argument("--limit", type=int, default=None, help="use the first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy, where outputs must equal `none`'s")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1, help="decodes of each (prompt, method); the median time is kept")
    p.add_argument("--k", type=int, default=4, help="draft length; also num_assistant_tokens and prompt_lookup_num_tokens")
    p.add_argument("--no-peers", action="store_true", help="skip transformers' generate() baselines")
    p.add_argument("--verify-sizes", default=None, help="n for the verify-cost curve, e.g. 1,2,4,8 (0 to skip)")
    p.add_argument("--context-len", type=int, default=256, help="cached tokens before each timed verify forward")
    p.add_argument("--bandwidth-mb", type=int, default=256, help="size of the tensor copied to measure memory bandwidth")
    p.add_argument("--quick", action="store_true", help=f"cost curve at n = {','.join(map(str, QUICK_SIZES))} only, fewer repeats")
    p.add_argument("--allow-mismatch", action="store_true", help="exit 0 even when outputs differ from `none` at temperature 0")
    p.add_argument("--json-out", default=None, help="write the report as one JSON document")
    p.add_argument("--md-out", default=None, help="write the report as Markdown tables (it is printed either way)")
    return p


def settings_from_args(args) -> BenchSettings:
    base = quick_settings() if args.quick else BenchSettings()
    sizes = base.verify_sizes
    if args.verify_sizes is not None:
        try:
            sizes = tuple(int(s) for s in args.verify_sizes.split(",") if s.strip() and int(s) > 0)
        except ValueError:
            raise SpecvizError(f"--verify-sizes takes comma-separated integers, got {args.verify_sizes!r}") from None
    return replace(
        base,
        drafters=tuple(s.strip() for s in args.drafters.split(",") if s.strip()),
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        repeats=args.repeats,
        k=args.k,
        peers=not args.no_peers,
        verify_sizes=sizes,
        context_len=args.context_len,
        bandwidth_mb=args.bandwidth_mb,
    )


def _load_models(args):
    from specviz import models

    return models.load(args.model, draft_model=args.draft_model, device=args.device, dtype=args.dtype)


def report_mismatches(report: dict, out=None) -> None:
    """Say loudly, on stderr, which drafters disagreed with `none` (and peers with generate) at temperature 0."""
    out = out or sys.stderr
    for name, d in report["drafters"].items():
        for x in d["mismatches"]:
            print(f"MISMATCH: drafter '{name}' differs from 'none' on prompt {x['prompt']} at token {x['index']} "
                  f"(none: {x['expected']}, {name}: {x['got']}; lengths {x['expected_tokens']} / {x['got_tokens']})", file=out)
    for name, p in report["peers"].items():
        for x in p["mismatches"]:
            print(f"note: peer '{name}' differs from plain generate() on prompt {x['prompt']} at token {x['index']}", file=out)
    if report["outputs_match_none"] is False:
        print(f"MISMATCH: at temperature 0 every drafter must reproduce 'none' token for token; "
              f"{len(report['mismatching_prompts'])} prompt(s) differ: {', '.join(report['mismatching_prompts'])}", file=out)


def exit_code(report: dict, allow_mismatch: bool = False) -> int:
    """1 when a drafter's greedy output differed from `none`'s (unless allowed), else 0."""
    return 1 if report["outputs_match_none"] is False and not allow_mismatch else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from_args(args)
        for path in (args.json_out, args.md_out):
            if path:
                check_writable(path)
        if args.threads is not None:
            if args.threads < 1:
                raise SpecvizError(f"--threads must be >= 1, got {args.threads}")
            torch.set_num_threads(args.threads)
        prompts = load_prompts(args.prompts, args.limit)
        models = _load_models(args)

        def progress(done: int, total: int, label: str) -> None:
            print(f"[{done}/{total}] {label}", file=sys.stderr, flush=True)

        report = run_bench(models, prompts, settings, progress, command=shlex.join(["python", "-m", "specviz", "bench", *argv]))
        validate(report)
    except SpecvizError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    markdown = to_markdown(report)
    print(markdown)  # first: a run's result is never lost to an output file that fails after it
    report_mismatches(report)
    for path, text in ((args.json_out, json.dumps(report, indent=1) + "\n"), (args.md_out, markdown)):
        if path:
            try:
                write_atomically(path, text)
            except OSError as err:
                print(f"error: cannot write {path}: {err}", file=sys.stderr)
                return 2
    return exit_code(report, args.allow_mismatch)


if __name__ == "__main__":
    raise SystemExit(main())
