"""The llama.cpp backend, bench lanes and observatory against the real llama-server (`make llamacpp`), on the embedded
model's GGUF: `make test-llamacpp` runs these (they are skipped, saying why, where llama-server is not built).

What they hold: the steps the backend reads from llama-server's stream add up to what the server itself counted
(its final timings and its /metrics, per position too), so the step reconstruction is llama.cpp's own; llama.cpp
plain and our `none` write the same greedy tokens on a plain prompt (both take the GGUF's 4-bit weights and
8-bit activations; a difference at a near-tie would be numerics, and this prompt has none in its first tokens);
our exported EAGLE-3 head and draft model load and are accepted; a server killed mid-run is a clear error."""
from __future__ import annotations

import concurrent.futures
import os
import signal

import pytest

from specviz import models as specviz_models
from specviz import observatory
from specviz.backends import open_backend
from specviz.errors import SpecvizError
from specviz.llamacpp.build import installed
from specviz.llamacpp.files import ggufs
from specviz.llamacpp.server import LlamaServer

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]
MODEL = "smollm2-135m"
LOOP = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu. " * 6  # (no chat) the model loops: n-grams match
CODE = "Write a Python function that returns the sum of the squares of a list of numbers. Repeat the function twice."
BINARY = installed()
if BINARY is None:
    pytest.skip("llama-server is not built: `make llamacpp`", allow_module_level=True)
if not specviz_models.is_fetched(MODEL):
    pytest.skip(f"needs the fetched {MODEL} (`make fetch`)", allow_module_level=True)


def run(backend, prompt, **kwargs):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(backend.run, prompt, **{"max_new_tokens": 48, "temperature": 0.0, **kwargs}).result(300)


@pytest.fixture(scope="module")
def files():
    return ggufs(MODEL, ["draft-eagle3", "draft-simple"])


def counted(events):
    steps = [e for e in events if e["type"] == "step"]
    return sum(s["drafted"] for s in steps), sum(s["accepted"] for s in steps), steps


@pytest.mark.parametrize("spec_type, draft", [("ngram-mod", None), ("draft-eagle3", "eagle3"),
                                              ("draft-simple", "draft")])
def test_the_steps_read_from_the_stream_add_up_to_the_servers_own_counts(files, spec_type, draft):
    with LlamaServer(BINARY, files["target"], spec_type=spec_type, draft=files.get(draft) if draft else None,
                     draft_max=3 if draft else None, threads=2) as server:
        watcher = observatory.Watcher(server.url)
        before = watcher.poll()
        backend = open_backend("llama+" + server.url)
        events = run(backend, CODE) if draft else run(backend, LOOP, chat=False, max_new_tokens=128)
        after = watcher.poll()
    drafted, accepted, steps = counted(events)
    stats = events[-1]["stats"]
    assert stats["drafted"] == drafted and stats["accepted"] == accepted  # the final timings' draft_n(_accepted)
    assert drafted > 0 and accepted > 0, f"{spec_type} drafted {drafted}, accepted {accepted}"
    w = observatory.window(before, after)
    assert w.draft_tokens == drafted and w.accepted == accepted
    assert w.drafts == sum(s["drafted"] > 0 for s in steps)  # llama.cpp's verify steps are our steps that drafted
    at = [sum(s["accepted"] > i for s in steps) for i in range(len(w.accepted_per_pos))]
    assert list(w.accepted_per_pos) == at  # per position, as the server counted it
    assert sum(len(s["committed"]) for s in steps) == len(events[-1]["token_ids"])
    assert events[-1]["text"] == "".join(s["text_delta"] for s in steps)


def test_llamacpp_plain_writes_our_none_tokens(files):
    from specviz.decoding.prompt import encode_prompt

    local = open_backend(f"local:{MODEL}")
    ids = encode_prompt(local.models_here().tokenizer, CODE)  # the same prompt tokens to both
    ours_ids = run(local, ids, drafter="none")[-1]["token_ids"]
    with LlamaServer(BINARY, files["target"], threads=2) as server:
        theirs = run(open_backend("llama+" + server.url), ids)[-1]["token_ids"]
    same = next((i for i, (a, b) in enumerate(zip(ours_ids, theirs)) if a != b), min(len(ours_ids), len(theirs)))
    assert same >= 16, f"llama.cpp plain parts from our none at token {same}: {ours_ids[:same + 1]} vs {theirs[:same + 1]}"


def test_a_server_killed_mid_run_is_a_clear_error(files):
    with LlamaServer(BINARY, files["target"], threads=1) as server:
        backend = open_backend("llama+" + server.url, silence_s=20)
        with pytest.raises(SpecvizError, match="mid-run|ended the run's stream"):
            with backend.events(CODE, max_new_tokens=400, temperature=0.0) as stream:
                next(stream)
                next(stream)
                os.killpg(server.process.pid, signal.SIGKILL)
                for _ in stream:
                    pass
