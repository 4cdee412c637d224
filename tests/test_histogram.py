"""The acceptance histogram: how many verify steps accepted 0, 1, 2, … drafted tokens, the same from a run's counts
(its stats), from its step events (the pages) and in the bench report."""
import pytest
import torch

from specviz import analysis
from specviz.decoding import engine
from specviz.decoding import events as ev
from specviz.decoding.metrics import Metrics, acceptance_histogram

from tiny import TinyTokenizer, decode_settings, tiny_llama
from tree_drafters import TopBTree

PROMPT = [5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6]


def test_the_histogram_from_the_per_depth_counts():
    # 5 steps drafted; 4 accepted at depth 1, 2 at depth 2, none at depth 3: one step accepted 0, two 1, two 2
    assert acceptance_histogram([5, 3, 1], [4, 2, 0]) == [1, 2, 2, 0]
    assert acceptance_histogram([], []) == []  # nothing drafted (`none`)
    metrics = Metrics()
    for depth, accepted in ((3, 3), (3, 0), (0, 0), (2, 1)):  # a step that drafted nothing is left out
        metrics.observe(depth, depth, accepted, accepted + 1, 0.0, 0.0)
    assert metrics.summary(1.0)["acceptance_histogram"] == [1, 1, 0, 1]


@pytest.fixture(scope="module", params=[0.0, 1.0], ids=["greedy", "sampled"])
def tree_run(request) -> list[dict]:
    target = tiny_llama(scale=3.0)
    draft = tiny_llama(seed=0, layers=1, scale=2.0)  # the target's first layer under a flatter head: agrees often
    with torch.no_grad():
        events = engine.decode(target, TinyTokenizer(64), TopBTree(draft, b=2, depth=3), PROMPT,
                               decode_settings(max_new_tokens=40, temperature=request.param, seed=3))
        return [ev.to_dict(e) for e in events]


def test_the_stats_and_the_step_events_give_the_same_histogram(tree_run):
    steps, stats = [e for e in tree_run if e["type"] == "step"], tree_run[-1]["stats"]
    histogram = analysis.acceptance_histogram(steps)
    assert histogram == stats["acceptance_histogram"]
    assert sum(histogram) == sum(bool(s["nodes"]) for s in steps)  # one count per step that drafted
    assert sum(j * h for j, h in enumerate(histogram)) == stats["accepted"]  # Σ j·h_j: the accepted tokens
    assert sum(h > 0 for h in histogram) >= 2, "a run whose steps all accepted alike tests little"
    # a planted miscount (drafted instead of committed tokens) breaks the second identity
    wrong = [0] * (len(histogram) + 8)
    for s in steps:
        if s["nodes"]:
            wrong[min(len(s["tests"]), len(wrong) - 1)] += 1
    assert sum(j * h for j, h in enumerate(wrong)) != stats["accepted"]


def test_steps_that_drafted_nothing_are_counted_beside_the_histogram_and_tau_divides_by_them_too():
    """Prompt lookup drafts nothing where it finds no match: those steps are out of the histogram, counted beside it,
    and are why τ (÷ every step) sits below the mean acceptance length (÷ steps that drafted)."""
    from app import teaching
    from specviz.drafters.ngram import NgramDrafter

    target = tiny_llama(scale=3.0)
    with torch.no_grad():
        events = [ev.to_dict(e) for e in engine.decode(target, TinyTokenizer(64), NgramDrafter(k=3, max_ngram=2),
                                                       [5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6], decode_settings(max_new_tokens=40))]
    steps = [e for e in events if e["type"] == "step"]
    histogram = analysis.acceptance_histogram(steps)
    nothing = analysis.drafted_nothing(steps)
    assert nothing == sum(not s["nodes"] for s in steps) > 0 and sum(histogram) + nothing == len(steps)
    numbers = teaching.acceptance_numbers(events)
    assert numbers.mean_acceptance_length == pytest.approx(1 + numbers.accepted / sum(histogram))
    assert numbers.tau == pytest.approx(1 + numbers.accepted / len(steps))  # no end-of-sequence cut in this run
    assert numbers.tau < numbers.mean_acceptance_length
    note = teaching.HISTOGRAM_NOTE
    assert "no match, or a wrong one" not in note and "drafts nothing and is not in the histogram" in note
    assert "mean plus one, over every step" not in note and "1 + accepted ÷ steps that drafted" in note
