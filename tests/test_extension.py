"""specviz's C++ attention op (specviz/csrc/attend.cpp) computes what the decoder's torch ops compute, writes the
same cache bits, and its absence (or a failed build) leaves decoding working."""
from types import SimpleNamespace

import pytest
import torch
from test_fastdecoder import hf_hidden
from test_tree import PROMPT, random_tree
from transformers import DynamicCache

from specviz.decoding import engine
from specviz.drafters import NoDraft
from specviz.kernels import extension, fastdecoder

from tiny import TinyTokenizer, decode_settings, hf_greedy, tiny_llama

needs_op = pytest.mark.skipif(not extension.available(), reason="specviz's C++ ops are not built here")


def stack(heads, kv_heads, head_dim):
    """An (empty) decoder stack with these head sizes: what the attention block needs, rotary tables included."""
    config = SimpleNamespace(num_hidden_layers=0, num_attention_heads=heads, num_key_value_heads=kv_heads,
                             head_dim=head_dim, hidden_size=heads * head_dim, intermediate_size=1)
    rotary = SimpleNamespace(inv_freq=1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    return fastdecoder._Layers([], config, rotary, True, torch.float32, "cpu")


def inputs(layers, T, past, seed):
    generator = torch.Generator().manual_seed(seed)
    width = (layers.heads + 2 * layers.kv_heads) * layers.head_dim
    qkv = torch.randn(T, width, generator=generator)
    shape = (1, layers.kv_heads, past + T + 5, layers.head_dim)
    keys, values = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
    cos, sin = layers._rotary(torch.arange(past, past + T) + 3)
    return qkv, cos, sin, keys, values


class Layer:
    scaling = 0.3


@needs_op
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 16), (9, 3, 64), (14, 2, 64), (2, 2, 32), (4, 1, 128), (2, 1, 48)])  # 48: portable
@pytest.mark.parametrize("T,past,mask_kind", [(1, 0, None), (1, 40, None), (5, 17, "causal"), (10, 33, "tree"),
                                               (10, 33, "tree-bool")])
@torch.inference_mode()
def test_one_op_equals_the_torch_ops(heads, kv_heads, head_dim, T, past, mask_kind):
    layers = stack(heads, kv_heads, head_dim)
    qkv, cos, sin, keys, values = inputs(layers, T, past, seed=T + past + heads)
    mask = None
    if mask_kind == "causal":
        mask = torch.ones(T, past + T, dtype=torch.bool).tril(past)
    elif mask_kind is not None:
        mask = random_tree(n=T - 1, seed=3).attention_mask(past)
        if mask_kind == "tree-bool":
            mask = mask == 0
    theirs_k, theirs_v = keys.clone(), values.clone()
    theirs = layers._attend(Layer, qkv, cos.unsqueeze(0), sin.unsqueeze(0), theirs_k, theirs_v, past, mask)
    op_mask = None if mask_kind == "causal" else mask  # None means causal to the op
    ours = layers._attend_in_one_op(Layer, qkv, cos, sin, keys, values, past, op_mask)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert torch.equal(keys, theirs_k) and torch.equal(values, theirs_v)  # the same cache, bit for bit


@needs_op
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (2, 1, 48)])  # 48: the portable path
@pytest.mark.parametrize("bool_mask", [False, True])
@torch.inference_mode()
def test_a_tree_row_gives_the_bits_of_its_path_alone(heads, kv_heads, head_dim, bool_mask):
    """Each row of a tree's attention is, bit for bit, what the op gives that row with only its path in the cache
    (what a one-token decode along it computes): the same keys summed in the same order, whatever else the tree
    holds. On 8-bit activations one changed bit can move a rounding, and with it a greedy token."""
    layers = stack(heads, kv_heads, head_dim)
    past, tree = 37, random_tree(n=23, seed=5)
    qkv, cos, sin, keys, values = inputs(layers, len(tree) + 1, past, seed=11)
    mask = tree.attention_mask(past)
    together = layers._attend_in_one_op(Layer, qkv, cos, sin, keys.clone(), values.clone(), past,
                                        mask == 0 if bool_mask else mask)
    for row in range(len(tree) + 1):  # row 0 is the root, row i + 1 the tree's node i
        path = [0] + [node + 1 for node in (tree.path_to(row - 1) if row else [])]
        alone = layers._attend_in_one_op(Layer, qkv[path].contiguous(), cos[path].contiguous(), sin[path].contiguous(),
                                         keys.clone(), values.clone(), past, None)
        assert torch.equal(alone[-1], together[row]), f"row {row} differs from its path alone"


@needs_op
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(14, 2, 64), (4, 1, 128), (9, 3, 48)])  # 48: the portable path
@pytest.mark.parametrize("mask_kind", [None, "tree", "bias"])
@pytest.mark.parametrize("past", [29, 700])  # 700: a context long enough that a task takes only some of a group's heads
@torch.inference_mode()
def test_a_head_gives_the_same_bits_whatever_else_shares_its_kv_head(heads, kv_heads, head_dim, mask_kind, past):
    """The heads of one kv head are computed together (their value sums side by side); each one's output is, bit for
    bit, what it gives as the only head of its kv head: causal, under a tree mask, and under a mask that adds a bias
    to some keys; also where one head of a group has a NaN query (its output is 0, the others keep their places)."""
    layers, group = stack(heads, kv_heads, head_dim), heads // kv_heads
    T = 9
    qkv, cos, sin, keys, values = inputs(layers, T, past, seed=7)
    qkv[2, 1 * head_dim] = float("nan")  # token 2, head 1
    mask = None
    if mask_kind == "tree":
        mask = random_tree(n=T - 1, seed=4).attention_mask(past)
    elif mask_kind == "bias":
        mask = torch.zeros(T, past + T)
        mask[:, ::3] = -2.0
        mask[:, past:] = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)
    together = layers._attend_in_one_op(Layer, qkv, cos, sin, keys.clone(), values.clone(), past, mask)
    alone_stack = stack(kv_heads, kv_heads, head_dim)
    q, kv = qkv[:, : heads * head_dim].reshape(T, heads, head_dim), qkv[:, heads * head_dim :]
    for i in range(group):  # head i of every kv head, alone with it
        picked = q[:, [g * group + i for g in range(kv_heads)]].reshape(T, -1)
        alone = alone_stack._attend_in_one_op(Layer, torch.cat([picked, kv], 1).contiguous(), cos, sin, keys.clone(),
                                              values.clone(), past, mask).reshape(T, kv_heads, head_dim)
        assert torch.equal(alone, together.reshape(T, heads, head_dim)[:, i::group]), f"head {i} of its group differs"
    assert not together[2, head_dim : 2 * head_dim].any() and together[2, 2 * head_dim :].isfinite().all()


@needs_op
@torch.inference_mode()
def test_a_mask_with_other_values_attends_over_every_key_with_them_added():
    """A mask that does more than let keys in or shut them out (here a bias of -2 on some) is applied as it is."""
    layers = stack(4, 2, 16)
    T, past = 6, 20
    qkv, cos, sin, keys, values = inputs(layers, T, past, seed=2)
    mask = torch.zeros(T, past + T)
    mask[:, ::3] = -2.0
    mask[:, past:] = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)
    theirs = layers._attend(Layer, qkv, cos.unsqueeze(0), sin.unsqueeze(0), keys.clone(), values.clone(), past, mask)
    ours = layers._attend_in_one_op(Layer, qkv, cos, sin, keys, values, past, mask)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


@needs_op
@torch.inference_mode()
def test_one_op_rejects_what_it_cannot_do():
    layers = stack(4, 2, 16)
    qkv, cos, sin, keys, values = inputs(layers, 3, 10, seed=0)
    with pytest.raises(RuntimeError, match="no room"):
        torch.ops.specviz.attend(qkv, cos, sin, keys, values, keys.shape[2] - 2, None, 0.3, 4, 2)
    with pytest.raises(RuntimeError, match="qkv width"):
        torch.ops.specviz.attend(qkv[:, :-16].contiguous(), cos, sin, keys, values, 10, None, 0.3, 4, 2)
    with pytest.raises(RuntimeError, match="mask"):
        torch.ops.specviz.attend(qkv, cos, sin, keys, values, 10, torch.ones(3, 5, dtype=torch.bool), 0.3, 4, 2)


@needs_op
@torch.inference_mode()
def test_decoder_with_the_op_matches_transformers_on_prompt_chain_and_tree():
    model = tiny_llama(hidden=64, scale=3.0)  # head_dim 16: the op applies
    fast = fastdecoder.FastDecoder(model)
    assert fast.stack.one_op
    ours, theirs = fast.new_cache(), DynamicCache(config=model.config)
    prompt = PROMPT[:-1]
    torch.testing.assert_close(fast(torch.tensor(prompt), ours), hf_hidden(model, prompt, theirs), atol=1e-5, rtol=1e-5)
    for chain in ([PROMPT[-1]], [5, 9, 11]):
        torch.testing.assert_close(fast(torch.tensor(chain), ours), hf_hidden(model, chain, theirs), atol=1e-5, rtol=1e-5)
    past = ours.length
    tree = random_tree(n=9, seed=2)
    ids, positions, mask = [7] + tree.tokens, tree.position_ids(past), tree.attention_mask(past)
    torch.testing.assert_close(fast(torch.tensor(ids), ours, positions, mask),
                               hf_hidden(model, ids, theirs, positions, mask), atol=1e-5, rtol=1e-5)


@needs_op
def test_greedy_decode_with_the_op_equals_generate():
    model = tiny_llama(hidden=64, scale=3.0)
    assert engine.Target(model).fast.stack.one_op
    events = list(engine.decode(model, TinyTokenizer(64), NoDraft(), PROMPT, decode_settings(max_new_tokens=40)))
    assert events[-1].token_ids == hf_greedy(model, PROMPT, 40)


def test_a_failed_build_warns_leaves_nothing_behind_and_decoding_works(monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(extension, "_state", None)

    def fail(*args, build_directory, **kwargs):
        open(f"{build_directory}/half-built.o", "w").close()  # the build had started writing
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(cpp_extension, "load", fail)
    monkeypatch.setattr(extension, "library_folder", lambda: tmp_path / "kernels" / "not-built-yet")
    with pytest.warns(UserWarning, match="could not be built.*no compiler here"):
        assert not extension.available()
    assert list((tmp_path / "kernels").iterdir()) == []  # no temporary build folder, no library, no lock
    model = tiny_llama(hidden=64, scale=3.0)
    target = engine.Target(model)
    assert not target.fast.stack.one_op  # torch's ops instead
    events = list(engine.decode(model, TinyTokenizer(64), NoDraft(), PROMPT, decode_settings(max_new_tokens=12)))
    assert events[-1].token_ids == hf_greedy(model, PROMPT, 12)


def test_a_build_removes_killed_builds_and_libraries_unused_for_30_days(monkeypatch, tmp_path):
    import os
    import time

    from torch.utils import cpp_extension

    kernels = tmp_path / "kernels"
    killed, running = kernels / ".build-killed", kernels / ".build-running"
    unused, recent = kernels / "specviz_ops-unused", kernels / "specviz_ops-recent"  # other source versions
    for folder, name in ((killed, "lock"), (running, "lock"), (unused, "specviz_ops.so"), (recent, "specviz_ops.so")):
        folder.mkdir(parents=True)
        (folder / name).write_text("")
    os.utime(killed, (1, 1))  # long ago
    month = time.time() - extension.UNUSED_LIBRARY_S
    os.utime(unused / "specviz_ops.so", (month - 60, month - 60))
    os.utime(recent / "specviz_ops.so", (month + 3600, month + 3600))  # loaded an hour short of 30 days ago
    monkeypatch.setattr(extension, "library_folder", lambda: kernels / "specviz_ops-test")
    monkeypatch.setattr(cpp_extension, "load", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stop here")))
    with pytest.raises(RuntimeError, match="stop here"):
        extension._build_and_load()
    assert sorted(p.name for p in kernels.iterdir()) == [".build-running", "specviz_ops-recent"]


def test_loading_a_built_library_marks_it_used(monkeypatch, tmp_path):
    import os

    folder = tmp_path / "specviz_ops-built"
    folder.mkdir()
    (folder / "specviz_ops.so").write_text("")
    os.utime(folder / "specviz_ops.so", (1, 1))
    monkeypatch.setattr(extension, "library_folder", lambda: folder)
    monkeypatch.setattr(torch.ops, "load_library", lambda path: None)
    extension._build_and_load()
    assert (folder / "specviz_ops.so").stat().st_mtime > 1e9  # now, so a later build elsewhere keeps it


def test_switched_off_it_is_not_built(monkeypatch):
    monkeypatch.setenv(extension.ENV_SWITCH, "0")
    monkeypatch.setattr(extension, "_state", None)
    monkeypatch.setattr(extension, "_build_and_load", lambda: pytest.fail("built although switched off"))
    assert not extension.available()
