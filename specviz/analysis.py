"""The numbers the app's pages compute besides decoding: bandwidth arithmetic, cost, predicted speedup,
the speculative sampling rule on small hand-made distributions, and two-sample statistics.

Pure Python (numpy, scipy); never imports streamlit. p = target, q = draft. The copy-bandwidth measurement is
specviz.bench.BandwidthProbe.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Datasheet figures (not measured here). Sources: NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: 3.35 TB/s
# HBM3, 989 TFLOPS dense BF16 tensor core, i.e. half the 1,979 quoted with sparsity) and NVIDIA H200 datasheet
# (4.8 TB/s HBM3e, same compute as H100 SXM).
GPU_DATASHEET = {
    "H100 SXM": {"bandwidth_tb_s": 3.35, "bf16_tflops": 989.0, "source": "NVIDIA H100 datasheet"},
    "H200": {"bandwidth_tb_s": 4.8, "bf16_tflops": 989.0, "source": "NVIDIA H200 datasheet"},
}


# ------------------------------------------------------------------------------------------ bandwidth


def ms_per_token(params: float, bytes_per_param: float, bandwidth_bytes_per_s: float) -> float:
    """Lower bound on one decode step at batch 1: every weight is read from memory once per token."""
    return params * bytes_per_param / bandwidth_bytes_per_s * 1e3


# ----------------------------------------------------------------------------------------------- cost


def usd_per_million(usd_per_gpu_hour: float, n_gpus: int, tokens_per_s: float) -> float:
    """$ per million output tokens = $/hour for the GPUs ÷ tokens per hour × 1e6."""
    if tokens_per_s <= 0:
        return math.inf
    return usd_per_gpu_hour * n_gpus / (tokens_per_s * 3600) * 1e6


# -------------------------------------------------------------------------------------------- speedup


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """E[tokens per target forward] for a chain of k drafted tokens each accepted with probability α
    independently, counting the replacement/bonus token: (1 − α^(k+1)) / (1 − α)."""
    if alpha >= 1.0:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_tokens_over(alpha: float, drafted: list[int] | tuple[int, ...], k: int) -> float:
    """E(α, n) averaged over the drafted lengths n of a run's steps: a drafter whose length varies (the
    cost-aware policy, a lookup that finds fewer tokens) drafts 0 on some steps and K on others, and the formula
    holds per step. Where every step drafts K it is E(α, K); with no steps it falls back to E(α, k)."""
    if not drafted:
        return expected_tokens_per_step(alpha, k)
    return sum(expected_tokens_per_step(alpha, n) for n in drafted) / len(drafted)


def predicted_speedup(tokens_per_step: float, step_cost: float) -> float:
    """The speedup over plain decoding: tokens committed per step ÷ the step's cost in units of one plain target
    forward. The cost page feeds it E(α, K); the bench, the measured τ and the verify-cost curve."""
    return tokens_per_step / step_cost


@dataclass
class RunSummary:
    """What the speedup comparison needs from one run's done event and step events."""

    drafter: str
    k: int
    tokens_per_s: float
    tau: float
    acceptance_rate: float | None  # accepted drafted tokens ÷ drafted tokens (untested ones count)
    draft_ms_per_step: float
    verify_ms_per_step: float
    tested: int = 0  # drafted tokens the acceptance test ran on (a chain stops testing at its first rejection)
    accepted_tested: int = 0
    drafted: tuple[int, ...] = ()  # drafted tokens of each step, as measured (K where every step drafts K)

    @property
    def mean_drafted(self) -> float:
        """Drafted tokens per step, measured (K only where every step drafted K)."""
        return sum(self.drafted) / len(self.drafted) if self.drafted else float(self.k)

    @property
    def alpha(self) -> float | None:
        """Accepted ÷ tested: the probability that a tested token is accepted, the α of E(α, K)."""
        return self.accepted_tested / self.tested if self.tested else None

    @property
    def ms_per_step(self) -> float:
        return self.draft_ms_per_step + self.verify_ms_per_step


def summarise(events: list[dict]) -> RunSummary:
    """The run's own statistics (its done event, as the engine's Metrics computed them), per step."""
    start, done = events[0], events[-1]
    stats = done["stats"]
    n = max(stats["steps"], 1)
    tests = [t for e in events if e["type"] == "step" for t in e["tests"]]
    return RunSummary(
        drafter=start["drafter"],
        k=int(start["options"].get("k") or start["options"].get("depth") or 0),  # chains: K; trees: their depth
        tokens_per_s=done["stats"]["tokens_per_s"],
        tau=done["stats"]["tau"],
        acceptance_rate=done["stats"]["acceptance_rate"],
        draft_ms_per_step=1e3 * stats["draft_s"] / n,
        verify_ms_per_step=1e3 * stats["verify_s"] / n,
        tested=len(tests),
        accepted_tested=sum(t["accepted"] for t in tests),
        drafted=tuple(n for e in events if e["type"] == "step" and (n := drafted_in(e)) is not None),
    )


def speedup_comparison(baseline: RunSummary, spec: RunSummary) -> dict:
    """Predicted (from measured α and measured step cost) next to measured speedup over the baseline.

    α is accepted ÷ tested, the probability that a tested token is accepted, which is what E(α, K) assumes;
    accepted ÷ drafted (the run's acceptance rate) is smaller, α(1 − α^K) / (K(1 − α)) for a K-token chain, and
    would predict too few tokens per step. The tokens per step are E(α, n) over the drafted lengths n the run's
    steps measured (expected_tokens_over), not E(α, K): a cost-aware draft is often shorter than K, or empty."""
    alpha = spec.alpha or 0.0
    step_cost = spec.ms_per_step / baseline.ms_per_step  # in plain target forwards
    expected = expected_tokens_over(alpha, spec.drafted, spec.k)
    return {
        "alpha": alpha,
        "acceptance_rate": spec.acceptance_rate,
        "k": spec.k,
        "mean_drafted": spec.mean_drafted,
        "expected_tokens_per_step": expected,
        "measured_tau": spec.tau,
        "step_cost": step_cost,
        "predicted_speedup": predicted_speedup(expected, step_cost),
        "measured_speedup": spec.tokens_per_s / baseline.tokens_per_s if baseline.tokens_per_s else math.nan,
    }


def batch_speedup_model(batch_sizes, params: float, bytes_per_param: float, bandwidth_bytes_per_s: float,
                        flops_per_s: float, alpha: float, k: int, draft_cost: float) -> list[float]:
    """A roofline MODEL (not a measurement) of speculative speedup against batch size.

    One forward over n tokens takes max(weights / bandwidth, 2 · params · n / FLOPS): memory-bound at small n,
    compute-bound at large n. Autoregressive: n = B. Speculative: the target verifies B · (k + 1) tokens, and
    the draft costs `draft_cost` plain target forwards per drafted token. KV-cache reads are ignored."""
    def forward_s(n_tokens):
        return max(params * bytes_per_param / bandwidth_bytes_per_s, 2 * params * n_tokens / flops_per_s)

    gain = expected_tokens_per_step(alpha, k)
    out = []
    for b in batch_sizes:
        plain = forward_s(b)
        spec = forward_s(b * (k + 1)) + k * draft_cost * plain
        out.append(gain * plain / spec)
    return out


# ------------------------------------------------------------------------------ the speculative rule


def normalise(weights) -> np.ndarray:
    w = np.clip(np.asarray(weights, dtype=float), 0, None)
    total = w.sum()
    if total <= 0:
        raise ValueError("a distribution needs at least one positive weight")
    return w / total


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray | None:
    """max(0, p − q) normalised; None when p == q (a rejection then never happens)."""
    r = np.clip(p - q, 0, None)
    return r / r.sum() if r.sum() > 1e-12 else None


def speculative_samples(p, q, n: int, seed: int = 0, skip_residual: bool = False) -> tuple[np.ndarray, int]:
    """n independent draws with the speculative rule: x ~ q, accept when u ≤ min(1, p(x)/q(x)), else draw from
    the residual. Returns (tokens (n,), number accepted). skip_residual=True plants a bug (redraw from q
    instead of the residual) so a learner can watch the statistics catch it."""
    p, q = normalise(p), normalise(q)
    rng = np.random.default_rng(seed)
    x = rng.choice(len(q), size=n, p=q)
    with np.errstate(divide="ignore", invalid="ignore"):
        alpha = np.minimum(1.0, p[x] / q[x])
    accepted = rng.random(n) <= alpha
    r = q if skip_residual else residual(p, q)
    out = x.copy()
    n_rejected = int((~accepted).sum())
    if n_rejected and r is not None:
        out[~accepted] = rng.choice(len(p), size=n_rejected, p=r)
    return out, int(accepted.sum())


def total_variation(a, b) -> float:
    """½ Σ |a − b| over two distributions (or count vectors, normalised first)."""
    a, b = normalise(a), normalise(b)
    return 0.5 * float(np.abs(a - b).sum())


def goodness_of_fit(counts, p, min_expected: float = 5.0) -> dict:
    """Pearson's chi-square test of observed counts against the distribution p. Outcomes whose expected count
    n·p is below `min_expected` are pooled into one cell (the chi-square approximation needs it); with fewer than
    two cells left no test is possible and the p-value is NaN. A count where p is 0 is an impossible outcome: the
    statistic is then infinite and the p-value 0."""
    from scipy import stats

    counts, p = np.asarray(counts, dtype=float), normalise(p)
    n = counts.sum()
    support = p > 0
    result = {"n": int(n), "chi2": math.nan, "dof": 0, "p_value": math.nan, "tv": total_variation(counts, p),
              "pooled": 0, "cells": 0}
    if (counts[~support] > 0).any():
        return {**result, "chi2": math.inf, "dof": int(support.sum() - 1), "p_value": 0.0}
    expected = n * p[support]
    common = expected >= min_expected
    observed_cells, expected_cells = list(counts[support][common]), list(expected[common])
    if (~common).any():
        observed_cells.append(counts[support][~common].sum())
        expected_cells.append(expected[~common].sum())
    result.update(pooled=int((~common).sum()), cells=len(observed_cells))
    if len(observed_cells) < 2:
        return result
    chi2, p_value = stats.chisquare(observed_cells, expected_cells)
    return {**result, "chi2": float(chi2), "dof": len(observed_cells) - 1, "p_value": float(p_value)}


def detectable_tv(n_a: int, n_b: int, dof: int, level: float = 0.01, power: float = 0.8) -> float:
    """The smallest total-variation distance between two distributions that Pearson's chi-square test of
    homogeneity on n_a and n_b samples (dof degrees of freedom, rejecting at `level`) detects with probability at
    least `power`, whatever the shape of the difference over the test's columns, in the test's large-sample
    approximation. The distance is over those columns (the common outcomes and the pooled rest, as `two_sample_test`
    makes them), not over the outcomes: mass moved among pooled outcomes is invisible to the test.

    Under an alternative the statistic is noncentral chi-square with noncentrality λ = n_eff · Σ (a_i − b_i)² / m_i,
    n_eff = n_a·n_b ÷ (n_a + n_b) and m the pooled shares. By Cauchy–Schwarz Σ (a_i − b_i)² / m_i ≥ (Σ |a_i − b_i|)²
    = 4·TV², with equality when |a_i − b_i| is proportional to m_i (the hardest difference to see), so every
    alternative at distance TV has λ ≥ 4·n_eff·TV². The answer is the TV whose λ gives the test `power`.
    Above 1 (returned as is): no difference at all is sure to be seen with so few samples."""
    from scipy import optimize, stats

    if n_a <= 0 or n_b <= 0 or dof < 1:
        return math.inf
    critical = stats.chi2.ppf(1 - level, dof)
    lam = optimize.brentq(lambda x: stats.ncx2.sf(critical, dof, x) - power, 1e-9, 1e6)
    return math.sqrt(lam / (4 * n_a * n_b / (n_a + n_b)))


def two_sample_test(samples_a: list, samples_b: list, min_expected: float = 5.0) -> dict:
    """Are two lists of outcomes drawn from the same distribution? Chi-square test of homogeneity on the
    2 × C contingency table, with outcomes whose expected count is below `min_expected` pooled into one
    "other" column (the chi-square approximation needs it).

    `tv` is the total variation distance between the two empirical distributions over the test's own columns (the
    common outcomes and the pooled rest): the distance the test and `detectable_tv` speak of; `noise_tv` what
    sampling noise alone gives it. `tv_outcomes` is the distance over the outcomes themselves, unpooled: on a long
    tail it is large from noise alone, and a difference that only moves mass among pooled outcomes shows there and
    in no column of the test. `shares`: each outcome's share of both samples together (for `columns_at`)."""
    from collections import Counter

    from scipy import stats

    ca, cb = Counter(samples_a), Counter(samples_b)
    na, nb = len(samples_a), len(samples_b)
    outcomes = sorted(set(ca) | set(cb), key=lambda o: -(ca[o] + cb[o]))
    tv_outcomes = 0.5 * sum(abs(ca[o] / na - cb[o] / nb) for o in outcomes) if na and nb else math.nan
    share_a = na / (na + nb) if na + nb else 0
    common = [o for o in outcomes if min(share_a, 1 - share_a) * (ca[o] + cb[o]) >= min_expected]
    rare = [o for o in outcomes if o not in common]
    table = [[ca[o] for o in common], [cb[o] for o in common]]
    if rare:
        table[0].append(sum(ca[o] for o in rare))
        table[1].append(sum(cb[o] for o in rare))
    tv = 0.5 * sum(abs(x / na - y / nb) for x, y in zip(*table)) if na and nb else math.nan
    # the TV that sampling noise alone gives two samples of these sizes from one distribution (the pooled one), over
    # the same columns: each share difference is about normal with variance m(1 − m)(1/na + 1/nb), E|Z| = σ·√(2/π)
    columns = [(x + y) / (na + nb) for x, y in zip(*table)] if na and nb else []
    noise_tv = (0.5 * sum(math.sqrt(2 / math.pi * m * (1 - m) * (1 / na + 1 / nb)) for m in columns)
                if columns else math.nan)
    result = {"n_a": na, "n_b": nb, "tv": tv, "tv_outcomes": tv_outcomes, "noise_tv": noise_tv,
              "columns": len(table[0]), "pooled": len(rare), "chi2": math.nan, "dof": 0, "p_value": math.nan,
              "shares": [(ca[o] + cb[o]) / (na + nb) for o in outcomes] if na and nb else []}
    if len(table[0]) >= 2:
        chi2, p_value, dof, _ = stats.chi2_contingency(np.array(table), correction=False)
        result.update(chi2=float(chi2), dof=int(dof), p_value=float(p_value))
    elif len(outcomes) == 1:
        result.update(chi2=0.0, p_value=1.0)  # one outcome only: both samples agree completely
    # else every outcome is rare: no test is possible (p_value stays NaN); more samples are needed
    return result


def columns_at(shares: list[float], n: int, min_expected: float = 5.0) -> int:
    """The columns `two_sample_test` would make with n samples a side from outcomes of these shares: those expecting
    at least `min_expected` a side, plus one for the pooled rest if any. More samples, fewer pooled, more columns."""
    common = sum(1 for m in shares if n * m >= min_expected)
    return common + (common < len(shares))



def samples_for_a_test(shares: list[float], n: int) -> int | None:
    """The fewest samples a side above n with which `two_sample_test` has two columns (one degree of freedom): the
    most frequent outcome, at its share in this sample, expects `min_expected` = 5 a side and gets a column of its
    own beside the pooled rest. None when every sample gave one outcome (no second column at any n)."""
    if len(shares) < 2:
        return None
    return max(n + 1, math.ceil(5 / max(shares) - 1e-9))

# ------------------------------------------------------------------------------- the acceptance histogram


def acceptance_histogram(steps: list[dict], done: dict | None = None) -> list[int]:
    """From a run's step events, what specviz.decoding.metrics.acceptance_histogram computes from its counts:
    index j = the steps that drafted something and committed exactly j drafted tokens (steps that drafted nothing
    left out, as in vLLM's per-request `acceptance_histogram`); empty when nothing was drafted. A run from an engine
    that reports only counts (vLLM) has no tree to read: its Done event's histogram, as the engine reported it,
    is used where there is one."""
    if done is not None and not any(s.get("nodes") for s in steps) and done["stats"].get("acceptance_histogram"):
        return list(done["stats"]["acceptance_histogram"])
    drafting = [s for s in steps if s.get("nodes")]
    if not drafting:
        return []
    out = [0] * (max(n["depth"] for s in drafting for n in s["nodes"]) + 1)
    for s in drafting:
        out[sum(c["kind"] == "accepted" for c in s["committed"])] += 1
    return out


def drafted_nothing(steps: list[dict]) -> int:
    """Steps that drafted no token (prompt lookup without a match, `none`): the acceptance histogram leaves them
    out. A step counts when its engine reported 0 drafted, or it carries the verification detail (`final`) and no
    tree; an engine that reported no count for a step says nothing about it."""
    return sum(1 for s in steps if drafted_in(s) == 0 or (drafted_in(s) is None and s.get("final")))


def drafted_in(step: dict) -> int | None:
    """Drafted tokens a step verified: its tree's size, or the count an engine without a tree reported (None
    when it reported none)."""
    return len(step["nodes"]) if step.get("nodes") else step.get("drafted")


def ends_with(step: dict) -> str:
    """How a step's last committed token was made: replacement, bonus or autoregressive."""
    if step.get("final"):
        return step["final"]["kind"]
    return step["committed"][-1]["kind"] if step["committed"] else "none"


# ------------------------------------------------------------------------------- the measured batch surface
# A batch surface is {B: {n: ms}} (string keys, as specviz.bench.batch writes it): the measured cost c(B, n) of
# one target forward over B sequences × n new tokens each.


def surface_grid(ms: dict) -> dict[int, dict[int, float]]:
    """{"B": {"n": ms}} → {B: {n: ms}} with integer keys, sorted."""
    return {int(b): {int(n): float(v) for n, v in sorted(row.items(), key=lambda kv: int(kv[0]))}
            for b, row in sorted(ms.items(), key=lambda kv: int(kv[0]))}


def surface_ratios(ms: dict) -> dict[int, dict[int, float]]:
    """c(B, n) ÷ c(B, 1): what n new tokens per sequence cost, in forwards of one new token per sequence at the
    same batch size."""
    return {b: {n: c / row[1] for n, c in row.items()} for b, row in surface_grid(ms).items()}


def speculative_step_cost(row: dict[int, float], k: int, draft_cost: float) -> float:
    """One speculative step at one batch size, in plain forwards c(B, 1): verifying K + 1 tokens per sequence,
    c(B, K + 1) ÷ c(B, 1), plus drafting K tokens at `draft_cost` plain forwards each (as batch_speedup_model
    charges the draft)."""
    if k + 1 not in row:
        raise ValueError(f"the surface has no n = {k + 1} (K + 1 for K = {k}); it measures n = {sorted(row)}")
    return row[k + 1] / row[1] + k * draft_cost


def measured_batch_gain(ms: dict, alpha: float, k: int, draft_cost: float) -> dict[int, float]:
    """The speedup of speculative decoding predicted at each measured batch size:
    gain(B) = E(α, K) ÷ (c(B, K + 1) ÷ c(B, 1) + K · draft_cost), E(α, K) = (1 − α^(K+1)) ÷ (1 − α)
    (Leviathan et al., 2023), the same assumptions as the roofline model but the forward's cost measured."""
    tokens = expected_tokens_per_step(alpha, k)
    return {b: predicted_speedup(tokens, speculative_step_cost(row, k, draft_cost)) for b, row in surface_grid(ms).items()}


def batch_node_rows(ms: dict, alpha: float, k: int, draft_cost: float, usd_per_hour: float) -> list[dict]:
    """Per batch size: the node's total tokens/s over all B sequences, plain (B tokens per c(B, 1)) and
    speculative (B · E(α, K) tokens per step), and $ per million tokens = price ÷ that total throughput."""
    tokens = expected_tokens_per_step(alpha, k)
    rows = []
    for b, row in surface_grid(ms).items():
        plain = b * 1e3 / row[1]
        spec = b * tokens * 1e3 / (row[1] * speculative_step_cost(row, k, draft_cost))
        rows.append({"batch": b, "plain_tokens_per_s": plain, "spec_tokens_per_s": spec,
                     "plain_usd_per_million": usd_per_million(usd_per_hour, 1, plain),
                     "spec_usd_per_million": usd_per_million(usd_per_hour, 1, spec)})
    return rows
