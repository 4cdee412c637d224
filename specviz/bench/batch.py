"""The batch surface: the target's measured forward cost over B sequences × n new tokens each, every sequence
with `context_len` tokens already in its KV cache. Its B = 1 row is keyed like the verify-cost curve
(specviz.decoding.costs) but runs transformers' batched forward (the curve's own path, the lean decoder, is the
`lean_b1_ms` row); the other rows say what verifying K + 1 tokens per sequence costs once the target
already serves B sequences, the measured side of the cost page's batch section.

specviz's lean decoder (specviz.kernels.fastdecoder) and its KV cache hold one sequence, so every cell runs
transformers' batched forward over a DynamicCache; where the lean decoder runs (the CPU), B = 1 is measured with
it too, in the same rounds, so the two B = 1 rows can be compared. Cells run in a new shuffled order every
round (after one untimed warm-up round), so a neighbour's job that slows the machine for a while spreads over
the surface instead of biasing one corner; each cell keeps the median over rounds and its spread.
"""
from __future__ import annotations

import contextlib
import os
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from transformers import DynamicCache

from specviz.bench.probes import BandwidthProbe, machine_info, target_forward
from specviz.bench.schema import parse_json
from specviz.decoding.costs import fitting_context, synchronize
from specviz.decoding.target import Target
from specviz.errors import SpecvizError
from specviz.kernels import fastlinear, products, quant
from specviz.kernels.kvcache import crop_cache

BATCH_SIZES = (1, 2, 4, 8, 16, 32)
NEW_TOKENS = (1, 2, 3, 4, 5, 6, 7, 8)  # K + 1 for K = 0 … 7 drafted tokens per sequence
KIND = "specviz batch surface"
SURFACE_VERSION = 1
SHIPPED = Path(__file__).resolve().parent / "data" / "batch-surface-cpu.json"
BATCHED_FORWARD = "transformers (batched, DynamicCache)"

# progress(done, total, label): called after each round
ProgressCallback = Callable[[int, int, str], None]


@dataclass(frozen=True)
class SurfaceSettings:
    batch_sizes: tuple[int, ...] = BATCH_SIZES
    new_tokens: tuple[int, ...] = NEW_TOKENS  # must include 1: every ratio is c(B, n) ÷ c(B, 1)
    context_len: int = 256  # cached tokens per sequence before the timed forward (as the bench's verify curve)
    rounds: int = 10  # timed passes over every cell, each in a new shuffled order; the median is kept
    seed: int = 0  # the shuffles and the random token ids
    bandwidth_mb: int = 256  # the machine probe's copy, measured before and after the surface
    bandwidth_repeats: int = 5

    def check(self) -> None:
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise SpecvizError(f"batch sizes must be >= 1, got {list(self.batch_sizes)}")
        if 1 not in self.new_tokens or min(self.new_tokens) < 1:
            raise SpecvizError(f"new-token counts must be >= 1 and include 1 (the ratios divide by c(B, 1)), got {list(self.new_tokens)}")
        if self.rounds < 1 or self.context_len < 1:
            raise SpecvizError(f"rounds and context length must be >= 1, got {self.rounds} and {self.context_len}")
        if self.bandwidth_mb < 1:
            raise SpecvizError(f"the bandwidth probe needs at least 1 MB, got {self.bandwidth_mb}")


def quick_surface_settings(**overrides) -> SurfaceSettings:
    """Two batch sizes, two token counts, two rounds: a smoke run."""
    return SurfaceSettings(**{"batch_sizes": (1, 2), "new_tokens": (1, 2), "context_len": 32, "rounds": 2,
                              "bandwidth_mb": 16, "bandwidth_repeats": 2, **overrides})


# --------------------------------------------------------------------------------------- the cells


def batched_cache(target: Target, context: torch.Tensor, batch: int) -> DynamicCache:
    """A cache holding the context (1, context_len) for each of `batch` sequences: prefilled once and repeated B
    times (a dense forward's time does not depend on the cached values). One per batch size, shared by its cells."""
    cache = DynamicCache(config=target.model.config)
    target.decoder(input_ids=context, cache=cache, use_cache=True)
    cache.batch_repeat_interleave(batch)
    return cache


def batched_cell(target: Target, cache: DynamicCache, ids: torch.Tensor, context_len: int) -> Callable[[], None]:
    """One timed call: a forward over ids (B, n) after `context_len` cached tokens per sequence, logits for every
    new token as the engine computes them, then the cache cropped back."""

    def call() -> None:
        hidden = target.decoder(input_ids=ids, cache=cache, use_cache=True).last_hidden_state  # (B, n, H)
        target.head(hidden).float()  # (B, n, V)
        crop_cache(cache, context_len)

    return call


def lean_cell(target: Target, ids: list[int], context: list[int], context_len: int,
              path: str | None = None) -> Callable[[], None]:
    """B = 1 through the engine's own Target.forward (the lean decoder where it runs), as verify_costs times it;
    path: the products held to that path (products.products_on) during the call, e.g. VNNI where AMX would run."""
    cache = target.new_cache()
    target.forward(context, cache, logits=False)

    def call() -> None:
        with products.products_on(path) if path else contextlib.nullcontext():
            target.forward(ids, cache)
        crop_cache(cache, context_len)

    return call


def timed_rounds(cells: dict, rounds: int, seed: int, device: torch.device,
                 progress: ProgressCallback | None = None) -> dict[object, list[float]]:
    """Seconds of every cell in each of `rounds` rounds, after an untimed warm-up round; every round in a new
    shuffled order."""
    order = list(cells)
    shuffle = random.Random(seed).shuffle
    times: dict[object, list[float]] = {key: [] for key in cells}
    for r in range(rounds + 1):
        shuffle(order)
        for key in order:
            synchronize(device)
            started = time.perf_counter()
            cells[key]()
            synchronize(device)
            if r:
                times[key].append(time.perf_counter() - started)
        if progress is not None:
            progress(r + 1, rounds + 1, "warm-up" if r == 0 else f"round {r}")
    return times


def spread(seconds: list[float]) -> dict:
    """The cell's median, range and quartiles in ms, and its relative spread (interquartile range ÷ median)."""
    ms = sorted(1e3 * s for s in seconds)
    median = statistics.median(ms)
    q1, _, q3 = statistics.quantiles(ms, n=4, method="inclusive") if len(ms) > 1 else (ms[0], ms[0], ms[0])
    return {"median": median, "min": ms[0], "max": ms[-1], "q1": q1, "q3": q3, "relative_iqr": (q3 - q1) / median}


def by_batch(stats: dict, field: str) -> dict[str, dict[str, float]]:
    """{(B, n): spread} → {"B": {"n": value}}, the keys strings as in the verify-cost curve's JSON."""
    out: dict[str, dict[str, float]] = {}
    for (batch, n), cell in sorted(stats.items()):
        out.setdefault(str(batch), {})[str(n)] = cell[field]
    return out


@torch.inference_mode()
def measure_surface(model, settings: SurfaceSettings | None = None, name: str = "", command: str = "",
                    progress: ProgressCallback | None = None) -> dict:
    """The batch surface of `model` (a causal LM on its device), with the machine probe: one JSON document."""
    settings = settings or SurfaceSettings()
    settings.check()
    started = time.perf_counter()
    target = Target(model)
    device = target.device
    context_len = fitting_context(model, settings.new_tokens, settings.context_len)
    vocab = model.get_input_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(settings.seed)
    load_before = os.getloadavg()
    probe = BandwidthProbe(device, settings.bandwidth_mb, settings.bandwidth_repeats)
    bandwidth = [probe.measure()]

    context = torch.randint(vocab, (1, context_len), generator=generator)
    cells = {}
    for batch in settings.batch_sizes:
        cache = batched_cache(target, context.to(device), batch)
        for n in settings.new_tokens:
            ids = torch.randint(vocab, (batch, n), generator=generator)
            cells["batched", batch, n] = batched_cell(target, cache, ids.to(device), context_len)
    tiles = target.fast is not None and quant.activations(model) == "q8" and products.amx_tiles()
    if target.fast is not None:
        for n in settings.new_tokens:
            ids = torch.randint(vocab, (n,), generator=generator)
            cells["lean", 1, n] = lean_cell(target, ids.tolist(), context[0].tolist(), context_len)
            if tiles:  # the same forward with the products held to VNNI: what the tiles save, in the same rounds
                cells["vnni", 1, n] = lean_cell(target, ids.tolist(), context[0].tolist(), context_len, "avx512")
    times = timed_rounds(cells, settings.rounds, settings.seed, device, progress)
    bandwidth.append(probe.measure())
    del probe, cells
    stats = {key: spread(seconds) for key, seconds in times.items()}
    batched = {(b, n): s for (kind, b, n), s in stats.items() if kind == "batched"}
    lean = {(b, n): s for (kind, b, n), s in stats.items() if kind == "lean"}
    vnni = {(b, n): s for (kind, b, n), s in stats.items() if kind == "vnni"}
    relative = sorted(s["relative_iqr"] for s in stats.values())
    dtype = next(model.parameters()).dtype
    return {
        "kind": KIND,
        "version": SURFACE_VERSION,
        "command": command or "specviz.bench.batch.measure_surface (Python API)",
        "model": name or getattr(model.config, "_name_or_path", "") or type(model).__name__,
        "machine": {**machine_info(device, dtype, statistics.median(bandwidth), fastlinear.is_packed(model),
                                   BATCHED_FORWARD),
                    "bandwidth_gb_s_before_after": bandwidth,
                    "load_average_before_after": [load_before[0], os.getloadavg()[0]]},
        "config": {**asdict(settings), "batch_sizes": list(settings.batch_sizes),
                   "new_tokens": list(settings.new_tokens), "context_len": context_len,
                   "logits": "for every new token (as the engine verifies)",
                   "cache": "each sequence's context prefilled once and repeated B times"},
        "forward": BATCHED_FORWARD,
        "ms": by_batch(batched, "median"),
        "ms_min": by_batch(batched, "min"),
        "ms_max": by_batch(batched, "max"),
        "relative_iqr": by_batch(batched, "relative_iqr"),
        "lean_b1_forward": target_forward(model) if lean else None,
        "lean_b1_ms": by_batch(lean, "median").get("1") if lean else None,
        # the products of two rows or more on AMX tiles (lean_b1_ms), and the same forwards held to VNNI
        "amx_tiles": tiles,
        "lean_b1_ms_vnni": by_batch(vnni, "median").get("1") if vnni else None,
        "noise": {"cells": len(stats), "rounds": settings.rounds,
                  "median_relative_iqr": statistics.median(relative), "max_relative_iqr": relative[-1],
                  "what": "relative IQR: (3rd − 1st quartile) ÷ median of a cell's rounds"},
        "wall_s": time.perf_counter() - started,
    }


# ------------------------------------------------------------------------------------- the file


_GRID = {"type": "object", "minProperties": 1, "propertyNames": {"pattern": "^[0-9]+$"},
         "additionalProperties": {"type": "object", "minProperties": 1, "propertyNames": {"pattern": "^[0-9]+$"},
                                  "additionalProperties": {"type": "number", "exclusiveMinimum": 0}}}
SURFACE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "specviz batch surface",
    "type": "object",
    "required": ["kind", "version", "command", "model", "machine", "config", "forward", "ms", "noise"],
    "properties": {
        "kind": {"const": KIND},
        "version": {"const": SURFACE_VERSION},
        "command": {"type": "string"},
        "model": {"type": "string"},
        "machine": {"type": "object", "required": ["cpu", "device", "dtype", "date", "torch_threads", "bandwidth_gb_s"],
                    "properties": {"cpu": {"type": "string"}, "gpu": {"type": ["string", "null"]},
                                   "device": {"type": "string"}, "dtype": {"type": "string"}, "date": {"type": "string"},
                                   "torch_threads": {"type": "integer"}, "bandwidth_gb_s": {"type": "number"}}},
        "config": {"type": "object", "required": ["batch_sizes", "new_tokens", "context_len", "rounds"],
                   "properties": {"batch_sizes": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 1}},
                                  "new_tokens": {"type": "array", "contains": {"const": 1},
                                                 "items": {"type": "integer", "minimum": 1}},
                                  "context_len": {"type": "integer", "minimum": 1}, "rounds": {"type": "integer", "minimum": 1}}},
        "forward": {"type": "string"},
        "ms": _GRID,
        "ms_min": _GRID,
        "ms_max": _GRID,
        "lean_b1_ms": {"type": ["object", "null"], "additionalProperties": {"type": "number", "exclusiveMinimum": 0}},
        "lean_b1_forward": {"type": ["string", "null"]},
        "amx_tiles": {"type": "boolean"},
        "lean_b1_ms_vnni": {"type": ["object", "null"], "additionalProperties": {"type": "number", "exclusiveMinimum": 0}},
        "noise": {"type": "object", "required": ["median_relative_iqr", "max_relative_iqr"],
                  "properties": {"median_relative_iqr": {"type": "number"}, "max_relative_iqr": {"type": "number"}}},
    },
    # a lean B = 1 row names the forward that made it
    "if": {"required": ["lean_b1_ms"], "properties": {"lean_b1_ms": {"type": "object"}}},
    "then": {"required": ["lean_b1_forward"], "properties": {"lean_b1_forward": {"type": "string"}}},
}


def parse_surface(text: str | bytes, source: str = "the file") -> dict:
    """A batch surface from its JSON text, checked against SURFACE_SCHEMA and for a full grid (in ms and, where
    present, ms_min and ms_max): every batch size of its config with every token count (SpecvizError saying what is wrong when it is not one)."""
    surface = parse_json(text, SURFACE_SCHEMA, source, "specviz batch surface")
    config = surface["config"]
    want = {str(n) for n in config["new_tokens"]}
    for field in ("ms", "ms_min", "ms_max"):
        for batch in map(str, config["batch_sizes"]) if field in surface else ():
            have = set(surface[field].get(batch, {}))
            if have != want:
                raise SpecvizError(f"{source} is not a full batch surface: {field} at B = {batch} has n = "
                                   f"{sorted(have, key=int)}, its config says {sorted(want, key=int)}")
    return surface


def load_surface(path: str | os.PathLike = SHIPPED) -> dict:
    """Read a surface file (the shipped one by default) and check it."""
    try:
        text = Path(path).read_bytes()
    except OSError as err:
        raise SpecvizError(f"cannot read the batch surface {path}: {err}") from err
    return parse_surface(text, str(path))


def to_markdown(surface: dict) -> str:
    """The surface as two tables: ms per forward, and c(B, n) ÷ c(B, 1)."""
    ns = surface["config"]["new_tokens"]
    head = "| B | " + " | ".join(f"n = {n}" for n in ns) + " |\n|---|" + "---|" * len(ns) + "\n"
    ms = surface["ms"]
    rows = "".join(f"| {b} | " + " | ".join(f"{ms[b][str(n)]:.1f}" for n in ns) + " |\n" for b in ms)
    ratios = "".join(f"| {b} | " + " | ".join(f"{ms[b][str(n)] / ms[b]['1']:.2f}" for n in ns) + " |\n" for b in ms)
    lean = surface.get("lean_b1_ms")
    lean_row = ("\nB = 1 through " + surface["lean_b1_forward"] + ": " +
                ", ".join(f"n = {n}: {lean[str(n)]:.1f} ms" for n in ns) + "\n") if lean else ""
    m, noise = surface["machine"], surface["noise"]
    return (f"Batch surface of {surface['model']} ({m['dtype']}, {m['device']}, {m['cpu']}, {m['torch_threads']} threads), "
            f"{surface['config']['context_len']} cached tokens per sequence, median of {surface['config']['rounds']} "
            f"shuffled rounds; cell spread (IQR ÷ median) median {noise['median_relative_iqr']:.1%}, "
            f"max {noise['max_relative_iqr']:.1%}.\n\nms per forward ({surface['forward']}):\n\n" + head + rows
            + "\nc(B, n) ÷ c(B, 1):\n\n" + head + ratios + lean_row)
