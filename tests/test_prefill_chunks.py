"""A prompt is prefilled in chunks (engine.prefill_chunk: 256 tokens, fewer past 1,024 cached) with the run's cancel flag read between them: the
chunks cache what one forward over the prompt caches (the same bits on the 4-bit path, the same greedy output on
fp32), a cancel ends the run within one chunk, and through the service a DELETE frees the engine for the next
run within one chunk's time however long the prompt."""
from __future__ import annotations

import random
import threading
import time

import httpx
import pytest
import torch
from serving import Running
from test_q4 import needs_op, tiny_pair

from specviz.decoding import engine
from specviz.decoding import events as ev
from specviz.decoding.settings import DecodeSettings
from specviz.decoding.target import Target
from specviz.drafters.ngram import NgramDrafter
from specviz.serve.http import Service

from tiny import TinyTokenizer

PROMPT = 700  # tokens: three chunks, the last one short


def prefilled(target: Target, ids: list[int], chunk: int):
    """The prompt's hidden states and the cache, prefilled `chunk` tokens a forward."""
    cache = target.new_cache()
    hidden = torch.cat([target.forward(ids[i : i + chunk], cache, logits=False)[0] for i in range(0, len(ids), chunk)])
    return hidden, cache


@needs_op
def test_on_the_4_bit_path_chunks_cache_the_bits_of_one_forward():
    _, q4, _ = tiny_pair(max_positions=1024)
    target = Target(q4)
    ids = random.Random(0).choices(range(1, 64), k=PROMPT)
    whole, whole_cache = prefilled(target, ids, PROMPT)
    chunked, chunked_cache = prefilled(target, ids, engine.PREFILL_CHUNK)
    assert torch.equal(whole, chunked)
    for a, b in zip(whole_cache.keys + whole_cache.values, chunked_cache.keys + chunked_cache.values):
        assert torch.equal(a[:, :, :PROMPT], b[:, :, :PROMPT])
    assert torch.equal(target.forward([5], whole_cache)[1], target.forward([5], chunked_cache)[1])  # the next logits


@needs_op
def test_a_chunk_over_a_long_past_attends_in_torch_and_agrees_to_rounding(monkeypatch):
    """Past fastdecoder.LONG_PAST cached positions a prompt chunk leaves the 4-bit layer op for torch's attention
    (faster there: experiments/prefill_attention_ab.py); what it caches agrees with one forward to rounding."""
    from specviz.kernels import fastdecoder

    _, q4, _ = tiny_pair(max_positions=1024)
    target = Target(q4)
    ids = random.Random(0).choices(range(1, 64), k=PROMPT)
    whole, whole_cache = prefilled(target, ids, PROMPT)  # one forward over an empty cache: the layer op
    monkeypatch.setattr(fastdecoder, "LONG_PAST", engine.PREFILL_CHUNK)
    pasts = []
    attend = fastdecoder._Layers._attend
    monkeypatch.setattr(fastdecoder._Layers, "_attend",
                        lambda self, layer, qkv, cos, sin, keys, values, past, mask:
                        pasts.append(past) or attend(self, layer, qkv, cos, sin, keys, values, past, mask))
    chunked, chunked_cache = prefilled(target, ids, engine.PREFILL_CHUNK)
    layers = len(target.fast.stack.layers)
    assert pasts == [256] * layers + [512] * layers  # the first chunk in the op, the two after it in torch
    torch.testing.assert_close(chunked, whole, rtol=1e-4, atol=1e-4)
    for a, b in zip(whole_cache.keys + whole_cache.values, chunked_cache.keys + chunked_cache.values):
        torch.testing.assert_close(b[:, :, :PROMPT], a[:, :, :PROMPT], rtol=1e-4, atol=1e-4)
    assert target.forward([5], whole_cache)[1].argmax() == target.forward([5], chunked_cache)[1].argmax()


def test_on_fp32_chunks_give_the_same_greedy_output_and_logits_to_rounding(tiny_models, monkeypatch):
    """fp32 products over a different number of rows may round differently (the BLAS blocks them by size): the
    logits agree to rounding, and the greedy output is the same."""
    model, tokenizer = tiny_models.target, tiny_models.tokenizer
    target = Target(model)
    ids = random.Random(1).choices(range(100, 40000), k=PROMPT)
    whole, _ = prefilled(target, ids, PROMPT)
    chunked, _ = prefilled(target, ids, engine.PREFILL_CHUNK)
    torch.testing.assert_close(whole, chunked, rtol=1e-5, atol=1e-5)
    settings = DecodeSettings(max_new_tokens=24, temperature=0.0)

    def greedy() -> list[int]:
        return list(engine.decode(model, tokenizer, NgramDrafter(3), ids, settings))[-1].token_ids

    chunked_output = greedy()
    monkeypatch.setattr(engine, "PREFILL_CHUNK", 10**6)  # one forward over the whole prompt
    assert greedy() == chunked_output and len(chunked_output) == 24


def test_a_cancel_is_read_between_chunks_and_ends_the_run_there():
    _, q4, _ = tiny_pair(max_positions=1024)
    forwards, reads = [], []
    target_forward = Target.forward

    def counted(self, ids, *args, **kwargs):
        forwards.append(len(ids))
        return target_forward(self, ids, *args, **kwargs)

    def cancelled() -> bool:
        reads.append(len(forwards))
        return len(forwards) >= 2  # cancelled during the second chunk
    ids = random.Random(0).choices(range(1, 64), k=PROMPT)
    Target.forward = counted
    try:
        events = list(engine.decode(q4, TinyTokenizer(64), NgramDrafter(3), ids, DecodeSettings(max_new_tokens=8),
                                    cancelled=cancelled))
    finally:
        Target.forward = target_forward
    assert [type(e) for e in events] == [ev.Start]  # no step, no done
    assert forwards == [engine.PREFILL_CHUNK] * 2 and reads == [0, 1, 2]



def test_chunks_shrink_as_the_cached_prompt_grows(tiny_models, monkeypatch):
    """Past SHRINK_PAST cached positions each chunk takes fewer tokens, in proportion (its attention then stays what
    a first-size chunk's is), down to MIN_PREFILL_CHUNK; the engine's forwards follow prefill_chunk."""
    assert [engine.prefill_chunk(p) for p in (0, 1024, 2048, 4096, 8192, 10**6)] == [256, 256, 128, 64, 32, 32]
    monkeypatch.setattr(engine, "SHRINK_PAST", 64)
    monkeypatch.setattr(engine, "PREFILL_CHUNK", 64)
    monkeypatch.setattr(engine, "MIN_PREFILL_CHUNK", 8)
    forwards = []
    forward = Target.forward
    monkeypatch.setattr(Target, "forward", lambda self, ids, *a, **k: forwards.append(len(ids)) or forward(self, ids, *a, **k))
    ids = tiny_models.tokenizer("a b c d e f g h " * 40)["input_ids"][:601]
    list(engine.decode(tiny_models.target, tiny_models.tokenizer, NgramDrafter(3), ids, DecodeSettings(max_new_tokens=1)))
    prefill = forwards[: len(forwards) - 1]  # the last forward is the step's
    assert sum(prefill) == len(ids) - 1
    starts = [sum(prefill[:i]) for i in range(len(prefill))]
    assert prefill[:-1] == [engine.prefill_chunk(s) for s in starts[:-1]] and prefill[0] == 64 and min(prefill) < 32
    # the prefill bench times the same forwards the engine makes
    from specviz.bench.prefill import prefill_ours

    forwards.clear()
    timed = prefill_ours(Target(tiny_models.target), ids[:-1])
    assert [n for n, _ in timed] == forwards == prefill


@pytest.fixture
def slow_prefill(monkeypatch):
    """The tiny model's forwards made as slow as a real model's on a CPU: 1 ms a token."""
    forward = Target.forward

    def slow(self, ids, *args, **kwargs):
        time.sleep(len(ids) / 1000)
        return forward(self, ids, *args, **kwargs)

    monkeypatch.setattr(Target, "forward", slow)


def test_delete_frees_the_engine_within_a_chunk_of_a_long_prompt(tiny_models, slow_prefill):
    prompt = "the" + " the" * 1899  # 1,900 tokens: eight chunks, 1.9 s of prefill
    assert len(tiny_models.tokenizer.encode(prompt)) == 1900
    with Running(Service({"tiny": tiny_models})) as running:
        owner = httpx.Client(base_url=running.url, headers={"X-Specviz-Client": "long"}, timeout=30)
        created = owner.post("/v1/runs", json={"prompt": prompt, "model": "tiny", "chat": False, "max_new_tokens": 4})
        assert created.status_code == 201, created.text
        long_id = created.json()["run_id"]
        threading.Thread(target=lambda: httpx.get(f"{running.url}/v1/runs/{long_id}/events", timeout=30,
                                                  headers={"X-Specviz-Client": "long"}), daemon=True).start()
        other = httpx.Client(base_url=running.url, headers={"X-Specviz-Client": "short"}, timeout=30)
        short_id = other.post("/v1/runs", json={"prompt": "abc", "model": "tiny", "max_new_tokens": 2}).json()["run_id"]
        started: list[float] = []

        def follow_short():
            with other.stream("GET", f"/v1/runs/{short_id}/events") as response:
                for line in response.iter_lines():
                    if '"type":"start"' in line and not started:
                        started.append(time.monotonic())
        short = threading.Thread(target=follow_short)
        short.start()
        deadline = time.monotonic() + 10
        while owner.get(f"/v1/runs/{long_id}").json()["state"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.4)  # well into the prefill
        deleted = time.monotonic()
        assert owner.delete(f"/v1/runs/{long_id}").status_code == 200
        while owner.get(f"/v1/runs/{long_id}").json()["state"] != "cancelled":
            assert time.monotonic() - deleted < 10
            time.sleep(0.01)
        freed = time.monotonic() - deleted
        short.join(10)
        chunk_s = engine.PREFILL_CHUNK / 1000
        assert freed < chunk_s + 0.35, f"the engine was freed {freed:.2f} s after DELETE"
        assert started and started[0] - deleted < chunk_s + 0.5  # the next run was decoding by then
        assert owner.get(f"/v1/runs/{long_id}").json()["events"] == 1  # its start only: no step ran


def test_the_prefill_bench_times_the_engines_chunks_and_tabulates_them(tiny_models, monkeypatch):
    """specviz.bench.prefill: one forward per engine chunk over the whole prompt, and a table row per length."""
    from specviz.bench import prefill

    monkeypatch.setattr(engine, "SHRINK_PAST", 64)
    monkeypatch.setattr(engine, "PREFILL_CHUNK", 64)
    monkeypatch.setattr(engine, "MIN_PREFILL_CHUNK", 8)
    chunks = prefill.prefill_ours(Target(tiny_models.target), prefill.prompt_ids(300, 64))
    sizes = [n for n, _ in chunks]
    assert sizes[:4] == [64, 64, 32, 25] and sum(sizes) == 300 and all(s > 0 for _, s in chunks)
    row = {"tokens": 300, "ours_tokens_per_s": 1234.5, "chunks": len(chunks), "first_chunk_ms": 2.0,
           "slowest_chunk_ms": 3.0, "slowest_chunk_vs_first": 1.5, "slowest_token_vs_first": 2.25,
           "llama_tokens_per_s": {1: 999.0}}
    text = prefill.to_markdown({"model": "m", "weights": "q4q8", "rounds": 1, "threads": 2, "rows": [row]}, "cmd")
    assert "| 300 | 1234 | 999 | " in text and "llama-server tokens/s (1 thread)" in text and "`cmd`" in text
