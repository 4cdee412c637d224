"""The HTTP service: FastAPI routes over the scheduler. docs/service.md is the API reference.

    POST   /v1/runs                  a run's parameters -> {"run_id", "position", "share_id"}
    GET    /v1/runs/{id}/events      Server-Sent Events: each `data:` one schema-v1 event, `id:` its sequence
                                     number (Last-Event-ID resumes); `event: queued` while the run waits
    GET    /v1/runs/{id}/events.jsonl  the same events as a trace, one JSON object a line
    GET    /v1/runs/{id}             the run's state and queue position
    DELETE /v1/runs/{id}             cancel
    POST   /v1/runs/{id}/share       a read-only watch link (share id) for the run
    GET    /v1/watch/{share}[/events]  a shared run's state and events, for any number of viewers
    GET    /v1/models                what is loaded, where, the drafters and the measured verify-cost curve
    POST   /v1/chat/completions      OpenAI-compatible (stream true or false), through the same queue
    GET    /healthz, /metrics        liveness; Prometheus text format
    GET    /openapi.json             this API's schema (behind the token; no /docs page)

A run belongs to the client that made it: another client's request for it is answered 404, as for a run that
does not exist, unless it comes through the run's share id (read-only)."""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from specviz.backends.local import LocalBackend
from specviz.decoding.costs import verify_curve
from specviz.decoding.settings import DecodeSettings
from specviz.drafters import DEFAULT, SERVICE_PREFERRED, available, first_available, reads_verify_cost, variants
from specviz.errors import SpecvizError
from specviz.serve import streaming
from specviz.serve.guard import BodyLimit, ClientError, ErrorBody, HostAllowList, TokenGate, authorised, client_of, error, problems, shown
from specviz.serve.metrics import ServiceMetrics
from specviz.serve.runs import QueueFull, Run, RunRequest, Scheduler
from specviz.serve.validate import ChatBody, Limits, RunBody, chat_run_body, check_context, check_tokens, must_tokenize, run_request, token_bounds

__all__ = ["ClientError", "Limits", "RunBody", "Service"]

ERRORS = {"4XX": {"model": ErrorBody, "description": "refused: `error.message` says what is wrong"}}
SSE = {200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
             "description": "Server-Sent Events (docs/service.md, the event stream)"}}
PREPARE_THREADS = 2  # threads that admit runs, besides the engine workers ...
TOKENIZE_THREADS = 1  # ... and that tokenize a prompt the bounds cannot tell, apart: they never hold up the others
TOKENIZING_MAX = 16  # prompts waiting to be tokenized at most; past it a new one gets 429
LAST_EVENT_ID_CHARS = 20  # a sequence number has fewer digits
Owner = Annotated[str, Depends(client_of)]  # who asks: a run is theirs, or 404


class RunCreated(BaseModel):
    run_id: str
    position: int | None  # in the queue (1 = next); None once it runs
    share_id: str | None = None  # the read-only watch link's id, when the run was shared


class RunState(BaseModel):
    run_id: str | None  # None for a viewer of a share link
    state: str  # queued, running, done, failed or cancelled
    position: int | None
    events: int
    error: str | None


class Shared(BaseModel):
    run_id: str
    share_id: str


class Service:
    """The loaded models, the scheduler and the limits; `app()` builds the FastAPI application."""

    def __init__(self, models: dict, token: str | None = None, limits: Limits = Limits(), max_queue: int = 16,
                 max_per_client: int = 3, disconnect_grace_s: float = 1.0, default_drafter: str | None = None,
                 keep_bytes: int = 256 * 2**20, keep_s: float = 600.0, allowed_hosts: tuple[str, ...] = ()):
        if not models:
            raise SpecvizError("the service needs at least one model")
        self.models = models  # name -> specviz.models.LoadedModels
        self.backends = {name: LocalBackend(loaded) for name, loaded in models.items()}  # the engine, one per model
        self.token = token
        self.limits = limits
        self.allowed_hosts = allowed_hosts  # besides the loopback names; "*" for any
        self.metrics = ServiceMetrics()
        devices = sorted({str(m.device) for m in models.values()})
        self.scheduler = Scheduler(self._decode, devices, self.metrics, max_queue, max_per_client, disconnect_grace_s,
                                   keep_bytes=keep_bytes, keep_s=keep_s)
        self.default_model = next(iter(models))
        first = models[self.default_model]
        self.default_drafter = default_drafter or first_available(SERVICE_PREFERRED, available(first), DEFAULT)
        self.executor: ThreadPoolExecutor | None = None  # started with the app (see prestarted)
        self.tokenizer_pool: ThreadPoolExecutor | None = None  # the same
        self.tokenizing = 0  # prompts waiting for it or being tokenized (read and written on the event loop only)
        self.started = time.time()
        for loaded in models.values():  # the tree drafters' "auto" budget reads it: measured now, never beside a run
            if reads_verify_cost(loaded):
                verify_curve(loaded)
            token_bounds(loaded.tokenizer)  # read from its vocabulary and chat template once, not in a request

    # ------------------------------------------------------------------------------------------ runs

    def _decode(self, run: Run):
        backend = self.backends[run.request.model]
        return backend.stream(run.request, cancelled=lambda: run.cancel_requested)  # read between prefill chunks

    def request_of(self, body: RunBody) -> RunRequest:
        """Check a request against the loaded models and the limits, building nothing."""
        return run_request(self.models, body, self.limits, self.default_model)

    def chat_request(self, body: ChatBody) -> RunRequest:
        return self.request_of(chat_run_body(body, self.default_drafter, self.limits))

    def submit(self, request: RunRequest, owner: str, share: bool = False, tokenize: bool | None = None) -> Run:
        """Queue the run (QueueFull past the limits); only once admitted is its prompt checked against the
        context (and tokenized, when it might not fit). `tokenize`: what must_tokenize said of it, when it was
        asked already (False: the bounds took it; None: ask now)."""
        models = self.models[request.model]
        check = check_context if tokenize is None else check_tokens if tokenize else None
        return self.scheduler.submit(request, owner, str(models.device), share=share,
                                     prepare=None if check is None else lambda r: check(models, r))

    def describe(self) -> list[dict]:
        """What is loaded; the verify-cost curve as the constructor measured it (never measured here: that would
        run forwards beside the engine worker's)."""
        rows = []
        for name, models in self.models.items():
            drafters = available(models) + variants(models)
            curve = models.verify_curve
            rows.append({"name": name, "device": str(models.device), "dtype": str(models.dtype).removeprefix("torch."),
                         "weights": models.weights,
                         "drafters": drafters, "default_drafter": self.default_drafter if name == self.default_model else None,
                         "verify_cost_ms": {str(n): s * 1e3 for n, s in curve.items()} if curve else None,
                         "max_positions": getattr(models.target.config, "max_position_embeddings", None)})
        return rows

    def warm(self) -> None:
        """Run every drafter once on a short prompt, so the first client's run is not the one that pays for the
        first forwards (the verify-cost curve was measured when the service was made)."""
        for name, models in self.models.items():
            for drafter in available(models) + variants(models):
                self.backends[name].run("Say hello.", drafter=drafter, settings=DecodeSettings(max_new_tokens=8))

    # ------------------------------------------------------------------------------------------- app

    def app(self) -> FastAPI:
        service, scheduler = self, self.scheduler

        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI):
            scheduler.start()  # the engine workers and the reaper run while the app does
            service.executor = prestarted(PREPARE_THREADS)
            service.tokenizer_pool = prestarted(TOKENIZE_THREADS, "specviz-tokenize")
            yield
            scheduler.stop()
            for pool in (service.executor, service.tokenizer_pool):
                pool.shutdown(wait=False, cancel_futures=True)

        async def off_the_loop(work, *args, pool: ThreadPoolExecutor | None = None):
            """Work that may take a while, in the service's own threads."""
            return await asyncio.get_running_loop().run_in_executor(pool or service.executor, work, *args)

        async def admit(request: RunRequest, owner: str, share: bool = False) -> Run:
            """Check the prompt against the context from bounds (refused at once when it cannot fit), then queue
            the run; a prompt only tokenizing can tell is admitted in its own thread, so that many of them (a
            room of clients sending prompts just past the context) never make the other clients' runs wait."""
            tokenize = await off_the_loop(must_tokenize, service.models[request.model], request)
            if not tokenize:
                return await off_the_loop(service.submit, request, owner, share, False)
            if service.tokenizing >= TOKENIZING_MAX:
                raise QueueFull(f"{service.tokenizing} long prompts are being checked against the context; try again "
                                "shortly", retry_after_s=2)
            service.tokenizing += 1
            try:
                return await off_the_loop(service.submit, request, owner, share, True, pool=service.tokenizer_pool)
            finally:
                service.tokenizing -= 1

        # no /docs page (it would load its scripts from a CDN, and a browser cannot send the token to it); the
        # schema is at /openapi.json, behind the token
        app = FastAPI(title="specviz", version="1", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
        app.state.service = service
        app.add_middleware(BodyLimit, limit=service.limits.max_body_bytes)
        app.add_middleware(TokenGate, token=service.token)  # from the headers, before the body is read
        app.add_middleware(HostAllowList, hosts=service.allowed_hosts)  # outermost
        add_error_handlers(app)
        auth = [Depends(authorised)]

        def find(run_id: str, owner: str) -> Run:
            run = scheduler.get(run_id, owner)
            if run is None:
                raise ClientError(f"no run {shown(run_id)} of yours (unknown, or finished long ago)", 404)
            return run

        def watched(share_id: str) -> Run:
            run = scheduler.watched(share_id)
            if run is None:
                raise ClientError(f"no shared run {shown(share_id)} (unknown, or finished long ago)", 404)
            return run

        def state(run: Run, owner: bool) -> RunState:
            return RunState(run_id=run.id if owner else None, state=run.state, position=scheduler.position(run),
                            events=len(run.events), error=run.error)

        @app.get("/openapi.json", dependencies=auth, include_in_schema=False)
        async def openapi() -> JSONResponse:
            return JSONResponse(app.openapi())

        @app.get("/healthz")
        async def healthz() -> dict:
            return {"status": "ok", "models": list(service.models), "queue": scheduler.queue_length(),
                    "uptime_s": round(time.time() - service.started, 1)}

        @app.get("/metrics", dependencies=auth, responses={**ERRORS, 200: {"content": {"text/plain": {}}}})
        async def metrics() -> Response:
            return Response(service.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

        @app.get("/v1/models", dependencies=auth, responses=ERRORS)
        async def list_models() -> dict:
            return {"models": service.describe()}  # what was measured at start: nothing is run here

        @app.post("/v1/runs", dependencies=auth, status_code=201, responses=ERRORS)
        async def create_run(body: RunBody, owner: Owner) -> RunCreated:
            request = service.request_of(body)
            run = await admit(request, owner, body.share)
            return RunCreated(run_id=run.id, position=scheduler.position(run), share_id=run.share_id)

        @app.get("/v1/runs/{run_id}", dependencies=auth, responses=ERRORS)
        async def run_state(run_id: str, owner: Owner) -> RunState:
            return state(find(run_id, owner), True)

        @app.delete("/v1/runs/{run_id}", dependencies=auth, responses=ERRORS)
        async def cancel_run(run_id: str, owner: Owner) -> RunState:
            run = find(run_id, owner)
            scheduler.cancel(run)
            return state(run, True)

        @app.post("/v1/runs/{run_id}/share", dependencies=auth, responses=ERRORS)
        async def share_run(run_id: str, owner: Owner) -> Shared:
            run = find(run_id, owner)
            return Shared(run_id=run.id, share_id=scheduler.share(run))

        @app.get("/v1/runs/{run_id}/events", dependencies=auth, response_class=StreamingResponse,
                 responses={**ERRORS, **SSE})
        async def run_events(run_id: str, owner: Owner, last_event_id: Annotated[str | None, Header()] = None):
            run = find(run_id, owner)
            return events_response(streaming.sse(scheduler, run, first_event(last_event_id)))

        @app.get("/v1/runs/{run_id}/events.jsonl", dependencies=auth, response_class=StreamingResponse,
                 responses={**ERRORS, 200: {"content": {"application/x-ndjson": {"schema": {"type": "string"}}}}})
        async def run_trace(run_id: str, owner: Owner):
            return StreamingResponse(streaming.trace(scheduler, find(run_id, owner)), media_type="application/x-ndjson")

        @app.get("/v1/watch/{share_id}", dependencies=auth, responses=ERRORS)
        async def watch_state(share_id: str) -> RunState:
            return state(watched(share_id), False)

        @app.get("/v1/watch/{share_id}/events", dependencies=auth, response_class=StreamingResponse,
                 responses={**ERRORS, **SSE})
        async def watch_events(share_id: str, last_event_id: Annotated[str | None, Header()] = None):
            run = watched(share_id)
            return events_response(streaming.sse(scheduler, run, first_event(last_event_id), owner=False))

        @app.post("/v1/chat/completions", dependencies=auth, response_class=JSONResponse,
                  responses={**ERRORS, 200: {"content": {"application/json": {}, "text/event-stream": {}}}})
        async def chat(body: ChatBody, owner: Owner, request: Request):
            run = await admit(service.chat_request(body), owner)
            if body.stream:
                return StreamingResponse(streaming.chat_chunks(scheduler, run), media_type="text/event-stream")
            return await streaming.chat_whole(scheduler, run, request.is_disconnected)

        return app

    def server_config(self, host: str, port: int, **limits):
        """uvicorn's configuration for this service: its app, and the connection cap and header deadline."""
        from specviz.serve.connections import server_config

        return server_config(self.app(), host, port, **limits)


def prestarted(threads: int, name: str = "specviz-prepare") -> ThreadPoolExecutor:
    """A pool whose threads all start now (a pool starts them as work comes and never ends them), so the
    service's thread count is the same from its first request on."""
    pool = ThreadPoolExecutor(threads, thread_name_prefix=name)
    barrier = threading.Barrier(threads)
    for _ in range(threads):
        pool.submit(barrier.wait, 10)  # each thread waits for the others: the pool must start them all
    return pool


def first_event(last_event_id: str | None) -> int:
    """The sequence number a stream starts at: 0, or the one after Last-Event-ID."""
    if last_event_id is None:
        return 0
    text = last_event_id.strip()
    if not (text.isdigit() and text.isascii() and len(text) <= LAST_EVENT_ID_CHARS):
        raise ClientError(f"Last-Event-ID must be an event's sequence number, got {shown(last_event_id)}")
    return int(text) + 1


def events_response(stream) -> StreamingResponse:
    return StreamingResponse(stream, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def add_error_handlers(app: FastAPI) -> None:
    """Every refusal in the one shape, never a traceback."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        return error(f"bad request: {problems(exc.errors())}", 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return error(str(exc.detail), exc.status_code)

    @app.exception_handler(SpecvizError)
    async def refused(request: Request, exc: SpecvizError):
        if isinstance(exc, QueueFull):
            return error(str(exc), 429, {"Retry-After": str(exc.retry_after_s)})
        return error(str(exc), exc.status if isinstance(exc, ClientError) else 400)

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception):  # a bug of the service: still the one shape
        return error(f"the service failed ({type(exc).__name__})", 500)
