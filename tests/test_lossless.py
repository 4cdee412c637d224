"""Statistical losslessness of speculative sampling, end to end through the engine.

The first two generated tokens of a small-vocabulary target are sampled N times with speculative decoding and
compared, by a chi-square test, with the exact distribution of the target alone computed by enumeration.
The test has power: the planted bugs at the bottom (each a classic mistake) are caught by the same test.
"""
import pytest
import torch

from specviz.decoding import verify as verify_module
from specviz.decoding.sampling import Sampling
from specviz.drafters.draft_model import DraftModelDrafter
from specviz.drafters.ngram import NgramDrafter

from stats import (
    chi_square_p_value,
    exact_two_tokens,
    sampled_two_tokens,
    total_variation,
)
from tiny import TinyTokenizer, decode_settings, tiny_llama

VOCAB = 8
N = 1500  # runs per configuration; enough to catch the planted bugs below at p < 1e-6
PROMPT = [1, 2, 3]
PASS_P = 1e-3  # seeded runs are deterministic, so this threshold does not make the test flaky
T1 = Sampling(1.0)
T07_TOP_P = Sampling(0.7, top_p=0.8)


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(vocab_size=VOCAB, hidden=16, layers=1, scale=20.0, eos=None)
    good = tiny_llama(vocab_size=VOCAB, hidden=16, layers=1, scale=14.0, eos=None)  # same weights, flatter q
    bad = tiny_llama(vocab_size=VOCAB, hidden=16, layers=1, seed=3, scale=40.0, eos=None)  # q far from p
    return target, good, bad


@pytest.fixture(scope="module")
def good_bf16(models):
    """The good draft in bf16 (as specviz.models.draft_dtype runs shipped drafts where the CPU multiplies bf16)
    against the fp32 target: q now comes from bf16 logits, and the output must still be the target's."""
    import copy

    return copy.deepcopy(models[1]).to(torch.bfloat16)


pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # chi-square tests: thousands of decodes


def check(models, sampling, drafter, k, n=N, expect_pass=True, drafts=None):
    target, good, bad = models
    draft = {"good": good, "bad": bad, **(drafts or {})}.get(drafter)
    make = (lambda: NgramDrafter(k, max_ngram=1)) if drafter == "ngram" else (lambda: DraftModelDrafter(draft, k))
    counts = sampled_two_tokens(target, TinyTokenizer(VOCAB, eos=None), make, PROMPT, sampling, n)
    probs = exact_two_tokens(target, PROMPT, sampling)
    p_value = chi_square_p_value(counts, probs)
    tv = total_variation(counts, probs)
    return p_value, tv


def test_the_draft_models_really_differ_from_the_target(models):
    target, good, bad = models
    exact = exact_two_tokens(target, PROMPT, T1)
    for draft, lo, hi in ((good, 0.02, 0.3), (bad, 0.5, 1.0)):
        tv = 0.5 * float((exact - exact_two_tokens(draft, PROMPT, T1)).abs().sum())
        assert lo < tv < hi


@pytest.mark.parametrize("sampling", [T1, T07_TOP_P], ids=["T=1", "T=0.7,top-p=0.8"])
@pytest.mark.parametrize("drafter, k", [("good", 1), ("bad", 2), ("ngram", 2), ("good-bf16", 2)])
def test_spec_sampling_matches_the_target(models, good_bf16, sampling, drafter, k):
    p_value, tv = check(models, sampling, drafter, k, drafts={"good-bf16": good_bf16})
    assert p_value > PASS_P, f"chi-square p = {p_value:.2e}, TV = {tv:.3f}"


# ---- planted bugs: the same test must fail --------------------------------------------------------------


def test_catches_a_replacement_drawn_from_p_instead_of_the_residual(models, monkeypatch):
    monkeypatch.setattr(verify_module, "_residual", lambda p, x, q_dist: p)
    p_value, tv = check(models, T1, "bad", 2)
    assert p_value < 1e-6, f"planted bug not caught: p = {p_value:.2e}"


def test_catches_temperature_applied_to_p_only(models, monkeypatch):
    # Bug: the draft samples at temperature T, but verification uses its untempered q = softmax(logits).
    # (softmax(l / T) ** T, renormalised, is softmax(l): the q the buggy code would compute.)
    propose = DraftModelDrafter.propose

    def q_without_temperature(self, request):
        tree = propose(self, request)
        t = request.sampling.temperature
        tree.q_dist = [q**t / (q**t).sum() for q in tree.q_dist]
        return tree

    monkeypatch.setattr(DraftModelDrafter, "propose", q_without_temperature)
    p_value, tv = check(models, Sampling(0.5), "bad", 2)
    assert p_value < 1e-6, f"planted bug not caught: p = {p_value:.2e}"


def test_catches_a_dropped_bonus(models, monkeypatch):
    # Bug: after a fully accepted draft, take the draft's next token instead of sampling the bonus from p.
    verify = verify_module.verify

    def no_bonus(tree, p, greedy, generator, n_top=5):
        verdict = verify(tree, p, greedy, generator, n_top)
        if verdict.kind == "bonus" and verdict.path and tree.q_dist[verdict.path[-1]] is not None:
            verdict.token = int(torch.multinomial(tree.q_dist[verdict.path[-1]], 1, generator=generator))
        return verdict

    monkeypatch.setattr(verify_module, "verify", no_bonus)
    p_value, tv = check(models, T1, "bad", 1)
    assert p_value < 1e-6, f"planted bug not caught: p = {p_value:.2e}"


def test_eagle_with_prompt_lookup_grafted_on_matches_the_target(models):
    """EAGLE-2's tree with prompt lookup's continuation grafted on (eagle2:lookup=N): grafted tokens are point
    masses beside the head's, so the two-token distribution must still be the target's."""
    from specviz.decoding import engine
    from specviz.drafters.eagle import EagleDrafter, TreeShape
    from specviz.models.heads import EagleHead

    target = models[0]
    torch.manual_seed(0)
    head = EagleHead(target.config).eval()
    for parameter in head.parameters():
        parameter.data.normal_(0, 0.3)
    prompt = [1, 2, 3, 1, 2]  # its suffix (1, 2) occurred before: lookup proposes 3 (one token: max_depth is 1 here)
    make = lambda: EagleDrafter(head, target, TreeShape(depth=2, top_k=2, total_tokens=6), lookup=3)  # noqa: E731
    tokenizer = TinyTokenizer(VOCAB, eos=None)
    first = list(engine.decode(target, tokenizer, make(), prompt, decode_settings(2, T1)))[1]
    assert [b["stage"] for b in first.build][-2:] == ["lookup", "rerank"]
    assert [n.token for n in first.nodes].count(3) == 1  # grafted (a new node or the head's own): one node
    counts = sampled_two_tokens(target, tokenizer, make, prompt, T1, N)
    p_value = chi_square_p_value(counts, exact_two_tokens(target, prompt, T1))
    assert p_value > PASS_P, f"chi-square p = {p_value:.2e}"
