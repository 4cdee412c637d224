"""Faster linear layers on the CPU: weights reordered once for oneDNN's packed-weight kernel (fp32 everywhere;
bf16 only on CPUs that multiply bf16 in hardware, which is where specviz runs its drafters in bf16).

Why it matters here: decoding a small model on a CPU is dominated by its matrix products with 1–16 rows. On a
2-core CPU torch's default fp32 `linear` (MKL sgemm on a row-major weight) reads a 1536 × 576 weight at about
11 GB/s for 1–3 rows and gets slower per call from 1 to 3 rows; oneDNN, given the weight already reordered into
its blocked layout, runs the same products about twice as fast and nearly flat from 1 to 16 rows
(`experiments/product_bandwidth.py` measures both on the machine it runs on). That
flatness is what speculative decoding needs: verifying 8 drafted tokens then costs little more than one.

It is the same arithmetic in the same precision (the weight's): results differ from `F.linear` by rounding only (about
1e-6 relative), just as MKL's own results already differ between 1 and 8 rows. The target is still the same model,
and every path (plain decoding, every drafter and transformers' own `generate()`) runs through the same modules.
The packed copy costs one more copy of the weights in memory; the original `weight` stays, so code that reads
`module.weight` (tied embeddings, EAGLE's reduced vocabulary) is unaffected.

`torch.ops.mkldnn._linear_pointwise` and `_reorder_linear_weight` are the ops torch's own compiler (inductor)
emits for CPU linears; they are not a documented public API, so `pack_linears` checks them once against `F.linear`
and leaves the model untouched where they are missing or disagree.
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

ROWS_HINT = 16  # the batch size oneDNN picks its blocking for; 8–64 all measured alike, 1 is slower past 4 rows
# Products over fewer rows than this are padded with zero rows: on this project's 2-core AVX-512 CPU oneDNN's kernels
# for 1 and 2 rows stream the weights slower than its 4-row kernel. One SmolLM2-135M forward (fp32, LM head included)
# over 2 tokens: 36.3 ms unpadded, 32.1 padded, 31.0 for 4 real tokens; over 1 token: 32.0 and 30.5. Each real row
# comes out the same to rounding (bit for bit for most shapes; tested). `.venv/bin/python experiments/padded_rows.py`
# measures it here.
MIN_ROWS = 4
ENV_SWITCH = "SPECVIZ_PACKED_LINEAR"  # "0" turns packing off (to compare, or where oneDNN misbehaves)


def stacked_bias(biases: list, rows: list[int], like: torch.Tensor) -> torch.Tensor | None:
    """The bias of several products stacked in order (their outputs side by side): None when none has a bias;
    a missing one among present ones is a zero bias of its `rows` outputs."""
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else like.new_zeros(n) for b, n in zip(biases, rows)])


def reorder(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)


def packed_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., in) → (..., out) by oneDNN's packed kernel; fewer than MIN_ROWS rows are padded to MIN_ROWS."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if 0 < rows < MIN_ROWS:
        padded = F.pad(x.reshape(rows, x.shape[-1]), (0, 0, 0, MIN_ROWS - rows))
        out = torch.ops.mkldnn._linear_pointwise(padded, packed, bias, "none", [], "")[:rows]
        return out.reshape(*x.shape[:-1], out.shape[-1])
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackedLinear(nn.Module):
    """A stand-in for `nn.Linear` that multiplies by a oneDNN-packed copy of the weight.

    The packed copy is opaque (it cannot be moved, cast or copied), so it is rebuilt after `.to()` / `.half()` /
    `load_state_dict` (or dropped where packing does not apply: the plain product is used then), and it is
    bypassed whenever a gradient could flow to the weight."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameter: ties and readers of .weight keep working
        self.bias = linear.bias
        self._repack()

    def _repack(self) -> None:
        self.register_buffer("packed", reorder(self.weight) if usable(self.weight) else None, persistent=False)

    def _apply(self, fn, recurse=True):
        self._buffers.pop("packed", None)
        super()._apply(fn, recurse)
        self._repack()
        return self

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._repack()

    def __deepcopy__(self, memo):
        import copy

        clone = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        clone.weight = copy.deepcopy(self.weight, memo)
        clone.bias = copy.deepcopy(self.bias, memo)
        return PackedLinear(clone)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None or (torch.is_grad_enabled() and self.weight.requires_grad):
            return F.linear(x, self.weight, self.bias)
        return packed_product(x, self.packed, None if self.bias is None else self.bias.detach())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, packed=oneDNN"


class PackedProjection:
    """x ↦ x @ weight.T (+ bias) for a plain weight matrix (a reduced-vocabulary LM head, fused projections),
    packed when possible. Only the packed copy is kept then: callers that still need the plain weight hold it."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.bias = bias
        self.packed = reorder(weight) if usable(weight) else None
        self.weight = None if self.packed is not None else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return packed_product(x, self.packed, self.bias)


# (id(weight), rows, dtype) -> (weight, projection), least recently used first
_projections: OrderedDict[tuple, tuple[weakref.ref, Callable[[torch.Tensor], torch.Tensor]]] = OrderedDict()
# Projections kept at most. Each is a copy of (part of) an LM head, up to ~1 GB for a 1.5B model's; a drafter holds
# its own while it runs, so one dropped here costs only a re-pack the next time its rows are asked for. 8 covers
# every drafter of two loaded models (the app keeps two) with their default vocabularies.
MAX_PROJECTIONS = 8


def rows_projection(weight: torch.Tensor, rows: torch.Tensor | None = None,
                    dtype: torch.dtype | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """A PackedProjection of weight[rows] (all rows when None) in `dtype` (the weight's when None), made once per
    (weight, rows, dtype) and reused, so that a drafter built per run does not slice and re-pack a large LM head
    every time; the MAX_PROJECTIONS most recently used are kept. rows: (Vd,) int64 ids."""
    dtype = dtype or weight.dtype
    return kept_projection(weight, rows, dtype, lambda: PackedProjection(
        (weight if rows is None else weight[rows.to(weight.device)]).to(dtype)))


def kept_projection(owner: object, rows: torch.Tensor | None, form: object,
                    build: Callable[[], Callable[[torch.Tensor], torch.Tensor]]) -> Callable[[torch.Tensor], torch.Tensor]:
    """What `build()` makes, a projection onto `owner`'s rows `rows` in `form` (a dtype, or a name such as "q8"),
    made once per (owner, rows, form) and kept beside rows_projection's while `owner` lives."""
    key = (id(owner), None if rows is None else tuple(rows.tolist()), form)
    held = _projections.get(key)
    if held is None or held[0]() is not owner:  # new, or another object now has that id
        forget = lambda _, key=key, store=_projections: store.pop(key, None)  # noqa: E731
        _projections[key] = held = (weakref.ref(owner, forget), build())
        while len(_projections) > MAX_PROJECTIONS:
            _projections.popitem(last=False)
    _projections.move_to_end(key)
    return held[1]


def wanted() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


_CHECKED: dict[torch.dtype, bool] = {}
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of CPUs that multiply bf16 in hardware


def supported(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch build has the packed kernel for `dtype` and it agrees with F.linear (checked once per
    process and dtype)."""
    if dtype not in _CHECKED:
        try:
            generator = torch.Generator().manual_seed(0)
            weight = torch.randn(48, 40, generator=generator).to(dtype)
            x = torch.randn(3, 40, generator=generator).to(dtype)
            with torch.inference_mode():
                got = packed_product(x, reorder(weight), None).float()
            tolerance = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
            _CHECKED[dtype] = bool(torch.allclose(got, F.linear(x, weight).float(), **tolerance))
        except (RuntimeError, AttributeError):
            _CHECKED[dtype] = False
    return _CHECKED[dtype]


_NATIVE_BF16: bool | None = None


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX). Without it oneDNN emulates bf16 and
    a bf16 product is no faster than fp32, so nothing here switches to bf16 there."""
    global _NATIVE_BF16
    if _NATIVE_BF16 is None:
        try:
            with open("/proc/cpuinfo") as f:
                flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
        except OSError:
            flags = []
        _NATIVE_BF16 = any(flag in flags for flag in NATIVE_BF16_FLAGS)
    return _NATIVE_BF16


def usable(weight: torch.Tensor) -> bool:
    """fp32 weights pack wherever the kernel works; bf16 ones only on CPUs with native bf16 products."""
    if not wanted() or weight.device.type != "cpu":
        return False
    if weight.dtype == torch.bfloat16:
        return native_bf16() and supported(torch.bfloat16)
    return weight.dtype == torch.float32 and supported()


def pack_linears(model: nn.Module) -> int:
    """Swap every packable CPU `nn.Linear` under `model` (see `usable`) for a PackedLinear, in place; returns
    how many were swapped.

    Meant for frozen models used for inference; see PackedLinear for moves, casts and weight loads afterwards.
    """
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear and usable(child.weight)
    ]
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child))
    return len(swaps)


def is_packed(model: nn.Module) -> bool:
    return any(isinstance(m, PackedLinear) for m in model.modules())
