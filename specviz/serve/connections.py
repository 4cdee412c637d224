"""The server's connections: a cap on how many are open, a deadline for each request's headers, a deadline and
a byte-rate floor for its body, and a write timeout, so that clients that connect and send half a request, send
headers and never the body, or open an event stream and never read it, cannot hold the service's sockets or keep
others out.

uvicorn's own `limit_concurrency` counts such connections too and answers everyone past it with 503, so a
thousand half-open sockets would shut real clients out. Here, past the cap, room is made for the newcomer:
first the connection that has waited longest without a request in progress is closed (one that sent part of a
request's headers, or an idle keep-alive one), then one that has sent nothing for FRESH_S or more, then a body
that stopped arriving STALLED_S or more ago (408, send it again; one stopped only because the service paused
reading it has not stalled), then the response its client has left unread longest, for STALLED_S or more (an
event stream's viewer resumes with Last-Event-ID), and last a body still arriving UPLOAD_S after its headers,
however fast (408: bodies trickled just above the byte-rate floor would hold the cap). A connection that has
sent nothing for less than FRESH_S is never closed to make room: a burst of whole requests is accepted before any
of them is read. When no connection can give way, the newcomer is answered 503 with Retry-After once its
request's headers arrive. Two groups of newcomers wait past the cap, each of at most REFUSING_MAX (past it the
one waiting longest is closed): those not read yet, and those read and waiting for their headers to be answered
503; so open sockets stay within the cap plus twice REFUSING_MAX. Each kind of connection is kept oldest first
(Room): making room costs the same whether ten or ten thousand are open."""
from __future__ import annotations

import asyncio
import json
from collections import OrderedDict

import h11
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_CONNECTIONS = 512  # open connections at most (each viewer's event stream is one)
HEADER_TIMEOUT_S = 10.0  # a request's headers must have arrived this long after they began (or after connecting)
BODY_TIMEOUT_S = 10.0  # a request's whole body must have arrived this long after its headers
MIN_BODY_RATE = 1024  # bytes/s: a body arriving slower than this on average since its headers is cut off ...
BODY_GRACE_S = 1.0  # ... once it has had this long (the rate of the first packet says nothing)
BODY_CHECK_S = 0.5  # how often a body's progress is looked at
WRITE_TIMEOUT_S = 30.0  # a response (an event stream) its client has not read for this long is closed
STALLED_S = 1.0  # a body or a response stalled this long may be closed to make room for a newcomer
UPLOAD_S = 2.0  # a body still arriving this long after its headers is answered 408 to make room, however fast
FRESH_S = 0.25  # a connection that has sent nothing for this long may give way, not before
RETRY_AFTER_S = 2  # what a newcomer refused at the cap is told
REFUSING_MAX = 128  # newcomers past the cap not read yet, and those to be answered 503, at most each; past it the
# oldest of the group is closed
# connections the kernel completes and holds for the service to accept (listen's backlog; uvicorn's is 2,048). The
# event loop accepts up to this many at a time before it reads any: a flood of 1,500 connections a second accepted
# 2,048 at a time kept the loop from reading its clients (/healthz unanswered for seconds, 4,000 sockets open
# against a cap of 512); 128 at a time, the kernel holds the rest and the flood slows to what the service takes.
BACKLOG = 128


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


class Room:
    """The connections of one server as the cap sees them: those that may give way to a newcomer, by kind, each
    oldest first (connection -> since when), and how many open ones do not count against the cap."""

    def __init__(self) -> None:
        self.fresh: OrderedDict[GuardedH11Protocol, float] = OrderedDict()  # connected, nothing received yet
        # waiting on the client with no request in progress: part of a request's headers came, or a response is
        # done and the connection is kept alive for the next request
        self.waiting: OrderedDict[GuardedH11Protocol, float] = OrderedDict()
        self.bodies: OrderedDict[GuardedH11Protocol, float] = OrderedDict()  # a body arriving: since its last bytes
        self.uploads: OrderedDict[GuardedH11Protocol, float] = OrderedDict()  # the same, since its headers
        self.unread: OrderedDict[GuardedH11Protocol, float] = OrderedDict()  # a response its client is not reading
        self.refusing: OrderedDict[GuardedH11Protocol, float] = OrderedDict()  # to be answered 503: headers awaited
        # newcomers past the cap, nothing read from them yet: whether one is a whole request or half of one decides
        # what it gets, once it is read (the event loop reads a burst only after it has accepted all of it)
        self.pending: OrderedDict[GuardedH11Protocol, float] = OrderedDict()
        self.refused = 0  # connections answered (or to be answered) 503, not yet gone
        self.closed = 0  # connections this guard closed, not yet gone

    def oldest(self, kind: OrderedDict, older_than: float) -> GuardedH11Protocol | None:
        """The connection of this kind waiting longest, if it has waited `older_than` seconds or more (ones already
        closing are dropped on the way)."""
        while kind:
            connection, since = next(iter(kind.items()))
            if not connection.transport.is_closing():
                return connection if connection.loop.time() - since >= older_than else None
            del kind[connection]
        return None


class Flow(FlowControl):
    """uvicorn's flow control of one connection, telling the guard when the service pauses reading it (past 64 KB
    of a body the app has not taken yet) and resumes."""

    def __init__(self, transport: asyncio.Transport, connection: GuardedH11Protocol) -> None:
        super().__init__(transport)
        self.connection = connection

    def pause_reading(self) -> None:
        super().pause_reading()
        self.connection._reading_paused()

    def resume_reading(self) -> None:
        paused = self.read_paused
        super().resume_reading()
        if paused:
            self.connection._reading_resumed()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the cap, the deadlines and the write timeout (subclassed per server by
    server_config, each subclass with its own Room)."""

    max_connections = MAX_CONNECTIONS
    header_timeout_s = HEADER_TIMEOUT_S
    body_timeout_s = BODY_TIMEOUT_S
    min_body_rate = MIN_BODY_RATE
    write_timeout_s = WRITE_TIMEOUT_S
    room: Room | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.header_timer: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None
        self.write_timer: asyncio.TimerHandle | None = None
        self.body_since: float | None = None  # a request's body is awaited since its headers arrived then
        self.body_bytes = 0
        self.refusing = False  # over the cap: its request is answered 503
        self.pending = False  # over the cap, not read yet
        self.closed_here = False  # closed by this guard (to make room, or past a deadline)
        self.kind: OrderedDict | None = None  # which of the room's kinds it is in
        if type(self).room is None:
            type(self).room = Room()
        self.rooms: Room = type(self).room
        super().connection_made(transport)
        self.flow = Flow(transport, self)
        self._await_headers()
        self._be(self.rooms.fresh)
        if self._counted() > self.max_connections:
            self._be(None)  # neither gives way nor counts until it is read
            self.pending = True
            self.rooms.pending[self] = self.loop.time()
            if len(self.rooms.pending) > REFUSING_MAX:
                next(iter(self.rooms.pending))._close()  # accepted and closed: the newcomers sent nothing yet

    # ------------------------------------------------------------------------------------- the cap

    def _counted(self) -> int:
        """Open connections that count against the cap."""
        room = self.rooms
        return len(self.connections) - room.closed - room.refused - len(room.pending)

    def _read_first(self) -> None:
        """A newcomer past the cap has sent its first bytes: room is made for it, else it is answered 503."""
        self.pending = False
        self.rooms.pending.pop(self, None)
        if self._counted() > self.max_connections and not self._make_room():
            self._refuse()

    def _be(self, kind: OrderedDict | None) -> None:
        """Move it to the end of `kind` (None: a request in progress, it may not give way)."""
        if self.kind is not None:
            self.kind.pop(self, None)
        self.kind = kind
        if kind is not None:
            kind[self] = self.loop.time()

    def _make_room(self) -> bool:
        """Close the connection that gives way to this one; False when none may."""
        room = self.rooms
        stalled = (f"no more of the request body came for {STALLED_S:g} s and the service needed the connection "
                   "for another client; send it again")
        # bodies trickled just above the byte-rate floor would hold the cap until their deadline
        slow = (f"the request body was still arriving after {UPLOAD_S:g} s and the service needed the connection "
                "for another client; send it again")
        # who gives way, in this order: kind, after how long, the 408's message (None: closed without an answer)
        for kind, older_than, message in ((room.waiting, 0.0, None), (room.fresh, FRESH_S, None),
                                          (room.bodies, STALLED_S, stalled), (room.unread, STALLED_S, None),
                                          (room.uploads, UPLOAD_S, slow)):
            victim = room.oldest(kind, older_than)
            if victim is not None and victim is not self:
                if message is None:
                    victim._close(abort=victim in room.unread)  # what is buffered for a client not reading is dropped
                else:
                    victim._body_late(message)
                return True
        return False

    def _refuse(self) -> None:
        room = self.rooms
        self._be(None)
        self.refusing = True
        room.refused += 1
        room.refusing[self] = self.loop.time()
        self.app = over_capacity(RETRY_AFTER_S, self.max_connections)
        if len(room.refusing) > REFUSING_MAX:
            next(iter(room.refusing))._close()

    def _close(self, abort: bool = False) -> None:
        """Closed by the guard: it no longer counts against the cap, though its socket goes only when the loop
        next runs (abort: what is buffered for it is dropped; close() would wait to send it)."""
        if self.transport.is_closing():
            return
        self._be(None)
        self.rooms.refusing.pop(self, None)
        self.rooms.unread.pop(self, None)
        self.rooms.pending.pop(self, None)
        self.rooms.uploads.pop(self, None)
        self.pending = False
        if not self.refusing:  # a refused one is counted out by room.refused already
            self.closed_here = True
            self.rooms.closed += 1
        if abort:
            self.transport.abort()
        else:
            self.transport.close()

    def _abort(self) -> None:
        self._close(abort=True)

    # --------------------------------------------------------------------------------- the headers

    def _await_headers(self) -> None:
        if self.header_timer is None:
            self.header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _headers_late(self) -> None:
        self.header_timer = None
        if self._between_requests():
            self._close()

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def data_received(self, data: bytes) -> None:
        if self.pending:
            self._read_first()
        if self._between_requests() and self.body_since is None and not self.refusing:
            if self.header_timer is None:
                self._await_headers()  # a keep-alive connection's next request begins: its headers have the deadline
            if self.kind is not self.rooms.waiting:
                self._be(self.rooms.waiting)  # part of a request came: it waits on its client from now
        if self.body_since is not None:
            self.body_bytes += len(data)
            self._be(self.rooms.bodies)  # the body's last bytes came now
        super().data_received(data)
        self._body_progress()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's headers arrived: it is in progress
            self._be(None)
            self.rooms.refusing.pop(self, None)  # a newcomer over the cap is answered now
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None
            if self.conn.their_state is h11.SEND_BODY and not self.refusing:  # and its body is to come
                self.body_since = self.loop.time()
                self.body_bytes = 0
                if not self.flow.read_paused:  # paused by what came with its headers: not awaited until resumed
                    self._be(self.rooms.bodies)
                self.rooms.uploads[self] = self.body_since
                self.body_timer = self.loop.call_later(BODY_CHECK_S, self._check_body)

    # ------------------------------------------------------------------------------------ the body

    def _body_progress(self) -> None:
        if self.body_since is not None and self.conn.their_state is not h11.SEND_BODY:
            self._body_done()

    def _body_done(self) -> None:
        self.body_since = None
        self.rooms.uploads.pop(self, None)
        if self.kind is self.rooms.bodies:
            self._be(None)
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

    def _reading_paused(self) -> None:
        if self.kind is self.rooms.bodies:
            self._be(None)  # the service is not reading its body: it has not stalled, and does not give way as if so

    def _reading_resumed(self) -> None:
        if self.body_since is not None and self.kind is None and not self.transport.is_closing():
            self._be(self.rooms.bodies)  # the rest of its body is awaited from now

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
        if self not in self.rooms.unread:
            self.rooms.unread[self] = self.loop.time()
            self.write_timer = self.loop.call_later(self.write_timeout_s, self._abort)

    def resume_writing(self) -> None:
        super().resume_writing()
        self.rooms.unread.pop(self, None)
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None

    def send_400_response(self, msg: str) -> None:
        """A request h11 cannot parse (two Host headers, two Content-Lengths, a request line that is not HTTP) is
        answered in the service's error shape, as every other refusal (uvicorn's own answer is plain text)."""
        body = json.dumps({"error": {"message": f"bad request: {msg}", "status": 400}}).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._between_requests() and not self.transport.is_closing():
            self._be(self.rooms.waiting)  # idle, kept alive: it gives way before any request in progress

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self.header_timer, self.body_timer, self.write_timer):
            if timer is not None:
                timer.cancel()
        self.header_timer = self.body_timer = self.write_timer = None
        room = self.rooms
        self._be(None)
        room.refusing.pop(self, None)
        room.unread.pop(self, None)
        room.pending.pop(self, None)
        room.uploads.pop(self, None)
        if self.closed_here:
            room.closed -= 1
        if self.refusing:
            room.refused -= 1
        self.closed_here = self.refusing = False  # counted once, however often it is told
        super().connection_lost(exc)


def server_config(app, host: str, port: int, max_connections: int = MAX_CONNECTIONS,
                  header_timeout_s: float = HEADER_TIMEOUT_S, body_timeout_s: float = BODY_TIMEOUT_S,
                  min_body_rate: float = MIN_BODY_RATE, write_timeout_s: float = WRITE_TIMEOUT_S,
                  **kwargs) -> uvicorn.Config:
    """uvicorn's configuration for the service: the guarded h11 protocol with these limits."""
    protocol = type("GuardedH11Protocol", (GuardedH11Protocol,),
                    {"max_connections": max_connections, "header_timeout_s": header_timeout_s,
                     "body_timeout_s": body_timeout_s, "min_body_rate": min_body_rate,
                     "write_timeout_s": write_timeout_s, "room": Room()})
    return uvicorn.Config(app, host=host, port=port, http=protocol, log_level="warning", **{"backlog": BACKLOG, **kwargs})
