"""A `specviz serve` service in a thread of the test process, on a free loopback port (shared by the service tests)."""
from __future__ import annotations

import socket
import threading
import time

import httpx
import uvicorn

from specviz.serve.http import Service


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class InThread:
    """An ASGI app (a stand-in server) on a free loopback port, in a thread of this process, for a `with` block."""

    def __init__(self, app, name: str):
        self.app, self.name = app, name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class Running:
    """A service on a free port, in a thread of this process, with the server settings `specviz serve` uses."""

    def __init__(self, service: Service, **server):
        self.service = service
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(service.server_config("127.0.0.1", port, **server))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Running:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the service did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def post(url: str, body, **kwargs) -> httpx.Response:
    return httpx.post(url + "/v1/runs", json=body, timeout=30, **kwargs)
