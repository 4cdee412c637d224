"""The server's connections: a cap on how many are open, a deadline for each request's headers, a deadline and
a byte-rate floor for its body, and a write timeout, so that clients that connect and send half a request, send
headers and never the body, or open an event stream and never read it, cannot hold the service's sockets or keep
others out.

uvicorn's own `limit_concurrency` counts such connections too and answers everyone past it with 503, so a
thousand half-open sockets would shut real clients out. Here, past the cap, room is made for the newcomer:
first the connection that has waited longest without a request in progress is closed (a half-open one, or an
idle keep-alive one), then the one stalled longest (a body that stopped arriving, or a response its client has
not read for STALLED_S or more: an event stream's viewer resumes with Last-Event-ID). When every connection is
busy and reading, the newcomer is answered 503 with Retry-After once its request's headers arrive."""
from __future__ import annotations

import asyncio
import json

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_CONNECTIONS = 512  # open connections at most (each viewer's event stream is one)
HEADER_TIMEOUT_S = 10.0  # a request's headers must have arrived this long after they began (or after connecting)
BODY_TIMEOUT_S = 10.0  # a request's whole body must have arrived this long after its headers
MIN_BODY_RATE = 1024  # bytes/s: a body arriving slower than this on average since its headers is cut off ...
BODY_GRACE_S = 1.0  # ... once it has had this long (the rate of the first packet says nothing)
BODY_CHECK_S = 0.5  # how often a body's progress is looked at
WRITE_TIMEOUT_S = 30.0  # a response (an event stream) its client has not read for this long is closed
STALLED_S = 1.0  # a body or a response stalled this long may be closed to make room for a newcomer
RETRY_AFTER_S = 2  # what a newcomer refused at the cap is told
REFUSING_MAX = 64  # newcomers waiting to be answered 503 at most; past it the oldest is closed without a word


def _raw_error(status: int, reason: bytes, message: str, headers: bytes = b"") -> bytes:
    """A whole HTTP/1.1 response in the service's error shape, for a connection the app is not answering."""
    body = json.dumps({"error": {"message": message, "status": status}}).encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n%s\r\n"
            % (status, reason, len(body), headers) + body)


def over_capacity(retry_after_s: int, cap: int):
    """The app a newcomer refused at the cap gets instead of the service's: 503 with Retry-After."""
    async def refuse(scope, receive, send):
        body = json.dumps({"error": {"message": f"the service has as many connections open as it takes ({cap:,}), "
                                                f"all of them busy; try again in {retry_after_s} s", "status": 503}})
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"retry-after", str(retry_after_s).encode()),
                                (b"connection", b"close"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body.encode()})
    return refuse


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the cap, the deadlines and the write timeout (subclassed per server by
    server_config)."""

    max_connections = MAX_CONNECTIONS
    header_timeout_s = HEADER_TIMEOUT_S
    body_timeout_s = BODY_TIMEOUT_S
    min_body_rate = MIN_BODY_RATE
    write_timeout_s = WRITE_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.header_timer: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None
        self.write_timer: asyncio.TimerHandle | None = None
        self.waiting_since: float | None = None  # no request in progress since then: the first to be shed
        self.body_since: float | None = None  # a request's body is awaited since its headers arrived then
        self.body_bytes = 0
        self.body_idle_since: float | None = None  # the body's last bytes came then
        self.unread_since: float | None = None  # writes paused since then: the client is not reading
        self.refusing = False  # over the cap: its request is answered 503
        super().connection_made(transport)
        self._await_headers()
        if len(self.connections) > self.max_connections and self._open() > self.max_connections:
            self._make_room()

    # ------------------------------------------------------------------------------------- the cap

    def _open(self) -> int:
        return sum(1 for c in self.connections if not c.transport.is_closing())

    def _waiting_on_client(self) -> float | None:
        """Since when it has waited on its client without a request in progress, or for a body that stopped
        coming (None: a request in progress, or a response being sent)."""
        return self.waiting_since if self.waiting_since is not None else self.body_idle_since

    def _make_room(self) -> None:
        now = self.loop.time()
        others = [c for c in self.connections if c is not self and not c.transport.is_closing()
                  and isinstance(c, GuardedH11Protocol)]
        waiting = [(since, c) for c in others if (since := c._waiting_on_client()) is not None and not c.refusing]
        if waiting:
            min(waiting, key=lambda pair: pair[0])[1]._close()
            return
        unread = [(c.unread_since, c) for c in others if c.unread_since is not None and now - c.unread_since >= STALLED_S]
        if unread:
            min(unread, key=lambda pair: pair[0])[1]._abort()
            return
        self.refusing = True
        self.app = over_capacity(RETRY_AFTER_S, self.max_connections)
        refusing = [c for c in others if c.refusing and c.waiting_since is not None]
        if len(refusing) >= REFUSING_MAX:
            min(refusing, key=lambda c: c.waiting_since)._close()

    def _close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def _abort(self) -> None:
        """Closed at once, what is buffered for it dropped (close() would wait to send it to a client not reading)."""
        self.transport.abort()

    # --------------------------------------------------------------------------------- the headers

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

    def data_received(self, data: bytes) -> None:
        if self._between_requests() and self.header_timer is None and self.body_since is None:
            self._await_headers()  # a keep-alive connection's next request begins: its headers have the deadline
        if self.body_since is not None:
            self.body_bytes += len(data)
            self.body_idle_since = self.loop.time()
        super().data_received(data)
        self._body_progress()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's headers arrived: it is in progress
            self.waiting_since = None
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None
            if self.conn.their_state is h11.SEND_BODY:  # and its body is to come
                self.body_since = self.body_idle_since = self.loop.time()
                self.body_bytes = 0
                self.body_timer = self.loop.call_later(BODY_CHECK_S, self._check_body)

    # ------------------------------------------------------------------------------------ the body

    def _body_progress(self) -> None:
        if self.body_since is not None and self.conn.their_state is not h11.SEND_BODY:
            self._body_done()

    def _body_done(self) -> None:
        self.body_since = self.body_idle_since = None
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None

    def _check_body(self) -> None:
        self.body_timer = None
        if self.body_since is None or self.transport.is_closing():
            return
        elapsed = self.loop.time() - self.body_since
        if not self.flow.read_paused:  # paused, it is the service that is not reading: not the client's fault
            if elapsed >= self.body_timeout_s:
                return self._body_late(f"the request body did not all arrive within {self.body_timeout_s:g} s")
            if elapsed >= BODY_GRACE_S and self.body_bytes < self.min_body_rate * elapsed:
                return self._body_late(f"the request body arrived slower than {self.min_body_rate:,} bytes/s")
        self.body_timer = self.loop.call_later(BODY_CHECK_S, self._check_body)

    def _body_late(self, message: str) -> None:
        """408 when nothing was answered yet, then closed."""
        self._body_done()
        if self.cycle is not None and not self.cycle.response_started:
            self.cycle.response_started = True  # the app's own reply, if it comes, is not sent
            self.transport.write(_raw_error(408, b"Request Timeout", message))
        self._close()

    # ------------------------------------------------------------------------------- the responses

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.unread_since is None:
            self.unread_since = self.loop.time()
            self.write_timer = self.loop.call_later(self.write_timeout_s, self._abort)

    def resume_writing(self) -> None:
        super().resume_writing()
        self.unread_since = None
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._between_requests() and not self.transport.is_closing():
            self.waiting_since = self.loop.time()  # idle, kept alive: shed before any request in progress

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self.header_timer, self.body_timer, self.write_timer):
            if timer is not None:
                timer.cancel()
        self.header_timer = self.body_timer = self.write_timer = None
        super().connection_lost(exc)


def server_config(app, host: str, port: int, max_connections: int = MAX_CONNECTIONS,
                  header_timeout_s: float = HEADER_TIMEOUT_S, body_timeout_s: float = BODY_TIMEOUT_S,
                  min_body_rate: float = MIN_BODY_RATE, write_timeout_s: float = WRITE_TIMEOUT_S,
                  **kwargs) -> uvicorn.Config:
    """uvicorn's configuration for the service: the guarded h11 protocol with these limits."""
    protocol = type("GuardedH11Protocol", (GuardedH11Protocol,),
                    {"max_connections": max_connections, "header_timeout_s": header_timeout_s,
                     "body_timeout_s": body_timeout_s, "min_body_rate": min_body_rate,
                     "write_timeout_s": write_timeout_s})
    return uvicorn.Config(app, host=host, port=port, http=protocol, log_level="warning", **kwargs)
