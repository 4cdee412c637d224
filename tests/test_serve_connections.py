"""The server's connections: a thousand clients that connect and send half a header neither keep a new client
from being served within a second nor hold the service's sockets past the header deadline."""
from __future__ import annotations

import socket
import time

import httpx
from serving import Running

from specviz.serve.http import Service

HALF_OPEN = 1000


def test_half_open_connections_do_not_keep_a_new_client_out(tiny_models):
    service = Service({"tiny": tiny_models})
    with Running(service, max_connections=64, header_timeout_s=2.0) as running:
        port = int(running.url.rsplit(":", 1)[1])
        connections = running.server.server_state.connections
        sockets = []
        try:
            for _ in range(HALF_OPEN):
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half")  # and never the rest
                sockets.append(s)
            time.sleep(0.5)  # the server has accepted what it will
            started = time.monotonic()
            response = httpx.get(running.url + "/healthz", timeout=5)
            assert response.status_code == 200 and time.monotonic() - started < 1.0
            assert len(connections) <= 64 + 1  # the cap held (the newcomer's own included)
            deadline = time.monotonic() + 2.0 + 3
            while len(connections) > 0:  # the header deadline closed what was left
                assert time.monotonic() < deadline, f"{len(connections)} half-open connections outlived the deadline"
                time.sleep(0.1)
        finally:
            for s in sockets:
                s.close()


def test_a_slow_but_complete_request_and_a_kept_alive_one_are_served(tiny_models):
    with Running(Service({"tiny": tiny_models}), max_connections=8, header_timeout_s=2.0) as running:
        port = int(running.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as s:
            for part in (b"GET /healthz HTTP/1.1\r\n", b"Host: 127.0.0.1\r\n", b"\r\n"):
                s.sendall(part)
                time.sleep(0.4)  # within the deadline, all told
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
        with httpx.Client(base_url=running.url) as client:  # one connection, kept alive between requests
            for _ in range(3):
                assert client.get("/healthz").status_code == 200
                time.sleep(0.3)
