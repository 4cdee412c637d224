"""What a chi-square test can and cannot show: the smallest total-variation distance N samples per side detect at the
1 % level (checked by simulation, with a planted miscount caught), and the goodness-of-fit test pooling outcomes too
rare for the approximation."""
import math

import numpy as np
import pytest

from specviz import analysis


def rejection_rate(n: int, tv: float, reps: int = 400, seed: int = 0) -> float:
    """How often the two-sample test at 1 % rejects two distributions at distance `tv` of the hardest shape for it
    (the difference proportional to the pooled shares: four outcomes of 1/4, two up and two down by tv/2)."""
    rng = np.random.default_rng(seed)
    pooled = np.full(4, 0.25)
    a, b = pooled + np.array([1, 1, -1, -1]) * tv / 4, pooled - np.array([1, 1, -1, -1]) * tv / 4
    assert analysis.total_variation(a, b) == pytest.approx(tv)
    rejected = 0
    for _ in range(reps):
        test = analysis.two_sample_test(list(rng.choice(4, n, p=a)), list(rng.choice(4, n, p=b)))
        rejected += test["p_value"] < 0.01
    return rejected / reps


def test_the_detectable_distance_is_detected_with_the_stated_power():
    n = 400
    tv = analysis.detectable_tv(n, n, dof=3)
    assert 0.1 < tv < 0.2
    assert 0.72 <= rejection_rate(n, tv) <= 0.88  # stated power 0.8; 400 replicates: ±0.04 at two standard errors
    assert rejection_rate(n, 0.6 * tv, seed=1) < 0.5  # and it is not far more than needed


def test_a_planted_miscount_of_the_samples_is_caught():
    """Had the bound used N per side instead of N·N ÷ (N + N), it would promise √2 smaller distances."""
    n = 400
    promised = analysis.detectable_tv(n, n, dof=3) / math.sqrt(2)
    assert rejection_rate(n, promised, seed=2) < 0.6


def test_more_samples_see_smaller_differences_and_few_see_nothing():
    tvs = [analysis.detectable_tv(n, n, dof=4) for n in (30, 300, 3_000, 30_000)]
    assert tvs == sorted(tvs, reverse=True)
    assert tvs[1] / tvs[2] == pytest.approx(math.sqrt(10))  # as 1/√N
    assert analysis.detectable_tv(10, 10, dof=10) > 1  # no difference at all is sure to be seen
    assert analysis.detectable_tv(100, 100, dof=0) == math.inf


def test_goodness_of_fit_pools_rare_outcomes_and_declines_with_too_few_samples():
    p = [0.40, 0.25, 0.15, 0.15, 0.05]
    few = analysis.goodness_of_fit([4, 3, 2, 1, 0], p)  # n = 10: every expected count is below 5
    assert few["pooled"] == 5 and math.isnan(few["p_value"])
    some = analysis.goodness_of_fit([44, 22, 14, 16, 4], p)  # n = 100: 0.05 · 100 = 5 stays a cell of its own
    assert some["pooled"] == 0 and some["dof"] == 4 and 0 < some["p_value"] <= 1
    skewed = analysis.goodness_of_fit([50, 30, 16, 3, 1], [0.5, 0.3, 0.16, 0.03, 0.01])  # 3 and 1 expected: pooled
    assert skewed["pooled"] == 2 and skewed["dof"] == 3
    assert analysis.goodness_of_fit([5, 0, 1], [0.5, 0.5, 0.0])["p_value"] == 0.0  # an impossible outcome


def long_tail(swapped: bool = False) -> np.ndarray:
    """10 outcomes at 0.06 and 400 at 0.001; `swapped`: the tail's mass moved onto its first half (TV 0.20)."""
    tail = np.full(400, 0.001)
    if swapped:
        tail = np.r_[np.full(200, 0.002), np.zeros(200)]
    return np.r_[np.full(10, 0.06), tail]


def test_the_bound_is_over_the_tests_columns_and_the_tv_shown_is_too():
    """What `detectable_tv` bounds is the distance over the test's columns (rare outcomes pooled): a 0.20 difference
    inside the pooled tail is not seen, and the TV shown for it is the columns' one. Noise alone on the long tail
    stays below the "sure to see" bound over those columns (over unpooled outcomes it would not: about 0.39)."""
    assert analysis.total_variation(long_tail(), long_tail(swapped=True)) == pytest.approx(0.2)
    rng = np.random.default_rng(0)
    n = 300
    hidden, noise = [], []
    for _ in range(100):
        same = analysis.two_sample_test(list(rng.choice(410, n, p=long_tail())), list(rng.choice(410, n, p=long_tail())))
        moved = analysis.two_sample_test(list(rng.choice(410, n, p=long_tail())),
                                         list(rng.choice(410, n, p=long_tail(swapped=True))))
        noise.append((same["tv"], same["tv_outcomes"], analysis.detectable_tv(n, n, same["dof"])))
        hidden.append(moved["p_value"] < 0.01)
    assert np.mean(hidden) < 0.05  # the tail's difference is invisible to the test
    tv, tv_outcomes, bound = np.mean(noise, axis=0)
    assert tv < bound < tv_outcomes
    assert tv_outcomes > 0.3


def test_the_degrees_of_freedom_grow_with_n_as_fewer_outcomes_are_pooled():
    shares = list(long_tail())
    assert analysis.columns_at(shares, 300) == 11  # the ten common outcomes and the pooled tail
    assert analysis.columns_at(shares, 30_000) == 410  # every tail outcome expects 30 a side
    assert analysis.columns_at([0.5, 0.5], 100) == 2
