"""EAGLE-3 draft heads (Li et al., 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
Training-Time Test"), in the layout the published heads use, and their loading.

At position t the head reads g_t, the target's hidden states at three depths side by side (the inputs of decoder
layers `aux_layers`, (3·H_target)), and the embedding of x_{t+1}:

    x   = fc(g_t)                                  (H)      only for the target's features; when drafting
                                                            deeper, the head's own output h is fed back as x
    a   = attn(cat(input_norm(emb), hidden_norm(x)))        q, k, v read 2·H
    y   = x + o(a);   h = y + mlp(post_norm(y))    (H)      (norm_before_residual: hidden_norm(x) is the residual)
    q   = softmax(lm_head(norm(h)))                         over the draft vocabulary; draft id i is target
                                                            token i + d2t[i]; t2d marks the target ids it covers

Two layouts on disk, both a config.json beside model.safetensors (or a `weights_only` torch file):
* SafeAILab/EAGLE (`eagle/model/cnets.py`, EAGLE-3): a Llama config with `draft_vocab_size` (and
  `target_hidden_size` when it differs), weights `fc.weight`, `midlayer.*`, `norm.weight`, `lm_head.weight`,
  `d2t`, `t2d`, optionally `embed_tokens.weight`.
* speculators (what vLLM reads): `speculators_model_type: "eagle3"`, the layer's config in
  `transformer_layer_config`, `draft_vocab_size`, `norm_before_residual`, `target_hidden_size`,
  `eagle_aux_hidden_state_layer_ids`; weights as above with `layers.0.*` for `midlayer.*`.
The target's embedding is used (published heads carry a copy of it; a copy of another shape is refused).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from specviz.errors import SpecvizError
from specviz.kernels.fastdecoder import rotate_half
from specviz.models.heads import match_state_dict, read_config, read_state_dict, write_weights


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """The target layers whose inputs an EAGLE-3 head fuses when its config names none: 2, N // 2 and N - 3, as
    SafeAILab/EAGLE's EAGLE-3 targets and vLLM choose them (low, middle and high features)."""
    return (2, num_layers // 2, num_layers - 3)


class Attention(nn.Module):
    """Grouped-query attention whose q, k and v read 2·H (embedding and hidden side by side); rotary positions."""

    def __init__(self, cfg):
        super().__init__()
        hidden = cfg.hidden_size
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or hidden // self.heads
        self.scaling = 1 / math.sqrt(self.head_dim)
        bias = bool(getattr(cfg, "attention_bias", False))
        self.q_proj = nn.Linear(2 * hidden, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(2 * hidden, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(2 * hidden, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=bias)

    def forward(self, x, cos, sin, past=None, mask=None):
        """x (B, T, 2H); cos, sin (B, T, head_dim); past None or (keys, values) (B, kv, S, d); mask None (causal)
        or additive (B, 1, T, S + T) → (out (B, T, H), (keys, values) with the T new entries appended)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos[:, None].to(q.dtype), sin[:, None].to(q.dtype)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        if mask is None and T > 1:
            S = k.shape[2]
            mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(S - T)  # row i sees up to S - T + i
        elif mask is not None and mask.is_floating_point():
            mask = mask.to(q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling,
                                             enable_gqa=self.kv_heads != self.heads)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1)), (k, v)


class Layer(nn.Module):
    def __init__(self, cfg, norm_before_residual: bool):
        super().__init__()
        eps = cfg.rms_norm_eps
        self.hidden_norm = LlamaRMSNorm(cfg.hidden_size, eps)
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, eps)
        self.mlp = LlamaMLP(cfg)
        self.norm_before_residual = norm_before_residual

    def forward(self, x, embeds, cos, sin, past=None, mask=None):
        normed = self.hidden_norm(x)
        residual = normed if self.norm_before_residual else x
        attended, kv = self.self_attn(torch.cat([self.input_layernorm(embeds), normed], dim=-1), cos, sin, past, mask)
        y = residual + attended
        return y + self.mlp(self.post_attention_layernorm(y)), kv


class Eagle3Head(nn.Module):
    """fc (3·H_target → H), one decoder layer over [embedding ; feature], a final norm and an LM head over the
    draft vocabulary. lm_head None: the target's LM head rows at the draft ids serve (not stored)."""

    def __init__(self, layer_config, target_hidden_size: int, draft_vocab_size: int, aux_layers: tuple[int, ...],
                 norm_before_residual: bool = False, own_lm_head: bool = True):
        super().__init__()
        cfg = layer_config if isinstance(layer_config, LlamaConfig) else LlamaConfig(**dict(layer_config))
        self.config, self.aux_layers = cfg, tuple(aux_layers)
        self.target_hidden_size, self.draft_vocab_size = target_hidden_size, draft_vocab_size
        self.fc = nn.Linear(len(self.aux_layers) * target_hidden_size, cfg.hidden_size, bias=False)
        self.layer = Layer(cfg, norm_before_residual)
        self.norm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, draft_vocab_size, bias=False) if own_lm_head else None
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(config=cfg)

    def draft_ids(self) -> torch.Tensor:
        """The target token id of each draft id. (Vd,) int64"""
        return torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t

    def forward(self, features, embeds, position_ids, past=None, mask=None):
        """features (B, T, 3·H_target) from the target, or (B, T, H) the head's own earlier outputs; embeds (B, T, H);
        position_ids (B, T) → (h (B, T, H) before the final norm, (keys, values))."""
        x = self.fc(features) if features.shape[-1] != embeds.shape[-1] else features
        cos, sin = self.rotary(x, position_ids)
        return self.layer(x, embeds, cos, sin, past, mask)

    def logits(self, h: torch.Tensor, target_lm_head: torch.Tensor | None = None) -> torch.Tensor:
        """h (…, H) → logits over the draft vocabulary (…, Vd). target_lm_head (V, H) when the head has none."""
        weight = self.lm_head.weight if self.lm_head is not None else target_lm_head[self.draft_ids()]
        return self.norm(h) @ weight.T

    def save(self, path, config_extra: dict, dtype: torch.dtype = torch.float16):
        """Write the head in the speculators layout's names (config.json and model.safetensors), without its
        embedding and, when it reuses the target's rows, without an LM head: specviz fills both in from the target;
        a reader that expects them in the file (vLLM) needs them added."""
        state = {("layers.0." + k[len("layer."):]) if k.startswith("layer.") else k: v
                 for k, v in self.state_dict().items() if not k.startswith("rotary.")}
        # one decoder layer, as the weights hold: a reader that builds what the config says (vLLM) would otherwise
        # build LlamaConfig's default of 32, 31 of them without weights
        layer = {**self.config.to_dict(), "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1}
        config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
                  "transformer_layer_config": layer, "draft_vocab_size": self.draft_vocab_size,
                  "norm_before_residual": self.layer.norm_before_residual,
                  "target_hidden_size": self.target_hidden_size,
                  "eagle_aux_hidden_state_layer_ids": list(self.aux_layers),
                  "lm_head": "own" if self.lm_head is not None else "the target's rows at the draft ids",
                  "dtype": str(dtype).removeprefix("torch."), **config_extra}
        return write_weights(path, state, config, dtype)

    @classmethod
    def load(cls, path, target_config) -> "Eagle3Head":
        """A head in the SafeAILab or the speculators layout (see the module's docstring), checked against the
        target's sizes; a SpecvizError names what does not fit."""
        source = str(path)
        config = read_config(path)
        if not config:
            raise SpecvizError(f"{source}: no config.json beside the EAGLE-3 weights")
        speculators = config.get("speculators_model_type") is not None
        if speculators and config["speculators_model_type"] != "eagle3":
            raise SpecvizError(f"{source}: a speculators '{config['speculators_model_type']}' model, not eagle3")
        layer = dict(config["transformer_layer_config"]) if speculators else dict(config)
        eagle = config.get("eagle_config") or {}
        aux = config.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
        depth = target_config.num_hidden_layers
        aux = tuple(aux) if aux else default_aux_layers(depth)
        if any(not 0 <= n < depth for n in aux):
            raise SpecvizError(f"{source}: fuses target layers {aux}, but the target has {depth} layers")
        target_hidden = config.get("target_hidden_size") or layer.get("target_hidden_size") or layer["hidden_size"]
        draft_vocab = config.get("draft_vocab_size") or layer.get("draft_vocab_size") or layer["vocab_size"]
        for name, theirs, ours in (("target hidden size", target_hidden, target_config.hidden_size),
                                   ("target vocabulary", layer.get("vocab_size"), target_config.vocab_size)):
            if theirs != ours:
                raise SpecvizError(f"{source}: the head was made for a {name} of {theirs}; this target's is {ours}")
        if layer["hidden_size"] != target_config.hidden_size:
            raise SpecvizError(f"{source}: the head is {layer['hidden_size']} wide and the target {target_config.hidden_size}; "
                               "specviz feeds it the target's embedding, so they must be as wide")
        state = read_state_dict(path)
        prefix = "layers.0." if speculators else "midlayer."
        state = {("layer." + k[len(prefix):]) if k.startswith(prefix) else k: v for k, v in state.items()}
        embedding = state.pop("embed_tokens.weight", None)
        if embedding is not None and embedding.shape != (target_config.vocab_size, layer["hidden_size"]):
            raise SpecvizError(f"{source}: its embedding {tuple(embedding.shape)} does not fit this target")
        head = cls(layer, target_hidden, draft_vocab, aux, bool(config.get("norm_before_residual", False)),
                   own_lm_head="lm_head.weight" in state)
        head.load_state_dict(match_state_dict(head.state_dict(), state, source))
        ids = head.draft_ids()
        if int(ids.min()) < 0 or int(ids.max()) >= target_config.vocab_size:
            raise SpecvizError(f"{source}: d2t maps draft ids outside the target's vocabulary")
        return head.eval()

