"""An unmodified llama-server, started and stopped by specviz: for the bench's llama.cpp peers, the parity check of
the exported drafters, the build's probe and `make test-llamacpp`. The backend (specviz/backends/llamacpp.py)
talks to any llama-server, started here or by hand.

    with LlamaServer(binary, gguf, spec_type="draft-eagle3", draft=head_gguf, draft_max=3) as server:
        server.url  # http://127.0.0.1:PORT

The server binds the loopback address on a free port, with one slot (a single stream, as the bench measures),
`--metrics`, and OMP_WAIT_POLICY=passive (on a busy 2-core host llama.cpp's spinning threads otherwise collapse its
speed). A server that exits while starting, or is not ready within `ready_s`, raises a SpecvizError with the end of
its log; leaving the block stops it (SIGTERM, then SIGKILL).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from specviz.errors import SpecvizError

SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LlamaServer:
    """One llama-server process over one GGUF, optionally speculating (`spec_type`, with `draft` for the draft-*
    types)."""

    def __init__(self, binary: Path, gguf: Path, *, threads: int = 1, ctx: int = 2048, spec_type: str = "none",
                 draft: Path | None = None, draft_max: int | None = None, draft_min: int | None = None,
                 p_min: float | None = None, extra: tuple[str, ...] = (), ready_s: float = 120.0,
                 host: str = "127.0.0.1", port: int | None = None):
        if spec_type not in SPEC_TYPES:
            raise SpecvizError(f"unknown llama.cpp --spec-type {spec_type!r}; one of {', '.join(SPEC_TYPES)}")
        if spec_type.startswith("draft-") and draft is None:
            raise SpecvizError(f"--spec-type {spec_type} needs a draft GGUF")
        self.binary, self.gguf, self.ready_s = Path(binary), Path(gguf), ready_s
        self.port = port or free_port()
        self.url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{self.port}"
        args = [str(self.binary), "-m", str(self.gguf), "--host", host, "--port", str(self.port),
                "-t", str(threads), "-tb", str(threads), "-c", str(ctx), "-np", "1", "--metrics", "--no-webui",
                "--cache-ram", "0"]
        if spec_type != "none":
            args += ["--spec-type", spec_type]
        if draft is not None:
            args += ["-md", str(draft), "-td", str(threads), "-tbd", str(threads)]
        if draft_max is not None:
            args += ["--spec-draft-n-max", str(draft_max)]
        if draft_min is not None:
            args += ["--spec-draft-n-min", str(draft_min)]
        if p_min is not None:
            args += ["--spec-draft-p-min", str(p_min)]
        self.args = [*args, *extra]
        self.spec_type, self.threads = spec_type, threads
        self.process: subprocess.Popen[bytes] | None = None
        self.log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop()

    def start(self) -> None:
        env = {**os.environ, "OMP_WAIT_POLICY": "passive"}
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(self.args, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        deadline = time.monotonic() + self.ready_s
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise SpecvizError(f"llama-server exited while starting ({_exit(code)}): {self.tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise SpecvizError(f"llama-server was not ready within {self.ready_s:g} s: {self.tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def wait(self) -> int:
        """Until the server exits (in the foreground: `specviz llamacpp serve`); its exit status."""
        assert self.process is not None
        return self.process.wait()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 6) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty log)"

    def complete(self, prompt: str | list[int], max_tokens: int = 16, **fields: Any) -> dict[str, Any]:
        """One greedy completion (not streamed), with its tokens and timings; a server that died says how."""
        body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "return_tokens": True,
                "cache_prompt": False, **fields}
        try:
            answer: dict[str, Any] = httpx.post(f"{self.url}/completion", json=body, timeout=300).raise_for_status().json()
        except httpx.HTTPError as err:
            code = self.process.poll() if self.process else None
            died = f"; the server exited ({_exit(code)})" if code is not None else ""
            raise SpecvizError(f"llama-server failed a completion ({type(err).__name__}{died}): {self.tail()}") from None
        return answer


def _exit(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit status {code}"
