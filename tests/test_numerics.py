"""Greedy outputs against `none` in the bench: a difference at a floating-point near-tie is reported as a numerics
event with the target's two logits, anything else stays a failed drafter."""
import json

import pytest
import torch

from specviz import bench
from specviz.api import encode_prompt
from specviz.bench import numerics
from specviz.bench import run as bench_run
from specviz.models import LoadedModels

from tiny import TinyTokenizer, tiny_llama


def logits_with(top: list[tuple[int, float]], vocab: int = 16) -> torch.Tensor:
    row = torch.full((vocab,), -10.0)
    for token, logit in top:
        row[token] = logit
    return row


def mismatch(prompt: str, index: int, expected, got) -> dict:
    return {"prompt": prompt, "index": index, "expected": expected, "got": got, "expected_tokens": 8, "got_tokens": 8}


def test_the_tolerance_is_a_few_rounding_units_of_the_dtype():
    assert numerics.tolerance(torch.float32, 20.0) == pytest.approx(4 * 2**-23 * 20)
    assert numerics.tolerance(torch.bfloat16, 20.0) == pytest.approx(4 * 2**-7 * 20)
    assert numerics.tolerance(torch.float32, 0.01) == numerics.tolerance(torch.float32, 1.0)  # at least one unit of 1


def test_a_near_tie_is_a_numerics_event_and_anything_else_a_failure():
    reports = {"eagle2": {"mismatches": [mismatch("a", 3, 5, 7), mismatch("b", 2, 5, 7), mismatch("c", 1, 5, 9),
                                         mismatch("d", 4, 5, None)], "outputs_match_none": False}}
    logits = {"a": logits_with([(5, 12.0), (7, 12.0 - 2e-6)]),  # within 4 units of rounding of 12 in float32
              "b": logits_with([(5, 12.0), (7, 11.5)]),  # a real gap: the drafter changed the output
              "c": logits_with([(5, 12.0), (7, 12.0 - 1e-6), (9, 11.0)])}  # a tie, but not between these two tokens
    numerics.sort_out(reports, lambda prompt, index: logits[prompt], torch.float32)
    eagle2 = reports["eagle2"]
    assert [e["prompt"] for e in eagle2["numerics_events"]] == ["a"]
    event = eagle2["numerics_events"][0]
    assert event["top"][0] == [5, 12.0] and event["top"][1][0] == 7 and 0 < event["gap"] <= event["tolerance"]
    assert [m["prompt"] for m in eagle2["mismatches"]] == ["b", "c", "d"] and eagle2["outputs_match_none"] is False

    only_ties = {"medusa": {"mismatches": [mismatch("b", 2, 5, 7)], "outputs_match_none": False}}
    bf16_tie = logits_with([(5, 12.0), (7, 11.75)])  # 0.25 at 12: within 4 units of bfloat16's rounding, not float32's
    numerics.sort_out(only_ties, lambda prompt, index: bf16_tie, torch.bfloat16)
    assert only_ties["medusa"]["outputs_match_none"] is True and len(only_ties["medusa"]["numerics_events"]) == 1


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    target = tiny_llama(scale=3.0)
    models = LoadedModels("tiny", target, None, TinyTokenizer(64), target.device, target.dtype)
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text(json.dumps({"id": "cat", "instruction": "the cat sat on the mat. the cat"}) + "\n")
    settings = bench.quick_settings(drafters=("ngram",), peers=False, llama_cpp=False, max_new_tokens=12,
                                    verify_sizes=(1, 2), cost_repeats=1, bandwidth_mb=8, bandwidth_repeats=1,
                                    context_len=16)
    return models, bench.run_bench(models, bench.load_prompts(path), settings)


def test_the_logits_reported_are_the_targets_at_the_differing_token(tiny_report):
    """logits_after(prompt + none's first i tokens) predicts none's token i: an off-by-one would not."""
    models, _ = tiny_report
    prompt = bench.Prompt("cat", "the cat sat on the mat. the cat")
    ids = encode_prompt(models.tokenizer, prompt.text)
    tokens = bench_run.run_drafter(models, "none", prompt, ids, bench.BenchSettings(max_new_tokens=8)).token_ids
    assert len(tokens) == 8
    for i in range(len(tokens)):
        assert int(numerics.logits_after(models.target, ids + tokens[:i], models.vocab_size).argmax()) == tokens[i]


def test_the_report_carries_the_histogram_and_validates_with_a_numerics_event(tiny_report):
    _, report = tiny_report
    ngram = report["drafters"]["ngram"]
    assert report["drafters"]["none"]["acceptance_histogram"] == []  # nothing drafted
    assert ngram["outputs_match_none"] is True and ngram["numerics_events"] == []
    if ngram["steps"] and ngram["acceptance_histogram"]:
        assert sum(j * h for j, h in enumerate(ngram["acceptance_histogram"])) == ngram["accepted"]
    bench.validate(report)
    planted = json.loads(json.dumps(report))
    planted["drafters"]["ngram"]["mismatches"] = [mismatch("cat", 3, 5, 7)]
    numerics.sort_out(planted["drafters"], lambda prompt, index: logits_with([(5, 4.0), (7, 4.0)]), torch.float32)
    bench.validate(planted)
    assert "## Numerics events" in bench.to_markdown(planted)
    old = json.loads(json.dumps(report))
    for d in old["drafters"].values():  # a report written before the histogram and the numerics events
        d.pop("acceptance_histogram"), d.pop("numerics_events", None)
    bench.validate(old)
    bench.to_markdown(old)
