"""Whether the products on 8-bit activations take AMX tiles here, and holding every product to one path (to
measure what the tiles save). The paths themselves: csrc/intdot.h, csrc/intdot.cpp; `quant.PATHS` names them."""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch

from specviz.kernels.quant import PATHS, path_runs

ENV_PATH = "SPECVIZ_Q4_PATH"  # the path `auto` takes (the ops read it on every call)


STATUS = ("runs", "absent", "refused", "differs")  # csrc/intdot.cpp's q8act_amx_status, by number


def amx_status() -> str:
    """Why the AMX path runs here or not: "runs"; "absent" (no AMX-TILE, AMX-INT8 or VNNI, or the C++ ops not
    built); "refused" (Linux did not grant the tile state); "differs" (the tiles' products were unlike VNNI's in
    the check the op makes before first use, so it keeps VNNI: a bug to report)."""
    if not path_runs("portable", "q8"):
        return "absent"
    return STATUS[torch.ops.specviz.q8act_amx_status()]


def amx_tiles() -> bool:
    """Whether the products on 8-bit activations take AMX tiles here by default (two rows or more: a verify, a
    prefill, a head's depth of candidates): the CPU has AMX-INT8 and Linux granted the process the tile state."""
    return path_runs("amx", "q8") and torch.ops.specviz.q8act_path(-1) == PATHS["amx"]


@contextlib.contextmanager
def products_on(path: str) -> Iterator[None]:
    """Every product of this process on `path` while inside ("avx512": the VNNI path, to measure what AMX tiles
    save): SPECVIZ_Q4_PATH, so process-wide; hold the models' lock, and time nothing else meanwhile."""
    if path not in PATHS or path == "auto":
        raise ValueError(f"path must be one of {sorted(set(PATHS) - {'auto'})}, got {path!r}")
    before = os.environ.get(ENV_PATH)
    os.environ[ENV_PATH] = path
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV_PATH, None)
        else:
            os.environ[ENV_PATH] = before
