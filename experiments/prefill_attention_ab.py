"""Where a long prompt's attention should run: the C++ op's loop over keys per query (specviz::attend, inside the
4-bit layer op) or torch's scaled_dot_product_attention (matrix products), by how many positions are cached.

Two parts, each alternated in one process, medians after a warm-up:
* the attention alone for one layer of SmolLM2-135M's shape (9 heads, 3 key-value heads, head_dim 64) over T new
  tokens after `past` cached, on random inputs;
* the default-weights target's prefill of an N-token prompt in the engine's 256-token chunks, with long chunks
  attending in torch past `fastdecoder.LONG_PAST` cached positions (the default) and with every chunk in the
  layer op (LONG_PAST out of reach): each chunk's ms and the prompt's tokens/s.

    .venv/bin/python experiments/prefill_attention_ab.py [--prompt 4096] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch.nn import functional as F

from specviz.kernels import extension, fastdecoder

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
SHAPES = ((256, 0), (256, 256), (256, 512), (256, 768), (256, 1024), (256, 2048), (256, 4096), (256, 7936))
CHUNK = 256


def attention_inputs(T: int, past: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    qkv = torch.randn(T, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=generator)
    cos, sin = torch.randn(T, HEAD_DIM, generator=generator), torch.randn(T, HEAD_DIM, generator=generator)
    keys = torch.randn(1, KV_HEADS, past + T, HEAD_DIM, generator=generator)
    return qkv, cos, sin, keys, torch.randn_like(keys)


def in_op(past: int, qkv, cos, sin, keys, values) -> torch.Tensor:
    return torch.ops.specviz.attend(qkv, cos, sin, keys, values, past, None, HEAD_DIM**-0.5, HEADS, KV_HEADS)


def in_torch(past: int, qkv, cos, sin, keys, values) -> torch.Tensor:
    """The same attention as the lean decoder's torch path computes it (the rotary step left out of both timings'
    difference: it is the same elementwise work either way)."""
    T, q_size, kv_size = qkv.shape[0], HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    end = past + T
    q = qkv[:, :q_size].view(T, HEADS, HEAD_DIM).transpose(0, 1)
    keys[0, :, past:end] = qkv[:, q_size : q_size + kv_size].view(T, KV_HEADS, HEAD_DIM).transpose(0, 1)
    values[0, :, past:end] = qkv[:, q_size + kv_size :].view(T, KV_HEADS, HEAD_DIM).transpose(0, 1)
    mask = torch.ones(T, end, dtype=torch.bool).tril(past)
    out = F.scaled_dot_product_attention(q.unsqueeze(0), keys[:, :, :end], values[:, :, :end], attn_mask=mask,
                                         scale=HEAD_DIM**-0.5, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(T, q_size)


def attention_table(rounds: int) -> None:
    print("attention alone, one layer: T new tokens after `past` cached (ms, median)")
    for T, past in SHAPES:
        inputs = attention_inputs(T, past)
        times: dict[str, list[float]] = {"op": [], "torch": []}
        for _ in range(rounds + 1):
            for name, attend in (("op", in_op), ("torch", in_torch)):
                started = time.perf_counter()
                attend(past, *inputs)
                times[name].append(time.perf_counter() - started)
        op, torch_ms = (statistics.median(times[k][1:]) * 1e3 for k in ("op", "torch"))
        print(f"  T={T:4d} past={past:5d}: op {op:8.1f}  torch {torch_ms:8.1f}  op/torch {op / torch_ms:5.2f}", flush=True)


def prefill(target, ids: list[int], long_past: int) -> list[float]:
    """Seconds per chunk of one prefill of `ids` with fastdecoder.LONG_PAST at long_past."""
    saved, fastdecoder.LONG_PAST = fastdecoder.LONG_PAST, long_past
    try:
        cache = target.new_cache()
        cache.reserve(len(ids))
        times = []
        for start in range(0, len(ids), CHUNK):
            started = time.perf_counter()
            target.forward(ids[start : start + CHUNK], cache, logits=False)
            times.append(time.perf_counter() - started)
        return times
    finally:
        fastdecoder.LONG_PAST = saved


def prefill_table(n: int, rounds: int) -> None:
    from specviz import models
    from specviz.decoding.target import Target

    target = Target(models.load("smollm2-135m", device="cpu", weights="q4q8").target)
    ids = torch.randint(49152, (n,), generator=torch.Generator().manual_seed(0)).tolist()
    target.forward(ids[:CHUNK], target.new_cache(), logits=False)  # warm-up
    ways = {f"torch past {fastdecoder.LONG_PAST}": fastdecoder.LONG_PAST, "layer op throughout": 1 << 30}
    runs: dict[str, list[list[float]]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, long_past in ways.items():
            runs[name].append(prefill(target, ids, long_past))
    print(f"\nprefill of {n} tokens in {CHUNK}-token chunks, default weights (median of {rounds})")
    for name, chunks in runs.items():
        per_chunk = [statistics.median(c) for c in zip(*chunks)]
        print(f"  {name}: {n / sum(per_chunk):6.1f} tokens/s; last chunk {per_chunk[-1] / per_chunk[0]:.2f}x the "
              f"first; chunks ms " + " ".join(f"{1e3 * c:.0f}" for c in per_chunk), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=4096, help="prompt tokens for the prefill part (0: skip it)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if not extension.available():
        print("specviz's C++ ops are not built here")
        return 1
    torch.set_grad_enabled(False)
    attention_table(args.rounds)
    if args.prompt:
        prefill_table(args.prompt, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
