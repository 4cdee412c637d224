"""A prompt is prefilled in chunks (engine.prefill_slices: 256 tokens, then each sized to the first one's time) with the
run's cancel flag read between them: the chunks cache what one forward over the prompt caches (the same bits on the
4-bit path, the same greedy output on fp32), a cancel ends the run within one chunk, chunks stay as fast as the
first while a token's attention grows with the prompt, and through the service a DELETE frees the engine for the
next run within about the first chunk's time however long the prompt."""
from __future__ import annotations

import itertools
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
    assert forwards == [engine.PREFILL_CHUNK, engine.PREFILL_CHUNK // 2] and reads == [0, 1, 2]



def modelled_chunks(n: int, ms_per_token) -> list[tuple[int, int, float]]:
    """(start, tokens, seconds) of each slice prefill_slices gives when a chunk's tokens take ms_per_token(its middle
    position) each on its clock."""
    now = [0.0]
    chunks = []
    for part in engine.prefill_slices(n, lambda: now[0]):
        tokens = part.stop - part.start
        seconds = tokens * ms_per_token((part.start + part.stop) / 2) / 1e3
        now[0] += seconds
        chunks.append((part.start, tokens, seconds))
    return chunks


def test_chunks_shrink_to_the_first_ones_time_as_attention_grows():
    """A token's time grows with the cached positions before it: after a half-size second chunk each takes as many
    tokens as fit in the first chunk's time (at 1 ms a token plus 1 ms per 1,024 cached, 256 tokens would take 8 times
    the first's by 8,000), never fewer than MIN_PREFILL_CHUNK; the slices cover the prompt once, in order."""
    chunks = modelled_chunks(8000, lambda position: 1 + position / 1024)
    first = chunks[0][2]
    assert [t for _, t, _ in chunks[:2]] == [engine.PREFILL_CHUNK, engine.PREFILL_CHUNK // 2]
    assert [start for start, *_ in chunks] == [0] + list(itertools.accumulate(t for _, t, _ in chunks[:-1]))
    assert sum(t for _, t, _ in chunks) == 8000
    assert max(s for *_, s in chunks) <= 1.05 * first  # each about the first's time ...
    assert chunks[len(chunks) // 2][1] < engine.PREFILL_CHUNK / 4  # ... by taking fewer tokens
    steep = modelled_chunks(8000, lambda position: 1 + position / 64)  # past what MIN_PREFILL_CHUNK tokens can keep to
    assert min(t for _, t, _ in steep[:-1]) == engine.MIN_PREFILL_CHUNK


def test_chunks_keep_their_size_when_a_token_costs_the_same_or_a_chunk_is_quick():
    flat = modelled_chunks(1000, lambda position: 1.0)
    assert [t for _, t, _ in flat] == [256, 128, 256, 256, 104]
    quick = modelled_chunks(2000, lambda position: 0.01 * (1 + position / 256))  # 3 ms a first chunk, 20 ms the last
    assert all(t == engine.PREFILL_CHUNK for _, t, _ in quick[2:-1])  # under PREFILL_FLOOR_S: not worth shrinking


def test_the_engines_prefill_and_the_bench_size_chunks_by_their_own_clocks(tiny_models, monkeypatch):
    """The engine sizes its prefill chunks by its own clock over each forward, and the prefill bench by the clock it is
    given: forwards that take longer per token as the cache grows come out shorter, the same in both."""
    monkeypatch.setattr(engine, "PREFILL_CHUNK", 64)
    monkeypatch.setattr(engine, "MIN_PREFILL_CHUNK", 8)
    monkeypatch.setattr(engine, "PREFILL_FLOOR_S", 0.01)
    now, forwards = [0.0], []
    forward = Target.forward

    def slower_as_it_grows(self, ids, cache, *a, **k):  # on the modelled clock: 1 ms a token, once more per 64 cached
        forwards.append(len(ids))
        now[0] += len(ids) * (1 + (cache.get_seq_length() + len(ids) / 2) / 64) / 1000
        return forward(self, ids, cache, *a, **k)

    monkeypatch.setattr(Target, "forward", slower_as_it_grows)
    monkeypatch.setattr(engine._Run, "_now", lambda self: now[0])
    ids = tiny_models.tokenizer("a b c d e f g h " * 40)["input_ids"]
    assert len(ids) > 300
    list(engine.decode(tiny_models.target, tiny_models.tokenizer, NgramDrafter(3), ids, DecodeSettings(max_new_tokens=1)))
    prefill = forwards[: len(forwards) - 1]  # the last forward is the step's
    assert sum(prefill) == len(ids) - 1 and prefill[:2] == [64, 32] and min(prefill[:-1]) < 24
    from specviz.bench.prefill import prefill_ours

    forwards.clear()
    timed = prefill_ours(Target(tiny_models.target), ids[:-1], lambda: now[0])
    assert [n for n, _ in timed] == forwards == prefill


@pytest.fixture
def slow_prefill(monkeypatch):
    """The tiny model's forwards made as slow as a real model's on a CPU: 1 ms a token, and 1 ms more per 256
    positions cached before it (its attention)."""
    forward = Target.forward

    def slow(self, ids, cache, *args, **kwargs):
        time.sleep(len(ids) * (1 + (cache.get_seq_length() + len(ids) / 2) / 256) / 1000)
        return forward(self, ids, cache, *args, **kwargs)

    monkeypatch.setattr(Target, "forward", slow)


def test_delete_frees_the_engine_within_a_chunk_of_a_long_prompt(tiny_models, slow_prefill):
    """Late in the prompt, where 256 tokens would take 1.3 s, a chunk still takes about the first's 0.38 s."""
    prompt = "the" + " the" * 1299  # 1,300 tokens: 4.6 s of prefill
    assert len(tiny_models.tokenizer.encode(prompt)) == 1300
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
        time.sleep(2.0)  # well into the prefill, where a 256-token chunk would take 1.15 s
        deleted = time.monotonic()
        assert owner.delete(f"/v1/runs/{long_id}").status_code == 200
        while owner.get(f"/v1/runs/{long_id}").json()["state"] != "cancelled":
            assert time.monotonic() - deleted < 10
            time.sleep(0.01)
        freed = time.monotonic() - deleted
        short.join(10)
        chunk_s = engine.PREFILL_CHUNK * 1.5 / 1000  # the first chunk's time
        assert freed < chunk_s + 0.35, f"the engine was freed {freed:.2f} s after DELETE"
        assert started and started[0] - deleted < chunk_s + 0.5  # the next run was decoding by then
        assert owner.get(f"/v1/runs/{long_id}").json()["events"] == 1  # its start only: no step ran


def test_the_prefill_bench_times_the_engines_chunks_and_tabulates_them(tiny_models, monkeypatch):
    """specviz.bench.prefill: one forward per engine chunk over the whole prompt, each round's figures from its own
    chunks, and a table row per length."""
    from specviz.bench import prefill

    monkeypatch.setattr(engine, "PREFILL_CHUNK", 64)
    chunks = prefill.prefill_ours(Target(tiny_models.target), prefill.prompt_ids(300, 64))
    assert [n for n, _ in chunks][:2] == [64, 32] and sum(n for n, _ in chunks) == 300 and all(s > 0 for _, s in chunks)
    figures = prefill.summary(300, [(64, 0.2), (32, 0.1), (32, 0.3), (172, 0.4)])
    assert figures == pytest.approx({"ours_tokens_per_s": 300, "chunks": 4, "first_chunk_ms": 200, "slowest_chunk_ms": 400,
                       "slowest_chunk_vs_first": 2, "slowest_token_vs_first": 3})
    row = {"tokens": 300, "ours_tokens_per_s": 1234.5, "chunks": len(chunks), "first_chunk_ms": 2.0,
           "slowest_chunk_ms": 3.0, "slowest_chunk_vs_first": 1.5, "slowest_token_vs_first": 2.25,
           "llama_tokens_per_s": {1: 999.0}}
    text = prefill.to_markdown({"model": "m", "weights": "q4q8", "rounds": 1, "threads": 2, "rows": [row]}, "cmd")
    assert "| 300 | 1234 | 999 | " in text and "llama-server tokens/s (1 thread)" in text and "`cmd`" in text
