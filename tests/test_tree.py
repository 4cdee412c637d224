"""Tree verification: mask and positions, cache gather, greedy identity, statistical losslessness."""
import math
import random

import pytest
import torch

from specviz.decoding import engine
from specviz.decoding import verify as verify_module
from specviz.decoding.costs import AUTO_SIZES, interpolate
from specviz.decoding.sampling import Sampling
from specviz.decoding.tree import DraftTree
from specviz.drafters.eagle import EagleDrafter, TreeShape
from specviz.drafters.medusa import MedusaDrafter, check_tree
from specviz.errors import SpecvizError
from specviz.kernels.kvcache import keep_cache_entries
from specviz.models.heads import EagleHead, MedusaHeads

from stats import chi_square_p_value, exact_two_tokens, sampled_two_tokens, unnormalised_residual
from tiny import TinyTokenizer, decode_settings, hf_greedy, tiny_llama
from tree_drafters import TopBTree

PROMPT = [5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6]


def random_tree(n=12, vocab=64, seed=0) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    tree = DraftTree()
    for i in range(n):
        parent = int(torch.randint(-1, i, (1,), generator=g)) if i else -1
        tree.add(int(torch.randint(1, vocab, (1,), generator=g)), parent)
    return tree


@torch.no_grad()
def test_tree_logits_equal_running_each_path_sequentially():
    model = tiny_llama(scale=3.0)
    target = engine.Target(model)
    tree = random_tree()
    cache = target.new_cache()
    target.forward(PROMPT[:-1], cache)
    past = len(PROMPT) - 1
    mask = tree.attention_mask(past)
    _, logits = target.forward([PROMPT[-1]] + tree.tokens, cache, tree.position_ids(past), mask)
    full = lambda ids: model(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(logits[0], full(PROMPT), atol=1e-4, rtol=1e-4)
    for node in range(len(tree)):
        path = [tree.tokens[i] for i in tree.path_to(node)]
        torch.testing.assert_close(logits[node + 1], full(PROMPT + path), atol=1e-4, rtol=1e-4)


def test_mask_positions_and_paths_of_a_small_tree():
    tree = DraftTree()
    a = tree.add(11, -1)
    b = tree.add(12, -1)
    c = tree.add(13, a)
    assert tree.depths() == [1, 1, 2]
    assert tree.position_ids(10).tolist() == [[10, 11, 11, 12]]
    assert tree.leaf_paths() == [[b], [a, c]]
    allowed = tree.attention_mask(2)[0, 0] == 0
    assert allowed[:, :2].all()  # everyone sees the cached context
    assert allowed[:, 2:].tolist() == [
        [True, False, False, False],  # root
        [True, True, False, False],  # a
        [True, False, True, False],  # b: not a
        [True, True, False, True],  # c: root, a, itself
    ]


@torch.no_grad()
def test_keeping_a_tree_path_leaves_the_cache_of_that_sequence():
    model = tiny_llama(scale=3.0)
    target = engine.Target(model)
    tree = random_tree(n=10, seed=3)
    leaf_path = max(tree.leaf_paths(), key=len)
    cache = target.new_cache()
    target.forward(PROMPT[:-1], cache)
    past = len(PROMPT) - 1
    target.forward([PROMPT[-1]] + tree.tokens, cache, tree.position_ids(past), tree.attention_mask(past))
    keep_cache_entries(cache, past, leaf_path)
    follow = 7
    _, logits = target.forward([follow], cache)
    sequence = PROMPT + [tree.tokens[i] for i in leaf_path] + [follow]
    torch.testing.assert_close(logits[0], model(torch.tensor([sequence])).logits[0, -1], atol=1e-4, rtol=1e-4)


def run(target, drafter, **settings):
    return list(engine.decode(target, TinyTokenizer(64), drafter, PROMPT, decode_settings(**settings)))


@pytest.mark.parametrize("cheat", [False, True])
def test_greedy_tree_output_equals_target_alone(cheat):
    target = tiny_llama(scale=3.0)
    draft = tiny_llama(seed=1, layers=1, scale=3.0)
    reference = hf_greedy(target, PROMPT, 40)
    evs = run(target, TopBTree(draft, b=2 if cheat else 3, depth=3, cheat_target=target if cheat else None), max_new_tokens=40)
    assert evs[-1].token_ids == reference
    if cheat:  # the right child is the last sibling, so deep non-contiguous paths were accepted
        assert evs[-1].stats["tau"] > 3


@pytest.mark.parametrize("n_top", [0, 1, 5])
def test_the_greedy_token_is_the_argmax_also_where_the_top_probabilities_tie(n_top, monkeypatch):
    """The verdict reads the argmax off its top-n where the first entry is strictly the largest; a tie (or no
    top-n) falls back to argmax, whose first index wins, whatever order topk put the tied tokens in."""
    generator = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(1, 50, generator=generator), -1)
    verdict = verify_module.verify(DraftTree(), p, True, generator, n_top)
    assert verdict.token == int(p[0].argmax()) and len(verdict.final_dist_top) == n_top and verdict.kind == "bonus"
    p[0, [7, 31]] = p[0].max() * 2  # two equal maxima: argmax takes 7
    top = verify_module.top_n(p[0], n_top)
    monkeypatch.setattr(verify_module, "top_n", lambda probs, n: sorted(top, key=lambda e: (-e[1], -e[0])))
    assert verify_module.verify(DraftTree(), p, True, generator, n_top).token == 7 == int(p[0].argmax())


def tiny_heads(target):
    torch.manual_seed(0)
    eagle = EagleHead(target.config).eval()
    medusa = MedusaHeads(target.config, num_heads=3).eval()
    for module in (eagle, medusa):
        for p in module.parameters():
            p.data.normal_(0, 0.3)
    return eagle, medusa


@pytest.mark.parametrize("total_tokens", [6, 20])
def test_eagle_and_medusa_greedy_equal_target_alone(total_tokens):
    target = tiny_llama(scale=3.0)
    eagle, medusa = tiny_heads(target)
    reference = hf_greedy(target, PROMPT, 40)
    vocab = torch.arange(0, 64, 2)  # a reduced draft vocabulary
    drafters = [
        EagleDrafter(eagle, target, TreeShape(depth=3, top_k=3, total_tokens=total_tokens)),
        EagleDrafter(eagle, target, TreeShape(depth=4, top_k=2, total_tokens=total_tokens), draft_vocab=vocab),
        MedusaDrafter(medusa, target, tree=[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]),
        MedusaDrafter(medusa, target, tree=[(0,), (0, 0), (0, 0, 0)], draft_vocab=vocab),
        MedusaDrafter(medusa, target, tree=[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)], total_tokens=3),
    ]
    for drafter in drafters:
        evs = run(target, drafter, max_new_tokens=40)
        assert evs[-1].token_ids == reference, drafter.name
        assert all(len(e.nodes) <= total_tokens for e in evs[1:-1])
        if getattr(drafter, "total_tokens", None) == 3:  # the best 3 nodes by path score, ancestors included
            assert all(len(e.nodes) <= 3 for e in evs[1:-1])
            assert all(n.parent == -1 or n.parent < n.id for e in evs[1:-1] for n in e.nodes)


@pytest.mark.parametrize("fast", ["1", "0"], ids=["lean forward", "transformers forward"])
def test_bf16_heads_against_an_fp32_target_stay_lossless(fast, monkeypatch):
    """specviz.models.draft_dtype runs shipped heads in bf16 beside an fp32 target: features, embeddings, masks
    and the head's cache are cast to the head's dtype, and the output is still the target's."""
    from specviz.kernels import fastdecoder
    from specviz.models.device import cast_parameters

    monkeypatch.setenv("SPECVIZ_FAST_DECODER", fast)
    target = tiny_llama(scale=3.0)
    eagle, medusa = (cast_parameters(head, torch.bfloat16) for head in tiny_heads(target))
    assert (fastdecoder.for_eagle(eagle) is None) == (fast == "0")
    reference = hf_greedy(target, PROMPT, 30)
    vocab = torch.arange(0, 64, 2)
    for drafter in (EagleDrafter(eagle, target, TreeShape(depth=3, top_k=3, total_tokens=8)),
                    EagleDrafter(eagle, target, TreeShape(depth=3, top_k=2, total_tokens=8), draft_vocab=vocab),
                    MedusaDrafter(medusa, target, tree=[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)], draft_vocab=vocab)):
        evs = run(target, drafter, max_new_tokens=30)
        assert evs[-1].token_ids == reference, drafter.name
        assert sum(len(e.nodes) for e in evs[1:-1]) > 0


def test_a_grafted_path_is_scored_once_on_the_step_that_verified_it():
    """A step the drafter was not asked for (the cost policy skipped it) drafted no grafted path: the path of the step
    before is not scored again as a miss."""
    from specviz.decoding.drafter import Outcome

    target = tiny_llama(scale=3.0)
    eagle, _ = tiny_heads(target)
    drafter = EagleDrafter(eagle, target, TreeShape(depth=3, top_k=2, total_tokens=8), lookup=4)
    drafter.start(torch.tensor([1, 2, 3]), None)
    width = target.config.hidden_size
    drafter.grafted = [7, 8]
    drafter.observe(Outcome(accepted=1, committed=[7, 9], features=torch.zeros(2, width)))
    assert (drafter.lookup_hits, drafter.lookup_tries) == (1 + 1, 2 + 2)  # 7 accepted, 8 tried and rejected
    drafter.observe(Outcome(accepted=0, committed=[5], features=torch.zeros(1, width)))  # a plain step
    assert (drafter.lookup_hits, drafter.lookup_tries) == (2, 4)


def test_prompt_lookup_grafted_onto_the_eagle_tree_keeps_the_output_and_learns_its_rate():
    from app import figures
    from specviz.decoding import events

    target = tiny_llama(scale=3.0)
    eagle, _ = tiny_heads(target)
    reference = hf_greedy(target, PROMPT, 40)
    for total_tokens in (8, "auto"):
        flat = (lambda n: 1.0) if total_tokens == "auto" else None  # verifying is free: take every node with a chance
        drafter = EagleDrafter(eagle, target, TreeShape(depth=3, top_k=2, total_tokens=total_tokens), verify_cost=flat,
                               lookup=4)
        evs = run(target, drafter, max_new_tokens=40)
        assert evs[-1].token_ids == reference
        assert drafter.options()["lookup"] == 4
        grafts = [(e, b) for e in evs[1:-1] for b in e.build if b["stage"] == "lookup"]
        assert grafts, "the repetitive prompt and output give prompt lookup matches"
        kept = sum(1 for e, _ in grafts if any(n.q is None for n in e.nodes))
        assert drafter.lookup_tries - 2 >= kept  # every step with a kept grafted node added at least one try
        for step, graft in grafts:
            path = graft["candidates"]
            assert path[0]["parent_cid"] == -1 and all(b["parent_cid"] == a["cid"] for a, b in zip(path, path[1:]))
            for depth, c in enumerate(path, 1):  # r^depth, or the head's own path score where that is larger
                assert c["score"] >= graft["rate"] ** depth * (1 - 1e-6)
                if c["q"] is None:
                    assert c["score"] == pytest.approx(graft["rate"] ** depth, rel=1e-5)
            assert all(a["score"] >= b["score"] for a, b in zip(path, path[1:]))  # never a child above its parent
            assert step.build[-1]["stage"] == "rerank"
            siblings = [(n.parent, n.token) for n in step.nodes]
            assert len(siblings) == len(set(siblings))  # a grafted token the head proposed too is one node
        # a grafted token the head did not propose is a node without q, drawn in the build view with its stage
        step, graft = next((e, b) for e, b in grafts if any(c["q"] is None for c in b["candidates"]))
        new = {c["token"] for c in graft["candidates"] if c["q"] is None}
        assert any(n.q is None and n.token in new for n in step.nodes)
        stage = [b["stage"] for b in step.build].index("lookup")
        figure = figures.build_stage_figure(events.to_dict(step), stage)
        assert "prompt lookup" in figure.layout.title.text
    plain = EagleDrafter(eagle, target, TreeShape(depth=3, top_k=2, total_tokens=8))
    assert not [b for e in run(target, plain, max_new_tokens=12)[1:-1] for b in e.build if b["stage"] == "lookup"]


def test_grafted_tokens_are_counted_along_the_accepted_path_even_when_the_text_ends():
    from specviz.decoding.drafter import Outcome
    from specviz.drafters.eagle import accepted_along

    def outcome(accepted, committed):
        return Outcome(accepted=accepted, committed=committed, features=None)

    assert accepted_along([5, 6, 7], outcome(3, [5, 6, 7, 8])) == (3, 3)  # all accepted, then a bonus token
    assert accepted_along([5, 6, 7], outcome(0, [9])) == (0, 1)  # the first was tried and rejected
    assert accepted_along([5, 6, 7], outcome(2, [5, 9, 4])) == (1, 2)  # the head's branch was accepted past 5
    assert accepted_along([5, 6], outcome(4, [5, 6, 1, 2, 3])) == (2, 2)  # past the graft: nothing more to try
    # end of text at the grafted 6: the engine cuts `committed` there though the target accepted more
    assert accepted_along([5, 6, 7, 8], outcome(4, [5, 6])) == (2, 3)


def test_eagle_build_stages_describe_the_tree():
    target = tiny_llama(scale=3.0)
    eagle, _ = tiny_heads(target)
    evs = run(target, EagleDrafter(eagle, target, TreeShape(depth=3, top_k=2, total_tokens=5)), max_new_tokens=6)
    step = evs[1]
    stages = step.build
    assert [s["stage"] for s in stages] == ["expand", "expand", "expand", "rerank"]
    assert [len(s["candidates"]) for s in stages[:3]] == [2, 4, 4]  # top_k children of the top_k frontier
    assert all(len(s["kept"]) == 2 for s in stages[:3])
    rerank = stages[-1]
    assert rerank["total_tokens"] == len(step.nodes) == 5
    by_cid = {c["cid"]: c for s in stages[:3] for c in s["candidates"]}
    for cid, node in rerank["node_ids"]:
        assert step.nodes[node].token == by_cid[cid]["token"]
    scores = sorted((c["score"] for c in by_cid.values()), reverse=True)
    assert sorted((n.score for n in step.nodes), reverse=True) == pytest.approx(scores[:5], rel=1e-5)


def best_budget(log_scores: list[float], cost) -> int:
    """The "auto" budget of nodes with these log path scores: best_length on their chances."""
    from specviz.decoding.policy import best_length

    return best_length([math.exp(s) for s in log_scores], cost)


def test_auto_budget_stops_where_extra_nodes_cost_more_than_they_bring():
    flat = lambda n: 1.0  # verification is free: take every node that has any chance
    assert best_budget([-0.1, -0.5, -3.0], flat) == 3
    steep = lambda n: float(n)  # each node costs as much as a whole step: never worth it
    assert best_budget([-0.1, -0.5, -3.0], steep) == 0
    knee = lambda n: 1.0 if n <= 3 else 10.0
    assert best_budget([-0.01, -0.02, -0.03, -0.04], knee) == 2


def test_auto_budget_finds_the_cheap_sizes_only_where_they_are_measured():
    # a CPU curve like this machine's: 2 tokens cost more than 1, 3-6 tokens about the same as 1, 7 jumps
    dense = {1: 31.0, 2: 36.0, 3: 30.5, 4: 30.0, 5: 30.0, 6: 30.0, 7: 34.0, 8: 35.0, 16: 44.0}
    assert set(dense) <= set(AUTO_SIZES)  # what the "auto" budget measures
    scores = [-0.7, -1.4, -2.1, -2.8, -3.5, -4.0, -4.5, -5.0]
    assert best_budget(scores, interpolate(dense)) == 5  # root + 5 nodes: the last size before the jump
    sparse = {n: dense[n] for n in (1, 2, 4, 8, 16)}  # 5-6 interpolated between 4 and 8: overpriced
    assert best_budget(scores, interpolate(sparse)) == 3


def test_eagle_stops_expanding_when_a_deeper_level_cannot_pay_for_itself():
    target = tiny_llama(scale=3.0)
    eagle, _ = tiny_heads(target)
    reference = hf_greedy(target, PROMPT, 24)
    cheap_target = lambda n: 1e-9  # a target step costs (almost) nothing: drafting deeper never pays
    stopping = EagleDrafter(eagle, target, TreeShape(depth=4, top_k=2, total_tokens="auto"), verify_cost=cheap_target)
    evs = run(target, stopping, max_new_tokens=24)
    assert evs[-1].token_ids == reference
    expands = [[s for s in e.build if s["stage"] == "expand"] for e in evs[1:-1]]
    assert len(expands[0]) == 3  # the first expansion is not counted (cold), the second is timed, then the rule applies
    assert all(len(x) <= 2 for x in expands[1:])
    assert sum(bool(x and x[-1].get("stopped_early")) for x in expands[1:]) >= len(expands) // 2  # the last may be capped by the token budget
    keep_going = EagleDrafter(eagle, target, TreeShape(depth=4, top_k=2, total_tokens="auto", early_stop=False),
                              verify_cost=cheap_target)
    evs = run(target, keep_going, max_new_tokens=12)
    assert [len([s for s in e.build if s["stage"] == "expand"]) for e in evs[1:3]] == [4, 4]


@pytest.mark.parametrize("shape, message", [
    (dict(top_k=0), "top_k must be a whole number >= 1"),
    (dict(depth=0), "depth must be"),
    (dict(total_tokens=-3), "total_tokens must be 'auto' or a whole number"),
    (dict(total_tokens=1.5), "total_tokens must be"),
    (dict(total_tokens="abc"), "total_tokens must be"),
])
def test_a_bad_eagle_tree_shape_is_a_clear_error(shape, message):
    with pytest.raises(SpecvizError, match=message):
        TreeShape(**shape)


def test_tree_drafters_refuse_budgets_and_vocabularies_they_cannot_use():
    target = tiny_llama(seed=0, layers=1)
    with pytest.raises(SpecvizError, match="medusa option total_tokens"):
        MedusaDrafter(MedusaHeads(target.config), target, total_tokens=-3)
    with pytest.raises(SpecvizError, match="ranks 4 candidates per position but its draft vocabulary has only 2"):
        EagleDrafter(EagleHead(target.config), target, TreeShape(top_k=4), draft_vocab=torch.tensor([3, 5]))
    with pytest.raises(SpecvizError, match="lookup must be >= 0"):
        EagleDrafter(EagleHead(target.config), target, lookup=-1)


def test_a_cost_curve_of_one_size_is_flat():
    cost = interpolate({1: 0.03})
    assert cost(1) == cost(6) == 0.03


def test_medusa_tree_paths_are_checked():
    with pytest.raises(SpecvizError, match="no parent"):
        check_tree([(0,), (1, 0)], num_heads=4)
    with pytest.raises(SpecvizError, match="ranks"):
        check_tree([(0,), (0, 0), (0, 0, 0)], num_heads=2)


# ---- statistical losslessness of the tree rule ------------------------------------------------------------

VOCAB = 8


@pytest.fixture(scope="module")
def small():
    target = tiny_llama(vocab_size=VOCAB, hidden=16, layers=1, scale=20.0, eos=None)
    bad = tiny_llama(vocab_size=VOCAB, hidden=16, layers=1, seed=3, scale=40.0, eos=None)
    return target, bad


def tree_p_value(small, sampling, b, draft="bad", n=1500):
    target, bad = small
    tree_from = {"bad": bad, "target": target}[draft]  # children: top-b of a far-off q, or of p itself
    make = lambda: TopBTree(tree_from, b=b, depth=2)
    counts = sampled_two_tokens(target, TinyTokenizer(VOCAB, eos=None), make, [1, 2, 3], sampling, n)
    return chi_square_p_value(counts, exact_two_tokens(target, [1, 2, 3], sampling))


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("draft", ["bad", "target"])
@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.7, top_p=0.8)], ids=["T=1", "T=0.7,top-p=0.8"])
def test_tree_sampling_matches_the_target(small, sampling, draft):
    assert tree_p_value(small, sampling, b=3, draft=draft) > 1e-3


def test_tree_test_catches_an_unnormalised_residual(small, monkeypatch):
    monkeypatch.setattr(verify_module, "_residual", unnormalised_residual)
    assert tree_p_value(small, Sampling(1.0), b=3, draft="target") < 1e-6


def test_medusa_typical_acceptance_is_marked_lossy_and_off_by_default():
    target = tiny_llama(scale=3.0)
    _, medusa = tiny_heads(target)
    default = run(target, MedusaDrafter(medusa, target, tree=[(0,), (0, 0)]), max_new_tokens=8, sampling=Sampling(1.0))
    assert not default[0].lossy and not any(e.lossy for e in default[1:-1])
    typical = MedusaDrafter(medusa, target, tree=[(0,), (1,), (0, 0)], typical=True, epsilon=1.0, delta=1.0)
    evs = run(target, typical, max_new_tokens=12, sampling=Sampling(1.0))
    assert evs[0].lossy and all(e.lossy for e in evs[1:-1])
    assert evs[0].options["typical_acceptance"] is True
    # with ε = δ = 1 the threshold is exp(−H(p)) and a flat p over 64 tokens lets most children pass
    assert evs[-1].stats["acceptance_rate"] > 0


def test_the_tree_mask_lets_each_input_see_exactly_the_context_the_root_its_path_and_itself():
    """Against the definition, on random trees of 0-129 nodes (wider than a byte of the packed rows) and both
    dtypes: row 0 (the root) and row i + 1 (node i) see every cached position, the root, and path_to(i)."""
    rng = random.Random(5)
    for _ in range(60):
        tree = DraftTree()
        for i in range(rng.randrange(0, 130)):
            tree.add(rng.randrange(1000), rng.randrange(-1, i) if i else -1)
        past = rng.randrange(0, 40)
        for dtype in (torch.float32, torch.bfloat16):
            mask = tree.attention_mask(past, dtype=dtype)
            assert mask.shape == (1, 1, len(tree) + 1, past + len(tree) + 1) and mask.dtype == dtype
            seen = mask[0, 0] == 0
            assert seen[:, :past].all() and seen[:, past].all()  # the context and the root, for every input
            assert (mask[0, 0][~seen] == torch.finfo(dtype).min).all()
            for node in range(len(tree)):
                expected = {past + 1 + j for j in tree.path_to(node)}
                assert set(torch.nonzero(seen[node + 1, past + 1 :]).flatten().add(past + 1).tolist()) == expected
            assert not seen[0, past + 1 :].any()


def test_the_auto_budget_grows_the_tree_where_the_verify_cost_curve_is_flat():
    """Where verifying many tokens costs what one costs (a GPU, or AMX tiles), "auto" keeps every candidate the
    tree grew; where each token costs a whole forward it keeps none; a curve with a knee keeps what fits before it.
    Greedy output is the target's whichever tree runs."""
    target = tiny_llama(scale=3.0)
    eagle, _ = tiny_heads(target)
    reference = hf_greedy(target, PROMPT, 16)
    curves = {"flat": lambda n: 1.0, "steep": lambda n: float(n), "knee": lambda n: 1.0 if n <= 4 else 10.0}
    sizes = {}
    for name, curve in curves.items():
        drafter = EagleDrafter(eagle, target, TreeShape(depth=3, top_k=2, total_tokens="auto", early_stop=False),
                               verify_cost=curve)
        evs = run(target, drafter, max_new_tokens=16)
        assert evs[-1].token_ids == reference, name
        steps = evs[1:-1]
        grown = [len({c["cid"] for s in e.build if s["stage"] == "expand" for c in s["candidates"]}) for e in steps]
        sizes[name] = [(len(e.nodes), n) for e, n in zip(steps, grown)]
    # steps with the whole depth ahead grow 2 + 2·2 + 2·2 = 10 candidates (the last ones, near max_new_tokens, fewer)
    for name, kept in (("flat", 10), ("steep", 0), ("knee", 3)):  # knee: root + 3 nodes, the last size before it
        whole = [nodes for nodes, grown in sizes[name] if grown == 10]
        assert len(whole) >= 10 and set(whole) == {kept}, (name, sizes[name])
    assert all(nodes == grown for nodes, grown in sizes["flat"])  # every candidate kept, also in the short steps


@pytest.mark.parametrize("length", [49152, 49152 + 77, 4096, 1000, 300, 7])
def test_the_blockwise_top_k_and_argmax_give_torchs_values_and_first_maximum(length):
    """sampling.row_topk and row_argmax, which the greedy test and the step event use on every row of a verify:
    torch.topk's values (largest first) and argmax's index, the first of equal maxima, on rows with ties
    (probabilities rounded to 4 decimals, so many equal values), a maximum in the tail past the last whole block,
    and peaked and flat rows."""
    from specviz.decoding import sampling
    generator = torch.Generator().manual_seed(length)
    for trial in range(150):
        row = torch.softmax(torch.randn(length, generator=generator) * (1 + trial % 7), -1)
        if trial % 3 == 0:
            row = row.round(decimals=4)
        if trial % 5 == 0:
            row[-1] = row.max() + 1  # the maximum in the tail (or the last block)
        if trial % 7 == 0:
            row[length // 3] = row[length // 2] = row.max()  # equal maxima: argmax takes the first
        for k in (1, 2, 5):
            values, ids = sampling.row_topk(row, k)
            assert torch.equal(values, torch.topk(row, k).values) and torch.equal(row[ids], values)
        assert sampling.row_argmax(row) == int(row.argmax())
