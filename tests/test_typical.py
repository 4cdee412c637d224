"""Medusa's typical acceptance uses Medusa's constants: the hard cap 0.09 (the paper's ε, `posterior_threshold` in its
code) and the entropy factor 0.3 (δ, `posterior_alpha`), threshold = min(0.09, 0.3 · exp(−H(p))). A rule with the
two swapped accepts tokens Medusa rejects; the checks below catch it."""
import math

import pytest
import torch

from specviz.decoding.tree import DraftTree
from specviz.decoding.verify import MEDUSA_TYPICAL, Typical, verify_typical
from specviz.drafters.medusa import MedusaDrafter
from specviz.models.heads import MedusaHeads

from tiny import tiny_llama

# as FasterDecoding/Medusa's medusa_generate passes them to evaluate_posterior
POSTERIOR_THRESHOLD, POSTERIOR_ALPHA = 0.09, 0.3


def medusa_accepts(p: torch.Tensor, token: int) -> bool:
    """Medusa's evaluate_posterior for one candidate, written out from its code: p(x) > min(posterior_threshold,
    exp(−H) · posterior_alpha) (with the exact entropy; Medusa adds 1e-5 inside the log)."""
    entropy = float(-(p * torch.log(p.clamp_min(1e-12))).sum())
    return float(p[token]) > min(POSTERIOR_THRESHOLD, math.exp(-entropy) * POSTERIOR_ALPHA)


def cases():
    """(p, token) pairs over a range of entropies (near 0 to about log 64) and candidate ranks, kept away from the
    threshold by 2 % so the entropy's 1e-5 detail cannot decide them."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for scale in (0.3, 0.6, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 10.0):
        for _ in range(4):
            p = torch.softmax(scale * torch.randn(64, generator=generator), dim=0)
            entropy = float(-(p * torch.log(p)).sum())
            threshold = min(POSTERIOR_THRESHOLD, POSTERIOR_ALPHA * math.exp(-entropy))
            for rank in range(8):
                token = int(torch.argsort(p, descending=True)[rank])
                if abs(float(p[token]) - threshold) > 0.02 * threshold:
                    out.append((p, token))
    return out


def disagreements(rule: Typical) -> int:
    """How many cases `rule`, run through verify_typical on a one-child tree, decides otherwise than Medusa."""
    wrong = 0
    for p, token in cases():
        tree = DraftTree()
        tree.add(token, -1)
        rows = torch.stack([p, p])  # (2, V): p at the root and after the child
        verdict = verify_typical(tree, rows, rule, torch.Generator().manual_seed(0))
        wrong += verdict.tests[0].accepted != medusa_accepts(p, token)
    return wrong


def test_the_typical_rule_has_medusas_constants_under_unswappable_names():
    assert MEDUSA_TYPICAL == Typical() == Typical(hard_cap=0.09, entropy_factor=0.3)
    confident = torch.tensor([1.0] + [0.0] * 9)  # H = 0: the entropy term is 0.3, the cap 0.09 binds
    assert Typical().threshold(confident) == pytest.approx(0.09)
    flat = torch.full((64,), 1 / 64)  # H = log 64: 0.3 / 64 ≈ 0.0047 binds
    assert Typical().threshold(flat) == pytest.approx(0.3 / 64)


def test_medusas_drafter_defaults_to_medusas_constants():
    target = tiny_llama(scale=3.0)
    drafter = MedusaDrafter(MedusaHeads(target.config).eval(), target, tree=[(0,), (0, 0)], typical=True)
    assert drafter.acceptance == MEDUSA_TYPICAL


def test_the_rule_decides_as_medusas_code_does():
    assert len(cases()) > 150
    assert disagreements(MEDUSA_TYPICAL) == 0


def test_a_planted_swapped_rule_is_caught():
    swapped = Typical(hard_cap=0.3, entropy_factor=0.09)  # the two constants exchanged
    assert disagreements(swapped) > 10

    class SwappedFormula(Typical):  # the names right, the formula's two roles exchanged
        def threshold(self, p_here):
            entropy = float(-(p_here * torch.log(p_here.clamp_min(1e-12))).sum())
            return min(self.entropy_factor, self.hard_cap * math.exp(-entropy))

    assert disagreements(SwappedFormula()) > 10
