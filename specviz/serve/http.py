"""The HTTP service: FastAPI routes over the scheduler. docs/service.md is the API reference.

    POST   /v1/runs                  a run's parameters -> {"run_id"}
    GET    /v1/runs/{id}/events      Server-Sent Events: each `data:` one schema-v1 event, `id:` its sequence
                                     number (Last-Event-ID resumes); `event: queued` while the run waits
    GET    /v1/runs/{id}/events.jsonl  the same events as a trace, one JSON object a line
    GET    /v1/runs/{id}             the run's state and queue position
    DELETE /v1/runs/{id}             cancel
    GET    /v1/models                what is loaded, where, the drafters and the measured verify-cost curve
    POST   /v1/chat/completions      OpenAI-compatible (stream true or false), through the same queue
    GET    /healthz, /metrics        liveness; Prometheus text format
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import time
from dataclasses import dataclass, fields
from typing import Annotated, AsyncIterator, Literal

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, create_model
from starlette.exceptions import HTTPException as StarletteHTTPException

from specviz.backends.local import LocalBackend
from specviz.decoding.costs import verify_curve
from specviz.decoding.prompt import encode_prompt
from specviz.decoding.settings import DECODE_FIELDS, FIELD_HELP, FIELD_TYPES, DecodeSettings
from specviz.drafters import K, available, check_options, make_drafter, parse_spec, variants
from specviz.errors import SpecvizError
from specviz.serve.metrics import ServiceMetrics
from specviz.serve.runs import CANCELLED, FAILED, QueueFull, Run, RunRequest, Scheduler

KEEPALIVE_S = 15.0  # an SSE comment this often while nothing happens, so proxies keep the connection open


@dataclass(frozen=True)
class Limits:
    """What one request may ask for: the service's defence against a run that would hold the device for long."""

    max_new_tokens: int = 512
    max_prompt_chars: int = 32_000
    max_body_bytes: int = 256 * 1024
    max_n_top: int = 20


class ClientError(SpecvizError):
    """A request the service refuses: a 4xx with this message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "user", "assistant"]
    content: str


class RunParameters(BaseModel):
    """POST /v1/runs, besides the decode settings: what to decode, where, and how much detail to keep."""

    model_config = ConfigDict(extra="forbid", strict=True)
    prompt: str | None = None
    messages: list[Message] | None = None  # instead of prompt: a conversation, through the chat template
    model: str | None = None  # one the service loaded (default: the first)
    drafter: str = "ngram"  # a drafter with options, e.g. "eagle2:lookup=4"
    drafter_options: dict[str, int | float | bool | str] = Field(default_factory=dict)
    detail: bool = True  # False: leave out tree-building stages and top-N lists
    chat: bool = True  # False: the prompt as it is, without the chat template


# POST /v1/runs: the parameters of specviz.stream, the fields of DecodeSettings among them (read from it, not
# written again here)
RunBody = create_model("RunBody", __base__=RunParameters, __doc__=RunParameters.__doc__, **{
    f.name: (FIELD_TYPES[f.name], Field(f.default, description=FIELD_HELP[f.name])) for f in fields(DecodeSettings)})


class ChatBody(BaseModel):
    """POST /v1/chat/completions: OpenAI's request; unknown OpenAI fields are ignored, `specviz` picks the
    drafter ({"drafter": "eagle2", "k": 4})."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[Message]
    stream: bool = False
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = 1.0  # OpenAI's default
    top_p: float = 1.0
    seed: int | None = None
    specviz: dict[str, int | float | bool | str] = Field(default_factory=dict)


class Service:
    """The loaded models, the scheduler and the limits; `app()` builds the FastAPI application."""

    def __init__(self, models: dict, token: str | None = None, limits: Limits = Limits(), max_queue: int = 16,
                 max_per_client: int = 3, disconnect_grace_s: float = 1.0, default_drafter: str | None = None):
        if not models:
            raise SpecvizError("the service needs at least one model")
        self.models = models  # name -> specviz.models.LoadedModels
        self.backends = {name: LocalBackend(loaded) for name, loaded in models.items()}  # the engine, one per model
        self.token = token
        self.limits = limits
        self.metrics = ServiceMetrics()
        devices = sorted({str(m.device) for m in models.values()})
        self.scheduler = Scheduler(self._decode, devices, self.metrics, max_queue, max_per_client, disconnect_grace_s)
        self.default_model = next(iter(models))
        first = models[self.default_model]
        self.default_drafter = default_drafter or next(
            (d for d in ("eagle2:lookup=4", "eagle2", "ngram") if parse_spec(d)[0] in available(first)), "ngram")
        self.started = time.time()
        for loaded in models.values():  # the tree drafters' "auto" budget reads it: measured now, never beside a run
            if getattr(loaded, "eagle", None) is not None or getattr(loaded, "medusa", None) is not None:
                verify_curve(loaded)

    # ------------------------------------------------------------------------------------------ runs

    def _decode(self, run: Run):
        r = run.request
        return self.backends[r.model].stream(r.prompt, drafter=r.drafter, settings=r.settings,
                                             drafter_options=r.drafter_options, chat=r.chat)

    def request_of(self, body: RunBody) -> RunRequest:
        """Check a request against the loaded models and the limits; ClientError says what is wrong."""
        lim = self.limits
        if (body.prompt is None) == (body.messages is None):
            raise ClientError("send either `prompt` (a string) or `messages` (a conversation), not both or neither")
        prompt = body.prompt if body.prompt is not None else [m.model_dump() for m in body.messages]
        chars = len(prompt) if isinstance(prompt, str) else sum(len(m["content"]) for m in prompt)
        if chars > lim.max_prompt_chars:
            raise ClientError(f"the prompt has {chars:,} characters; this service takes at most {lim.max_prompt_chars:,}", 413)
        name = body.model or self.default_model
        if name not in self.models:
            raise ClientError(f"model {name!r} is not loaded here; this service runs only: {', '.join(self.models)} "
                              "(it never loads a path or a hub id from a request)", 404)
        models = self.models[name]
        drafter = parse_spec(body.drafter)[0]
        if drafter not in available(models):
            raise ClientError(f"drafter {drafter!r} is not available for {name}; available: {', '.join(available(models))}")
        spec_options = {**parse_spec(body.drafter)[1], **body.drafter_options}
        if "head" in spec_options:
            raise ClientError("drafter option head= names a folder on the server; the service runs only the heads "
                              "it loaded")
        k = spec_options.get("k", body.k)
        for field_name, value, high in (("max_new_tokens", body.max_new_tokens, lim.max_new_tokens),
                                        ("n_top", body.n_top, lim.max_n_top)):
            if not 0 <= value <= high or (field_name == "max_new_tokens" and value < 1):
                raise ClientError(f"{field_name} must be a whole number from {int(field_name == 'max_new_tokens')} to "
                                  f"{high} here, got {value!r}")
        try:
            K.check(drafter, k, served=True)
            check_options(body.drafter, body.drafter_options, served=True)  # the spec's allow-list and bounds
            settings = DecodeSettings(**{**{f: getattr(body, f) for f in DECODE_FIELDS}, "k": k,
                                         "n_top": body.n_top if body.detail else 0})
        except SpecvizError as err:
            raise ClientError(str(err)) from err
        try:
            make_drafter(body.drafter, models, k=settings.k, options=body.drafter_options)  # its own option checks
            ids = encode_prompt(models.tokenizer, prompt, body.chat)
        except SpecvizError:
            raise
        except Exception as err:  # a drafter or a chat template refusing a value in its own way
            raise ClientError(f"the request was refused: {type(err).__name__}: {err}") from err
        limit = getattr(models.target.config, "max_position_embeddings", None) or 2**31
        if len(ids) + settings.max_new_tokens > limit:
            raise ClientError(f"the prompt ({len(ids)} tokens) + max_new_tokens ({settings.max_new_tokens}) exceeds "
                              f"{name}'s context of {limit} tokens")
        return RunRequest(prompt, name, body.drafter, body.drafter_options, settings, body.detail, body.chat)

    def chat_request(self, body: ChatBody) -> RunRequest:
        extra = dict(body.specviz)
        drafter = str(extra.pop("drafter", self.default_drafter))
        k = extra.pop("k", 4)
        if isinstance(k, bool) or not isinstance(k, int):
            raise ClientError(f"specviz.k must be a whole number, got {k!r}")
        try:
            run = RunBody(messages=body.messages, model=body.model, drafter=drafter, drafter_options=extra,
                          max_new_tokens=body.max_completion_tokens or body.max_tokens or 256,
                          temperature=float(body.temperature), top_p=float(body.top_p),
                          seed=body.seed or 0, k=k, n_top=0, detail=False)
        except ValueError as err:  # pydantic's ValidationError
            raise ClientError(f"bad request: {err}", 422) from err
        return self.request_of(run)

    def submit(self, request: RunRequest, client: str) -> Run:
        return self.scheduler.submit(request, client, str(self.models[request.model].device))

    def describe(self) -> list[dict]:
        """What is loaded; the verify-cost curve as the constructor measured it (never measured here: that would
        run forwards beside the engine worker's)."""
        rows = []
        for name, models in self.models.items():
            drafters = available(models) + variants(models)
            curve = models.verify_curve
            rows.append({"name": name, "device": str(models.device), "dtype": str(models.dtype).removeprefix("torch."),
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
        service = self

        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI):
            service.scheduler.start()  # the engine workers run while the app does
            yield
            service.scheduler.stop()

        app = FastAPI(title="specviz", version="1", docs_url="/docs", redoc_url=None, lifespan=lifespan)
        app.state.service = service

        app.add_middleware(BodyLimit, limit=service.limits.max_body_bytes)

        @app.exception_handler(RequestValidationError)
        async def invalid(request: Request, exc: RequestValidationError):
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}"
                                 for e in exc.errors())
            return error(f"bad request: {problems}", 422)

        @app.exception_handler(StarletteHTTPException)
        async def http_error(request: Request, exc: StarletteHTTPException):
            return error(str(exc.detail), exc.status_code)

        @app.exception_handler(SpecvizError)
        async def refused(request: Request, exc: SpecvizError):
            if isinstance(exc, QueueFull):
                return error(str(exc), 429, {"Retry-After": str(exc.retry_after_s)})
            return error(str(exc), exc.status if isinstance(exc, ClientError) else 400)

        auth = [Depends(authorised)]

        def find(run_id: str) -> Run:
            run = service.scheduler.get(run_id)
            if run is None:
                raise ClientError(f"no run {run_id!r} (unknown, or finished long ago)", 404)
            return run

        @app.get("/healthz")
        async def healthz() -> dict:
            return {"status": "ok", "models": list(service.models), "queue": service.scheduler.queue_length(),
                    "uptime_s": round(time.time() - service.started, 1)}

        @app.get("/metrics", dependencies=auth)
        async def metrics() -> Response:
            return Response(service.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

        @app.get("/v1/models", dependencies=auth)
        async def list_models() -> dict:
            return {"models": await asyncio.to_thread(service.describe)}

        @app.post("/v1/runs", dependencies=auth, status_code=201)
        async def create_run(body: RunBody, client: Annotated[str, Depends(client_of)]) -> dict:
            request = await asyncio.to_thread(service.request_of, body)
            run = service.submit(request, client)
            return {"run_id": run.id, "position": service.scheduler.position(run)}

        @app.get("/v1/runs/{run_id}", dependencies=auth)
        async def run_state(run_id: str) -> dict:
            run = find(run_id)
            return {"run_id": run.id, "state": run.state, "position": service.scheduler.position(run),
                    "events": len(run.events), "error": run.error}

        @app.delete("/v1/runs/{run_id}", dependencies=auth)
        async def cancel_run(run_id: str) -> dict:
            run = find(run_id)
            service.scheduler.cancel(run)
            return {"run_id": run.id, "state": run.state}

        @app.get("/v1/runs/{run_id}/events", dependencies=auth)
        async def run_events(run_id: str, last_event_id: Annotated[str | None, Header()] = None) -> StreamingResponse:
            run = find(run_id)
            try:
                after = int(last_event_id) if last_event_id is not None else -1
            except ValueError:
                after = -2
            if after < -1:
                raise ClientError(f"Last-Event-ID must be an event's sequence number, got {last_event_id!r}")
            return StreamingResponse(service.sse(run, after + 1), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

        @app.get("/v1/runs/{run_id}/events.jsonl", dependencies=auth)
        async def run_trace(run_id: str) -> StreamingResponse:
            run = find(run_id)

            async def lines():
                async for seq, event in service.follow(run, 0):
                    if seq is not None:
                        yield json.dumps(event, ensure_ascii=False) + "\n"

            return StreamingResponse(lines(), media_type="application/x-ndjson")

        @app.post("/v1/chat/completions", dependencies=auth)
        async def chat(body: ChatBody, client: Annotated[str, Depends(client_of)]):
            request = await asyncio.to_thread(service.chat_request, body)
            run = service.submit(request, client)
            if body.stream:
                return StreamingResponse(service.chat_chunks(run), media_type="text/event-stream")
            return await service.chat_whole(run)

        return app

    # ------------------------------------------------------------------------------------- streaming

    async def follow(self, run: Run, first: int) -> AsyncIterator[tuple[int | None, dict]]:
        """(sequence, event) from `first` on as they arrive, with (None, queued-or-end marker) between: the
        marker is {"type": "queued", "position": n}, or at the end {"type": "error" | "cancelled", ...}."""
        loop = asyncio.get_running_loop()
        scheduler = self.scheduler
        scheduler.listen(run)
        try:
            seq, told = first, None
            while True:
                position = scheduler.position(run)  # None once the run has left the queue
                if position != told:
                    told = position
                    if position is not None:
                        yield None, {"type": "queued", "run_id": run.id, "position": position}
                finished = run.done  # read before the events: the last ones are appended before the run finishes
                while seq < len(run.events):
                    yield seq, run.events[seq]
                    seq += 1
                if finished:
                    if run.state == FAILED:
                        yield None, {"type": "error", "run_id": run.id, "error": run.error}
                    elif run.state == CANCELLED:
                        yield None, {"type": "cancelled", "run_id": run.id}
                    return
                changed = asyncio.Event()
                run.on_change(functools.partial(loop.call_soon_threadsafe, changed.set))
                if seq < len(run.events) or run.done or scheduler.position(run) != told:
                    continue  # it changed while the waiter was being registered
                try:
                    await asyncio.wait_for(changed.wait(), KEEPALIVE_S)
                except asyncio.TimeoutError:
                    yield None, {"type": "keepalive"}
        finally:
            scheduler.leave(run)

    async def sse(self, run: Run, first: int) -> AsyncIterator[str]:
        async for seq, event in self.follow(run, first):
            if seq is not None:
                yield f"id: {seq}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
            elif event["type"] == "keepalive":
                yield ": keep-alive\n\n"
            else:
                yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"

    async def chat_chunks(self, run: Run) -> AsyncIterator[str]:
        """OpenAI's streaming chunks: the role, then text deltas, then the finish reason with usage and the
        specviz statistics, then [DONE]."""
        created, model = int(time.time()), run.request.model

        def chunk(delta: dict, finish: str | None = None, **extra) -> str:
            body = {"id": f"chatcmpl-{run.id}", "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        yield chunk({"role": "assistant"})
        prompt_tokens = 0
        async for seq, event in self.follow(run, 0):
            if seq is None:
                if event["type"] in ("error", "cancelled"):
                    yield f"data: {json.dumps({'error': {'message': event.get('error') or 'the run was cancelled'}})}\n\n"
                    return
                continue
            if event["type"] == "start":
                prompt_tokens = len(event["prompt_token_ids"])
            elif event["type"] == "step" and event["text_delta"]:
                yield chunk({"content": event["text_delta"]})
            elif event["type"] == "done":
                if event["text_delta"]:
                    yield chunk({"content": event["text_delta"]})
                yield chunk({}, "stop" if event["stop_reason"] == "eos" else "length",
                            usage=usage(prompt_tokens, event), specviz=event["stats"])
        yield "data: [DONE]\n\n"

    async def chat_whole(self, run: Run):
        start = done = None
        async for seq, event in self.follow(run, 0):
            if seq is None and event["type"] in ("error", "cancelled"):
                status = 409 if event["type"] == "cancelled" else 400 if run.refused else 500
                return error(event.get("error") or "the run was cancelled", status)
            if seq is not None and event["type"] == "start":
                start = event
            if seq is not None and event["type"] == "done":
                done = event
        if start is None or done is None:
            return error("the run ended before its last event", 500)
        return {"id": f"chatcmpl-{run.id}", "object": "chat.completion", "created": int(time.time()),
                "model": run.request.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": done["text"]},
                             "finish_reason": "stop" if done["stop_reason"] == "eos" else "length"}],
                "usage": usage(len(start["prompt_token_ids"]), done), "specviz": done["stats"]}


def authorised(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """The bearer token, compared in constant time, when the service has one."""
    token = request.app.state.service.token
    if token is None:
        return
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
        raise ClientError("missing or wrong bearer token (Authorization: Bearer TOKEN)", 401)


def client_of(request: Request, x_specviz_client: Annotated[str | None, Header()] = None) -> str:
    """Who is asking, for the per-client limit: the address, and the name an app gives each of its viewers."""
    host = request.client.host if request.client else "?"
    return f"{host}/{(x_specviz_client or '')[:64]}"


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


def usage(prompt_tokens: int, done: dict) -> dict:
    completion = len(done["token_ids"])
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def error(message: str, status: int, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "status": status}}, status_code=status, headers=headers)
