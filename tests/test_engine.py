"""The engine on tiny random models: greedy identity, events, replay, reproducibility, clear errors."""
import json

import jsonschema
import pytest
import torch

import specviz
from specviz import bench
from specviz.bench import run as bench_run
from specviz.decoding import engine, events
from specviz.decoding.sampling import Sampling
from specviz.drafters import make_drafter
from specviz.drafters.base import NoDraft
from specviz.drafters.draft_model import DraftModelDrafter
from specviz.drafters.ngram import NgramDrafter, lookup, lookup_match
from specviz.errors import SpecvizError
from specviz.models import LoadedModels

from tiny import EOS, TinyTokenizer, decode_settings, hf_greedy, tiny_llama

PROMPT = [5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(scale=3.0)


@pytest.fixture(scope="module")
def tok():
    return TinyTokenizer(64)


def run(target, tok, drafter, prompt=PROMPT, **settings):
    return list(engine.decode(target, tok, drafter, prompt, decode_settings(**settings)))


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize(
    "make",
    [
        lambda t, k: NoDraft(),
        lambda t, k: NgramDrafter(k),
        lambda t, k: DraftModelDrafter(t, k),  # a perfect draft: everything accepted
        lambda t, k: DraftModelDrafter(tiny_llama(seed=1, layers=1, scale=3.0), k),  # a poor one
        lambda t, k: DraftModelDrafter(tiny_llama(seed=0, layers=2, scale=2.0), k),  # same argmax mostly
    ],
    ids=["none", "ngram", "draft-self", "draft-other", "draft-close"],
)
def test_greedy_output_equals_target_alone(target, tok, make, k):
    reference = hf_greedy(target, PROMPT, 48)
    done = run(target, tok, make(target, k), max_new_tokens=48)[-1]
    assert done.token_ids == reference


def test_greedy_stops_at_eos_like_the_target():
    # a target whose argmax soon becomes the end-of-sequence token
    model = tiny_llama(seed=5, scale=3.0)
    with torch.no_grad():
        model.lm_head.weight[EOS] += 0.3 * model.lm_head.weight.mean(0)
    tok = TinyTokenizer(64)
    reference = hf_greedy(model, PROMPT, 60)
    for drafter in (NoDraft(), NgramDrafter(4), DraftModelDrafter(model, 4)):
        done = run(model, tok, drafter, max_new_tokens=60)[-1]
        assert done.token_ids == reference
        assert done.stop_reason == ("eos" if EOS in reference else "max_new_tokens")


def test_tokens_accepted_past_an_eos_cut_are_not_counted():
    # a perfect draft keeps drafting past the end-of-sequence token; verification accepts those tokens, but
    # they are never committed, so acceptance counts only the accepted tokens that were committed
    model = tiny_llama(seed=5, scale=3.0)
    with torch.no_grad():
        model.lm_head.weight[EOS] += 0.3 * model.lm_head.weight.mean(0)
    reference = hf_greedy(model, PROMPT, 60)
    assert EOS in reference and (reference.index(EOS) + 1) % 5, "the EOS must fall inside a 4-token chain"
    events_ = run(model, TinyTokenizer(64), DraftModelDrafter(model, 4), max_new_tokens=60)
    steps, done = [e for e in events_ if isinstance(e, events.Step)], events_[-1]
    committed_accepted = sum(c.kind == "accepted" for s in steps for c in s.committed)
    assert len(steps[-1].accepted_path) > len(steps[-1].committed)  # the cut happened inside the accepted path
    assert done.stats["accepted"] == committed_accepted
    assert done.stats["acceptance_rate"] == committed_accepted / done.stats["drafted"]
    # the bench counts per-position acceptance from the events; it agrees with the engine's own count
    models = LoadedModels("tiny-eos", model, model, TinyTokenizer(64), model.device, model.dtype)
    settings = bench.quick_settings(max_new_tokens=60, k=4)
    # the same 4-token chains as above (the cost-aware length would size them by this machine's timings)
    result = bench_run.run_drafter(models, "draft:k_policy=fixed", bench.Prompt("p", ""), PROMPT, settings)
    assert result.accepted == committed_accepted == sum(result.accepted_at)


def test_perfect_draft_accepts_everything_and_adds_a_bonus(target, tok):
    done = run(target, tok, DraftModelDrafter(target, 4), max_new_tokens=40)[-1]
    assert done.stats["acceptance_rate"] == 1.0
    assert done.stats["tau"] == 5.0  # 4 accepted + the bonus token, every step
    assert done.stats["per_position_acceptance"] == [1.0] * 4


@pytest.mark.parametrize("text", ["[1, 2]\n", '{"type": "start"}\n7\n', ""])
def test_a_file_that_is_no_trace_is_a_clear_error(tmp_path, text):
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    with pytest.raises(SpecvizError, match="not a specviz trace"):
        events.read_trace(path)


def test_a_trace_that_fails_midway_leaves_no_file(tmp_path):
    def events_then_failure():
        yield {"type": "start"}
        raise RuntimeError("the decode broke")

    path = tmp_path / "sub" / "run.jsonl"  # a missing folder is made
    with pytest.raises(RuntimeError, match="broke"):
        events.write_trace(events_then_failure(), path)
    assert list(path.parent.iterdir()) == []


def test_every_event_validates_and_the_trace_replays(target, tok, tmp_path):
    evs = run(target, tok, DraftModelDrafter(tiny_llama(seed=1, layers=1), 3), max_new_tokens=30, sampling=Sampling(1.0))
    for e in evs:
        events.validate(e)
    path = tmp_path / "run.jsonl"
    events.write_trace(evs, path)
    loaded = events.read_trace(path)
    assert [e["type"] for e in loaded] == [e.type for e in evs]
    text, ids = events.replayed_text(loaded)
    assert ids == evs[-1].token_ids
    assert text == evs[-1].text == tok.decode(ids, skip_special_tokens=True)
    # the committed tokens of each step are the accepted path plus the replacement/bonus token
    # (cut short at end-of-sequence or at the token budget)
    for step in loaded[1:-1]:
        proposed = [step["nodes"][i]["token"] for i in step["accepted_path"]] + [step["final"]["token"]]
        committed = [c["token"] for c in step["committed"]]
        assert committed == proposed[: len(committed)]
        assert all(t["accepted"] == (t["node"] in step["accepted_path"]) for t in step["tests"])


def test_a_corrupt_event_fails_validation(target, tok):
    step = events.to_dict(run(target, tok, NgramDrafter(2), max_new_tokens=5)[1])
    step["tests"] = [{"node": 0}]
    with pytest.raises(jsonschema.ValidationError):
        events.validate(step)


def test_same_seed_same_output_and_events(target, tok):
    drafter = lambda: DraftModelDrafter(tiny_llama(seed=1, layers=1), 3)
    a = run(target, tok, drafter(), max_new_tokens=30, sampling=Sampling(0.8, top_p=0.9), seed=7)
    b = run(target, tok, drafter(), max_new_tokens=30, sampling=Sampling(0.8, top_p=0.9), seed=7)
    c = run(target, tok, drafter(), max_new_tokens=30, sampling=Sampling(0.8, top_p=0.9), seed=8)
    strip = lambda evs: [json.dumps({k: v for k, v in events.to_dict(e).items() if k not in ("timing", "stats")}) for e in evs]
    assert strip(a) == strip(b)
    assert a[-1].token_ids != c[-1].token_ids


def test_ngram_lookup_proposes_the_continuation_of_the_latest_match():
    ids = torch.tensor([1, 2, 3, 9, 9, 1, 2, 3, 4, 5, 1, 2])
    assert lookup(ids, 3, max_ngram=3, min_ngram=1) == [3, 4, 5]
    assert lookup(torch.tensor([7, 8]), 3, 3, 1) == []
    assert lookup_match(ids, 2, max_ngram=3, min_ngram=2) == (2, [3, 4])  # the suffix (1, 2) matched, not 3 tokens
    assert lookup_match(ids, 0, 3, 2) == (0, [])


def test_api_accepts_loaded_models(target, tok):
    models = specviz.loaded(target, tok, draft=tiny_llama(seed=1, layers=1))
    result = specviz.generate("abcabc", models=models, drafter="draft", max_new_tokens=12, k=2)
    assert len(result.token_ids) == 12
    for key in ("steps", "tau", "acceptance_rate", "per_position_acceptance", "tokens_per_s", "wall_s"):
        assert key in result.stats


# ---- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompt=""), "empty"),
        (dict(prompt="   "), "empty"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=-3), "max_new_tokens"),
        (dict(max_new_tokens=10_000), "context"),
        (dict(prompt="a" * 300), "context"),
        (dict(drafter="medusa-typo"), "unknown drafter"),
        (dict(temperature=-0.5), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(k=0), "k"),
        (dict(drafter="ngram:max_ngram"), "KEY=VALUE"),
        (dict(drafter="ngram:depth=3"), "unknown ngram option"),
        (dict(drafter="none:depth=2"), "takes no options"),
        (dict(drafter="draft:adaptive=maybe"), "true or false"),
        (dict(drafter="ngram:k=2.5"), "whole number"),
        (dict(drafter="ngram:min_ngram=0"), "min_ngram must be a whole number >= 1"),
        (dict(drafter="ngram:min_ngram=4:max_ngram=2"), "1 <= min_ngram <= max_ngram"),
    ],
)
def test_bad_input_is_a_clear_error(target, tok, kwargs, message):
    models = specviz.loaded(target, tok)
    args = dict(prompt="abc", models=models, drafter="ngram", max_new_tokens=8) | kwargs
    with pytest.raises(SpecvizError, match=message):
        specviz.generate(**args)


def test_drafter_spec_options_reach_the_drafter(target, tok):
    from specviz.drafters import parse_spec

    assert parse_spec("eagle2:draft_vocab=full:total_tokens=32:lossy=false") == (
        "eagle2", {"draft_vocab": "full", "total_tokens": 32, "lossy": False})
    drafter = make_drafter("ngram:max_ngram=2:k=6", specviz.loaded(target, tok))
    assert (drafter.k, drafter.max_ngram) == (6, 2)
    out = specviz.generate("abcabcabc", models=specviz.loaded(target, tok), drafter="ngram:k=2", max_new_tokens=12)
    assert out.token_ids == specviz.generate("abcabcabc", models=specviz.loaded(target, tok), drafter="none",
                                             max_new_tokens=12).token_ids


def test_adaptive_draft_length_stops_when_drafting_cannot_pay(target, tok):
    from specviz.decoding import engine
    from specviz.drafters.draft_model import DraftModelDrafter

    prompt = specviz.api.encode_prompt(tok, "abcabc")
    reference = specviz.generate("abcabc", models=specviz.loaded(target, tok), drafter="none", max_new_tokens=16)
    runs = {}
    # "costly": an infinitely slow target makes any chain worth drafting on (a finite cost made this depend on
    # how slow this machine's draft forward happened to be against the tiny model's small q products)
    for label, cost in (("cheap target", lambda n: 1e-9), ("costly target", lambda n: float("inf"))):
        drafter = DraftModelDrafter(target, k=4, adaptive=True, verify_cost=cost)
        events = list(engine.decode(target, tok, drafter, prompt, decode_settings(16)))
        assert events[-1].token_ids == reference.token_ids
        runs[label] = [len(e.nodes) for e in events[1:-1]]
    assert runs["cheap target"][0] >= 1 and sum(runs["cheap target"][1:]) <= len(runs["cheap target"]) // 2
    assert runs["costly target"][:3] == [4, 4, 4], runs  # the draft is the target itself: every token accepted


def test_adaptive_draft_length_does_not_count_the_prompt_as_a_draft_step(target, tok, monkeypatch):
    """A long prompt makes the first draft forward slow; timing it as one draft step would stop all drafting.

    The drafter's clock is replaced by one that charges one unit per token a draft forward reads, so the test does
    not depend on this machine's timing: a one-token draft step costs 1, the prompt's catch-up costs its length,
    and a target step is priced at 2. Counting the prompt (or any catch-up) as a draft step stops the chain for
    many steps; the rule as written keeps drafting (the first depth of a step is always tried while a draft token
    costs less than a target step)."""
    from types import SimpleNamespace

    from specviz.decoding import engine
    from specviz.drafters import draft_model
    from specviz.drafters.draft_model import DraftModelDrafter

    clock = [0.0]
    monkeypatch.setattr(draft_model, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    prompt = specviz.api.encode_prompt(tok, "the quick brown fox jumps over the lazy dog. " * 4)
    assert len(prompt) > 20
    drafter = DraftModelDrafter(target, k=4, adaptive=True, verify_cost=lambda n: 2.0)
    forward = drafter._forward

    def charged(new):
        clock[0] += len(new)
        return forward(new)

    monkeypatch.setattr(drafter, "_forward", charged)
    events = list(engine.decode(target, tok, drafter, prompt, decode_settings(40)))
    drafted = [len(e.nodes) for e in events[1:-2]]
    assert all(n >= 1 for n in drafted), drafted


def test_draft_vocabulary_choices():
    from types import SimpleNamespace

    from specviz.drafters import draft_vocabulary

    by_frequency = SimpleNamespace(draft_vocab=torch.tensor([2, 40, 7, 11]))
    assert draft_vocabulary(by_frequency, "trained") is by_frequency.draft_vocab
    assert draft_vocabulary(by_frequency, "full") is None
    assert draft_vocabulary(by_frequency, 2).tolist() == [2, 40]
    assert draft_vocabulary(by_frequency, 10).tolist() == [2, 40, 7, 11]
    with pytest.raises(SpecvizError, match="sorted by id"):
        draft_vocabulary(SimpleNamespace(draft_vocab=torch.tensor([2, 7, 11, 40])), 2)
    with pytest.raises(SpecvizError, match="draft_vocab must be"):
        draft_vocabulary(by_frequency, "most")
    with pytest.raises(SpecvizError, match="no trained draft vocabulary"):
        draft_vocabulary(SimpleNamespace(draft_vocab=None), 100)
    assert draft_vocabulary(SimpleNamespace(), "full") is None


def test_eagle_defaults_to_the_most_frequent_part_of_a_large_trained_vocabulary():
    from types import SimpleNamespace

    from specviz.drafters import EAGLE_DRAFT_VOCAB, default_draft_vocab

    frequent_first = torch.randperm(3 * EAGLE_DRAFT_VOCAB, generator=torch.Generator().manual_seed(0))
    assert default_draft_vocab("eagle2", SimpleNamespace(draft_vocab=frequent_first)) == EAGLE_DRAFT_VOCAB
    # small, sorted by id (no frequency order to cut by), or absent: the trained vocabulary as it is
    assert default_draft_vocab("eagle2", SimpleNamespace(draft_vocab=frequent_first[:100])) == "trained"
    assert default_draft_vocab("eagle2", SimpleNamespace(draft_vocab=frequent_first.sort().values)) == "trained"
    assert default_draft_vocab("eagle2", SimpleNamespace(draft_vocab=None)) == "trained"
    assert default_draft_vocab("medusa", SimpleNamespace(draft_vocab=frequent_first)) == "trained"


def test_reduced_draft_vocabulary_refuses_post_processed_logits():
    draft = tiny_llama(seed=1, layers=1)
    draft.config.final_logit_softcapping = 30.0  # logits = cap · tanh(lm_head(h) / cap): rows alone are not enough
    with pytest.raises(SpecvizError, match="draft_vocab=full"):
        DraftModelDrafter(draft, k=2, draft_vocab=torch.tensor([1, 2, 3]))
    DraftModelDrafter(draft, k=2)  # the full head is the model's own forward: fine


def test_draft_drafter_without_a_draft_model_says_so(target, tok):
    with pytest.raises(SpecvizError, match="no draft model"):
        specviz.generate("abc", models=specviz.loaded(target, tok), drafter="draft")


def test_nan_logits_are_reported(tok):
    broken = tiny_llama(seed=2)
    with torch.no_grad():
        broken.lm_head.weight[3, 0] = float("nan")
    with pytest.raises(SpecvizError, match="NaN"):
        specviz.generate("abc", models=specviz.loaded(broken, tok), drafter="none", max_new_tokens=4)


def test_mismatched_vocabularies_are_refused(target, tok):
    with pytest.raises(SpecvizError, match="vocab"):
        specviz.loaded(target, tok, draft=tiny_llama(vocab_size=80, seed=1), draft_tokenizer=TinyTokenizer(80))


def test_a_draft_with_extra_padding_rows_still_matches_the_target(target, tok):
    padded = tiny_llama(vocab_size=80, seed=1)  # same tokenizer, embedding padded to 80 rows
    models = specviz.loaded(target, tok, draft=padded)
    result = specviz.generate("abcabc", models=models, drafter="draft", max_new_tokens=20, k=3)
    assert result.token_ids == hf_greedy(target, tok("abcabc")["input_ids"], 20)
