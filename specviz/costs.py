"""The target's measured forward latency as a function of how many tokens it verifies at once."""
from __future__ import annotations

import statistics
import time
import weakref

import torch
from transformers import DynamicCache

DEFAULT_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64)

_curves: "weakref.WeakKeyDictionary[torch.nn.Module, dict[int, float]]" = weakref.WeakKeyDictionary()


@torch.inference_mode()
def measure_forward_latency(model, sizes=DEFAULT_SIZES, context: int = 128, repeats: int = 3) -> dict[int, float]:
    """Median seconds of one forward over n new tokens on top of a `context`-token KV cache, for each n."""
    device = model.device
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, context), generator=generator).to(device)
    cache = DynamicCache(config=model.config)
    model(input_ids=prefix, cache=cache, use_cache=True, logits_to_keep=1)
    curve = {}
    for n in sizes:
        new = torch.randint(0, vocab, (1, n), generator=generator).to(device)
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            model(input_ids=new, cache=cache, use_cache=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            cache.crop(-n)
        curve[n] = statistics.median(times[1:])
    return curve


def forward_latency(model) -> dict[int, float]:
    """The curve for this model, measured once per process."""
    if model not in _curves:
        _curves[model] = measure_forward_latency(model)
    return _curves[model]


def interpolate(curve: dict[int, float]):
    """n -> seconds, linear between measured sizes, extrapolated linearly past the last one."""
    xs = sorted(curve)

    def cost(n: int) -> float:
        if n <= xs[0]:
            return curve[xs[0]]
        for a, b in zip(xs, xs[1:]):
            if n <= b:
                return curve[a] + (curve[b] - curve[a]) * (n - a) / (b - a)
        a, b = xs[-2], xs[-1]
        return curve[b] + (curve[b] - curve[a]) * (n - b) / (b - a)

    return cost
