"""Exact target distributions by enumeration, and a chi-square test of sampled counts against them."""
from __future__ import annotations

import torch
from scipy import stats

from specviz.decoding import engine
from specviz.decoding.sampling import Sampling, process

from tiny import decode_settings


@torch.no_grad()
def exact_two_tokens(target, prompt: list[int], sampling: Sampling) -> torch.Tensor:
    """(V, V): probability that the target alone generates (t1, t2) after `prompt`, with processed p."""
    vocab = target.config.vocab_size
    p1 = process(target(torch.tensor([prompt])).logits[0, -1], sampling)  # (V,)
    seqs = torch.tensor([prompt + [t] for t in range(vocab)])
    p2 = process(target(seqs).logits[:, -1], sampling)  # (V, V): row t1 is p(t2 | prompt, t1)
    return p1[:, None] * p2


def sampled_two_tokens(target, tok, make_drafter, prompt, sampling, n, seed0=0) -> torch.Tensor:
    """(V, V) counts of the first two tokens over n seeded runs of the engine."""
    vocab = target.config.vocab_size
    counts = torch.zeros(vocab, vocab)
    for i in range(n):
        settings = decode_settings(max_new_tokens=2, sampling=sampling, seed=seed0 + i, n_top=0)
        done = list(engine.decode(target, tok, make_drafter(), prompt, settings))[-1]
        t1, t2 = done.token_ids
        counts[t1, t2] += 1
    return counts


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Goodness of fit of counts to probs; cells with a small expected count are pooled into one."""
    n = counts.sum()
    counts, expected = counts.flatten().double(), (probs.flatten() * n).double()
    small = expected < min_expected
    obs = torch.cat([counts[~small], counts[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    if exp[-1] == 0:
        if obs[-1] > 0:  # a token the target gives probability 0 was produced
            return 0.0
        obs, exp = obs[:-1], exp[:-1]
    exp = exp * obs.sum() / exp.sum()
    return float(stats.chisquare(obs.numpy(), exp.numpy()).pvalue)


def total_variation(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - probs).abs().sum())


def unnormalised_residual(p: torch.Tensor, x: int, q_dist) -> torch.Tensor:
    """A planted bug for verify's `_residual`: the rejected token's mass removed but not renormalised, so the next
    sibling is accepted with too small a probability."""
    r = p.clone()
    r[x] = 0.0
    return r
