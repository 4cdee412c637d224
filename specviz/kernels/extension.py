"""specviz's C++ ops (`specviz/kernels/csrc/*.cpp`, registered as `torch.ops.specviz.*`), compiled on first use.

The ops: `attend`, the attention block of a decoding step in one call (csrc/attend.cpp); `q4_linear` and
`q8_linear`, products with weights kept as GGUF blocks (csrc/blocklinear.cpp), which run on 8-bit activations in
integers where the blocks come in tiles (csrc/intdot.cpp, csrc/intdot.h); `q4_layer`, a whole 4-bit decoder layer in
one call, `q4_eagle3_layer` an EAGLE-3 head's, and their `rms_norm` (csrc/q4layer.cpp); see
specviz.kernels.fastdecoder and specviz.kernels.quant.
Everything works without them: where it cannot be built (no C++ compiler, no ninja, an unexpected torch), or with
`SPECVIZ_EXTENSION=0`, `available()` is False, the decoder runs the same arithmetic through torch's own ops, and one
warning says why.

The build: torch's `cpp_extension` compiles the sources (a few seconds here) with `-march=native`, into a temporary
folder of the cache (`models.cache_root()/kernels`) that is then renamed to a folder named by the sources, the
flags, the torch version and this CPU. An interrupted build leaves neither a half-built library nor a lock behind
(a process killed mid-build leaves its temporary folder, which the next build removes once it is an hour old);
two processes building at once each build, the first rename wins, and later processes load that library
directly. Each load marks its library used (its modification time); a build also removes the libraries of other
source versions that no process has loaded for 30 days (another checkout may still use a recent one).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import tempfile
import threading
import time
import warnings
from pathlib import Path

import torch

SOURCES = sorted((Path(__file__).with_name("csrc")).glob("*.cpp"))
LIBRARY = "specviz_ops"
ENV_SWITCH = "SPECVIZ_EXTENSION"  # "0": never build or use it (to compare against torch's ops)
STALE_BUILD_S = 3600  # a temporary build folder this old belongs to no running build
UNUSED_LIBRARY_S = 30 * 86400  # a library of another source version not loaded for this long is removed
# contraction off: products and sums rounded as torch's are; OpenMP on, since torch's at::parallel_for is OpenMP
# inlined into the op (without -fopenmp its loop runs on one thread); it links to the libgomp torch has loaded.
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"]

_state: bool | None = None  # None: not tried yet; then whether the library is loaded
_lock = threading.Lock()  # one build or load per process, also when two models are loaded at once


def wanted() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


def _cpu_signature() -> str:
    """What -march=native compiles for: the CPU's model name and flags."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = [platform.processor()]
    return "".join(lines)


def library_folder() -> Path:
    from specviz.paths import cache_root

    digest = hashlib.sha256()
    for source in sorted(Path(__file__).with_name("csrc").iterdir()):  # the sources and the header they share
        digest.update(source.name.encode() + source.read_bytes())
    digest.update(" ".join(FLAGS).encode() + torch.__version__.encode() + _cpu_signature().encode())
    return cache_root() / "kernels" / f"{LIBRARY}-{digest.hexdigest()[:16]}"


def _build_and_load() -> None:
    folder = library_folder()
    built = folder / f"{LIBRARY}.so"
    if built.is_file():
        torch.ops.load_library(str(built))
        try:
            os.utime(built)  # used now: see _remove_old
        except OSError:
            pass
        return
    from torch.utils import cpp_extension

    folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_old(folder.parent)
    temp = Path(tempfile.mkdtemp(prefix=".build-", dir=folder.parent))
    try:
        cpp_extension.load(LIBRARY, [str(s) for s in SOURCES], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
                           build_directory=str(temp),
                           is_python_module=False, verbose=False)
        try:
            os.rename(temp, folder)  # another process may have finished first: then its library stays
        except OSError:
            pass
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _remove_old(kernels: Path) -> None:
    """Remove temporary folders left by processes killed mid-build (a live build is younger than an hour) and the
    libraries of other source versions that no process has loaded for 30 days."""
    now = time.time()
    old = [(stale, stale, STALE_BUILD_S) for stale in kernels.glob(".build-*")]
    old += [(lib, lib / f"{LIBRARY}.so", UNUSED_LIBRARY_S) for lib in kernels.glob(f"{LIBRARY}-*")]
    for folder, stamp, max_age in old:
        try:
            if now - stamp.stat().st_mtime > max_age:
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # gone already, or never finished (no library: left alone)
            pass


def available() -> bool:
    """Whether torch.ops.specviz.* can be used: built or loaded on the first call in a process, remembered after."""
    global _state
    with _lock:
        if _state is None:
            _state = False
            if not wanted():
                return False
            try:
                _build_and_load()
                _state = hasattr(torch.ops.specviz, "attend")
            except Exception as error:  # no compiler, no ninja, a failed build: decoding works without it
                warnings.warn(f"specviz's C++ ops could not be built ({type(error).__name__}: {error}); "
                              f"decoding uses torch's ops instead ({ENV_SWITCH}=0 skips the attempt)", stacklevel=2)
        return _state
