"""A run is built once (specviz.backends.Run.of) by whoever asks, and every backend decodes it as it is: the drafter
string is parsed once on each route (the API, the CLI, the app, the bench, and a service's client and server
each), bad options are refused with the service's own messages, explicit options override the string's, and a
Run survives the trip through the service's request body."""
from __future__ import annotations

import json
import threading
from dataclasses import replace

import pytest
from serving import Running, post

import specviz
from specviz import drafters
from specviz.backends import Run, open_backend
from specviz.backends import request as request_module
from specviz.backends.local import LocalBackend
from specviz.backends.service import parameters
from specviz.decoding.settings import DecodeSettings
from specviz.drafters import options as options_module
from specviz.errors import SpecvizError
from specviz.serve.http import Service
from specviz.serve.validate import Limits, RunBody, run_request

VARIANT = "ngram:max_ngram=2"  # a drafter string with an option
PROMPT = "one two one two one two one two"


@pytest.fixture
def parses(monkeypatch) -> list[str]:
    """The name of the thread of every parse_spec call, wherever it is imported from."""
    calls: list[str] = []
    real = options_module.parse_spec

    def counted(spec):
        calls.append(threading.current_thread().name)
        return real(spec)

    for module in (options_module, drafters, request_module):
        monkeypatch.setattr(module, "parse_spec", counted)
    return calls


# ------------------------------------------------------------------------------------ parsed once per route


def test_a_local_run_parses_its_drafter_once(tiny_models, parses):
    events = list(specviz.stream(PROMPT, models=tiny_models, drafter=VARIANT, max_new_tokens=4))
    assert events[0].options["max_ngram"] == 2 and len(parses) == 1
    parses.clear()
    backend = LocalBackend(tiny_models)
    assert backend.run(PROMPT, drafter=VARIANT, max_new_tokens=4)[0]["options"]["max_ngram"] == 2
    assert len(parses) == 1


def test_the_cli_parses_its_drafter_once(tiny_model_dir, parses, capsys):
    from specviz.cli import main as cli

    assert cli.main(["generate", "--model", str(tiny_model_dir), "--device", "cpu", "--prompt", PROMPT, "--drafter",
                     VARIANT, "--max-new-tokens", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] and len(parses) == 1


def test_the_bench_parses_each_runs_drafter_once(tiny_models, parses):
    from specviz.bench.prompts import Prompt
    from specviz.bench.run import run_drafter
    from specviz.bench.settings import BenchSettings

    ids = tiny_models.tokenizer(PROMPT)["input_ids"]
    run = run_drafter(tiny_models, VARIANT, Prompt("p", PROMPT), ids, BenchSettings(max_new_tokens=4))
    assert run.token_ids and len(parses) == 1


def test_the_apps_run_parses_its_drafter_once(parses):
    from app.state import Settings

    settings = Settings(model="tiny", drafter="eagle2:lookup=4", tree=(("depth", 3), ("lookup", 0)))
    run = settings.run("hi")
    assert (run.drafter, run.drafter_options) == ("eagle2", {"depth": 3, "lookup": 4})  # the variant's own win
    assert len(parses) == 1


def test_a_service_run_parses_its_drafter_once_on_each_side(tiny_models, parses):
    with Running(Service({"tiny": tiny_models})) as running:
        backend = open_backend(running.url)
        parses.clear()
        events = backend.run(PROMPT, drafter=VARIANT, max_new_tokens=4, temperature=0.0)
        [asked] = [r.request for r in running.service.scheduler.runs.values()]
    client = [name for name in parses if name == threading.main_thread().name]
    assert events[0]["options"]["max_ngram"] == 2 and events[-1]["type"] == "done"
    assert len(client) == 1 and len(parses) - len(client) == 1  # the client's Run.of, then the service's
    assert (asked.drafter, asked.drafter_options, asked.model) == ("ngram", {"max_ngram": 2}, "tiny")


# ------------------------------------------------------------------------------------ what is refused, and how


SERVED_REFUSALS = [  # (drafter, options, the service's message)
    ("ngram", {"head": "/tmp/x"}, "drafter option head= names a folder on the server; the service runs only the heads "
                                  "it loaded"),
    ("ngram:foo=1", {}, "ngram option(s) 'foo' are not offered by the service; it takes: k, max_ngram, min_ngram"),
    ("ngram", {"tree": "x"}, "ngram option(s) 'tree' are not offered by the service; it takes: k, max_ngram, "
                             "min_ngram"),
    ("ngram:max_ngram=100", {}, "ngram option max_ngram must be a whole number from 1 to 8, got 100"),
    ("ngram:k=99", {}, "ngram option k must be a whole number from 1 to 16, got 99"),
    ("ngram:x", {}, "drafter 'ngram:x' is not NAME or NAME:KEY=VALUE:KEY=VALUE..."),
    ("ngram", {"x" * 40: 1}, f"drafter option {'x' * 40!r}: names and values are at most 32 characters"),
    ("ngram:" + "k" * 300, {}, "a drafter with its options is at most 256 characters here, got 'ngram:kkkkkkkkkkkkkk"),
    ("none", {"depth": 3}, "none option(s) 'depth' are not offered by the service; it takes: k_policy"),
]


@pytest.fixture(scope="module")
def served(tiny_models):
    with Running(Service({"tiny": tiny_models})) as running:
        yield running


@pytest.mark.parametrize("drafter,options,message", SERVED_REFUSALS, ids=[str(i) for i in range(len(SERVED_REFUSALS))])
def test_served_options_are_refused_with_the_services_messages(served, drafter, options, message):
    with pytest.raises(SpecvizError) as refused:
        Run.of("hi", drafter, options, served=True)
    assert str(refused.value).startswith(message)
    response = post(served.url, {"prompt": "hi", "max_new_tokens": 2, "drafter": drafter, "drafter_options": options})
    assert response.status_code == 400 and response.json()["error"]["message"] == str(refused.value)


@pytest.mark.parametrize("drafter", ["magic:lookup=4", "eagle2:lookup=4"])
def test_a_drafter_the_service_does_not_run_is_refused_after_its_checks(served, drafter):
    response = post(served.url, {"prompt": "hi", "drafter": drafter})
    assert response.status_code == 400
    name = drafter.split(":")[0]
    assert response.json()["error"]["message"] == f"drafter {name!r} is not available for tiny; available: none, ngram"


def test_unknown_options_are_refused_as_make_drafter_refuses_them():
    with pytest.raises(SpecvizError, match="unknown ngram options: foo; it takes: k, max_ngram, min_ngram"):
        Run.of("hi", "ngram:foo=1")
    with pytest.raises(SpecvizError, match="drafter option 'x' in 'ngram:x' is not KEY=VALUE"):
        Run.of("hi", "ngram:x")
    with pytest.raises(TypeError, match="unknown argument"):
        Run.of("hi", max_tokens=3)


def test_another_engines_drafter_is_left_to_that_engine():
    run = Run.of("hi", "vllm")
    assert (run.drafter, run.drafter_options, run.drafter_string()) == ("vllm", {}, "vllm")
    assert Run.of("hi").drafter is None and Run.of("hi").drafter_string() is None


# ------------------------------------------------------------------------------------ what a Run holds


def test_explicit_options_override_the_strings(tiny_models):
    run = Run.of(PROMPT, "ngram:max_ngram=3:min_ngram=1", {"max_ngram": 2}, max_new_tokens=4)
    assert run.drafter == "ngram" and run.drafter_options == {"max_ngram": 2, "min_ngram": 1}
    assert run.drafter_string() == "ngram:max_ngram=2:min_ngram=1"
    assert drafters.parse_spec(run.drafter_string()) == (run.drafter, run.drafter_options)
    start = next(iter(LocalBackend(tiny_models).stream(run)))
    assert start.options["max_ngram"] == 2


def test_settings_and_decode_fields_are_bounded_once():
    run = Run.of("hi", settings=DecodeSettings(max_new_tokens=9, seed=4), temperature=0.5, detail=False)
    assert run.settings == DecodeSettings(max_new_tokens=9, seed=4, temperature=0.5, n_top=0)
    with pytest.raises(SpecvizError, match="max_new_tokens must be"):
        Run.of("hi", max_new_tokens=0)


@pytest.mark.parametrize("prompt,chat,detail", [("abc abc", True, True), ("abc abc", False, False),
                                                ([{"role": "user", "content": "abc"}], True, True)])
def test_a_run_round_trips_through_the_services_body(tiny_models, prompt, chat, detail):
    run = Run.of(prompt, "ngram:max_ngram=2", {"min_ngram": 1}, chat=chat, detail=detail, max_new_tokens=5,
                 temperature=0.5, seed=3)
    body = {"messages" if isinstance(prompt, list) else "prompt": prompt, **parameters(run, "tiny")}
    assert body["drafter"] == "ngram" and body["drafter_options"] == {"max_ngram": 2, "min_ngram": 1}
    back = run_request({"tiny": tiny_models}, RunBody.model_validate(body), Limits(), "tiny")
    assert back == replace(run, model="tiny")


def test_a_ready_run_takes_no_other_arguments(tiny_models):
    backend = LocalBackend(tiny_models)
    run = Run.of(PROMPT, "ngram", max_new_tokens=3)
    assert backend.run(run)[-1]["type"] == "done"
    with pytest.raises(TypeError, match="a ready Run takes no other arguments, got drafter"):
        backend.run(run, drafter="none")
