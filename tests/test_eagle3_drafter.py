"""The eagle3 drafter through the engine: on tiny random Llama, Llama-3.x (llama3 rotary scaling) and Qwen3 targets
(the architectures published EAGLE-3 heads are trained for), greedy output equals the target alone; the tree's q
values are the head's equations (fused features at the root, the head's own output fed back deeper); a head in
the speculators layout runs from `eagle3:head=FOLDER`; and sampling stays the target's (chi-square)."""
import copy
import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from specviz.decoding import engine
from specviz.decoding.sampling import Sampling
from specviz.drafters import make_drafter
from specviz.drafters.eagle import TreeShape
from specviz.drafters.eagle3 import Eagle3Drafter
from specviz.models.eagle3 import Eagle3Head
from specviz.models.loading import LoadedModels

from stats import chi_square_p_value, exact_two_tokens, sampled_two_tokens
from tiny import EOS, TinyTokenizer, decode_settings, hf_greedy

VOCAB, HIDDEN, LAYERS = 64, 32, 6
AUX = (1, 3, 4)
COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
              bos_token_id=None, eos_token_id=EOS, pad_token_id=EOS)


def finish(model, scale=4.0, eos=EOS):
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)  # sharper p: long greedy runs of likely tokens, as in a real model
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=EOS)
    return model.eval().requires_grad_(False)


def tiny_target(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    if kind == "llama":
        return finish(LlamaForCausalLM(LlamaConfig(**COMMON)))
    if kind == "llama3":  # Llama-3.x: llama3 rotary scaling, a large rope base
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64, "rope_theta": 500000.0}
        return finish(LlamaForCausalLM(LlamaConfig(**COMMON, rope_parameters=rope)))
    if kind == "qwen3":  # Qwen3: q_norm / k_norm, an explicit head_dim
        return finish(Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=16)))
    raise ValueError(kind)


def random_head(target, draft_vocab: int = 24, own_lm_head: bool = False, seed: int = 1) -> Eagle3Head:
    """A random head fitted to `target`'s sizes; the draft vocabulary is a random subset that keeps EOS."""
    torch.manual_seed(seed)
    layer = dict(hidden_size=HIDDEN, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                 vocab_size=VOCAB, rms_norm_eps=1e-6, max_position_embeddings=256, rope_theta=10000.0)
    head = Eagle3Head(layer, HIDDEN, draft_vocab, AUX, own_lm_head=own_lm_head)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)
        ids = torch.cat([torch.tensor([EOS]), 1 + torch.randperm(VOCAB - 1)[: draft_vocab - 1]]).sort().values
        head.d2t.copy_(ids - torch.arange(draft_vocab))
        head.t2d.zero_()
        head.t2d[ids] = True
    return head.eval().requires_grad_(False)


def run(target, drafter, prompt, settings):
    events = list(engine.decode(target, TinyTokenizer(VOCAB), drafter, prompt, settings))
    steps = [e for e in events if e.type == "step"]
    return events[-1].token_ids, steps


PROMPT = [5, 9, 13, 5, 9, 2, 7, 30, 41, 8]


@pytest.mark.parametrize("kind", ["llama", "llama3", "qwen3"])
@pytest.mark.parametrize("own_lm_head", [False, True])
def test_greedy_output_is_the_targets_on_each_architecture(kind, own_lm_head):
    target = tiny_target(kind)
    head = random_head(target, own_lm_head=own_lm_head)
    drafter = Eagle3Drafter(head, target, TreeShape(depth=4, top_k=4, total_tokens=12), lookup=2)
    tokens, steps = run(target, drafter, PROMPT, decode_settings(40))
    assert tokens == hf_greedy(target, PROMPT, 40)
    assert sum(len(s.accepted_path) for s in steps) > 0, "nothing accepted: the acceptance path went untested"
    assert len(steps) < 40


def fused(target, ids):
    """The inputs of the AUX decoder layers side by side, from transformers' own forward. (T, 3·H)"""
    out = target(torch.tensor([ids]), output_hidden_states=True)
    return torch.cat([out.hidden_states[n][0] for n in AUX], dim=-1)


@torch.no_grad()
def test_the_trees_q_follow_the_heads_equations():
    """Depth 1: the head over the prompt's fused features and next tokens, read at the last position. Depth 2:
    the head's own output (before its norm) fed back with the child's embedding, one position on. A drafter that
    fed the fused feature again, skipped the norm or read the wrong layers gives other q."""
    target = tiny_target("llama")
    head = random_head(target)
    embed, lm_head = target.get_input_embeddings(), target.lm_head.weight
    drafter = Eagle3Drafter(head, target, TreeShape(depth=2, top_k=3, total_tokens=9))
    _, steps = run(target, drafter, PROMPT, decode_settings(4))
    build = steps[0].build
    L, ids = len(PROMPT), head.draft_ids()
    h, past = head(fused(target, PROMPT[:-1])[None], embed(torch.tensor([PROMPT[1:]])), torch.arange(L - 1)[None])
    q1 = torch.softmax(head.logits(h[0, -1], lm_head), -1)
    depth1 = {c["token"]: c for c in build[0]["candidates"]}
    assert set(depth1) == set(ids[q1.topk(3).indices].tolist())
    for token, c in depth1.items():
        assert c["q"] == pytest.approx(float(q1[(ids == token).nonzero()[0, 0]]), abs=2e-6)
    for c in build[1]["candidates"]:
        parent = next(p for p in build[0]["candidates"] if p["cid"] == c["parent_cid"])
        h2, _ = head(h[:, -1:], embed(torch.tensor([[parent["token"]]])), torch.tensor([[L - 1]]), past)
        q2 = torch.softmax(head.logits(h2[0, 0], lm_head), -1)
        assert c["q"] == pytest.approx(float(q2[(ids == c["token"]).nonzero()[0, 0]]), abs=2e-6)


@torch.no_grad()
def test_after_rejections_the_head_drafts_as_if_from_scratch():
    """Every step's root candidates equal the head run afresh over the whole committed text: the drafter's cache,
    cropped after each step's rejected nodes and extended with the accepted ones, holds nothing stale."""
    target = tiny_target("llama")
    head = random_head(target)
    embed, lm_head, ids = target.get_input_embeddings(), target.lm_head.weight, head.draft_ids()
    drafter = Eagle3Drafter(head, target, TreeShape(depth=4, top_k=4, total_tokens=12), lookup=2)
    _, steps = run(target, drafter, PROMPT, decode_settings(40))
    assert any(s.accepted_path for s in steps)  # accepted nodes, and beside them rejected ones to crop away
    sequence = list(PROMPT)
    for step in steps:
        if not step.build:  # the token budget left nothing to draft
            break
        L = len(sequence)
        h, _ = head(fused(target, sequence[:-1])[None], embed(torch.tensor([sequence[1:]])), torch.arange(L - 1)[None])
        q = torch.softmax(head.logits(h[0, -1], lm_head), -1)
        for c in step.build[0]["candidates"]:
            assert c["q"] == pytest.approx(float(q[(ids == c["token"]).nonzero()[0, 0]]), abs=2e-6), step.step
        sequence += [c.token for c in step.committed]


def save_speculators(head: Eagle3Head, folder):
    """`head` written as speculators saves an EAGLE-3 model (the layout vLLM reads)."""
    folder.mkdir()
    state = {("layers.0." + k[len("layer."):]) if k.startswith("layer.") else k: v.contiguous()
             for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    save_file(state, str(folder / "model.safetensors"))
    layer = {**head.config.to_dict(), "architectures": ["LlamaForCausalLM"]}
    config = {"speculators_model_type": "eagle3", "transformer_layer_config": layer,
              "draft_vocab_size": head.draft_vocab_size, "norm_before_residual": False,
              "target_hidden_size": HIDDEN, "eagle_aux_hidden_state_layer_ids": list(AUX)}
    (folder / "config.json").write_text(json.dumps(config))


def test_a_published_layout_head_runs_from_its_folder(tmp_path):
    """--drafter eagle3:head=FOLDER on a Qwen3 target: the loaded head drafts what the in-memory one drafts."""
    target = tiny_target("qwen3")
    head = random_head(target, own_lm_head=True)
    save_speculators(head, tmp_path / "head")
    models = LoadedModels("tiny-qwen3", target, None, TinyTokenizer(VOCAB), torch.device("cpu"), torch.float32)
    drafter = make_drafter(f"eagle3:head={tmp_path / 'head'}:total_tokens=12:depth=4", models)
    assert drafter.feature_layers == AUX and drafter.options()["aux_layers"] == list(AUX)
    tokens, steps = run(target, drafter, PROMPT, decode_settings(24))
    held = copy.deepcopy(head).to(drafter.dtype)  # heads run in draft_dtype (bf16 where the CPU multiplies it)
    same, same_steps = run(target, Eagle3Drafter(held, target, TreeShape(depth=4, total_tokens=12)), PROMPT,
                           decode_settings(24))
    assert tokens == same == hf_greedy(target, PROMPT, 24)
    # the same q to bf16 rounding (the loaded head runs packed products, so near-equal nodes may trade places at
    # the budget's cut later on: compare the first step's candidates)
    loaded, kept = ({c["token"]: c["q"] for c in s[0].build[0]["candidates"]} for s in (steps, same_steps))
    assert loaded.keys() == kept.keys() and all(loaded[t] == pytest.approx(kept[t], rel=0.03) for t in kept)


def test_no_head_is_a_clear_error():
    target = tiny_target("llama")
    models = LoadedModels("tiny", target, None, TinyTokenizer(VOCAB), torch.device("cpu"), torch.float32)
    with pytest.raises(Exception, match="no eagle3 head"):
        make_drafter("eagle3", models)
    with pytest.raises(Exception, match="unknown eagle3 options"):
        models.eagle3 = random_head(target)
        make_drafter("eagle3:total_tokens=8:draft_vocab=full", models)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_sampling_with_eagle3_is_the_targets():
    """The first two tokens at T = 1 over many seeded runs against the exact two-token distribution of the target
    alone (the same chi-square test that catches the planted bugs of tests/test_lossless.py)."""
    vocab = 8
    torch.manual_seed(0)
    config = LlamaConfig(**{**COMMON, "vocab_size": vocab, "num_hidden_layers": 5, "hidden_size": 16,
                            "intermediate_size": 32, "eos_token_id": None})
    target = finish(LlamaForCausalLM(config), scale=20.0, eos=None)
    torch.manual_seed(2)
    layer = dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=32,
                 vocab_size=vocab, rms_norm_eps=1e-6, max_position_embeddings=256)
    head = Eagle3Head(layer, 16, 6, AUX, own_lm_head=False)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)
        head.d2t.copy_(torch.tensor([0, 0, 1, 1, 2, 2]))  # draft ids 0..5 -> target tokens 0, 1, 3, 4, 6, 7
    head.eval()
    prompt = [1, 2, 3, 1, 2]
    make = lambda: Eagle3Drafter(head, target, TreeShape(depth=2, top_k=2, total_tokens=5), lookup=2)  # noqa: E731
    t1 = Sampling(1.0)
    counts = sampled_two_tokens(target, TinyTokenizer(vocab, eos=None), make, prompt, t1, 1500)
    p_value = chi_square_p_value(counts, exact_two_tokens(target, prompt, t1))
    assert p_value > 1e-3, f"chi-square p = {p_value:.2e}"

@torch.no_grad()
def test_a_drafter_reused_for_a_new_prompt_drafts_as_a_fresh_one():
    """One drafter object decoding two prompts in turn: the second run's trees equal a fresh drafter's. A run that
    kept the first run's head cache would attend to the first text and place the second at later positions."""
    target = tiny_target("llama")
    head = random_head(target)
    shape = TreeShape(depth=3, top_k=3, total_tokens=9)
    reused = Eagle3Drafter(head, target, shape, lookup=2)
    run(target, reused, PROMPT[::-1] + PROMPT, decode_settings(12))
    assert reused.committed > len(PROMPT)  # the first run left its text in the head's cache
    _, second = run(target, reused, PROMPT, decode_settings(12))
    _, fresh = run(target, Eagle3Drafter(head, target, shape, lookup=2), PROMPT, decode_settings(12))
    assert len(second) == len(fresh) and any(s.build for s in fresh)
    for a, b in zip(second, fresh):
        first_a, first_b = (s.build[0]["candidates"] if s.build else [] for s in (a, b))
        assert [c["token"] for c in first_a] == [c["token"] for c in first_b], a.step
        assert [c["q"] for c in first_a] == pytest.approx([c["q"] for c in first_b], abs=1e-6), a.step


@torch.no_grad()
def test_after_steps_it_was_not_asked_to_draft_the_head_catches_up_on_all_of_them():
    """When the run skips asking for a draft (drafting has been slower than plain steps), the head still gets every
    committed token's features: each draft it makes afterwards has the q of the head run afresh over the whole text."""
    target = tiny_target("llama")
    head = random_head(target)
    embed, lm_head, ids = target.get_input_embeddings(), target.lm_head.weight, head.draft_ids()
    drafter = Eagle3Drafter(head, target, TreeShape(depth=3, top_k=3, total_tokens=9))
    asks = iter([True, False, False, True, False, True, True, False, False, False] * 10)
    drafter.policy.draft_now = lambda: next(asks)
    tokens, steps = run(target, drafter, PROMPT, decode_settings(30))
    assert tokens == hf_greedy(target, PROMPT, 30)
    sequence, checked = list(PROMPT), 0
    for step in steps:
        if step.build:
            L = len(sequence)
            h, _ = head(fused(target, sequence[:-1])[None], embed(torch.tensor([sequence[1:]])), torch.arange(L - 1)[None])
            q = torch.softmax(head.logits(h[0, -1], lm_head), -1)
            for c in step.build[0]["candidates"]:
                assert c["q"] == pytest.approx(float(q[(ids == c["token"]).nonzero()[0, 0]]), abs=2e-6), step.step
            checked += 1
        sequence += [c.token for c in step.committed]
    assert checked >= 4 and any(not s.build for s in steps)
