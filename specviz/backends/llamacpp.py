"""The llama.cpp backend: a client of an unmodified llama-server (`llama+http://host:port`), speculating or not as
it was started (`--spec-type draft-simple|draft-eagle3|ngram-mod|...`).

What llama-server shows, and so what this backend's events carry (detail COUNTS): each generated token with its
text, and, with `timings_per_token`, the request's running counts of drafted and accepted tokens and the time of
the step that made each token. A run becomes steps this way: llama-server streams one chunk per token, and every
token of one verify step carries the same `predicted_ms` (the server stamps the step once, after verifying), so
consecutive chunks with the same stamp are one step; the step drafted the rise in `draft_n` since the step before
and accepted all its tokens but the last (the replacement or bonus). llama.cpp exposes no q, no tree and no u: the
pages say so instead of drawing them.

A chat prompt goes through the server's own template (`/apply-template`), then `/completion`, so the stream is
llama.cpp's native one. Faults are SpecvizErrors naming the server and what to try: nothing listening, a server
that does not answer, a refused run, a stream that ends before the run finished (the server stopped), a stream
silent for `silence_s`, and an answer that is not llama-server's.

Start the server as docs/llamacpp.md says (`make llamacpp`, then `specviz llamacpp serve`); `llama+http://host:8080`
(or `SPECVIZ_BACKEND=llama+http://...`) picks it.
"""
from __future__ import annotations

import json
import time
from typing import Any, Iterator

import httpx

from specviz.backends.base import COUNTS, Backend, Capabilities, Events, OnWait, Prompt, Run, no_options
from specviz.backends.vllm import auth_headers as _auth
from specviz.backends.vllm import stats_of
from specviz.decoding import events as ev
from specviz.decoding.settings import DecodeSettings
from specviz.errors import SpecvizError

SCHEME = "llama+"
START = "start one as docs/llamacpp.md says (`make llamacpp`, then `specviz llamacpp serve`), or check the address"
RESTART = "see the end of the server's log for why, and start it again (docs/llamacpp.md)"


class LlamaCppBackend(Backend):
    """Counts only: per step the drafted and accepted counts and the committed tokens; one drafting method, the
    one its server was started with."""

    engine = "llamacpp"
    capabilities = Capabilities(detail=COUNTS, tree=False, q_values=False, drafter_choice=False, batching=True)

    def __init__(self, url: str, model: str, token: str | None = None, speculative: bool | None = None,
                 timeout_s: float = 30.0, silence_s: float = 120.0, props: dict[str, Any] | None = None):
        self.url, self.model, self.token = url.rstrip("/"), model, token
        self.speculative = speculative  # whether its /metrics count speculative drafts (None: /metrics is off)
        self.timeout_s, self.silence_s = timeout_s, silence_s
        self.props = props or {}

    @classmethod
    def open(cls, address: str, model: str | None = None, token: str | None = None, *, silence_s: float = 120.0,
             timeout_s: float = 10.0, **options: Any) -> LlamaCppBackend:
        """"llama+http://host:port": the server's model (llama-server serves one; `model` must be its name)."""
        no_options(cls.engine, options, "llama-server loads its own model and drafts as it was started")
        url = address.removeprefix(SCHEME).rstrip("/")
        headers = _auth(token)
        try:
            served = httpx.get(f"{url}/v1/models", headers=headers, timeout=timeout_s).raise_for_status().json()
            props = httpx.get(f"{url}/props", headers=headers, timeout=timeout_s).raise_for_status().json()
        except httpx.HTTPStatusError as err:
            code, path = err.response.status_code, err.request.url.path
            if code in (401, 403):
                raise SpecvizError(f"the llama.cpp server at {url} answered {path} with {code}: check the token "
                                   "(SPECVIZ_BACKEND_TOKEN, llama-server's --api-key)") from None
            raise SpecvizError(f"the server at {url} answered {path} with {code}, which llama-server does not: it is "
                               f"not a llama-server (a vLLM server is vllm+http://...), or {START}") from None
        except httpx.TimeoutException as err:
            raise SpecvizError(f"the server at {url} took the connection but did not answer within {timeout_s:g} s "
                               f"({type(err).__name__}): busy, stuck or still loading; see its log, or {START}") from None
        except httpx.ConnectError as err:
            raise SpecvizError(f"no llama.cpp server answers at {url} (ConnectError: {err}): {START}") from None
        except (httpx.HTTPError, ValueError) as err:
            raise SpecvizError(f"the server at {url} did not answer /v1/models and /props as llama-server does "
                               f"({type(err).__name__}); check the address, or {START}") from None
        if not isinstance(served, dict) or not isinstance(props, dict) or "default_generation_settings" not in props:
            raise SpecvizError(f"the server at {url} is not a llama-server (its /props has no generation settings); "
                               f"check the address, or {START}")
        names = [str(m.get("id")) for m in served.get("data", []) if isinstance(m, dict)]
        if not names:
            raise SpecvizError(f"the llama.cpp server at {url} serves no model")
        if model is not None and model not in names:
            raise SpecvizError(f"the llama.cpp server at {url} has no model {model!r}; it serves: {', '.join(names)}")
        try:
            metrics = httpx.get(f"{url}/metrics", headers=headers, timeout=timeout_s)
            speculative = "llamacpp:spec_decode" in metrics.text if metrics.status_code == 200 else None
        except httpx.HTTPError:
            speculative = None
        return cls(url, model or names[0], token, speculative, timeout_s=timeout_s, silence_s=silence_s, props=props)

    @property
    def name(self) -> str:
        return self.model

    def drafters(self) -> list[str]:
        """llama.cpp drafts with what the server was started with (its --spec-type): one method, named after the
        engine (a run's Start says drafter "llamacpp")."""
        return [self.engine]

    def variants(self) -> list[str]:
        return []

    def where(self) -> str:
        how = {True: "speculative", False: "not speculating", None: "speculation unknown: start it with --metrics"}
        return f"on llama.cpp at {self.url} ({how[self.speculative]}; it reports accepted counts per step, no q or tree)"

    def describe(self) -> dict[str, Any]:
        return {"name": self.model, "engine": self.engine, "device": "llama.cpp", "dtype": "as served",
                "detail": self.detail, "drafters": self.drafters(), "where": self.where(),
                "speculative": self.speculative, "build": self.props.get("build_info")}

    def stream(self, run: Run, on_wait: OnWait | None = None) -> Events:
        prompt, settings = run.prompt, run.settings
        if run.drafter not in (None, self.engine) or run.drafter_options:
            raise SpecvizError(f"llama.cpp drafts with the method its server was started with: name no drafter, or "
                               f"{self.engine!r} (got {run.drafter_string()!r})")
        body = {**self.sampling(settings), "prompt": self._prompt(prompt, run.chat), "stream": True,
                "return_tokens": True, "timings_per_token": True, "cache_prompt": False}
        started = time.perf_counter()
        try:
            with httpx.stream("POST", f"{self.url}/completion", json=body, headers=_auth(self.token),
                              timeout=httpx.Timeout(self.timeout_s, read=self.silence_s)) as response:
                if response.status_code != 200:
                    response.read()
                    raise SpecvizError(f"the llama.cpp server at {self.url} refused the run "
                                       f"({response.status_code}): {_message(response)}")
                yield from self._events(_chunks(response.iter_lines(), self.url), prompt, body["prompt"], settings,
                                        started)
        except httpx.ConnectError as err:
            raise SpecvizError(f"no llama.cpp server answers at {self.url} ({err}); {START}") from None
        except httpx.ReadTimeout:
            raise SpecvizError(f"the llama.cpp server at {self.url} sent nothing for {self.silence_s:.0f} s mid-run; "
                               f"it may be stuck or overloaded: {RESTART}") from None
        except httpx.HTTPError as err:
            raise SpecvizError(f"the llama.cpp server at {self.url} stopped answering mid-run ({type(err).__name__}: "
                               f"the connection ended; it stopped or crashed): {RESTART}") from None

    @staticmethod
    def sampling(settings: DecodeSettings) -> dict[str, Any]:
        """/completion's sampler fields for ours: greedy at T = 0 (llama.cpp's temperature 0), else temperature,
        top-p and top-k (0: none, as ours) with every other llama.cpp sampler and penalty off."""
        off = {"min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
               "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "top_n_sigma": -1.0}
        fields = {**off, "n_predict": settings.max_new_tokens, "seed": settings.seed}
        if settings.temperature <= 0:
            return {**fields, "temperature": 0.0, "top_k": 1, "top_p": 1.0}
        return {**fields, "temperature": settings.temperature, "top_k": settings.top_k or 0, "top_p": settings.top_p}

    def _prompt(self, prompt: Prompt | list[int], chat: bool) -> str | list[int]:
        """What /completion is given: token ids as they are, a text as it is (chat False), chat messages or a text
        as chat through the server's template."""
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)  # type: ignore[arg-type]
        if isinstance(prompt, str) and not prompt.strip():
            raise SpecvizError("the prompt is empty")
        if isinstance(prompt, str) and not chat:
            return prompt
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        try:
            answer = httpx.post(f"{self.url}/apply-template", json={"messages": messages}, headers=_auth(self.token),
                                timeout=self.timeout_s).raise_for_status().json()
            return str(answer["prompt"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as err:
            raise SpecvizError(f"the llama.cpp server at {self.url} did not apply its chat template "
                               f"({type(err).__name__}); give a plain prompt (chat off), or {RESTART}") from None

    def _events(self, chunks: Iterator[dict[str, Any]], prompt: Prompt | list[int], sent: str | list[int],
                settings: DecodeSettings, started: float) -> Iterator[ev.Event]:
        yield self._start(prompt, sent if isinstance(sent, list) else [], settings)
        generated: list[int] = []
        text, last = "", started
        steps: list[ev.Step] = []
        pending: list[tuple[int, str]] = []  # the tokens of the step being read, with their text
        stamp, draft_seen, draft_before, prompt_n = None, 0, 0, len(sent) if isinstance(sent, list) else 0
        final: dict[str, Any] | None = None
        for chunk in chunks:
            timings = chunk.get("timings") or {}
            if chunk.get("stop"):
                final = chunk
                break
            prompt_n = int(chunk.get("tokens_evaluated") or prompt_n)
            tokens = [int(t) for t in chunk.get("tokens") or []]
            if not tokens:
                continue
            step_stamp = timings.get("predicted_ms")
            if pending and step_stamp != stamp:  # a new step began: the one read is complete
                now = time.perf_counter()
                steps.append(self._step(len(steps) + 1, pending, draft_seen - draft_before, now - last, started,
                                        prompt_n, len(generated)))
                yield steps[-1]
                draft_before, pending, last = draft_seen, [], now
            stamp = step_stamp
            draft_seen = int(timings.get("draft_n", draft_seen))
            content = str(chunk.get("content", ""))
            pending += [(t, content if i == len(tokens) - 1 else "") for i, t in enumerate(tokens)]
            generated += tokens
            text += content
        if final is None:
            raise SpecvizError(f"the llama.cpp server at {self.url} ended the run's stream after {len(generated)} "
                               f"token(s), before the run finished: {RESTART}")
        if pending:
            now = time.perf_counter()
            draft_seen = int((final.get("timings") or {}).get("draft_n", draft_seen))
            steps.append(self._step(len(steps) + 1, pending, draft_seen - draft_before, now - last, started,
                                    prompt_n, len(generated)))
            yield steps[-1]
        wall = time.perf_counter() - started
        yield ev.Done(text=text, token_ids=generated,
                      stop_reason="max_new_tokens" if final.get("stop_type") == "limit" else "eos",
                      stats=self.stats(steps, final, wall))

    def _start(self, prompt: Prompt | list[int], prompt_ids: list[int], settings: DecodeSettings) -> ev.Start:
        text = prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False)
        return ev.Start(model=self.model, drafter=self.engine, sampling={"temperature": settings.temperature,
                        "top_p": settings.top_p, "top_k": settings.top_k}, options={"server": self.url},
                        seed=settings.seed, max_new_tokens=settings.max_new_tokens, prompt_text=text,
                        prompt_token_ids=list(prompt_ids), device="llama.cpp", dtype="as served", detail=COUNTS,
                        engine=self.engine)

    def _step(self, number: int, tokens: list[tuple[int, str]], drafted: int, step_s: float, started: float,
              prompt_n: int, new_tokens: int) -> ev.Step:
        """One verify step: its last token is the replacement or bonus (or, with nothing drafted, the plain
        one), the ones before accepted drafts."""
        elapsed = time.perf_counter() - started
        last = "autoregressive" if drafted == 0 else "bonus" if len(tokens) - 1 == drafted else "replacement"
        kinds = ["accepted"] * (len(tokens) - 1) + [last]
        return ev.Step(step=number, position=prompt_n + new_tokens - len(tokens),
                       committed=[ev.Committed(t, s, k) for (t, s), k in zip(tokens, kinds)],
                       text_delta="".join(s for _, s in tokens),
                       timing={"draft_ms": 0.0, "verify_ms": step_s * 1e3, "step_ms": step_s * 1e3,
                               "elapsed_s": elapsed, "tokens_per_s": new_tokens / elapsed if elapsed > 0 else 0.0},
                       drafted=max(drafted, 0), accepted=len(tokens) - 1)

    @staticmethod
    def stats(steps: list[ev.Step], final: dict[str, Any], wall: float) -> dict[str, Any]:
        """The Done event's stats: per-step counts as the stream showed them, totals as the server counted them
        (its final timings' draft_n and draft_n_accepted), and llama.cpp's mean acceptance length (1 + accepted
        per verify step, over the steps that drafted)."""
        drafted = [int(s.drafted or 0) for s in steps]
        accepted = [int(s.accepted or 0) for s in steps]
        timings = final.get("timings") or {}
        total_drafted, total_accepted = int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
        verify_steps = sum(d > 0 for d in drafted)
        spec = {"per_step_accepted": accepted, "per_step_drafted": drafted, "num_draft_tokens": total_drafted,
                "num_accepted_draft_tokens": total_accepted,
                "draft_acceptance_rate": total_accepted / total_drafted if total_drafted else None,
                "mean_acceptance_length": 1 + total_accepted / verify_steps if verify_steps else None}
        new_tokens = sum(len(s.committed) for s in steps)
        stats = stats_of(len(steps), new_tokens, wall, spec if total_drafted else None)
        stats.update(source="llamacpp", server_tokens_per_s=timings.get("predicted_per_second"),
                     server_prompt_tokens_per_s=timings.get("prompt_per_second"), server_steps_with_draft=verify_steps)
        return stats


def _chunks(lines: Iterator[str], url: str) -> Iterator[dict[str, Any]]:
    """The JSON of each `data:` line of llama-server's stream; an error line as a SpecvizError."""
    for line in lines:
        if line.startswith("error:"):
            raise SpecvizError(f"the llama.cpp server at {url} failed the run: {line[6:].strip()[:300]}; {RESTART}")
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise SpecvizError(f"the llama.cpp server at {url} sent a line that is not JSON: {data[:120]!r}") from None
        if not isinstance(chunk, dict):
            raise SpecvizError(f"the llama.cpp server at {url} sent {data[:120]!r}, not a completion chunk")
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message", error) if isinstance(error, dict) else error
            raise SpecvizError(f"the llama.cpp server at {url} failed the run: {str(message)[:300]}; {RESTART}")
        yield chunk


def _message(response: httpx.Response) -> str:
    try:
        data = response.json()
        error = data.get("error", data) if isinstance(data, dict) else data
        return str(error.get("message", error) if isinstance(error, dict) else error)[:300]
    except ValueError:
        return response.text[:300]
