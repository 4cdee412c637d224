"""Medusa's typical acceptance uses Medusa's constants: the hard cap 0.09 (the paper's ε, `posterior_threshold` in its
code) and the entropy factor 0.3 (δ, `posterior_alpha`), threshold = min(0.09, 0.3 · exp(−H(p))). A rule with the
two swapped accepts tokens Medusa rejects; the checks below catch it. And it selects as Medusa's code selects: the
longest passing prefix over every root-to-leaf candidate (ties by likelihood), the argmax closing the step, the
threshold taken on softmax(logits / T) before top-k and top-p."""
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
        verdict = verify_typical(tree, rows, rule)
        wrong += verdict.tests[0].accepted != medusa_accepts(p, token)
    return wrong


def test_the_typical_rule_has_medusas_constants_under_unswappable_names():
    assert MEDUSA_TYPICAL == Typical() == Typical(hard_cap=0.09, entropy_factor=0.3)
    confident = torch.tensor([1.0] + [0.0] * 9)  # H = 0: the entropy term is 0.3, the cap 0.09 binds
    assert Typical().threshold(confident) == pytest.approx(0.09)
    flat = torch.full((64,), 1 / 64)  # H = log 64 (with Medusa's 1e-5 inside the log): 0.3 / 64 ≈ 0.0047 binds
    assert Typical().threshold(flat) == pytest.approx(0.3 / 64, rel=1e-3)


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
        def thresholds(self, probs):
            entropy = -(probs * torch.log(probs + 1e-5)).sum(-1)
            return torch.clamp(self.hard_cap * torch.exp(-entropy), max=self.entropy_factor)

    assert disagreements(SwappedFormula()) > 10


# ---- the selection over a tree, against a transcription of Medusa's `evaluate_posterior` (its `fast` path) --------


def medusa_select(logits: torch.Tensor, candidates: torch.Tensor, temperature: float) -> tuple[int, int]:
    """Medusa's evaluate_posterior at temperature > 0, transcribed step by step (our words, its operations).

    candidates: (C, L + 1) token ids, column 0 the token Medusa takes unconditionally, columns 1.. one root-to-leaf
    path each; logits: (C, L + 1, V), row j the target's logits after column j of that candidate. Returns the chosen
    candidate and its accepted length."""
    probs = torch.softmax(logits[:, :-1] / temperature, dim=-1)  # (C, L, V)
    candidate_probs = torch.gather(probs, -1, candidates[:, 1:].unsqueeze(-1)).squeeze(-1)  # (C, L)
    entropy = -torch.sum(probs * torch.log(probs + 1e-5), dim=-1)  # (C, L)
    threshold = torch.minimum(torch.full_like(entropy, POSTERIOR_THRESHOLD), torch.exp(-entropy) * POSTERIOR_ALPHA)
    passed = candidate_probs > threshold
    lengths = torch.cumprod(passed.int(), dim=1).sum(dim=1)  # (C,)
    length = int(lengths.max())
    if length == 0:
        return 0, 0
    tied = torch.where(lengths == length)[0]
    likelihood = torch.log(candidate_probs[tied, :length]).sum(-1)
    return int(tied[torch.argmax(likelihood)]), length


def medusa_candidates(tree: DraftTree, rows: torch.Tensor):
    """Medusa's (candidates, logits) for our tree: its leaves, deepest first and later nodes first (the order of its
    `retrieve_indices`), a shorter path padded to the deepest as Medusa pads it (a padding token, tested against the
    leaf's own row). Medusa pads with token 0; here the padding is an extra vocabulary entry with no mass anywhere,
    so that it never passes (with a real vocabulary token 0 practically never does)."""
    leaves = sorted(tree.leaf_paths(), key=lambda path: (-len(path), -path[-1]))
    depth = max(len(path) for path in leaves)
    pad = rows.shape[-1]
    rows = torch.cat([rows, torch.full((rows.shape[0], 1), -1e4)], dim=-1)  # (n + 1, V + 1)
    candidates, logits = [], []
    for path in leaves:
        filler = depth - len(path)
        candidates.append([0] + [tree.tokens[i] for i in path] + [pad] * filler)
        logits.append(rows[[0] + [i + 1 for i in path] + [path[-1] + 1] * filler])
    return leaves, torch.tensor(candidates), torch.stack(logits)


def small_tree():
    """Root children a (passes) then b (passes); a's child fails, b's child c passes: first-pass walking keeps [a],
    the longest prefix is [b, c]."""
    vocab = 16
    a, b, c, a2 = 3, 5, 7, 9
    tree = DraftTree()
    node_a = tree.add(a, -1)
    node_b = tree.add(b, -1)
    tree.add(a2, node_a)
    tree.add(c, node_b)

    def row(best: int, second: int) -> torch.Tensor:
        logits = torch.full((vocab,), -4.0)
        logits[best], logits[second] = 3.0, 2.5
        return logits

    rows = torch.stack([row(a, b), row(11, 12), row(c, 12), row(13, 14), row(2, 14)])  # (n + 1, V) logits
    return tree, rows


def test_the_typical_rule_keeps_the_longest_passing_prefix_as_medusa_does():
    tree, logits = small_tree()
    verdict = MEDUSA_TYPICAL(tree, torch.softmax(logits, -1), False, torch.Generator(), 5, logits=logits,
                             temperature=1.0)
    leaves, candidates, medusa_logits = medusa_candidates(tree, logits)
    chosen, length = medusa_select(medusa_logits, candidates, 1.0)
    assert length == 2
    assert verdict.path == leaves[chosen][:length] == [1, 3]  # b then c, not a alone
    assert verdict.token == int(logits[4].argmax())  # Medusa's next first token: the argmax after c
    assert verdict.kind == "bonus"
    assert [t.rule for t in verdict.tests] == ["typical"] * 4 and all(t.u is None for t in verdict.tests)
    assert [t.accepted for t in verdict.tests] == [True, True, False, True]


def test_the_typical_rule_selects_as_medusas_code_on_random_trees():
    """The default Medusa tree, each depth's tokens the ranks of one head (a random order of the vocabulary, so
    siblings differ as in Medusa), random logits sharpened so that prefixes of every length occur."""
    from specviz.drafters.medusa import DEFAULT_TREE

    generator = torch.Generator().manual_seed(1)
    lengths = set()
    for trial in range(200):
        tree = DraftTree()
        node_of = {}
        heads = [torch.randperm(12, generator=generator).tolist() for _ in range(4)]  # each head's ranking
        for path in DEFAULT_TREE:
            parent = -1 if len(path) == 1 else node_of[path[:-1]]
            node_of[path] = tree.add(heads[len(path) - 1][path[-1]], parent)
        logits = 3.0 * torch.randn(len(tree) + 1, 12, generator=generator)
        temperature = 0.8
        leaves, candidates, medusa_logits = medusa_candidates(tree, logits)
        chosen, length = medusa_select(medusa_logits, candidates, temperature)
        verdict = MEDUSA_TYPICAL(tree, torch.softmax(logits, -1), False, torch.Generator(), 5, logits=logits,
                                 temperature=temperature)
        lengths.add(length)
        assert verdict.path == leaves[chosen][:length], trial
        last = verdict.path[-1] if verdict.path else -1
        assert verdict.token == int(logits[last + 1].argmax()), trial
    assert lengths >= {0, 1, 2, 3}


def test_the_typical_threshold_reads_softmax_of_logits_over_t_before_top_k():
    """With top-k = 1 the processed p is a point mass on the argmax; Medusa thresholds softmax(logits / T)."""
    from specviz.decoding.sampling import Sampling, process

    tree, logits = small_tree()
    processed = process(logits, Sampling(temperature=1.0, top_k=1))
    verdict = MEDUSA_TYPICAL(tree, processed, False, torch.Generator(), 5, logits=logits, temperature=1.0)
    assert verdict.path == [1, 3]  # on the point mass b would fail at the root (p(b) = 0)
    assert verdict.tests[1].p == pytest.approx(float(torch.softmax(logits[0], -1)[5]))
