"""The vLLM backend: a client of an unmodified `vllm serve` over its OpenAI API, so it works with any vLLM
deployment (tensor- or pipeline-parallel, several nodes), not only one specviz started.

What vLLM shows, and so what this backend's events carry (detail COUNTS): per verify step, how many drafted tokens
it accepted, the committed token ids and their text, and the time between steps as the client saw it. vLLM
exposes no q, no tree and no u: the pages say so instead of drawing them.

How a run becomes steps: vLLM streams one chunk per engine step for a single request, holding that step's
committed tokens (accepted drafts plus the replacement or bonus), so a chunk of n tokens is a step that accepted
n - 1 drafted tokens (a server whose streaming falls behind its engine merges the steps not yet sent into one
chunk). With `--per-request-spec-decode-metrics detailed` the last chunk also carries vLLM's own ordered per-step
accepted and drafted counts and its acceptance histogram; the Done event's stats take those where they are given
(and say which source they came from).

Faults are SpecvizErrors naming the server and what to try: nothing listening (a vLLM still starting takes
connections only once it is ready), a server that takes the connection but does not answer, a refused run, an error chunk, a connection that ends
mid-run (the server stopped), and a stream silent for `silence_s` (stuck); none of them hangs.

Start the server as docs/vllm.md says; `vllm+http://host:8000` (or `SPECVIZ_BACKEND=vllm+http://...`) picks it.
"""
from __future__ import annotations

import json
import time
from typing import Any, Iterator

import httpx

from specviz.backends.base import COUNTS, Backend, Capabilities, Events, OnWait, Prompt, Run, no_options
from specviz.decoding import events as ev
from specviz.decoding.settings import DecodeSettings
from specviz.errors import SpecvizError

SCHEME = "vllm+"
START = ("start one as docs/vllm.md says (`make vllm`, then `.venv-vllm/bin/python -m "
         "vllm.entrypoints.openai.api_server --model ...`), or check the address")
RESTART = "see the end of the server's log for why, and start it again (docs/vllm.md)"
STARTING = ("A vLLM server that is still starting takes connections only once it is ready (30 to 110 s on a 2-core "
            "CPU): wait until its log says 'Application startup complete'")


class VllmBackend(Backend):
    """Counts only: no tree, no q; one drafting method, the one its server was started with; vLLM batches the
    runs of every client itself."""

    engine = "vllm"
    capabilities = Capabilities(detail=COUNTS, tree=False, q_values=False, drafter_choice=False, batching=True)

    def __init__(self, url: str, model: str, token: str | None = None, speculative: bool | None = None,
                 timeout_s: float = 30.0, silence_s: float = 120.0, detokenize: bool = True):
        self.url, self.model, self.token = url.rstrip("/"), model, token
        self.speculative = speculative  # whether its /metrics count speculative drafts (None: not known)
        self.timeout_s = timeout_s  # to connect and to send a request
        self.silence_s = silence_s  # a run whose stream sends nothing for this long is taken as stuck
        self.detokenize = detokenize  # each token's own text from /detokenize (False: a timed run asks nothing extra)
        self._texts: dict[int, str] = {}  # token id -> text, from the server's /detokenize
        self.names = [model]  # every model the server serves (connect fills it in)

    @classmethod
    def open(cls, address: str, model: str | None = None, token: str | None = None, *, silence_s: float = 120.0,
             detokenize: bool = True, timeout_s: float = 10.0, **options: Any) -> VllmBackend:
        """"vllm+http://host:port": the server's model `model` (default: its first)."""
        no_options(cls.engine, options, "the vLLM server loads its own model and drafts as it was started")
        return cls.connect(address, model=model, token=token, timeout_s=timeout_s, silence_s=silence_s,
                           detokenize=detokenize)

    @classmethod
    def connect(cls, url: str, model: str | None = None, token: str | None = None, timeout_s: float = 10.0,
                **options: Any) -> VllmBackend:
        """The server at `url` (http://host:port, without the vllm+ prefix) and one model it serves; SpecvizError
        within about timeout_s when there is none, or one that does not answer. `options`: the backend's
        silence_s and detokenize."""
        url = url.removeprefix(SCHEME).rstrip("/")
        headers = auth_headers(token)
        try:
            served = httpx.get(f"{url}/v1/models", headers=headers, timeout=timeout_s).raise_for_status().json()
        except httpx.HTTPStatusError as err:
            raise SpecvizError(f"the vLLM server at {url} answered /v1/models with {err.response.status_code}; "
                               "check the token (SPECVIZ_BACKEND_TOKEN)") from None
        except httpx.TimeoutException as err:
            raise SpecvizError(f"the server at {url} took the connection but did not answer /v1/models within "
                               f"{timeout_s:g} s ({type(err).__name__}): busy or stuck; see its log, or {START}") from None
        except httpx.ConnectError as err:
            raise SpecvizError(f"no vLLM server answers at {url} (ConnectError: {err}): nothing listens there yet. "
                               f"{STARTING}; or {START}") from None
        except (httpx.HTTPError, ValueError) as err:
            raise SpecvizError(f"the server at {url} did not answer /v1/models as vLLM does ({type(err).__name__}); "
                               f"check the address, or {START}") from None
        names = [m.get("id") for m in served.get("data", [])]
        if not names:
            raise SpecvizError(f"the vLLM server at {url} serves no model")
        if model is not None and model not in names:
            raise SpecvizError(f"the vLLM server at {url} has no model {model!r}; it serves: {', '.join(names)}")
        try:
            metrics = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
            speculative = "vllm:spec_decode_num_drafts" in metrics
        except httpx.HTTPError:
            speculative = None
        backend = cls(url, model or names[0], token, speculative, **options)
        backend.names = [str(n) for n in names]
        return backend

    @property
    def name(self) -> str:
        return self.model

    def served(self) -> list[str]:
        return list(self.names)

    def drafters(self) -> list[str]:
        """vLLM drafts with what the server was started with (its --speculative-config): one method, named after
        the engine (a run's Start says drafter "vllm")."""
        return [self.engine]

    def variants(self) -> list[str]:
        return []

    def where(self) -> str:
        how = {True: "speculative", False: "no speculative config", None: "speculation unknown"}[self.speculative]
        return f"on vLLM at {self.url} ({how}; it reports accepted counts per step, no q or tree)"

    def describe(self) -> dict[str, Any]:
        return {"name": self.model, "engine": self.engine, "device": "vllm", "dtype": "as served", "detail": self.detail,
                "drafters": self.drafters(), "where": self.where(), "speculative": self.speculative}

    def stream(self, run: Run, on_wait: OnWait | None = None) -> Events:
        prompt, settings = run.prompt, run.settings
        if run.drafter not in (None, self.engine) or run.drafter_options:
            raise SpecvizError(f"vLLM drafts with the method its server was started with: name no drafter, or "
                               f"{self.engine!r} (got {run.drafter_string()!r})")
        body = self._body(prompt, settings, run.chat)
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        started = time.perf_counter()
        try:
            with httpx.stream("POST", f"{self.url}{path}", json=body, headers=auth_headers(self.token),
                              timeout=httpx.Timeout(self.timeout_s, read=self.silence_s)) as response:
                if response.status_code != 200:
                    response.read()
                    raise SpecvizError(f"the vLLM server at {self.url} refused the run ({response.status_code}): "
                                       f"{_message(response)}")
                yield from self._events(_chunks(response.iter_lines()), prompt, settings, started)
        except httpx.ConnectError as err:
            raise SpecvizError(f"no vLLM server answers at {self.url} ({err}); {START}") from None
        except httpx.ReadTimeout:
            raise SpecvizError(f"the vLLM server at {self.url} sent nothing for {self.silence_s:.0f} s mid-run; it "
                               f"may be stuck or overloaded: {RESTART}") from None
        except httpx.HTTPError as err:
            raise SpecvizError(f"the vLLM server at {self.url} stopped answering mid-run ({type(err).__name__}: "
                               f"the connection ended; it stopped or crashed): {RESTART}") from None

    def _body(self, prompt: Prompt | list[int], settings: DecodeSettings, chat: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "stream": True, "stream_options": {"include_usage": True},
                                "return_token_ids": True, "max_tokens": settings.max_new_tokens,
                                "temperature": settings.temperature, "top_p": settings.top_p, "seed": settings.seed}
        if settings.top_k:
            body["top_k"] = settings.top_k
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return {**body, "prompt": prompt}
        if isinstance(prompt, list):
            return {**body, "messages": prompt}
        if not isinstance(prompt, str) or not prompt.strip():
            raise SpecvizError("the prompt is empty")
        return {**body, "messages": [{"role": "user", "content": prompt}]} if chat else {**body, "prompt": prompt}

    def _events(self, chunks: Iterator[dict[str, Any]], prompt: Prompt | list[int], settings: DecodeSettings,
                started: float) -> Iterator[ev.Event]:
        prompt_ids: list[int] = []
        generated: list[int] = []
        text, steps, last, start_sent = "", 0, started, False
        finish, spec = None, None
        for chunk in chunks:
            if "error" in chunk:
                raise SpecvizError(f"the vLLM server at {self.url} failed the run: {_error_text(chunk)}; {RESTART}")
            spec = ((chunk.get("metrics") or {}).get("speculative_decoding")) or spec
            choices = chunk.get("choices") or []
            for source in (chunk, *choices):
                prompt_ids = source.get("prompt_token_ids") or prompt_ids
            if choices and not start_sent:
                start_sent = True
                yield self._start(prompt, prompt_ids, settings)
            for choice in choices:
                ids = list(choice.get("token_ids") or [])
                delta = (choice.get("delta") or {}).get("content") if "delta" in choice else choice.get("text")
                finish = choice.get("finish_reason") or finish
                if not ids and not delta:
                    continue
                now = time.perf_counter()
                steps += 1
                generated += ids
                text += delta or ""
                yield self._step(steps, len(prompt_ids) + len(generated) - len(ids), ids, delta or "", now - last,
                                 now - started, len(generated))
                last = now
        if finish is None:  # a stream cut short by a server that stopped, not a run that finished
            raise SpecvizError(f"the vLLM server at {self.url} ended the run's stream after {len(generated)} "
                               f"token(s), before the run finished: {RESTART}")
        if finish in ("abort", "error"):  # vLLM ends a request its engine dropped or failed with these
            raise SpecvizError(f"the vLLM server at {self.url} ended the run with finish_reason {finish!r} after "
                               f"{len(generated)} token(s): {RESTART}")
        wall = time.perf_counter() - started
        yield ev.Done(text=text, token_ids=generated, stop_reason="max_new_tokens" if finish == "length" else "eos",
                      stats=stats_of(steps, len(generated), wall, spec))

    def _start(self, prompt: Prompt | list[int], prompt_ids: list[int], settings: DecodeSettings) -> ev.Start:
        text = prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False)
        return ev.Start(model=self.model, drafter=self.engine, sampling={"temperature": settings.temperature,
                        "top_p": settings.top_p, "top_k": settings.top_k}, options={"server": self.url},
                        seed=settings.seed, max_new_tokens=settings.max_new_tokens, prompt_text=text,
                        prompt_token_ids=list(prompt_ids), device="vllm", dtype="as served", detail=COUNTS,
                        engine=self.engine)

    def _step(self, number: int, position: int, ids: list[int], delta: str, step_s: float, elapsed: float,
              new_tokens: int) -> ev.Step:
        """One chunk as one verify step: its last token is the replacement or bonus, the ones before accepted."""
        texts = self._token_texts(ids, delta)
        kinds = ["accepted"] * (len(ids) - 1) + (["bonus" if self.speculative else "autoregressive"] if ids else [])
        return ev.Step(step=number, position=position,
                       committed=[ev.Committed(t, s, k) for t, s, k in zip(ids, texts, kinds)], text_delta=delta,
                       timing={"draft_ms": 0.0, "verify_ms": step_s * 1e3, "step_ms": step_s * 1e3,
                               "elapsed_s": elapsed, "tokens_per_s": new_tokens / elapsed if elapsed > 0 else 0.0},
                       drafted=None, accepted=max(len(ids) - 1, 0))

    def _token_texts(self, ids: list[int], delta: str) -> list[str]:
        """Each token's text: a one-token chunk's is its delta; a longer chunk's come from the server's
        /detokenize (memoised), or the whole delta on its last token where that endpoint is missing or
        `detokenize` is off."""
        if len(ids) <= 1:
            if ids:
                self._texts.setdefault(ids[0], delta)
            return [delta] * len(ids)
        if not self.detokenize:
            return [""] * (len(ids) - 1) + [delta]
        missing = [t for t in dict.fromkeys(ids) if t not in self._texts]
        try:
            for token in missing:
                answer = httpx.post(f"{self.url}/detokenize", json={"model": self.model, "tokens": [token]},
                                    headers=auth_headers(self.token), timeout=5).raise_for_status().json()
                self._texts[token] = answer.get("prompt", "")
        except (httpx.HTTPError, ValueError):
            return [""] * (len(ids) - 1) + [delta]
        return [self._texts[t] for t in ids]


def stats_of(steps: int, new_tokens: int, wall: float, spec: dict[str, Any] | None) -> dict[str, Any]:
    """The Done event's stats from what vLLM reported: its per-request speculative metrics where it sent them
    (source "vllm"), else what the chunks showed (source "chunks": a chunk of n tokens accepted n - 1)."""
    stats: dict[str, Any] = {"steps": steps, "new_tokens": new_tokens, "tau": new_tokens / steps if steps else 0.0,
                             "acceptance_rate": None, "drafted": 0, "accepted": max(new_tokens - steps, 0),
                             "per_position_acceptance": [], "wall_s": wall,
                             "tokens_per_s": new_tokens / wall if wall > 0 else 0.0,
                             "draft_s": 0.0, "verify_s": wall, "source": "chunks"}
    if spec:
        accepted, drafted = spec.get("per_step_accepted"), spec.get("per_step_drafted")
        stats.update(source="vllm", drafted=spec.get("num_draft_tokens", 0),
                     accepted=spec.get("num_accepted_draft_tokens", 0),
                     acceptance_rate=spec.get("draft_acceptance_rate"),
                     acceptance_histogram=list(spec.get("acceptance_histogram", [])),
                     mean_acceptance_length=spec.get("mean_acceptance_length"))
        if accepted and drafted:
            depth = max(drafted)
            reached = [sum(d > i for d in drafted) for i in range(depth)]  # steps whose draft reached depth i + 1
            hits = [sum(a > i for a in accepted) for i in range(depth)]  # ... and accepted a token there
            stats.update(reached=reached, accepted_at=hits, per_step_accepted=list(accepted),
                         per_position_acceptance=[h / r for h, r in zip(hits, reached) if r])
    return stats


def auth_headers(token: str | None) -> dict[str, str]:
    """The bearer-token header a server started with a key asks for (none without a token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def _chunks(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The JSON of each `data:` line of an OpenAI stream, up to [DONE]."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            yield json.loads(data)
        except ValueError:
            raise SpecvizError(f"the vLLM server sent a line that is not JSON: {data[:120]!r}") from None


def _error_text(chunk: dict[str, Any]) -> str:
    error = chunk.get("error")
    return str(error.get("message", error) if isinstance(error, dict) else error)[:300]


def _message(response: httpx.Response) -> str:
    try:
        return _error_text(response.json()) if "error" in response.json() else response.text[:300]
    except ValueError:
        return response.text[:300]
