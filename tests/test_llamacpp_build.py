"""`make llamacpp`'s choices, with the CPU's flags faked (so they hold on any host): the instruction sets named one
by one from the CPU's flags, ggml's AMX kernels only where the CPU has AMX, and kept only where a probe decode with
them runs (else rebuilt without, and why said); a build reused by version and flags; the binary found again."""
from __future__ import annotations

import json

import pytest

from specviz.llamacpp import build

AVX2_ONLY = {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"}
AVX512 = AVX2_ONLY | {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512_vnni"}
SAPPHIRE_RAPIDS = AVX512 | {"avx512_bf16", "avx512vbmi", "amx_tile", "amx_int8", "amx_bf16"}


def options(flags, amx):
    return dict(o.removeprefix("-D").split("=") for o in build.cmake_flags(flags, amx) if o.startswith("-DGGML_"))


@pytest.fixture(autouse=True)
def x86(monkeypatch):
    monkeypatch.setattr(build.platform, "machine", lambda: "x86_64")


def test_an_avx2_host_gets_avx2_and_nothing_newer():
    o = options(AVX2_ONLY, amx=False)
    assert o["GGML_NATIVE"] == "OFF" and o["GGML_AVX2"] == "ON" and o["GGML_FMA"] == "ON"
    assert o["GGML_AVX512"] == "OFF" and o["GGML_AVX512_VNNI"] == "OFF" and o["GGML_AMX_INT8"] == "OFF"


def test_avx512_needs_every_part_ggml_compiles_it_with():
    assert options(AVX512, amx=False)["GGML_AVX512"] == "ON"
    assert options(AVX512 - {"avx512bw"}, amx=False)["GGML_AVX512"] == "OFF"


def test_amx_kernels_only_where_asked_and_present():
    assert options(SAPPHIRE_RAPIDS, amx=True)["GGML_AMX_INT8"] == "ON"
    assert options(SAPPHIRE_RAPIDS, amx=False)["GGML_AMX_INT8"] == "OFF"
    assert options(AVX512, amx=True)["GGML_AMX_INT8"] == "OFF"
    assert build.key(build.cmake_flags(SAPPHIRE_RAPIDS, True)) != build.key(build.cmake_flags(SAPPHIRE_RAPIDS, False))


def fake_build(monkeypatch, tmp_path, flags, probe_answer):
    """main() with the compile and the probe replaced: which builds were asked for, in order."""
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECVIZ_LLAMA_SERVER", raising=False)
    monkeypatch.setattr(build, "cpu_flags", lambda: flags)
    monkeypatch.setattr(build.shutil, "which", lambda name: f"/usr/bin/{name}")
    built = []

    def compile_(opts, jobs, log):
        built.append("AMX" if "-DGGML_AMX_INT8=ON" in opts else "no AMX")
        server = tmp_path / build.key(opts) / "bin" / "llama-server"
        server.parent.mkdir(parents=True, exist_ok=True)
        server.write_text("")
        return server

    monkeypatch.setattr(build, "build", compile_)
    monkeypatch.setattr(build, "probe", lambda server, gguf: probe_answer)
    monkeypatch.setattr(build, "default_gguf", lambda: tmp_path / "model.gguf")
    assert build.main(["--jobs", "1"]) == 0
    return built, json.loads((tmp_path / "llama.cpp" / "current.json").read_text())


def test_amx_kernels_that_fault_are_built_out_and_the_reason_kept(monkeypatch, tmp_path):
    built, record = fake_build(monkeypatch, tmp_path, SAPPHIRE_RAPIDS,
                               "llama-server exited while starting (signal SIGILL): ...")
    assert built == ["AMX", "no AMX"]
    assert record["amx_kernels"] is False and "SIGILL" in record["amx_probe"]
    assert "-DGGML_AMX_INT8=OFF" in record["options"] and build.installed() == build.Path(record["server"])


def test_amx_kernels_that_decode_are_kept(monkeypatch, tmp_path):
    built, record = fake_build(monkeypatch, tmp_path, SAPPHIRE_RAPIDS, None)
    assert built == ["AMX"] and record["amx_kernels"] is True and record["amx_probe"] == "decoded"


def test_a_cpu_without_amx_builds_once_without_a_probe(monkeypatch, tmp_path):
    built, record = fake_build(monkeypatch, tmp_path, AVX512, "never asked")
    assert built == ["no AMX"] and record["cpu_amx"] is False and record["amx_probe"] is None


def test_the_binary_is_found_by_the_environment_first(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECVIZ_LLAMA_SERVER", raising=False)
    assert build.installed() is None
    monkeypatch.setenv("SPECVIZ_LLAMA_SERVER", "/opt/llama/llama-server")
    assert str(build.installed()) == "/opt/llama/llama-server"
