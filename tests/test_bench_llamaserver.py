"""llama-server configurations as bench lanes, each started by the bench: a stand-in program with llama-server's
command line (tests/fake_llama_server.py) plays the server, so the whole path runs here (start, wait for ready,
decode our prompt tokens interleaved with ours, report with llama.cpp's counts, stop); the lanes' options reach
the server's command line; a configuration that is not one is refused before anything starts."""
import stat
import sys
from pathlib import Path

import jsonschema
import pytest
from fake_llamacpp import DRAFT

from specviz import bench
from specviz.bench import llamaserver
from specviz.bench.llamaserver import parse_configs
from specviz.errors import SpecvizError
from specviz.models import LoadedModels

from tiny import TinyTokenizer, tiny_llama

PROMPTS = [bench.Prompt("a", "abc abc abc abc"), bench.Prompt("b", "the cat sat on the mat. the cat")]


@pytest.fixture(scope="module")
def tiny():
    target = tiny_llama(scale=3.0)
    return LoadedModels("tiny", target, None, TinyTokenizer(64), target.device, target.dtype)


@pytest.fixture
def fake_server(tmp_path, monkeypatch):
    """SPECVIZ_LLAMA_SERVER: a program that runs the stand-in; the lanes' GGUFs: empty files."""
    program = tmp_path / "llama-server"
    script = Path(__file__).resolve().parent / "fake_llama_server.py"
    program.write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    program.chmod(program.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("SPECVIZ_LLAMA_SERVER", str(program))
    files = {kind: tmp_path / f"{kind}.gguf" for kind in ("target", "draft", "eagle3")}
    for f in files.values():
        f.write_bytes(b"")
    monkeypatch.setattr(llamaserver, "lane_files", lambda model, configs: files)
    return program


def settings(**overrides):
    return bench.quick_settings(**{"max_new_tokens": 10, "verify_sizes": (), "bandwidth_mb": 8, "bandwidth_repeats": 1,
                                   "drafters": ("ngram",), "peers": False, "llama_cpp": False, **overrides})


def test_llama_server_lanes_run_beside_ours_with_llamacpps_counts(tiny, fake_server):
    report = bench.run_bench(tiny, PROMPTS, settings(llama_server=("plain:threads=1", "draft-eagle3:p_min=0.6,n_max=3")))
    jsonschema.validate(report, bench.BENCH_SCHEMA)
    lanes = report["llama_server"]["lanes"]
    assert list(lanes) == ["plain:threads=1", "draft-eagle3:p_min=0.6,n_max=3"]
    plain, eagle = lanes.values()
    assert plain["threads"] == 1 and plain["tau"] == 1.0 and plain["acceptance_rate"] is None
    assert "--spec-type" not in plain["command"] and "-t 1" in plain["command"]
    assert eagle["threads"] == __import__("torch").get_num_threads()  # our engine's threads by default
    for flag in ("--spec-type draft-eagle3", "-md eagle3.gguf", "--spec-draft-p-min 0.6", "--spec-draft-n-max 3"):
        assert flag in eagle["command"]
    # the stand-in's steps after the prefill commit 3, 2, 1, 3 (accepting 2, 1, 0, 2 of 3): 10 tokens in 1 + 4 steps
    assert eagle["tau"] == pytest.approx(10 / 5)
    assert eagle["drafted"] == 2 * 4 * DRAFT and eagle["accepted"] == 2 * (2 + 1 + 0 + 2)
    assert eagle["llamacpp_mean_length"] == pytest.approx(1 + 10 / 8)
    assert eagle["per_position_acceptance"] == pytest.approx([6 / 8, 4 / 8, 0.0])
    assert eagle["outputs_equal_none"] == 0 and len(eagle["parted_from_none"]) == 2  # another model: reported
    assert set(report["llama_server"]["ours_over"]["ngram"]) == set(lanes)
    runs = [r for r in report["runs"] if r["method"].startswith("llama.cpp:")]
    assert len(runs) == 2 * len(PROMPTS) and all(r["new_tokens"] == 10 for r in runs)
    markdown = bench.to_markdown(report)
    assert "## llama.cpp's llama-server" in markdown and "`draft-eagle3:p_min=0.6,n_max=3`" in markdown


def test_llama_server_lanes_report_llamacpps_own_timing_beside_the_wall_time(tiny, fake_server):
    report = bench.run_bench(tiny, PROMPTS, settings(llama_server=("draft-eagle3",)))
    jsonschema.validate(report, bench.BENCH_SCHEMA)
    lane = report["llama_server"]["lanes"]["draft-eagle3"]
    # the stand-in times each of its 5 forwards (10 tokens) at 4.25 ms, and its prompt at 2,000 tokens/s
    assert lane["server_tokens_per_s"]["median"] == pytest.approx(1e3 * 10 / (5 * 4.25))
    assert lane["server_prompt_tokens_per_s"] == {"median": 2000.0, "min": 2000.0, "max": 2000.0, "n": 2}
    assert lane["tokens_per_s"] < lane["server_tokens_per_s"]["min"]  # the client also waits 5 ms a step, and HTTP
    assert "decode tokens/s (llama.cpp)" in bench.to_markdown(report)


def test_a_server_that_fails_to_start_stops_the_bench_with_its_log(tiny, fake_server):
    with pytest.raises(SpecvizError, match="exited while starting.*n-max is too large"):
        bench.run_bench(tiny, PROMPTS, settings(llama_server=("plain", "ngram-mod:n_max=100")))


def test_without_llama_server_the_bench_says_how_to_build_it(tiny, monkeypatch, tmp_path):
    monkeypatch.delenv("SPECVIZ_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    with pytest.raises(SpecvizError, match="make llamacpp"):
        bench.run_bench(tiny, PROMPTS, settings(llama_server=("plain",)))


@pytest.mark.parametrize("items, message", [
    (["medusa"], "unknown llama-server configuration 'medusa'"),
    (["plain:depth=3"], "unknown option 'depth'"),
    (["draft-simple:n_max=many"], "n_max takes a number"),
    (["plain", "plain"], "given twice"),
])
def test_bad_configurations_are_refused(items, message):
    with pytest.raises(SpecvizError, match=message):
        parse_configs(items)


def test_the_cli_takes_configurations(tmp_path):
    from specviz.bench import cli

    args = cli.build_bench_parser().parse_args(["--llama-server", "plain", "ngram-mod:n_max=8"])
    assert cli.settings_from_args(args).llama_server == ("plain", "ngram-mod:n_max=8")
