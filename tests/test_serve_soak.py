"""A bounded soak of `specviz serve` as its own process on the tiny model: 300 runs with varied options through
every route a client uses (scripts/soak_service.py, which docs/service.md runs with 1,000), four clients at once.
Resident memory grows by less than 100 MB, threads and open files come back to where they were within a minute,
and nothing failed."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from serving import free_port

pytestmark = pytest.mark.slow
RUNS = 300  # under a minute on a 2-core machine


def test_varied_runs_leave_memory_threads_and_files_bounded(tiny_model_dir):
    from scripts.soak_service import soak

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "specviz", "serve", "--model", str(tiny_model_dir), "--port",
                               str(port), "--threads", "1", "--keep-mb", "16"], stderr=subprocess.PIPE, text=True)
    try:
        for line in server.stderr:
            if "ready on" in line:
                break
        assert server.poll() is None, "the service did not start"
        report = soak(f"http://127.0.0.1:{port}", server.pid, tiny_model_dir.name, runs=RUNS, clients=4)
        print("\n" + json.dumps(report, indent=1))
        assert not report["errors"], report["errors"]
        assert report["rss_growth_mb"] < 100
        assert report["settled"]["threads"] <= report["baseline"]["threads"]
        assert report["settled"]["fds"] <= report["baseline"]["fds"] + 2
    finally:
        server.terminate()
        server.wait(timeout=30)
