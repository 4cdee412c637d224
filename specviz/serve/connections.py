"""The server's connections: a cap on how many are open and a deadline for each request's headers, so that
clients that connect and send half a header, or nothing, cannot hold the service's sockets or keep others out.

uvicorn's own `limit_concurrency` counts such connections too and answers everyone past it with 503, so a
thousand half-open sockets would shut real clients out; here, past the cap, the connection that has waited
longest without a request in progress is closed instead (a half-open one, or an idle keep-alive one). Streams in
progress are never closed for a newcomer: with every connection busy, the newcomer is the one closed."""
from __future__ import annotations

import asyncio

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_CONNECTIONS = 512  # open connections at most (each viewer's event stream is one)
HEADER_TIMEOUT_S = 10.0  # a request's headers must have arrived this long after they began (or after connecting)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the cap and the header deadline (subclassed per server by server_config)."""

    max_connections = MAX_CONNECTIONS
    header_timeout_s = HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.header_timer: asyncio.TimerHandle | None = None
        self.waiting_since: float | None = None  # no request in progress since then: the first to be shed
        super().connection_made(transport)
        self._await_headers()
        if len(self.connections) > self.max_connections:
            self._shed()

    def _shed(self) -> None:
        waiting = [c for c in self.connections if getattr(c, "waiting_since", None) is not None
                   and not c.transport.is_closing()]
        oldest = min(waiting, key=lambda c: c.waiting_since, default=self)
        oldest._close()

    def _await_headers(self) -> None:
        self.waiting_since = self.loop.time()
        if self.header_timer is None:
            self.header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _headers_late(self) -> None:
        self.header_timer = None
        if self._between_requests():
            self._close()

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._between_requests() and self.header_timer is None:
            self._await_headers()  # a keep-alive connection's next request begins: its headers have the deadline
        super().data_received(data)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's headers arrived: it is in progress
            self.waiting_since = None
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._between_requests() and not self.transport.is_closing():
            self.waiting_since = self.loop.time()  # idle, kept alive: shed before any request in progress

    def connection_lost(self, exc: Exception | None) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None
        super().connection_lost(exc)


def server_config(app, host: str, port: int, max_connections: int = MAX_CONNECTIONS,
                  header_timeout_s: float = HEADER_TIMEOUT_S, **kwargs) -> uvicorn.Config:
    """uvicorn's configuration for the service: the guarded h11 protocol with these limits."""
    protocol = type("GuardedH11Protocol", (GuardedH11Protocol,),
                    {"max_connections": max_connections, "header_timeout_s": header_timeout_s})
    return uvicorn.Config(app, host=host, port=port, http=protocol, log_level="warning", **kwargs)
