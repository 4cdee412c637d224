"""The cost-aware draft length (specviz.decoding.policy): how many tokens each drafter drafts under a verify-cost
curve, why each step's draft stopped, and that the output never changes (it only sizes the draft)."""
from __future__ import annotations

import numpy as np
import pytest
from test_tree import tiny_heads

import specviz
from specviz import analysis
from specviz.decoding import engine, events
from specviz.decoding.policy import (
    COST,
    FIXED,
    STOP_CAP,
    STOP_CONFIDENCE,
    STOP_COST,
    STOP_NO_MATCH,
    STOP_SLOWER,
    STOPS,
    LengthPolicy,
    RunningAcceptance,
    best_length,
)
from specviz.drafters import make_drafter, ngram
from specviz.drafters.draft_model import DraftModelDrafter
from specviz.drafters.eagle import EagleDrafter, TreeShape
from specviz.drafters.medusa import MedusaDrafter
from specviz.drafters.ngram import NgramDrafter
from specviz.errors import SpecvizError

from tiny import TinyTokenizer, decode_settings, hf_greedy, tiny_llama

TOK = TinyTokenizer(64)
# a prompt that repeats itself: prompt lookup finds a continuation at every step
REPEATING = [5, 6, 7, 8, 9, 10, 11, 12] * 6


def flat(n: int) -> float:  # verifying more tokens costs nothing more: every draft pays
    return 1.0


def steep(n: int) -> float:  # each token verified costs a whole forward more: no draft pays
    return float(n)


def knee(n: int) -> float:  # up to 3 inputs (the root + 2 drafted) cost one forward, then each 10 more
    return 1.0 if n <= 3 else 10.0 * (n - 2)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(scale=3.0)


def steps_of(target, drafter, prompt=REPEATING, max_new_tokens=40):
    evs = list(engine.decode(target, TOK, drafter, prompt, decode_settings(max_new_tokens)))
    return evs, evs[1:-1]


def with_policy(drafter, kind=COST, cost=flat):
    drafter.policy = LengthPolicy(kind, cost if kind == COST else None)
    return drafter


# ---- the rule --------------------------------------------------------------------------------------------


def test_best_length_keeps_what_raises_the_expected_rate():
    chances = [0.9, 0.8, 0.7, 0.6]
    assert best_length(chances, flat) == 4  # free to verify: everything
    assert best_length(chances, steep) == 0  # each token costs a forward, none is certain: nothing
    assert best_length(chances, knee) == 2  # what fits before the knee
    # the first token pays exactly when P_1 · c(1) > c(2) − c(1) (+ its draft cost)
    assert best_length([0.26], lambda n: 1 + 0.25 * (n - 1)) == 1
    assert best_length([0.24], lambda n: 1 + 0.25 * (n - 1)) == 0
    assert best_length([0.9], flat, draft_s=0.5) == 1 and best_length([0.4], flat, draft_s=0.5) == 0
    # a costly size in the middle is looked past when what follows it is cheap enough
    assert best_length([0.9] * 4, lambda n: {1: 1.0, 2: 1.0, 3: 1.9, 4: 1.9, 5: 1.9}[n]) == 4


def test_drafting_already_paid_for_is_not_charged_again():
    """After a draft model has run its forwards, choosing how many drafted tokens to verify weighs only the verify
    cost: with a flat curve every drafted token with any chance is worth verifying, whatever the drafting cost."""
    curve = lambda n: 0.020  # noqa: E731
    chances = [0.9, 0.45, 0.09]  # q 0.9, 0.5, 0.2 along the chain
    assert best_length(chances, curve, draft_s=0.006) == 2  # before drafting, the third forward does not pay
    assert best_length(chances, curve, spent_s=3 * 0.006) == 3  # after it, verifying its token is free
    assert LengthPolicy(COST, curve).length(chances, spent_s=3 * 0.006) == 3


def test_the_next_draft_forward_looks_past_one_costly_size():
    """One costly size on the curve (a noisy c(2)) does not stop a draft model for good: worth_drafting looks as
    far ahead as the drafter may draft."""
    spike = lambda n: {1: 1.0, 2: 1.6}.get(n, 1.0)  # noqa: E731
    policy = LengthPolicy(COST, spike)  # running acceptance at its prior, 0.5 a position
    assert not policy.worth_drafting([], cap=1)  # one token: 1.5 expected in 1.6, below plain decoding
    assert policy.worth_drafting([], cap=4)  # two or more: 1.75 in 1.0
    assert not LengthPolicy(COST, steep).worth_drafting([], cap=8)  # a steep curve pays at no length


def test_the_next_draft_forward_is_charged_once():
    """Drafting one more token costs its forward, not again the forwards already run: with a flat curve, after one
    token at q 0.9 (1.9 expected in 1.2 s), a second at 0.5 gives 2.35 expected in 1.4 s and is worth its forward."""
    flat = lambda n: 1.0  # noqa: E731
    assert LengthPolicy(COST, flat).worth_drafting([0.9], draft_s=0.2, cap=2)
    assert not LengthPolicy(COST, flat).worth_drafting([0.9], draft_s=0.5, cap=2)  # 2.35 in 2.0 < 1.9 in 1.5


def test_a_tree_budget_stays_where_the_curve_was_measured():
    """A curve measured up to 16 tokens and nearly flat there, extrapolated, would price a 2,000-node tree as
    cheap; the cost-aware and `auto` budgets keep at most the 15 nodes the curve's last size verifies."""
    from specviz.decoding.costs import interpolate
    from specviz.drafters.eagle import tree_budget

    curve = interpolate({1: 1.0, 8: 1.02, 16: 1.01})  # falls past 8, so a straight line goes on falling past 16
    assert curve(2000) == curve(16) == 1.01 and curve.measured_up_to == 16  # it is held flat there
    assert interpolate({1: 1.0, 16: 2.5})(31) == 4.0  # a rising curve goes on rising
    chances = [0.5] * 2000
    assert tree_budget(LengthPolicy(COST, curve), chances, "auto", curve) == 15
    assert tree_budget(LengthPolicy(FIXED), chances, "auto", curve) == 15
    assert tree_budget(LengthPolicy(COST, curve), chances, 40, curve) == 40  # a number the user set is kept
    assert tree_budget(LengthPolicy(FIXED), chances, None, curve) == 2000  # fixed, no budget: every node


def test_steps_stop_drafting_while_drafting_steps_are_the_slower_but_for_a_probe():
    from specviz.decoding.policy import PROBE_EVERY, StepRates

    rates = StepRates(plain_s=1.0)  # one plain forward: 1 token a second
    assert rates.draft_now()  # nothing seen of drafting yet
    rates.observe(True, 100.0, 1)  # the first drafting step reads the prompt: not counted
    for _ in range(rates.evidence):
        assert rates.draft_now()  # too few drafting steps seen to judge
        rates.observe(True, 3.0, 2)  # a drafting step: 0.67 tokens a second
    asked = [rates.draft_now() for _ in range(2 * PROBE_EVERY)]
    assert asked == ([False] * (PROBE_EVERY - 1) + [True]) * 2  # a probe every PROBE_EVERY steps
    for _ in range(6):
        rates.observe(True, 1.0, 3)  # drafting now commits 3 tokens a second
    assert all(rates.draft_now() for _ in range(PROBE_EVERY))


def test_a_drafter_that_only_costs_is_asked_only_to_probe(target):
    """A lookup whose every drafted token is wrong and that takes 5 ms a step: under COST (a flat curve, so the
    chance estimates alone would keep drafting) the engine soon stops asking it, but for a probe every PROBE_EVERY
    steps, and says so (stop "slower", nothing drafted); FIXED asks every step. The output is the target's."""
    import time as _time

    from specviz.decoding.policy import PROBE_EVERY

    reference = hf_greedy(target, REPEATING, 48)
    never = next(t for t in range(1, 64) if t not in reference)

    class Wrong(NgramDrafter):
        asked = 0

        def propose(self, request):
            self.asked += 1
            _time.sleep(0.005)
            tree = super().propose(request)
            tree.tokens[:] = [never] * len(tree)
            return tree

    drafter = with_policy(Wrong(k=4), COST, lambda n: 0.001)  # flat, in seconds (the plain rate starts from c(1))
    evs, steps = steps_of(target, drafter, max_new_tokens=48)
    assert evs[-1].token_ids == reference
    assert drafter.asked <= 6 + len(steps) // PROBE_EVERY + 1, drafter.asked
    assert sum(1 for s in steps if s.stop == STOP_SLOWER and not s.drafted) >= len(steps) // 2
    fixed = with_policy(Wrong(k=4), FIXED)
    steps_of(target, fixed, max_new_tokens=48)
    assert fixed.asked == 48  # every step: none accepted, one token a step


def test_fixed_keeps_every_token_and_needs_no_curve():
    policy = LengthPolicy(FIXED)
    assert policy.length([0.01, 0.001]) == 2 and policy.worth_drafting([0.001])
    with pytest.raises(ValueError, match="curve"):
        LengthPolicy(COST)
    with pytest.raises(SpecvizError, match="k_policy"):
        LengthPolicy("sometimes")


def test_running_acceptance_falls_with_rejections_and_recovers_slowly():
    acceptance = RunningAcceptance(prior=0.5)
    assert acceptance.chances(3) == [0.5, 0.25, 0.125]
    for _ in range(10):
        acceptance.observe(drafted=2, accepted=0)  # position 1 rejected: position 2 never tried
    assert acceptance.rate(1) < 0.06 and acceptance.rate(2) == 0.5
    low = acceptance.rate(1)
    acceptance.observe(drafted=0, accepted=0)  # a step that drafted nothing: it drifts back toward the prior
    assert low < acceptance.rate(1) < low + 0.01
    for _ in range(5):
        acceptance.observe(drafted=2, accepted=2)
    assert acceptance.rate(1) > 0.6 and acceptance.rate(2) > 0.6


# ---- a chain drafter under fake curves ------------------------------------------------------------------


def test_a_flat_curve_drafts_to_the_cap(target):
    """Every step drafts all the lookup found, K where it found K; none is cut for cost."""
    _, steps = steps_of(target, with_policy(NgramDrafter(k=4), COST, flat))
    assert {s.stop for s in steps} == {STOP_CAP, STOP_NO_MATCH}
    capped = [s.drafted for s in steps[:-1] if s.stop == STOP_CAP]  # the last step is cut by the token budget
    assert len(capped) >= 5 and set(capped) == {4}


def test_a_steep_curve_drafts_nothing(target):
    evs, steps = steps_of(target, with_policy(NgramDrafter(k=4), COST, steep))
    assert all(s.drafted == 0 for s in steps) and sum(s.stop == STOP_COST for s in steps) >= 30
    assert evs[-1].stats["steps"] == 40  # one plain forward a token


def test_a_knee_drafts_what_fits(target):
    _, steps = steps_of(target, with_policy(NgramDrafter(k=4), COST, knee))
    cut = [s.drafted for s in steps if s.stop == STOP_COST]
    assert len(cut) >= 10 and set(cut) == {2} and max(s.drafted for s in steps) == 2


def test_a_drafter_whose_acceptance_collapses_stops_drafting(target, monkeypatch):
    """A lookup that is always wrong: under a curve where a token pays from a 26 % chance on, the cost-aware
    ngram drafts while its measured acceptance is above that, then (almost) never again; fixed K drafts on."""
    reference = hf_greedy(target, REPEATING, 48)
    never = next(t for t in range(1, 64) if t not in reference)
    monkeypatch.setattr(ngram, "lookup", lambda ids, k, *_: [never] * k)
    linear = lambda n: 1 + 0.25 * (n - 1)  # noqa: E731
    evs, steps = steps_of(target, with_policy(NgramDrafter(k=4), COST, linear), max_new_tokens=48)
    drafted = [s.drafted for s in steps]
    assert evs[-1].token_ids == reference
    assert drafted[0] == 1 and all(s.accepted == 0 for s in steps)
    assert sum(drafted[8:]) <= 2, drafted  # a rare probe at most, as the estimate drifts back
    assert {s.stop for s in steps[8:-1] if not s.drafted} == {STOP_COST}  # the last: no token left to draft
    _, fixed_steps = steps_of(target, with_policy(NgramDrafter(k=4), FIXED), max_new_tokens=48)
    assert all(s.drafted == 4 for s in fixed_steps[:-4])  # the last ones: fewer tokens left to generate


def test_no_match_is_said(target):
    _, steps = steps_of(target, with_policy(NgramDrafter(k=4), COST, flat), prompt=[5, 6, 7, 8, 9], max_new_tokens=3)
    assert steps[0].drafted == 0 and steps[0].stop == STOP_NO_MATCH


def test_a_draft_model_drops_the_tokens_its_own_q_does_not_back(target):
    """A poor draft with a cheap draft forward: drafting goes on (the running acceptance says it may pay), then
    the draft's own q cuts the chain before verification ("confidence")."""
    poor = tiny_llama(seed=1, layers=1, scale=0.3)  # flat q: P_i falls fast
    evs, steps = steps_of(target, with_policy(DraftModelDrafter(poor, k=4), COST, lambda n: 1 + 0.2 * (n - 1)))
    assert evs[-1].token_ids == hf_greedy(target, REPEATING, 40)
    assert STOP_CONFIDENCE in {s.stop for s in steps}
    assert all(s.drafted < 4 for s in steps if s.stop == STOP_CONFIDENCE)
    # the forwards whose tokens were dropped are still counted (the modelled clock prices them)
    assert all(s.draft_forwards >= s.drafted for s in steps)
    assert any(s.draft_forwards > s.drafted for s in steps if s.stop == STOP_CONFIDENCE)


# ---- lossless, and what the events say ----------------------------------------------------------------


@pytest.mark.parametrize("cost", [flat, knee, steep, lambda n: 1 + 0.1 * n], ids=["flat", "knee", "steep", "linear"])
def test_greedy_outputs_stay_those_of_none(target, cost):
    reference = hf_greedy(target, REPEATING, 40)
    eagle, medusa = tiny_heads(target)
    drafters = [NgramDrafter(k=5), DraftModelDrafter(tiny_llama(seed=0, layers=2, scale=2.0), k=4),
                EagleDrafter(eagle, target, TreeShape(depth=3, top_k=3, total_tokens=12), lookup=3),
                MedusaDrafter(medusa, target, tree=[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])]
    for drafter in drafters:
        evs, steps = steps_of(target, with_policy(drafter, COST, cost))
        assert evs[-1].token_ids == reference, drafter.name
        assert all(s.stop in STOPS for s in steps), drafter.name
        for e in evs:
            events.validate(e)


def test_the_registry_builds_cost_aware_drafters_unless_fixed_is_asked(target):
    models = specviz.loaded(target, TOK)
    assert make_drafter("ngram", models).policy.kind == COST
    assert make_drafter("ngram:k_policy=fixed", models).policy.kind == FIXED
    assert make_drafter("none", models).policy.kind == FIXED  # nothing to size
    with pytest.raises(SpecvizError, match="k_policy"):
        make_drafter("ngram:k_policy=always", models)
    runs = {kind: list(specviz.stream("abcabcabcabc", models=models, drafter=f"ngram:k_policy={kind}",
                                      max_new_tokens=16)) for kind in (COST, FIXED)}
    assert runs[COST][0].k_policy == COST and runs[FIXED][0].k_policy == FIXED
    assert runs[COST][-1].token_ids == runs[FIXED][-1].token_ids
    assert all(s.stop in STOPS for s in runs[COST][1:-1])


# ---- the Cost page's prediction --------------------------------------------------------------------------


def test_the_cost_prediction_follows_the_measured_draft_lengths():
    """A run that drafts 4 tokens on one step in three and nothing on the others (as a cost-aware drafter does
    where drafting does not pay): E(α, n) over its measured lengths matches its τ; E(α, K) overstates it."""
    rng = np.random.default_rng(0)
    alpha, steps, committed = 0.7, [], 0
    for i in range(30_000):
        length = 4 if i % 3 == 0 else 0
        tests = []
        for _ in range(length):
            tests.append({"accepted": bool(rng.random() < alpha)})
            if not tests[-1]["accepted"]:
                break
        committed += sum(t["accepted"] for t in tests) + 1
        steps.append({"type": "step", "tests": tests, "nodes": [{}] * length, "drafted": length})
    stats = {"steps": len(steps), "tau": committed / len(steps), "acceptance_rate": None, "tokens_per_s": 10.0,
             "draft_s": 0.1, "verify_s": 0.2}
    run = [{"type": "start", "drafter": "ngram", "options": {"k": 4}}, *steps, {"type": "done", "stats": stats}]
    base = analysis.summarise([run[0], {"type": "done", "stats": {**stats, "tau": 1.0}}])
    spec = analysis.summarise(run)
    cmp = analysis.speedup_comparison(base, spec)
    assert cmp["mean_drafted"] == pytest.approx(4 / 3, abs=1e-3)
    assert cmp["expected_tokens_per_step"] == pytest.approx(stats["tau"], rel=0.02)
    assert analysis.expected_tokens_per_step(alpha, 4) > 1.5 * stats["tau"]  # what K alone predicted
