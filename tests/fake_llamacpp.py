"""A stand-in for llama-server (llama.cpp build 11434) that answers as its native API does for a speculative run,
its shapes read from tools/server/server-task.cpp and server-context.cpp: /health, /v1/models, /props,
/apply-template, /metrics (Prometheus text, `llamacpp:` counters that advance with each run) and a streamed
/completion with `return_tokens` and `timings_per_token`: one chunk per token, every token of a verify step stamped
with the same `predicted_ms`, `draft_n` counting the drafts made so far, and a last chunk with `stop: true`, the
stop type and the request's timings (`draft_n`, `draft_n_accepted`).

The run: the prefill's token, then steps drafting 3 tokens that commit 3, 2, 1, 3, 2, 1 ... (accepting 2, 1, 0);
with `speculative=False`, one token a step and no draft counts. `die_after` ends the stream after that many
tokens, as a server that crashed would; `stall_after` keeps it open and sends nothing more; `garbage` answers
/completion with lines that are not JSON; `metrics=False` answers /metrics 501, as llama-server without
`--metrics` does."""
from __future__ import annotations

import asyncio
import json
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from serving import InThread

MODEL = "SmolLM2-fake.Q4_1.gguf"
DRAFT = 3


def text_of(token: int) -> str:
    return f"<{token}>"


def continuation(prompt: list[int], budget: int) -> list[int]:
    """What the fake model writes after `prompt`: the same tokens for the same prompt."""
    return [10 + (len(prompt) + i) % 6 for i in range(budget)]


def step_sizes(n: int, speculative: bool) -> list[int]:
    """Tokens committed per step for n tokens: the prefill's one, then 3, 2, 1, ... (cut at the budget)."""
    sizes, left = [1], n - 1
    while left > 0:
        sizes.append(min(DRAFT - (len(sizes) - 1) % DRAFT if speculative else 1, left))
        left -= sizes[-1]
    return sizes[:n] if n else []


def app(speculative: bool = True, die_after: int | None = None, stall_after: int | None = None,
        garbage: bool = False, metrics: bool = True) -> FastAPI:
    api = FastAPI()
    api.state.requests = []
    totals = {"drafts": 0, "drafted": 0, "accepted": 0, "predicted": 0, "per_pos": [0] * DRAFT}

    @api.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @api.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "llamacpp"}]}

    @api.get("/props")
    async def props() -> dict:
        return {"default_generation_settings": {"n_ctx": 2048, "params": {"temperature": 0.8}},
                "total_slots": 1, "model_path": f"/models/{MODEL}", "build_info": "b11434-fake"}

    @api.post("/apply-template")
    async def template(request: Request) -> dict:
        messages = (await request.json())["messages"]
        return {"prompt": "".join(f"<|{m['role']}|>{m['content']}" for m in messages) + "<|assistant|>"}

    @api.get("/metrics")
    async def prometheus():
        if not metrics:
            return JSONResponse({"error": {"code": 501, "message": "This server does not support metrics endpoint.",
                                           "type": "not_supported_error"}}, status_code=501)
        lines = [f"llamacpp:tokens_predicted_total {totals['predicted']}"]
        if speculative:
            lines += [f"llamacpp:spec_decode_num_draft_tokens_total {totals['drafted']}",
                      f"llamacpp:spec_decode_num_accepted_tokens_total {totals['accepted']}",
                      f"llamacpp:spec_decode_num_drafts_total {totals['drafts']}"]
            lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {n}'
                      for i, n in enumerate(totals["per_pos"])]
        return PlainTextResponse("\n".join(lines) + "\n")

    @api.post("/completion")
    async def completion(request: Request) -> StreamingResponse:
        body = await request.json()
        api.state.requests.append(body)
        prompt = body["prompt"]
        ids = list(prompt) if isinstance(prompt, list) else list(range(len(str(prompt).split())))
        out = continuation(ids, int(body["n_predict"]))
        sizes = step_sizes(len(out), speculative)

        def data(fields: dict) -> str:
            return "data: " + json.dumps({"index": 0, "id_slot": 0, "tokens_evaluated": len(ids), **fields}) + "\n\n"

        async def lines():
            if garbage:
                yield "data: this is not json\n\n"
                return
            at, drafted, accepted, clock = 0, 0, 0, 0.0
            for n, size in enumerate(sizes):
                if n > 0 and speculative:
                    drafted += DRAFT
                    accepted += size - 1
                    totals["drafts"] += 1
                    for i in range(size - 1):
                        totals["per_pos"][i] += 1
                clock += 4.25
                for token in out[at:at + size]:
                    if die_after is not None and at == die_after:
                        raise RuntimeError("the server died")  # the response ends without a stop chunk
                    if stall_after is not None and at == stall_after:
                        await asyncio.sleep(30)
                    timings = {"predicted_n": at + 1, "predicted_ms": clock, "prompt_n": len(ids)}
                    if drafted:
                        timings.update(draft_n=drafted, draft_n_accepted=accepted)
                    yield data({"content": text_of(token), "tokens": [token], "stop": False,
                                "tokens_predicted": at + 1, "timings": timings})
                    at += 1
                time.sleep(0.005)
            totals.update(drafted=totals["drafted"] + drafted, accepted=totals["accepted"] + accepted,
                          predicted=totals["predicted"] + len(out))
            final = {"predicted_n": len(out), "predicted_ms": clock, "predicted_per_second": 1e3 * len(out) / clock,
                     "prompt_n": len(ids), "prompt_ms": len(ids) / 2.0, "prompt_per_second": 2000.0}
            if drafted:
                final.update(draft_n=drafted, draft_n_accepted=accepted)
            yield data({"content": "", "tokens": [], "stop": True, "model": MODEL, "tokens_predicted": len(out),
                        "stop_type": "limit", "stopping_word": "", "timings": final})

        return StreamingResponse(lines(), media_type="text/event-stream")

    return api


class Served(InThread):
    """The stand-in on a free loopback port, in a thread, for a `with` block (`app`: its FastAPI app)."""

    def __init__(self, **options):
        super().__init__(app(**options), "the llama-server stand-in")
