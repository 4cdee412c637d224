"""Devices and dtypes: which device "auto" means, the target's dtype there, and the drafters' dtype."""
from __future__ import annotations

import os

import torch

from specviz.errors import SpecvizError
from specviz.kernels import fastlinear


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """"auto" -> cuda when available, else cpu. Asking for an accelerator that is not there is an error."""
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise SpecvizError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N") from err
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            raise SpecvizError(
                f"device {device!r} was asked for, but this torch ({torch.__version__}) sees no CUDA GPU. "
                "Use --device cpu (or auto)."
            )
        if chosen.index is not None and chosen.index >= torch.cuda.device_count():
            raise SpecvizError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif chosen.type == "mps":
        if not torch.backends.mps.is_available():
            raise SpecvizError(f"device {device!r} was asked for, but MPS is not available here")
    elif chosen.type != "cpu":
        raise SpecvizError(f"device {device!r} is not supported: use auto, cpu, cuda or cuda:N")
    return chosen


def default_dtype(device: str | torch.device) -> torch.dtype:
    """bfloat16 on CUDA (half the memory, fast), float32 elsewhere (CPU bf16 matmuls are slow)."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


DRAFT_DTYPE_ENV = "SPECVIZ_DRAFT_DTYPE"  # float32 / bfloat16 / float16: overrides draft_dtype's choice


def draft_dtype(target_dtype: torch.dtype, device: str | torch.device) -> torch.dtype:
    """The dtype the trained drafters (EAGLE and Medusa heads, the shipped independent draft) run in.

    A draft only proposes: the target verifies every token, so the draft's precision can change how many drafts
    are accepted, never the output. Drafting streams the draft's weights once per depth, so on a CPU that
    multiplies bf16 in hardware an fp32 target's heads run in bf16 (half the bytes); elsewhere in the target's
    dtype. (Beside a 4-bit target the EAGLE and EAGLE-3 heads get 4-bit products instead:
    specviz.models.loading.load_trained.)"""
    forced = os.environ.get(DRAFT_DTYPE_ENV)
    if forced:
        return as_dtype(forced)
    if (torch.device(device).type == "cpu" and target_dtype == torch.float32 and fastlinear.wanted()
            and fastlinear.native_bf16() and fastlinear.supported(torch.bfloat16)):
        return torch.bfloat16
    return target_dtype


def cast_parameters(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast the floating-point parameters only: unlike `module.to(dtype)` this keeps fp32 buffers such as the
    rotary `inv_freq`, which rounded to bf16 would turn far positions by visibly wrong angles. In place."""
    for parameter in module.parameters():
        if parameter.is_floating_point() and parameter.dtype != dtype:
            parameter.data = parameter.data.to(dtype)
    return module


def as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Accept torch.bfloat16 or its name ("bfloat16", "float32", "float16")."""
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise SpecvizError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16")
    return value
