"""specviz.kernels.fastdecoder computes what transformers computes: hidden states, cache surgery, greedy outputs."""
import pytest
import torch
from test_tree import PROMPT, random_tree
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from specviz import models
from specviz.decoding import engine
from specviz.drafters import NoDraft
from specviz.errors import SpecvizError
from specviz.kernels import fastdecoder
from specviz.kernels.kvcache import crop_cache, keep_cache_entries

from tiny import TinyTokenizer, decode_settings, hf_greedy, tiny_llama


def tiny_qwen2(seed=0):
    """Qwen2 has biases on q, k and v (fused along with the weights) and a different rotary base."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, rope_theta=1e6, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:  # transformers initialises biases to zero; make them matter
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_()
    return model


MODELS = {"llama": lambda: tiny_llama(scale=3.0), "qwen2": tiny_qwen2}


def hf_hidden(model, ids, cache, position_ids=None, mask=None):
    return model.model(input_ids=torch.tensor([ids]), cache=cache, position_ids=position_ids, attention_mask=mask,
                       use_cache=True).last_hidden_state[0]


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "separate"])
@pytest.mark.parametrize("arch", MODELS)
@torch.inference_mode()
def test_prefill_chain_and_tree_match_transformers(arch, fuse):
    model = MODELS[arch]()
    fast = fastdecoder.FastDecoder(model, fuse=fuse)
    assert fast.fused is fuse
    ours, theirs = fast.new_cache(), DynamicCache(config=model.config)
    prompt = PROMPT[:-1]
    torch.testing.assert_close(fast(torch.tensor(prompt), ours), hf_hidden(model, prompt, theirs), atol=1e-5, rtol=1e-5)
    chain = [PROMPT[-1], 5, 9]  # several new tokens without a mask: causal among themselves
    torch.testing.assert_close(fast(torch.tensor(chain), ours), hf_hidden(model, chain, theirs), atol=1e-5, rtol=1e-5)
    past = len(prompt) + len(chain)
    tree = random_tree(n=9, seed=2)
    ids, positions, mask = [7] + tree.tokens, tree.position_ids(past), tree.attention_mask(past)
    torch.testing.assert_close(fast(torch.tensor(ids), ours, positions, mask),
                               hf_hidden(model, ids, theirs, positions, mask), atol=1e-5, rtol=1e-5)
    assert ours.get_seq_length() == theirs.get_seq_length() == past + len(ids)


def test_cache_grows_and_keeps_a_tree_path_like_transformers():  # not under inference_mode, as the engine runs
    model = tiny_llama(scale=3.0)
    target = engine.Target(model)
    cache = fastdecoder.KVCache(2, 2, 8, torch.float32, "cpu", capacity=3)  # far too small: must grow
    reference = DynamicCache(config=model.config)
    target.forward(PROMPT[:-1], cache)
    target.fast, fast = None, target.fast
    target.forward(PROMPT[:-1], reference)
    past = len(PROMPT) - 1
    tree = random_tree(n=12, seed=5)
    path = max(tree.leaf_paths(), key=len)
    assert path != list(range(len(path)))  # a path that is not a prefix: entries must move
    for which, kv in ((fast, cache), (None, reference)):
        target.fast = which
        target.forward([PROMPT[-1]] + tree.tokens, kv, tree.position_ids(past), tree.attention_mask(past))
        keep_cache_entries(kv, past, path)
    assert cache.capacity > 3 and cache.length == reference.get_seq_length() == past + 1 + len(path)
    for which, kv in ((fast, cache), (None, reference)):
        target.fast = which
        crop_cache(kv, past + 2)  # drop all but the first kept node, then go on
    target.fast = fast
    ours = target.forward([3, 4], cache)[1]
    target.fast = None
    theirs = target.forward([3, 4], reference)[1]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    sequence = PROMPT + [tree.tokens[path[0]], 3, 4]
    torch.testing.assert_close(ours[-1], model(torch.tensor([sequence])).logits[0, -1], atol=1e-4, rtol=1e-4)


def test_greedy_decode_through_the_fast_path_equals_generate():
    model = tiny_llama(scale=3.0)
    assert engine.Target(model).fast is not None
    events = list(engine.decode(model, TinyTokenizer(64), NoDraft(), PROMPT, decode_settings(max_new_tokens=40)))
    assert events[-1].token_ids == hf_greedy(model, PROMPT, 40)


def test_fusing_needs_the_memory_for_it(monkeypatch):
    monkeypatch.setattr(fastdecoder, "_available_memory", lambda: 1000)
    assert fastdecoder.fits_in_memory(250) and not fastdecoder.fits_in_memory(251)
    assert not fastdecoder.FastDecoder(tiny_llama()).fused  # its fused copies take far more than 250 bytes
    monkeypatch.setattr(fastdecoder, "_available_memory", lambda: None)  # unknown: fuse
    assert fastdecoder.FastDecoder(tiny_llama()).fused


def test_not_covered_means_transformers_forward(monkeypatch):
    model = tiny_llama()
    monkeypatch.setenv(fastdecoder.ENV_SWITCH, "0")
    assert "turned off" in fastdecoder.unsupported_reason(model)
    target = engine.Target(model)
    assert target.fast is None and isinstance(target.new_cache(), DynamicCache)
    monkeypatch.delenv(fastdecoder.ENV_SWITCH)
    config = model.config
    config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    dynamic = type(model)(config)  # its frequencies change with the sequence length
    assert "rotary scaling" in fastdecoder.unsupported_reason(dynamic)
    assert engine.Target(dynamic).fast is None


@torch.no_grad()  # not inference_mode: tensors made under it keep no version counter
def test_a_changed_weight_rebuilds_the_fused_copy():
    model = tiny_llama(scale=3.0)
    first = fastdecoder.for_model(model)
    assert fastdecoder.for_model(model) is first  # built once
    model.model.layers[0].self_attn.k_proj.weight.mul_(2.0)
    second = fastdecoder.for_model(model)
    assert second is not first
    cache, reference = second.new_cache(), DynamicCache(config=model.config)
    torch.testing.assert_close(second(torch.tensor(PROMPT), cache), hf_hidden(model, PROMPT, reference), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not models.is_fetched("smollm2-135m"), reason="smollm2-135m is not fetched (make fetch)")
@torch.inference_mode()
def test_real_model_packed_fast_path_agrees_with_transformers():
    smol = models.load("smollm2-135m", device="cpu", weights="fp32")
    target = engine.Target(smol.target)
    assert target.fast is not None
    ids = smol.tokenizer("The capital of France is a city where", return_tensors=None)["input_ids"]
    cache = target.new_cache()
    ours = target.forward(ids, cache)[1]
    step = target.forward([ids[-1]], cache)[1]
    target.fast = None
    reference = target.new_cache()
    theirs = target.forward(ids, reference)[1]
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(step, target.forward([ids[-1]], reference)[1], atol=2e-4, rtol=1e-4)


@torch.inference_mode()
def test_eagle_head_fast_path_equals_the_module_in_chunks_and_under_a_tree_mask():
    from test_heads import eagle_inputs, tiny_config

    from specviz.models.heads import EagleHead, causal_mask

    head = EagleHead(tiny_config()).eval()
    fast = fastdecoder.for_eagle(head)
    assert fast is not None and fastdecoder.for_eagle(head) is fast
    f, e, pos = eagle_inputs(batch=1)
    f, e = f[0], e[0]
    ours, theirs = fast.new_cache(), DynamicCache()
    for chunk in (slice(0, 4), slice(4, 5)):  # a prefix, then one more committed token
        torch.testing.assert_close(fast(f[chunk], e[chunk], pos[:, chunk], ours),
                                   head(f[None, chunk], e[None, chunk], pos[:, chunk], theirs)[0], atol=1e-5, rtol=1e-5)
    mask = causal_mask(1, 2, 5, torch.float32, "cpu").clone()  # two siblings after the 5 committed entries
    mask[:, :, 1, 5] = float("-inf")
    tree_pos = torch.tensor([[5, 5]])
    torch.testing.assert_close(fast(f[5:7], e[5:7], tree_pos, ours, mask),
                               head(f[None, 5:7], e[None, 5:7], tree_pos, theirs, mask)[0], atol=1e-5, rtol=1e-5)
    assert ours.get_seq_length() == theirs.get_seq_length() == 7


EAGLE3_VARIANTS = {  # what the head runs on: (head_dim, dtype, 4-bit products on these activations or None, biases)
    "torch-ops": (8, torch.float32, None, False),  # head_dim 8: the attention in torch's ops
    "bf16": (16, torch.bfloat16, None, True),  # torch's ops too (the C++ op is fp32), q/k/v/o and MLP biases
    "cpp-op": (16, torch.float32, None, True),  # the C++ attention op up to 16 new tokens, torch's beyond
    "q4": (16, torch.float32, "fp32", False),  # as beside a 4-bit target: fc and the layer Q4_1, the q4 norm
    "q4q8": (16, torch.float32, "q8", False),  # as beside the default q4q8 target: 8-bit activations
}


@pytest.mark.parametrize("variant", EAGLE3_VARIANTS)
@pytest.mark.parametrize("norm_before_residual", [False, True])
@torch.inference_mode()
def test_eagle3_head_fast_path_equals_the_module_in_chunks_fed_back_and_under_a_tree_mask(variant, norm_before_residual):
    """The fused target features (3·H) over a 20-token prefix and one more token, then the head's own output (H)
    fed back under a tree mask, then one token after a crop: the lean layer gives the module's h each time, and its
    cache holds what the module's does. A 4-bit layer's one-call op gives the bits of the same layer op by op."""
    from specviz.kernels import extension, quant
    from specviz.models.eagle3 import Eagle3Head
    from specviz.models.heads import causal_mask

    head_dim, dtype, activations, bias = EAGLE3_VARIANTS[variant]
    if (variant == "cpp-op" or activations) and not (extension.available() and quant.available()):
        pytest.skip("specviz's C++ ops are not built here")
    torch.manual_seed(3)
    H = 4 * head_dim
    layer = dict(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, intermediate_size=2 * H, vocab_size=64,
                 rms_norm_eps=1e-6, max_position_embeddings=256, rope_theta=10000.0, attention_bias=bias,
                 mlp_bias=bias)
    head = Eagle3Head(layer, H, 64, (0, 1, 2), norm_before_residual=norm_before_residual, own_lm_head=False)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.normal_(0, 0.3)
    head = head.to(dtype).eval()
    if activations:
        assert quant.quantize_linears(head, activations) == 8  # fc, q, k, v, o, gate, up, down (no LM head)
    fast = fastdecoder.for_eagle3(head)
    assert fast is not None and fastdecoder.for_eagle3(head) is fast
    assert fast.stack.one_op == (dtype == torch.float32 and head_dim == 16)  # which attention is under test
    assert (fast.rms_norm is fastdecoder._q4_rms_norm) == bool(activations)
    assert fast.layer_op == bool(activations)  # a 4-bit layer as one call (q4_eagle3_layer) up to 16 new tokens
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=2e-5, rtol=2e-5)
    f, e, pos = torch.randn(23, 3 * H, dtype=dtype), torch.randn(23, H, dtype=dtype), torch.arange(23)[None]
    mask = causal_mask(1, 2, 21, dtype, "cpu").clone()  # two siblings after the 21 committed entries
    mask[:, :, 1, 21] = torch.finfo(dtype).min

    def calls(layer_op: bool):
        """The lean path's outputs and cache over: a prefix past the C++ op's 16 tokens, one more token, the head's
        own output fed back to two siblings under the tree mask, and, after they are cropped, one token."""
        fast.layer_op = layer_op
        cache, out = fast.new_cache(), []
        out.append(fast(f[:20], e[:20], pos[:, :20], cache))
        out.append(fast(f[20:21], e[20:21], pos[:, 20:21], cache))
        out.append(fast(torch.cat([out[-1], out[-1]]), e[21:23], torch.tensor([[21, 21]]), cache, mask))
        out += [cache.keys[0][:, :, :23].clone(), cache.values[0][:, :, :23].clone()]
        cache.crop(21)
        out.append(fast(out[1], e[22:23], torch.tensor([[21]]), cache))
        return out

    try:
        ours = calls(fast.layer_op)
        if activations:  # the one-call op gives the bits of the layer run op by op
            assert all(torch.equal(a, b) for a, b in zip(ours, calls(False)))
    finally:
        fast.layer_op = bool(activations)
    h, past = head(f[None, :20], e[None, :20], pos[:, :20])
    torch.testing.assert_close(ours[0], h[0], **tol)
    h, past = head(f[None, 20:21], e[None, 20:21], pos[:, 20:21], past)
    torch.testing.assert_close(ours[1], h[0], **tol)
    fed_back = torch.cat([h[0], h[0]])  # the head's own output, not 3·H
    h2, past = head(fed_back[None], e[None, 21:23], torch.tensor([[21, 21]]), past, mask)
    torch.testing.assert_close(ours[2], h2[0], **tol)
    torch.testing.assert_close(ours[3], past[0], **tol)
    torch.testing.assert_close(ours[4], past[1], **tol)
    h3, _ = head(h[0][None], e[None, 22:23], torch.tensor([[21]]), tuple(t[:, :, :21] for t in past))
    torch.testing.assert_close(ours[5], h3[0], **tol)


def test_long_prompt_tree_decode_grows_the_cache_and_stays_lossless():
    """Past the first 512 slots the cache regrows mid-run, and accepted tree paths that are not prefixes move
    entries in the regrown buffers (outside inference_mode, as the engine does it)."""
    from tree_drafters import TopBTree

    target = tiny_llama(scale=3.0, max_positions=1024)
    draft = tiny_llama(seed=1, layers=1, scale=3.0, max_positions=1024)
    prompt = torch.randint(5, 60, (600,), generator=torch.Generator().manual_seed(0)).tolist()
    drafter = TopBTree(draft, b=2, depth=3, cheat_target=target)  # the right child last: non-prefix paths
    events = list(engine.decode(target, TinyTokenizer(64), drafter, prompt, decode_settings(max_new_tokens=30)))
    assert events[-1].token_ids == hf_greedy(target, prompt, 30)
    assert events[-1].stats["tau"] > 2


@torch.inference_mode()
def test_bf16_matches_transformers_bit_for_bit():
    model = tiny_llama(scale=3.0).to(torch.bfloat16)
    fast = fastdecoder.FastDecoder(model)
    ours, theirs = fast.new_cache(), DynamicCache(config=model.config)
    assert torch.equal(fast(torch.tensor(PROMPT), ours), hf_hidden(model, PROMPT, theirs))
    tree = random_tree(n=6, seed=1)
    past = len(PROMPT)
    ids, positions = [9] + tree.tokens, tree.position_ids(past)
    mask = tree.attention_mask(past, dtype=torch.bfloat16)
    assert torch.equal(fast(torch.tensor(ids), ours, positions, mask), hf_hidden(model, ids, theirs, positions, mask))


@pytest.mark.parametrize("arch", MODELS)
def test_target_returns_chosen_layers_inputs_from_the_same_pass(arch, monkeypatch):
    """Target.forward(layers=...) gives the inputs of those decoder layers side by side (what an EAGLE-3 head
    fuses), on the lean path and on transformers', for a prompt and a tree step, and the same logits as without."""
    model = MODELS[arch]()
    layers = (1, 0)
    prompt, tree = PROMPT[:-1], random_tree(n=6, seed=3)
    past = len(prompt)
    ids, positions, mask = [PROMPT[-1]] + tree.tokens, tree.position_ids(past), tree.attention_mask(past)
    with torch.inference_mode():
        states = model.model(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states
    expected_prompt = torch.cat([states[n][0] for n in layers], dim=-1)
    results = {}
    for path in ("lean", "transformers"):
        if path == "transformers":
            monkeypatch.setenv(fastdecoder.ENV_SWITCH, "0")
        target = engine.Target(model)
        assert (target.fast is None) is (path == "transformers")
        cache, plain_cache = target.new_cache(), target.new_cache()
        features, _ = target.forward(prompt, cache, logits=False, layers=layers)
        target.forward(prompt, plain_cache, logits=False)
        torch.testing.assert_close(features, expected_prompt, atol=1e-5, rtol=1e-5)
        step, logits = target.forward(ids, cache, positions, mask, layers=layers)
        final, plain_logits = target.forward(ids, plain_cache, positions, mask)
        assert step.shape == (len(ids), 2 * model.config.hidden_size)
        torch.testing.assert_close(logits, plain_logits, atol=0, rtol=0)
        results[path] = step
        with pytest.raises(SpecvizError, match="not all layers"):
            target.forward(prompt, target.new_cache(), layers=(model.config.num_hidden_layers,))
    torch.testing.assert_close(results["lean"], results["transformers"], atol=1e-5, rtol=1e-5)
