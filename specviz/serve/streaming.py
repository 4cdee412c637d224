"""A run's events as the service sends them: followed as they arrive (with the queue position and the end in
between), as Server-Sent Events, as a JSONL trace, and as OpenAI chat completions (streamed, or whole while the
client stays connected)."""
from __future__ import annotations

import asyncio
import functools
import json
import time
from typing import AsyncIterator, Awaitable, Callable

from specviz.serve.guard import error
from specviz.serve.runs import CANCELLED, FAILED, Run, Scheduler

KEEPALIVE_S = 15.0  # an SSE comment this often while nothing happens, so proxies keep the connection open
DISCONNECT_POLL_S = 0.25  # how often a whole chat completion checks that its client is still there


async def follow(scheduler: Scheduler, run: Run, first: int, owner: bool = True
                 ) -> AsyncIterator[tuple[int | None, bytes | dict]]:
    """(sequence, event JSON) from `first` on as they arrive, with (None, marker) between: the marker is
    {"type": "queued", "position": n}, a keep-alive, or at the end {"type": "error" | "cancelled", ...}.
    `owner`: the run's owner listens (its streams keep the run alive), else a viewer of its share link."""
    loop = asyncio.get_running_loop()
    scheduler.listen(run, owner)
    try:
        seq, told = first, None
        while True:
            position = scheduler.position(run)  # None once the run has left the queue
            if position != told:
                told = position
                if position is not None:
                    yield None, {"type": "queued", "run_id": run.id if owner else None, "position": position}
            finished = run.done  # read before the events: the last ones are appended before the run finishes
            while seq < len(run.events):
                yield seq, run.events[seq]
                seq += 1
            if finished:
                if run.state == FAILED:
                    yield None, {"type": "error", "run_id": run.id if owner else None, "error": run.error}
                elif run.state == CANCELLED:
                    yield None, {"type": "cancelled", "run_id": run.id if owner else None}
                return
            changed = asyncio.Event()
            wake = functools.partial(loop.call_soon_threadsafe, changed.set)
            run.on_change(wake)
            quiet = False
            try:
                if seq < len(run.events) or run.done or scheduler.position(run) != told:
                    continue  # it changed while the waiter was being registered
                await asyncio.wait_for(changed.wait(), KEEPALIVE_S)
            except asyncio.TimeoutError:
                quiet = True
            finally:
                run.off_change(wake)  # woken, timed out or gone: the run holds no waiter of this listener
            if quiet:
                yield None, {"type": "keepalive"}
    finally:
        scheduler.leave(run, owner)


async def sse(scheduler: Scheduler, run: Run, first: int, owner: bool = True) -> AsyncIterator[bytes]:
    async for seq, event in follow(scheduler, run, first, owner):
        if seq is not None:
            yield b"id: %d\ndata: %s\n\n" % (seq, event)
        elif event["type"] == "keepalive":
            yield b": keep-alive\n\n"
        else:
            yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


async def trace(scheduler: Scheduler, run: Run) -> AsyncIterator[bytes]:
    """The run's events as a JSONL trace, one event a line, as they come."""
    async for seq, event in follow(scheduler, run, 0):
        if seq is not None:
            yield event + b"\n"


async def chat_chunks(scheduler: Scheduler, run: Run) -> AsyncIterator[str]:
    """OpenAI's streaming chunks: the role, then text deltas, then the finish reason with usage and the
    specviz statistics, then [DONE]."""
    created, model = int(time.time()), run.request.model

    def chunk(delta: dict, finish: str | None = None, **extra) -> str:
        body = {"id": f"chatcmpl-{run.id}", "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    yield chunk({"role": "assistant"})
    prompt_tokens = 0
    async for seq, data in follow(scheduler, run, 0):
        if seq is None:
            if data["type"] in ("error", "cancelled"):
                yield f"data: {json.dumps({'error': {'message': data.get('error') or 'the run was cancelled'}})}\n\n"
                return
            continue
        event = json.loads(data)
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


async def chat_whole(scheduler: Scheduler, run: Run, disconnected: Callable[[], Awaitable[bool]]):
    """The whole completion, once the run is done; a client that leaves first has its run cancelled."""
    whole = asyncio.ensure_future(_completion(scheduler, run))
    try:
        while not whole.done():
            await asyncio.wait({whole}, timeout=DISCONNECT_POLL_S)
            if not whole.done() and await disconnected():
                scheduler.cancel(run)
                return error("the client left before its completion was ready; the run was cancelled", 400)
        return whole.result()
    finally:
        whole.cancel()


async def _completion(scheduler: Scheduler, run: Run):
    start = done = None
    async for seq, data in follow(scheduler, run, 0):
        if seq is None and data["type"] in ("error", "cancelled"):
            status = 409 if data["type"] == "cancelled" else 400 if run.refused else 500
            return error(data.get("error") or "the run was cancelled", status)
        if seq is not None:
            event = json.loads(data)
            start = event if event["type"] == "start" else start
            done = event if event["type"] == "done" else done
    if start is None or done is None:
        return error("the run ended before its last event", 500)
    return {"id": f"chatcmpl-{run.id}", "object": "chat.completion", "created": int(time.time()),
            "model": run.request.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": done["text"]},
                         "finish_reason": "stop" if done["stop_reason"] == "eos" else "length"}],
            "usage": usage(len(start["prompt_token_ids"]), done), "specviz": done["stats"]}


def usage(prompt_tokens: int, done: dict) -> dict:
    completion = len(done["token_ids"])
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}
