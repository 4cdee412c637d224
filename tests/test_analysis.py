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


def chain_run(alpha: float, k: int, steps: int, seed: int) -> list[dict]:
    """The events (as dicts) of a chain run whose every tested token is accepted with probability alpha."""
    rng = np.random.default_rng(seed)
    step_events, accepted, committed = [], 0, 0
    for _ in range(steps):
        tests = []
        for _ in range(k):
            tests.append({"accepted": bool(rng.random() < alpha)})
            if not tests[-1]["accepted"]:
                break
        n = sum(t["accepted"] for t in tests)
        accepted, committed = accepted + n, committed + n + 1
        step_events.append({"type": "step", "tests": tests})
    stats = {"steps": steps, "tau": committed / steps, "acceptance_rate": accepted / (k * steps),
             "tokens_per_s": 10.0, "draft_s": 0.1 * steps, "verify_s": 0.2 * steps}
    return [{"type": "start", "drafter": "draft", "options": {"k": k}}, *step_events, {"type": "done", "stats": stats}]


def test_the_predicted_tokens_per_step_use_alpha_as_accepted_over_tested():
    """E(α, K) with α = accepted ÷ tested matches the measured τ of a chain run; accepted ÷ drafted (the run's
    acceptance rate) is a different, smaller number and would predict far too few tokens per step."""
    base = analysis.summarise(chain_run(0.0, 1, 10, 0))  # a baseline; only its step cost matters here
    for alpha, k in ((0.43, 4), (0.7, 4), (0.9, 6)):
        spec = analysis.summarise(chain_run(alpha, k, 20_000, 1))
        cmp = analysis.speedup_comparison(base, spec)
        assert abs(cmp["alpha"] - alpha) < 0.01
        assert abs(cmp["expected_tokens_per_step"] - cmp["measured_tau"]) < 0.02 * cmp["measured_tau"]
        wrong = analysis.expected_tokens_per_step(cmp["acceptance_rate"], k)  # the rate put into E(α, K)
        assert wrong < 0.9 * cmp["measured_tau"]
