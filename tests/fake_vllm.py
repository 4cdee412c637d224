"""A stand-in for `vllm serve` that answers as vLLM 0.32's OpenAI server does for a speculative run with
`--per-request-spec-decode-metrics detailed` (its shapes read from vllm/entrypoints/openai and
vllm/v1/metrics/stats.py): /v1/models, /metrics, /detokenize, and a streamed /v1/chat/completions whose chunks hold
one verify step's tokens each, then a usage chunk with metrics.speculative_decoding; and /v1/completions from
token ids, committing `continuation(prompt ids, max_tokens)` in verify steps. `die_after` closes the
connection mid-stream, as a server that crashed would; `stall_after` keeps it open and sends nothing more, as a
stuck one would; `last_finish` is the finish_reason of the last step (vLLM says "abort" or "error" for a request
its engine dropped or failed)."""
from __future__ import annotations

import asyncio
import json
import time

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from serving import InThread

PROMPT_IDS = [1, 2, 3]
STEPS = [[10], [11, 12, 13], [14, 15]]  # committed tokens per verify step: accepted 0, 2 and 1 of 3 drafted
SPEC = {"mean_acceptance_length": 2.0, "draft_acceptance_rate": 3 / 9, "acceptance_histogram": [1, 1, 1, 0],
        "num_spec_steps": 3, "num_accepted_draft_tokens": 3, "num_draft_tokens": 9, "num_spec_tokens": 3,
        "per_step_accepted": [0, 2, 1], "per_step_drafted": [3, 3, 3]}


def text_of(token: int) -> str:
    return f"<{token}>"


def app(die_after: int | None = None, stall_after: int | None = None, continuation=None,
        last_finish: str = "length") -> FastAPI:
    continuation = continuation or (lambda prompt, budget: [10 + i % 6 for i in range(budget)])
    api = FastAPI()
    api.state.requests = []

    @api.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}

    @api.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse("vllm:spec_decode_num_drafts_total 0.0\n")

    @api.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        return {"prompt": "".join(text_of(t) for t in (await request.json())["tokens"])}

    @api.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        api.state.requests.append(body)

        def chunk(**fields) -> str:
            return "data: " + json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                                          "model": "fake-model", **fields}) + "\n\n"

        async def lines():
            yield chunk(choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "token_ids": []}],
                        prompt_token_ids=PROMPT_IDS)
            for n, ids in enumerate(STEPS):
                if die_after is not None and n == die_after:
                    raise RuntimeError("the server died")  # the response ends without [DONE] or a usage chunk
                if stall_after is not None and n == stall_after:
                    await asyncio.sleep(30)
                finish = last_finish if n == len(STEPS) - 1 else None
                yield chunk(choices=[{"index": 0, "delta": {"content": "".join(map(text_of, ids))},
                                      "token_ids": ids, "finish_reason": finish}])
                time.sleep(0.01)
            yield chunk(choices=[], usage={"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9},
                        metrics={"speculative_decoding": SPEC})
            yield "data: [DONE]\n\n"

        return StreamingResponse(lines(), media_type="text/event-stream")

    @api.post("/v1/completions")
    async def completions(request: Request) -> StreamingResponse:
        """Token ids in, `continuation(prompt ids, max_tokens)` out: the prefill's token in the first chunk, then
        verify steps of 3 drafted tokens committing 3, 2, 1, 3, 2, 1 ... tokens (accepting 2, 1, 0, ...)."""
        body = await request.json()
        api.state.requests.append(body)
        out = continuation(list(body["prompt"]), body["max_tokens"])
        sizes, left = [1], len(out) - 1
        while left > 0:
            sizes.append(min(3 - (len(sizes) - 1) % 3, left))
            left -= sizes[-1]
        accepted = [3 - (n % 3) - 1 for n in range(len(sizes) - 1)]  # vLLM's count: before the cut at the budget
        spec = {"num_spec_steps": len(accepted), "num_accepted_draft_tokens": sum(accepted),
                "num_draft_tokens": 3 * len(accepted), "num_spec_tokens": 3,
                "draft_acceptance_rate": sum(accepted) / (3 * len(accepted)) if accepted else 0.0,
                "acceptance_histogram": [accepted.count(j) for j in range(4)],
                "per_step_accepted": accepted, "per_step_drafted": [3] * len(accepted)}

        def chunk(**fields) -> str:
            return "data: " + json.dumps({"id": "cmpl-1", "object": "text_completion", "created": 0,
                                          "model": "fake-model", **fields}) + "\n\n"

        async def lines():
            at = 0
            for n, size in enumerate(sizes):
                ids, at = out[at:at + size], at + size
                yield chunk(choices=[{"index": 0, "text": "".join(map(text_of, ids)), "token_ids": ids,
                                      "prompt_token_ids": body["prompt"] if n == 0 else None,
                                      "finish_reason": "length" if n == len(sizes) - 1 else None}])
            yield chunk(choices=[], usage={"prompt_tokens": len(body["prompt"]), "completion_tokens": len(out)},
                        metrics={"speculative_decoding": spec if accepted else None})
            yield "data: [DONE]\n\n"

        return StreamingResponse(lines(), media_type="text/event-stream")

    return api


class Served(InThread):
    """The fake server on a free loopback port, in a thread, for a `with` block (`app`: its FastAPI app)."""

    def __init__(self, die_after: int | None = None, stall_after: int | None = None, continuation=None,
                 last_finish: str = "length"):
        super().__init__(app(die_after, stall_after, continuation, last_finish), "the fake vLLM server")
