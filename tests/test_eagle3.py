"""EAGLE-3 heads: the architecture against the equations written out, and loading both published layouts
(random tensors written as SafeAILab/EAGLE and as speculators save them), with clear errors on a mismatch."""
import json
import math

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig

from specviz.errors import SpecvizError
from specviz.models.eagle3 import Eagle3Head, default_aux_layers

TARGET = LlamaConfig(hidden_size=32, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=64, vocab_size=64)
LAYER = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48, vocab_size=64,
             rms_norm_eps=1e-6, max_position_embeddings=256, rope_theta=10000.0)
DRAFT_VOCAB = 16


def random_head(norm_before_residual=False, seed=0) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head(LAYER, 32, DRAFT_VOCAB, default_aux_layers(6), norm_before_residual)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)
        ids = torch.randperm(64)[:DRAFT_VOCAB].sort().values
        head.d2t.copy_(ids - torch.arange(DRAFT_VOCAB))
        head.t2d.zero_()
        head.t2d[ids] = True
    return head.eval()


def rms(x, w, eps=1e-6):
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def reference(head: Eagle3Head, g, emb, positions):
    """The head's equations one position at a time, causal: (T, 3H), (T, H), (T,) → h (T, H)."""
    L, a = head.layer, head.layer.self_attn
    x = g @ head.fc.weight.T
    normed = rms(x, L.hidden_norm.weight)
    inp = torch.cat([rms(emb, L.input_layernorm.weight), normed], dim=-1)
    d = a.head_dim
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    ang = positions[:, None].float() * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rot(t):  # (T, heads, d)
        half = torch.cat([-t[..., d // 2:], t[..., : d // 2]], -1)
        return t * cos[:, None] + half * sin[:, None]

    q = rot((inp @ a.q_proj.weight.T).view(len(g), a.heads, d))
    k = rot((inp @ a.k_proj.weight.T).view(len(g), a.kv_heads, d))
    v = (inp @ a.v_proj.weight.T).view(len(g), a.kv_heads, d)
    group = a.heads // a.kv_heads
    out = torch.zeros(len(g), a.heads, d)
    for t in range(len(g)):
        for h in range(a.heads):
            scores = torch.stack([q[t, h] @ k[s, h // group] for s in range(t + 1)]) / math.sqrt(d)
            out[t, h] = torch.softmax(scores, 0) @ v[: t + 1, h // group]
    y = (normed if L.norm_before_residual else x) + out.reshape(len(g), -1) @ a.o_proj.weight.T
    m = rms(y, L.post_attention_layernorm.weight)
    mlp = L.mlp
    return y + (torch.nn.functional.silu(m @ mlp.gate_proj.weight.T) * (m @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T


@pytest.mark.parametrize("before", [False, True], ids=["norm-after-residual", "norm-before-residual"])
@torch.no_grad()
def test_head_follows_its_equations_and_a_cache_changes_nothing(before):
    head = random_head(before)
    T = 7
    g, emb, pos = torch.randn(T, 96), torch.randn(T, 32), torch.arange(3, 3 + T)
    whole, _ = head(g[None], emb[None], pos[None])
    torch.testing.assert_close(whole[0], reference(head, g, emb, pos), atol=1e-4, rtol=1e-4)
    first, kv = head(g[None, :4], emb[None, :4], pos[None, :4])
    rest, kv = head(g[None, 4:], emb[None, 4:], pos[None, 4:], past=kv)
    torch.testing.assert_close(torch.cat([first, rest], 1), whole, atol=1e-5, rtol=1e-5)
    assert kv[0].shape == (1, 2, T, 8)
    fed_back, _ = head(whole[:, -1:], emb[None, :1], pos[None, -1:] + 1, past=kv)  # (B, T, H): no fc
    assert fed_back.shape == (1, 1, 32)
    logits = head.logits(whole[0])
    assert logits.shape == (T, DRAFT_VOCAB)
    assert torch.equal(head.t2d.nonzero()[:, 0], head.draft_ids())


def write(folder, config, state):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    return folder


def safeailab(head, folder, **extra):
    config = {**LlamaConfig(**LAYER).to_dict(), "architectures": ["LlamaForCausalLMEagle3"],
              "draft_vocab_size": DRAFT_VOCAB, **extra}
    state = {k.replace("layer.", "midlayer.", 1) if k.startswith("layer.") else k: v for k, v in head.state_dict().items()}
    state["embed_tokens.weight"] = torch.randn(64, 32)
    return write(folder, config, state)


def speculators(head, folder, aux=(1, 3, 4)):
    config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
              "transformer_layer_config": {**LAYER, "model_type": "llama"}, "draft_vocab_size": DRAFT_VOCAB,
              "norm_before_residual": True, "target_hidden_size": 32, "eagle_aux_hidden_state_layer_ids": list(aux)}
    state = {k.replace("layer.", "layers.0.", 1) if k.startswith("layer.") else k: v for k, v in head.state_dict().items()}
    return write(folder, config, state)


@torch.no_grad()
def test_both_published_layouts_load_with_their_settings(tmp_path):
    head = random_head()
    loaded = Eagle3Head.load(safeailab(head, tmp_path / "safeailab"), TARGET)
    assert loaded.aux_layers == (2, 3, 3) and not loaded.layer.norm_before_residual  # no ids: 2, N/2, N - 3
    for key, value in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    g, emb, pos = torch.randn(1, 5, 96), torch.randn(1, 5, 32), torch.arange(5)[None]
    torch.testing.assert_close(loaded(g, emb, pos)[0], head(g, emb, pos)[0])

    other = random_head(norm_before_residual=True, seed=1)
    loaded = Eagle3Head.load(speculators(other, tmp_path / "speculators"), TARGET)
    assert loaded.aux_layers == (1, 3, 4) and loaded.layer.norm_before_residual
    torch.testing.assert_close(loaded(g, emb, pos)[0], other(g, emb, pos)[0])


def test_a_head_that_does_not_fit_the_target_is_refused_clearly(tmp_path):
    head = random_head()
    folder = safeailab(head, tmp_path / "ok")
    wider = LlamaConfig(**{**TARGET.to_dict(), "hidden_size": 48})
    with pytest.raises(SpecvizError, match="target hidden size of 32; this target's is 48"):
        Eagle3Head.load(folder, wider)
    other_vocab = LlamaConfig(**{**TARGET.to_dict(), "vocab_size": 80})
    with pytest.raises(SpecvizError, match="target vocabulary of 64; this target's is 80"):
        Eagle3Head.load(folder, other_vocab)
    shallow = LlamaConfig(**{**TARGET.to_dict(), "num_hidden_layers": 4})
    with pytest.raises(SpecvizError, match=r"fuses target layers \(1, 3, 4\), but the target has 4 layers"):
        Eagle3Head.load(speculators(head, tmp_path / "deep"), shallow)
    with torch.no_grad():
        head.d2t[-1] += 100
    with pytest.raises(SpecvizError, match="outside the target's vocabulary"):
        Eagle3Head.load(safeailab(head, tmp_path / "bad-d2t"), TARGET)
    broken = safeailab(random_head(), tmp_path / "missing")
    from safetensors.torch import load_file

    state = load_file(str(broken / "model.safetensors"))
    del state["midlayer.self_attn.q_proj.weight"]
    save_file(state, str(broken / "model.safetensors"))
    with pytest.raises(SpecvizError, match="missing weights"):
        Eagle3Head.load(broken, TARGET)
    (tmp_path / "noconfig").mkdir()
    save_file({"fc.weight": torch.zeros(1)}, str(tmp_path / "noconfig" / "model.safetensors"))
    with pytest.raises(SpecvizError, match="no config.json"):
        Eagle3Head.load(tmp_path / "noconfig", TARGET)


@torch.no_grad()
def test_training_time_test_sees_what_drafting_sees():
    """train.eagle3.unrolled over a whole sequence at once equals drafting it step by step with a cache: step k at
    position s is the chain that starts from the true entries up to s - k and feeds the head's own outputs back.
    A mask that let a step see one more true entry (or its chain's wrong entries) fails this."""
    from specviz.train.eagle3 import unrolled

    head = random_head()
    T = 9
    g, emb = torch.randn(1, T, 3 * 32), torch.randn(1, T, 32)
    pos = torch.arange(T)[None]
    outs = unrolled(head, g, emb, pos, steps=3)
    for s in range(2, T):
        for k in (1, 2):
            start = s - k  # the chain's first fed-back entry sits at position start + 1
            h, past = head(g[:, :start + 1], emb[:, :start + 1], pos[:, :start + 1])
            x = h[:, -1:]
            for i in range(1, k + 1):
                x, past = head(x, emb[:, start + i: start + i + 1], pos[:, start + i: start + i + 1], past)
            assert torch.allclose(outs[k][0, s], x[0, 0], atol=1e-5), (s, k)
