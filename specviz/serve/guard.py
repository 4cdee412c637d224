"""What stands before the routes: the Host allow-list, the bearer token (checked from the headers, before any body
is read), the body limit, who a client is, and the one shape of every error ({"error": {"message", "status"}}, its
message cut short)."""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from specviz.errors import ECHO_CHARS, SpecvizError, shown

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
MESSAGE_CHARS = 600  # the longest error message sent: what it quotes of a request is cut shorter still
CLIENT_NAME_CHARS = 64  # of X-Specviz-Client

bearer = HTTPBearer(auto_error=False, description="the service's token, when it was started with one")


class ClientError(SpecvizError):
    """A request the service refuses: a 4xx with this message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class ErrorDetail(BaseModel):
    message: str
    status: int


class ErrorBody(BaseModel):
    """Every refusal: what is wrong, in words."""

    error: ErrorDetail


def error(message: str, status: int, headers: dict | None = None) -> JSONResponse:
    if len(message) > MESSAGE_CHARS:
        message = message[:MESSAGE_CHARS] + "…"
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")  # nothing a client sent breaks the reply
    return JSONResponse({"error": {"message": message, "status": status}}, status_code=status, headers=headers)


TOKEN_MISSING = "missing or wrong bearer token (Authorization: Bearer TOKEN)"
OPEN_PATHS = ("/healthz",)  # never behind the token


def token_matches(token: str, authorization: str) -> bool:
    """An Authorization header's bearer token against the service's, compared in constant time."""
    scheme, _, given = authorization.partition(" ")
    given = given.strip() if scheme.lower() == "bearer" else ""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode())


async def authorised(request: Request,
                     credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
    """The bearer token, when the service has one (TokenGate has checked it already, before the body; this
    dependency is what puts it in the OpenAPI schema)."""
    token = request.app.state.service.token
    if token is None:
        return
    given = f"Bearer {credentials.credentials}" if credentials is not None and credentials.scheme.lower() == "bearer" else ""
    if not token_matches(token, given):
        raise ClientError(TOKEN_MISSING, 401)


class TokenGate:
    """ASGI middleware: with a token, every request but /healthz must carry it, and is answered 401 from its
    headers alone, before any of its body is read: a client without the token cannot make the service wait for a
    body, nor have one parsed."""

    def __init__(self, app, token: str | None):
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.token is None or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        authorization = dict(scope.get("headers", [])).get(b"authorization", b"").decode("latin-1")
        if not token_matches(self.token, authorization):
            return await error(TOKEN_MISSING, 401, {"WWW-Authenticate": "Bearer"})(scope, receive, send)
        return await self.app(scope, receive, send)


async def client_of(request: Request, x_specviz_client: Annotated[str | None, Header()] = None) -> str:
    """Who is asking: the address, and the name an app gives each of its viewers. A run belongs to it (only it
    reads or cancels the run by its id), and the per-client limit counts by it."""
    host = request.client.host if request.client else "?"
    return f"{host}/{client_name(x_specviz_client or '')}"


def client_name(header: str) -> str:
    """The X-Specviz-Client value as a run's owner keeps it: as it is up to CLIENT_NAME_CHARS characters, else a
    digest of the whole value (longer than any name kept as it is, so the two never meet): two names that differ
    anywhere are two clients."""
    if len(header) <= CLIENT_NAME_CHARS:
        return header
    return "sha256:" + hashlib.sha256(header.encode("utf-8", "surrogateescape")).hexdigest()


def problems(errors: list[dict]) -> str:
    """pydantic's validation errors in a line: their locations (a dict key there is the client's) cut so that all
    of them together repeat at most ECHO_CHARS characters; past that, how many more there are."""
    said, budget = [], ECHO_CHARS
    for e in errors[:5]:
        where = ".".join(str(p) for p in e["loc"] if p != "body") or "body"
        if budget <= 0:
            break
        said.append(f"{where[:budget]}{'…' if len(where) > budget else ''}: {e['msg']}")
        budget -= len(where)
    more = len(errors) - len(said)
    return "; ".join(said) + (f"; and {more} more" if more else "")


def host_name(header: str) -> str:
    """'Example.com:8000' -> 'example.com', '[::1]:8000' -> '::1'."""
    if header.startswith("["):
        return header[1:].partition("]")[0].lower()
    return header.rpartition(":")[0].lower().rstrip(".") if header.count(":") == 1 else header.lower().rstrip(".")


def over_tcp(scope) -> bool:
    """Whether the request came from an address on the network (what a browser connects from), not through a
    Unix socket or in-process (Starlette's TestClient names its client "testclient")."""
    client = scope.get("client")
    try:
        return client is not None and bool(ipaddress.ip_address(client[0]))
    except ValueError:
        return False


class HostAllowList:
    """ASGI middleware: a request over TCP whose Host header names none of `hosts` gets 400. The loopback names
    and addresses always pass; "*" lets every name through. A web page that points its own domain at 127.0.0.1 (DNS
    rebinding) then cannot reach a token-less service on loopback: its requests carry its domain as the Host."""

    def __init__(self, app, hosts: tuple[str, ...] = ()):
        self.app = app
        self.any = "*" in hosts
        self.hosts = {h.lower().rstrip(".") for h in (*LOOPBACK_NAMES, *hosts)}

    def allowed(self, name: str) -> bool:
        if self.any or name in self.hosts:
            return True
        try:
            return ipaddress.ip_address(name).is_loopback
        except ValueError:
            return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not over_tcp(scope):
            return await self.app(scope, receive, send)
        header = dict(scope.get("headers", [])).get(b"host", b"").decode("latin-1")
        name = host_name(header)
        if not self.allowed(name):
            return await error(f"this service does not answer to the host name {shown(name)}; it answers to "
                               f"{', '.join(sorted(self.hosts))} (start it with --allowed-host NAME to add one)",
                               400)(scope, receive, send)
        return await self.app(scope, receive, send)


class BodyTooLarge(StarletteHTTPException):
    """Raised while the body is read; FastAPI passes HTTP exceptions on as they are, so it becomes the 413."""

    def __init__(self, limit: int):
        super().__init__(413, f"the request body is larger than {limit:,} bytes")


class BodyLimit:
    """ASGI middleware: a request body past `limit` bytes gets 413, however it is sent (a Content-Length, or
    chunks), counted as it is read."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            return await error(f"the request body is larger than {self.limit:,} bytes", 413)(scope, receive, send)
        read, started = 0, False

        async def counted():
            nonlocal read
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        async def sending(message):
            nonlocal started
            started |= message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except BodyTooLarge:
            if not started:
                await error(f"the request body is larger than {self.limit:,} bytes", 413)(scope, receive, send)
