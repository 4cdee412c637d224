"""specviz.analysis: the two-sample test behind the "Is it really lossless?" page."""
import numpy as np

from specviz import analysis

P = np.array([0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02])


def draw(rng, n, p=P):
    return list(rng.choice(len(p), size=n, p=p))


def test_the_noise_tv_matches_what_sampling_noise_gives():
    """Two samples of one distribution: their mean TV is what the page calls the noise level."""
    rng = np.random.default_rng(0)
    for n in (100, 1000):
        tests = [analysis.two_sample_test(draw(rng, n), draw(rng, n)) for _ in range(200)]
        measured = np.mean([t["tv"] for t in tests])
        predicted = np.mean([t["noise_tv"] for t in tests])
        assert abs(predicted - measured) < 0.15 * measured, (n, predicted, measured)


def test_a_shifted_distribution_is_caught_and_its_tv_exceeds_the_noise():
    rng = np.random.default_rng(1)
    shifted = np.array([0.3, 0.35, 0.15, 0.1, 0.05, 0.03, 0.02])  # 0.1 of mass moved between two outcomes
    test = analysis.two_sample_test(draw(rng, 2000), draw(rng, 2000, shifted))
    assert test["p_value"] < 1e-6 and test["tv"] > 2 * test["noise_tv"]
    same = analysis.two_sample_test(draw(rng, 2000), draw(rng, 2000))
    assert same["p_value"] > 0.001
