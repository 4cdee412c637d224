"""Measurements of the machine the bench runs on: memory bandwidth, the bytes a forward streams, what ran."""
from __future__ import annotations

import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from specviz.decoding.costs import synchronize
from specviz.kernels import fastdecoder


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
    embedding, of which a step reads one row, unless the LM head shares it (then the head reads all of it).
    Projections kept in GGUF blocks (specviz.kernels.quant.BLOCK_LINEARS) count their codes, scales and
    minimums; an LM head computed from 8-bit blocks (specviz.models.quantized.q8_head) counts those instead of its
    fp32 weight."""
    from specviz.kernels.quant import BLOCK_LINEARS, q8_head

    total = sum(p.numel() * p.element_size() for p in model.parameters())
    total += sum(b.numel() * b.element_size() for m in model.modules() if isinstance(m, BLOCK_LINEARS)
                 for b in m.buffers(recurse=False))
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is None or head.weight.data_ptr() != embedding.data_ptr():
        total -= embedding.numel() * embedding.element_size()
    if (blocks := q8_head(model)) is not None:  # the step reads the 8-bit head, not the fp32 one
        total += blocks.nbytes - head.weight.numel() * head.weight.element_size()
    return total


def machine_info(device: torch.device, dtype: torch.dtype, bandwidth: float, packed: bool = False,
                 forward: str = "transformers") -> dict:
    import transformers

    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "linear": "oneDNN packed weights (specviz.kernels.fastlinear)" if packed else "torch default",
        "forward": forward,
        "bandwidth_gb_s": bandwidth,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def draft_dtypes(models) -> dict[str, str]:
    """The dtype each trained drafter runs in (specviz.models.draft_dtype; bf16 on CPUs with bf16 products), and
    whether its products are 4-bit (an EAGLE or EAGLE-3 head beside a 4-bit target; specviz.models.loading.load_trained),
    and on which activations."""
    from specviz.drafters import REGISTRY
    from specviz.kernels.quant import activations, is_quantized

    out = {}
    for drafter, spec in REGISTRY.items():
        module = models.part(spec.needs) if spec.needs else None
        if module is not None:
            dtype = str(next(module.parameters()).dtype).removeprefix("torch.")
            if not is_quantized(module):
                out[drafter] = dtype
            else:  # tiles name their 8-bit activations themselves ("Q4_1 tiles, 8-bit activations")
                out[drafter] = block_formats(module) + ("" if activations(module) == "q8" else f", {dtype} activations")
    return out


def block_formats(module) -> str:
    """What a module's block linears hold: "4-bit products (Q4_1)", or with 8-bit ones beside them (a K-quant
    file's Q6_K / Q5_0 projections) "4-bit products (Q4_K) and 8-bit (Q6_K: N of M)"."""
    from specviz.kernels.quant import BLOCK_LINEARS, EIGHT_BIT

    linears = [m for m in module.modules() if isinstance(m, BLOCK_LINEARS)]
    four = sorted({m.format for m in linears if not isinstance(m, EIGHT_BIT)})
    eight = [m for m in linears if isinstance(m, EIGHT_BIT)]
    label = f"4-bit products ({', '.join(four)})"
    if not eight:
        return label
    return f"{label} and 8-bit ({', '.join(sorted({m.format for m in eight}))}: {len(eight)} of {len(linears)})"


def target_forward(model) -> str:
    """Which forward our engine runs the target with (transformers' peers always run transformers')."""
    if fastdecoder.for_model(model) is not None:
        return "specviz.kernels.fastdecoder (fused qkv and gate-up, in-place KV cache)"
    return f"transformers ({fastdecoder.unsupported_reason(model)})"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
