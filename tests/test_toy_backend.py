"""Adding an engine is its module, its registry line and its stand-in server: a toy engine written the way
CONTRIBUTING.md says ("echo+http://", a server that streams the prompt's words back, two per step), registered,
then run through every conformance case, `specviz generate --backend` and the app's sidebar address field, with no
other file touched."""
from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from streamlit.testing.v1 import AppTest
from test_backends_conformance import Engine, conform

from specviz import backends
from specviz.backends.base import COUNTS, Backend, Capabilities, Events, OnWait, Run, no_options
from specviz.cli import main as cli
from specviz.decoding import events as ev
from specviz.errors import SpecvizError

ROOT_DIR = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ 1. the module (specviz/backends/echo.py)


class EchoBackend(Backend):
    """An echo server's one model: its steps are the words it sends back, its detail counts only."""

    engine = "echo"
    capabilities = Capabilities(detail=COUNTS, tree=False, q_values=False, drafter_choice=False)

    def __init__(self, url: str, model: str):
        self.url, self.model = url, model

    @classmethod
    def open(cls, address: str, model: str | None = None, token: str | None = None, **options: Any) -> EchoBackend:
        no_options(cls.engine, options, "the echo server has no settings")
        url = address.removeprefix("echo+")
        try:
            names = httpx.get(f"{url}/models", timeout=5).raise_for_status().json()["models"]
        except httpx.HTTPError as err:
            raise SpecvizError(f"no echo server answers at {url} ({type(err).__name__})") from None
        return cls(url, model or names[0])

    @property
    def name(self) -> str:
        return self.model

    def drafters(self) -> list[str]:
        return [self.engine]  # it drafts as it was started

    def variants(self) -> list[str]:
        return []

    def where(self) -> str:
        return f"on the echo server at {self.url}"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "engine": self.engine, "device": "echo", "dtype": "words", "detail": self.detail,
                "drafters": self.drafters(), "where": self.where()}

    def stream(self, run: Run, on_wait: OnWait | None = None) -> Events:
        settings = run.settings
        if run.drafter not in (None, self.engine) or run.drafter_options:
            raise SpecvizError(f"the echo server drafts as it was started; got drafter {run.drafter_string()!r}")
        text = run.prompt if isinstance(run.prompt, str) else run.prompt[-1]["content"]
        yield ev.Start(model=self.model, drafter=self.engine, sampling={"temperature": settings.temperature, "top_p": settings.top_p, "top_k": settings.top_k},
                       options={}, seed=settings.seed, max_new_tokens=settings.max_new_tokens, prompt_text=text,
                       prompt_token_ids=[], device="echo", dtype="words", detail=COUNTS, engine=self.engine)
        ids: list[int] = []
        out, started = "", time.perf_counter()
        with httpx.stream("POST", f"{self.url}/echo", json={"text": text, "max_tokens": settings.max_new_tokens},
                          timeout=10) as response:
            for n, line in enumerate(response.iter_lines(), 1):
                step = json.loads(line)
                elapsed = time.perf_counter() - started
                timing = {"draft_ms": 0.0, "verify_ms": 0.0, "step_ms": 0.0, "elapsed_s": elapsed, "tokens_per_s": 0.0}
                yield ev.Step(step=n, position=len(ids), text_delta=step["text"], drafted=len(step["ids"]) - 1,
                              accepted=len(step["ids"]) - 1, timing=timing,
                              committed=[ev.Committed(t, w, "accepted" if i < len(step["ids"]) - 1 else "bonus")
                                         for i, (t, w) in enumerate(zip(step["ids"], step["words"]))])
                ids, out = ids + step["ids"], out + step["text"]
        wall = time.perf_counter() - started
        steps = n if ids else 0
        yield ev.Done(text=out, token_ids=ids, stop_reason="max_new_tokens" if len(ids) == settings.max_new_tokens
                      else "eos", stats={"steps": steps, "new_tokens": len(ids), "tau": len(ids) / max(steps, 1),
                                         "acceptance_rate": None, "drafted": 0, "accepted": len(ids) - steps,
                                         "per_position_acceptance": [], "wall_s": wall,
                                         "tokens_per_s": len(ids) / wall, "draft_s": 0.0, "verify_s": wall})


# ------------------------------------------------------------------ 2. its line in specviz/backends/__init__.py


@pytest.fixture
def echo():
    backends.register("echo+http://", EchoBackend.open)  # in the package: register("echo+http://", "specviz.backends.echo:EchoBackend.open")
    yield
    backends.unregister("echo+http://")


# ------------------------------------------------------------------ 3. its stand-in server


def echo_app() -> FastAPI:
    api = FastAPI()

    @api.get("/models")
    async def models() -> dict:
        return {"models": ["echo-1"]}

    @api.post("/echo")
    async def answer(request: Request) -> StreamingResponse:
        body = await request.json()
        words = (body["text"].split() * body["max_tokens"])[: body["max_tokens"]]

        async def lines():
            for at in range(0, len(words), 2):
                pair = [f"{w} " for w in words[at:at + 2]]
                yield json.dumps({"ids": [len(w) for w in pair], "words": pair, "text": "".join(pair)}) + "\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    return api


class EchoServer:
    def __enter__(self) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(echo_app(), host="127.0.0.1", port=port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        return f"echo+http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class echo_engine:  # noqa: N801  (a conformance case: a context manager giving the address and its options)
    def __init__(self, *models):
        self.server = EchoServer()

    def __enter__(self):
        return self.server.__enter__(), {}

    def __exit__(self, *exc):
        self.server.__exit__(*exc)


# ------------------------------------------------------------------ 4. the tests


def test_it_passes_every_conformance_case(echo, tmp_path, tiny_model_dir, tiny_models):
    from serving import free_port

    conform(Engine(echo_engine, lambda tmp: f"echo+http://127.0.0.1:{free_port()}"), tmp_path, tiny_model_dir,
            tiny_models)


def test_specviz_generate_runs_on_it_by_address(echo, capsys):
    with EchoServer() as address:
        assert cli.main(["generate", "--backend", address, "--prompt", "hello big world", "--json",
                         "--max-new-tokens", "4"]) == 0
        assert json.loads(capsys.readouterr().out)["text"] == "hello big world hello "
        assert cli.main(["generate", "--backend", address, "--prompt", "x", "--drafter", "ngram"]) == 2
    assert "the echo server drafts as it was started" in capsys.readouterr().err


def test_the_apps_sidebar_opens_it_from_the_address_field(echo, monkeypatch):
    monkeypatch.delenv("SPECVIZ_BACKEND", raising=False)
    monkeypatch.delenv("SPECVIZ_DEFAULT_MODEL", raising=False)
    with EchoServer() as address:
        at = AppTest.from_file(str(ROOT_DIR / "app.py"), default_timeout=120)
        at.run()
        at.sidebar.radio(key="sb_source").set_value("engine address")
        at.run()
        at.sidebar.text_input(key="sb_address").set_value(address)
        at.run()
        assert any("the engine on the echo server at" in c.value for c in at.sidebar.caption)
        at.switch_page("app/pages/live.py")
        at.run()
        at.sidebar.slider(key="sb_max_new").set_value(4)
        at.run()
        at.button(key="live_run").click()
        at.run()
        assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
        assert "".join(h.proto.body for h in at.html).count('class="specviz-token"') == 4


def test_without_its_line_the_address_is_refused():
    with pytest.raises(SpecvizError, match="unknown backend address 'echo\\+http://"):
        backends.open_backend("echo+http://127.0.0.1:1")
