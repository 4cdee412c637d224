"""A lean forward pass for Llama-family decoders (Llama, SmolLM2, Qwen2) on the CPU, and the KV cache it fills.

Why: profiling one decoding step of SmolLM2-135M in transformers (fp32, 2 cores, packed linears) gives about
43 ms, of which 76 % is the 211 linear layers, 8 % the KV cache's `torch.cat`, and the rest small ops. This module
computes the same function with

- q, k and v in one product and gate and up in one product (their weights concatenated once, in the order the
  model has them): 121 products per step instead of 211, each reading one larger weight;
- a preallocated KV cache written in place (no `cat` per layer and step); dropping rejected positions is
  setting a length, keeping an accepted tree path is one `index_copy` per layer;
- rotary tables computed once per position, and nothing else per layer but the ops of the model itself;
- for forwards over a few new tokens (decoding steps, small trees), the attention block (rotary, the cache
  writes, the attention itself) as one C++ op (specviz.kernels.extension, csrc/attend.cpp) instead of some thirty small
  torch ops per layer: a 1-token step about 1.1× faster (experiments/attention_op_ab.py). The cache gets the same bits;
  the attention agrees with torch's to rounding. Where the op cannot be built, torch's ops run.

It is the same arithmetic in the same precision: every output element is the same dot product as in
transformers, so outputs agree with `model.model(...)` to rounding (bit for bit in the tests we run in bf16, and in
fp32 where the attention runs in torch's ops).
Where a model is not covered (another architecture, a rotary scaling that depends on the length, sliding-window
layers, a device other than the CPU), `for_model` returns None and the engine uses transformers' forward.
`FastEagleHead` runs an EAGLE draft head (specviz.models.heads.EagleHead) the same way, `FastEagle3Head` an EAGLE-3
one (specviz.models.eagle3.Eagle3Head).

The fused weights are one more copy of q, k, v, gate and up (for SmolLM2-135M about 280 MB in fp32); where that
would take more than a quarter of the free memory, the layers run the model's own products one by one. The model
must stay frozen while a FastDecoder built from it is in use (`for_model` rebuilds it when a weight changes).
`SPECVIZ_FAST_DECODER=0` turns it off.
"""

from __future__ import annotations

import os
import threading
import weakref

import torch
from torch.nn import functional as F

from specviz.kernels import extension, fastlinear, quant

ENV_SWITCH = "SPECVIZ_FAST_DECODER"
ARCHITECTURES = ("llama", "qwen2")
STATIC_ROPE = ("default", "linear", "llama3")  # rotary frequencies that do not depend on the sequence length
# Forwards over at most this many new tokens (decoding steps, verified trees) run the attention block as one C++
# op (specviz.kernels.extension); longer ones (prompts) through scaled_dot_product_attention, which is faster there.
ONE_OP_MAX_TOKENS = 16
# A long forward (a prompt chunk) over at least this many cached positions attends in scaled_dot_product_attention,
# 4-bit layers included: its matrix products cost less a key than the C++ op's loop over keys per query, which is
# faster over a short past (256 new tokens, the op's time against torch's: 0.4-0.7x over 256 cached, 1.3-1.6x over
# 1,024, 2.9-3.2x over 4,096, 4.9x over 7,936, on a 2-core AVX2 host under load: experiments/prefill_attention_ab.py,
# experiments/results/prefill-attention-ab.txt). Without it a prompt's chunks slowed down as the prompt grew, each
# by its attention alone.
LONG_PAST = 1024


class KVCache:
    """Keys and values of every layer in one preallocated (2, layers, kv_heads, capacity, head_dim) buffer; `keys[l]`
    and `values[l]` are its (1, kv_heads, capacity, head_dim) views, each contiguous.

    Positions [0, length) are valid. A forward writes its T new entries at [length, length + T) in every layer and
    then advances the length; the capacity doubles when it runs out. One buffer lets the surgery after a tree verify
    move every layer's entries in one operation. Buffers are made and changed under inference_mode (forwards run
    under it; the engine's surgery after verification does not)."""

    @torch.inference_mode()
    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device, capacity: int = 512):
        self.length = 0
        self._views(torch.zeros(2, layers, kv_heads, capacity, head_dim, dtype=dtype, device=device))

    def _views(self, both: torch.Tensor) -> None:
        self.both = both  # (2, layers, kv_heads, capacity, head_dim): keys, then values
        self.keys = [both[0, n : n + 1] for n in range(both.shape[1])]
        self.values = [both[1, n : n + 1] for n in range(both.shape[1])]

    @property
    def capacity(self) -> int:
        return self.both.shape[3]

    def get_seq_length(self) -> int:
        return self.length

    @torch.inference_mode()
    def reserve(self, new_tokens: int) -> None:
        needed = self.length + new_tokens
        if needed <= self.capacity:
            return
        old = self.both
        grown = old.new_zeros(*old.shape[:3], max(needed, 2 * self.capacity), old.shape[4])
        grown[:, :, :, : self.length] = old[:, :, :, : self.length]
        self._views(grown)

    def crop(self, length: int) -> None:
        """Keep positions [0, length)."""
        self.length = min(self.length, length)

    @torch.inference_mode()
    def keep(self, past_len: int, keep: list[int]) -> None:
        """After a forward over root + nodes, keep the root (at past_len) and the nodes `keep` (their entries sit at
        past_len + 1 + i), in that order, right after the root: every layer's keys and values in one gather."""
        if keep != list(range(len(keep))):
            source = torch.tensor([past_len + 1 + i for i in keep], device=self.both.device)
            target = torch.arange(past_len + 1, past_len + 1 + len(keep), device=source.device)
            self.both.index_copy_(3, target, self.both.index_select(3, source))
        self.crop(past_len + 1 + len(keep))


def _fused(*modules) -> fastlinear.PackedProjection:
    """One product for several linear modules that read the same input: weights (and biases) stacked in order.
    Block linears (specviz.kernels.quant.BLOCK_LINEARS: weights kept as GGUF blocks) give their own stacked
    product (or products side by side where their formats differ) instead of a concatenated fp32 copy."""
    blocks = quant.stacked_blocks(*modules)
    if blocks is not None:
        return blocks
    weights = [m.weight for m in modules]
    bias = fastlinear.stacked_bias([m.bias for m in modules], [w.shape[0] for w in weights], weights[0])
    return fastlinear.PackedProjection(torch.cat(weights).contiguous(), bias)


class _Separate:
    """The unfused fallback: the model's own modules, one product each, outputs side by side."""

    def __init__(self, *modules):
        self.modules = modules

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([module(x) for module in self.modules], dim=-1)


class _Layer:
    def __init__(self, layer, fuse: bool):
        attn, mlp = layer.self_attn, layer.mlp
        if fuse:
            self.qkv = _fused(attn.q_proj, attn.k_proj, attn.v_proj)
            self.gate_up = _fused(mlp.gate_proj, mlp.up_proj)
        else:
            self.qkv = _Separate(attn.q_proj, attn.k_proj, attn.v_proj)
            self.gate_up = _Separate(mlp.gate_proj, mlp.up_proj)
        self.o_proj = attn.o_proj  # unfused: the model's own (packed) module
        self.down_proj = mlp.down_proj
        self.scaling = attn.scaling
        norm = layer.input_layernorm  # an EAGLE head's only layer has none (nn.Identity)
        self.input_norm = None if isinstance(norm, torch.nn.Identity) else norm
        self.post_attention_norm = layer.post_attention_layernorm
        self.blocks = self._blocks()

    def _blocks(self) -> tuple | None:
        """The arguments of the one-call layer op (csrc/q4layer.cpp) where every projection is 4-bit and fused, the
        norms (the input one may be absent, as in an EAGLE head) share one epsilon, and only q/k/v has a bias; else
        None (the layer runs op by op)."""
        products = (self.qkv, self.o_proj, self.gate_up, self.down_proj)
        if not (isinstance(self.qkv, quant.Q4Projection) and isinstance(self.gate_up, quant.Q4Projection)
                and isinstance(self.o_proj, quant.Q4Linear) and isinstance(self.down_proj, quant.Q4Linear)):
            return None
        if self.gate_up.bias is not None or any(p.bias is not None for p in products[1::2]):
            return None
        eps = self.post_attention_norm.variance_epsilon
        if self.input_norm is not None and self.input_norm.variance_epsilon != eps:
            return None
        blocks = [[p.codes, p.scales, p.mins] for p in products]
        input_norm = None if self.input_norm is None else self.input_norm.weight
        return (input_norm, self.post_attention_norm.weight, eps, blocks[0], self.qkv.bias, *blocks[1:])


class _Layers:
    """A stack of Llama-family decoder layers reading and extending a KVCache (no embedding, no final norm)."""

    def __init__(self, layers, config, rotary, fuse: bool, dtype: torch.dtype, device, layer_op: bool = True):
        self.layers = [_Layer(layer, fuse) for layer in layers[: config.num_hidden_layers]]  # as transformers runs them
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.intermediate = config.intermediate_size
        self.dtype, self.device = dtype, device
        self.inv_freq = rotary.inv_freq.float().to(device)
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self._tables = (torch.empty(0, self.head_dim), torch.empty(0, self.head_dim))  # cos, sin by position
        # The attention block as one C++ op where it is built and applies (fp32 on the CPU); torch's ops otherwise.
        self.one_op = (dtype == torch.float32 and torch.device(device).type == "cpu" and self.head_dim % 16 == 0
                       and extension.available())
        # Where it also applies, each 4-bit layer as one C++ call (specviz::q4_layer: the same ops, the same bits);
        # layer_op False where the layers are not the Llama layer that op computes (an EAGLE-3 head's).
        self.layer_op = layer_op and self.one_op and hasattr(torch.ops.specviz, "q4_layer") and all(l.blocks for l in self.layers)
        # The layer op normalises with its own RMSNorm; run op by op, 4-bit layers use that one too (same bits).
        self.q4_norm = self.one_op and hasattr(torch.ops.specviz, "rms_norm")
        self._lock = threading.Lock()

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers), self.kv_heads, self.head_dim, self.dtype, self.device)

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (T, head_dim) for these positions, as transformers computes them (fp32, then cast)."""
        cos, sin = self._tables
        end = int(positions.max()) + 1
        if end > cos.shape[0]:
            with self._lock:
                size = max(end, 2 * cos.shape[0], 1024)
                freqs = torch.outer(torch.arange(size, device=self.device, dtype=torch.float32), self.inv_freq)
                angles = torch.cat((freqs, freqs), dim=-1)
                cos = (angles.cos() * self.rope_scale).to(self.dtype)
                sin = (angles.sin() * self.rope_scale).to(self.dtype)
                self._tables = (cos, sin)
        return cos[positions], sin[positions]

    def __call__(self, x: torch.Tensor, cache: KVCache, position_ids: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None, capture: tuple[int, ...] = ()):
        """x (T, H) → (T, H). position_ids (1, T) or None (the next T positions); mask: None (causal) or an
        additive (1, 1, T, past + T) tree mask. capture: numbers of layers whose inputs are returned too, in that
        order: then → ((T, H), [(T, H), ...])."""
        past, end = cache.length, cache.length + x.shape[0]
        cos, sin, mask, attend, one_op = self.prepare(x, cache, position_ids, mask)
        inputs = {}
        for number, (layer, keys, values) in enumerate(zip(self.layers, cache.keys, cache.values)):
            if number in capture:
                inputs[number] = x
            if self.layer_op and one_op:
                x = torch.ops.specviz.q4_layer(x, *layer.blocks, cos, sin, keys, values, past, mask, layer.scaling,
                                               self.heads, self.kv_heads)
                continue
            norm = _q4_rms_norm if self.q4_norm and layer.blocks else _rms_norm
            qkv = layer.qkv(x if layer.input_norm is None else norm(layer.input_norm, x))
            x = x + layer.o_proj(attend(layer, qkv, cos, sin, keys, values, past, mask))
            gate_up = layer.gate_up(norm(layer.post_attention_norm, x))
            x = x + layer.down_proj(F.silu(gate_up[:, : self.intermediate]) * gate_up[:, self.intermediate :])
        cache.length = end
        return (x, [inputs[number] for number in capture]) if capture else x

    def prepare(self, x: torch.Tensor, cache: KVCache, position_ids: torch.Tensor | None, mask: torch.Tensor | None):
        """What every layer of a forward over x (T, H) shares: (cos, sin, mask, attend, one_op), the attention
        block chosen for this length (the C++ op or torch's) and the rotary tables and mask in its shapes; makes
        room in the cache for the T new entries."""
        T, past = x.shape[0], cache.length
        end = past + T
        positions = position_ids.reshape(-1) if position_ids is not None else torch.arange(past, end, device=x.device)
        cos, sin = self._rotary(positions)
        if mask is not None and mask.is_floating_point() and mask.dtype != x.dtype:
            mask = mask.to(x.dtype)
        # 4-bit layers run as one call at any length over a short past: their products outweigh the attention there
        # (a 128-token prefill 1.08x faster than with scaled_dot_product_attention, experiments/q4_layer_op_ab.py);
        # over a long one (LONG_PAST) the attention does not
        one_op = self.one_op and (T <= ONE_OP_MAX_TOKENS or (self.layer_op and past < LONG_PAST))
        attend = self._attend_in_one_op if one_op else self._attend
        if not one_op:
            cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)  # broadcast over heads
            if mask is None and T > 1:
                mask = torch.ones(T, end, dtype=torch.bool, device=x.device).tril(past)  # row i sees up to past + i
        cache.reserve(T)
        return cos, sin, mask, attend, one_op

    def _attend(self, layer: _Layer, qkv, cos, sin, keys, values, past: int, mask) -> torch.Tensor:
        """The attention block in torch's ops: rotary, the cache writes, scaled_dot_product_attention.
        qkv (T, width); cos, sin (1, T, head_dim); mask None (one token) or (T, past + T) / (1, 1, T, past + T)."""
        T, end = qkv.shape[0], past + qkv.shape[0]
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q = qkv[:, :q_size].view(T, self.heads, self.head_dim).transpose(0, 1)
        k = qkv[:, q_size : q_size + kv_size].view(T, self.kv_heads, self.head_dim).transpose(0, 1)
        v = qkv[:, q_size + kv_size :].view(T, self.kv_heads, self.head_dim).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        keys[0, :, past:end] = k * cos + rotate_half(k) * sin
        values[0, :, past:end] = v
        attended = F.scaled_dot_product_attention(
            q.unsqueeze(0), keys[:, :, :end], values[:, :, :end], attn_mask=mask, scale=layer.scaling,
            enable_gqa=self.kv_heads != self.heads,
        )
        return attended[0].transpose(0, 1).reshape(T, q_size)

    def _attend_in_one_op(self, layer: _Layer, qkv, cos, sin, keys, values, past: int, mask) -> torch.Tensor:
        """The same in one call of specviz's C++ op (specviz.kernels.extension): cos, sin (T, head_dim); mask None means
        causal."""
        return torch.ops.specviz.attend(qkv, cos, sin, keys, values, past, mask, layer.scaling, self.heads, self.kv_heads)


def _rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """transformers' LlamaRMSNorm / Qwen2RMSNorm: normalise in fp32, cast back, scale (one fused op in fp32)."""
    eps = norm.variance_epsilon
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, eps)
    x32 = x.float()
    return norm.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _q4_rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """The same in the C++ op the 4-bit layer op uses (csrc/q4layer.cpp): fp32 rows, the mean summed in double."""
    return torch.ops.specviz.rms_norm(x, norm.weight, norm.variance_epsilon)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def fused_bytes(decoder) -> int:
    """Bytes the fused copies of q, k, v, gate and up take."""
    return sum(p.numel() * p.element_size()
               for layer in decoder.layers
               for module in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                              layer.mlp.gate_proj, layer.mlp.up_proj)
               for p in module.parameters())


def fits_in_memory(nbytes: int, share: float = 0.25) -> bool:
    """Whether nbytes is at most `share` of the memory available now (True where that cannot be read). A 135M
    model's fused copies (0.3 GB) always fit; a 1.5B model's (5 GB) beside its packed weights may not, and then
    the decoder runs the model's own q, k, v, gate and up products one by one instead."""
    available = _available_memory()
    return available is None or nbytes <= share * available


def _available_memory() -> int | None:
    """MemAvailable on Linux (free memory plus what the page cache would give back), else None."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def unsupported_reason(model) -> str | None:
    """Why `for_model` / `for_eagle` / `for_eagle3` return None for this model or head (None when it is covered)."""
    config = model.config
    device = next(model.parameters()).device
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return f"turned off by {ENV_SWITCH}=0"
    if config.model_type not in ARCHITECTURES:
        return f"architecture {config.model_type!r} (covered: {', '.join(ARCHITECTURES)})"
    if device.type != "cpu":
        return f"device {device.type} (only the CPU path is tested; transformers' forward runs there)"
    rotary = (getattr(model, "rotary_emb", None) or getattr(model, "rotary", None)  # an Eagle3Head's
              or getattr(model.get_decoder(), "rotary_emb", None))
    if rotary is None or not hasattr(rotary, "inv_freq"):
        return "no rotary embedding module with static frequencies"
    if getattr(rotary, "rope_type", "default") not in STATIC_ROPE:
        return f"rotary scaling {rotary.rope_type!r}"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return "sliding-window attention layers"
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "pretraining_tp", 1) != 1:
        return "a non-standard MLP"
    return None


class FastDecoder:
    """hidden = FastDecoder(model)(ids, cache, position_ids, mask): the final-norm hidden states of a Llama-family
    decoder for T new tokens, reading and extending a KVCache. Same contract as the engine's use of
    `model.model(input_ids=…, cache=…, position_ids=…, attention_mask=…)`."""

    def __init__(self, model, fuse: bool | None = None):
        """fuse: concatenate q/k/v and gate/up (one more copy of those weights); None = when memory allows."""
        decoder = model.get_decoder()
        self.fused = fits_in_memory(fused_bytes(decoder)) if fuse is None else fuse
        self.embed = decoder.embed_tokens
        self.norm = decoder.norm
        self.stack = _Layers(decoder.layers, model.config, decoder.rotary_emb, self.fused, model.dtype, model.device)

    def new_cache(self) -> KVCache:
        return self.stack.new_cache()

    @torch.inference_mode()
    def __call__(self, ids: torch.Tensor, cache: KVCache, position_ids: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None, layers: tuple[int, ...] = ()):
        """ids (T,) → hidden (T, H). position_ids (1, T) or None (the next T positions); mask: None (causal) or
        the engine's additive (1, 1, T, past + T) tree mask. layers: decoder layers (each < the model's depth)
        whose inputs come back too, side by side: then → (hidden, (T, len(layers) * H)), from the same pass."""
        if not layers:
            return _rms_norm(self.norm, self.stack(self.embed(ids), cache, position_ids, mask))
        x, inputs = self.stack(self.embed(ids), cache, position_ids, mask, capture=tuple(layers))
        return _rms_norm(self.norm, x), torch.cat(inputs, dim=-1)


class FastEagleHead:
    """An EagleHead (specviz.models.heads) on the same path: fc(cat(embedding, feature)), then its one layer (no input
    norm, no final norm), with its q/k/v and gate/up fused and an in-place KVCache."""

    def __init__(self, head):
        fc = head.fc
        self.fc = fc.projection() if isinstance(fc, quant.Q4Linear) else fastlinear.PackedProjection(fc.weight, fc.bias)
        weight = next(head.parameters())  # an fp32 norm or bias where the products are 4-bit (Q4Linear keeps no weight)
        self.stack = _Layers(head.layers, head.config, head.rotary_emb, True, weight.dtype, weight.device)

    def new_cache(self) -> KVCache:
        return self.stack.new_cache()

    @torch.inference_mode()
    def __call__(self, features: torch.Tensor, embeds: torch.Tensor, position_ids: torch.Tensor, cache: KVCache,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        """features, embeds (T, H), position_ids (1, T) → the predicted next features (T, H)."""
        x = self.fc(torch.cat([embeds, features], dim=-1))
        return self.stack(x, cache, position_ids, mask)


class FastEagle3Head:
    """An Eagle3Head (specviz.models.eagle3) on the same path: fc over the fused target features (skipped for the
    head's own output fed back), then its one layer, whose q/k/v (fused) read [input_norm(embedding) ;
    hidden_norm(x)] and whose residual is x (or hidden_norm(x)); gate/up fused, an in-place KVCache. A 4-bit head's
    layer runs as one call of its own op over up to ONE_OP_MAX_TOKENS new tokens (a drafting step; q4_eagle3_layer:
    q4_layer computes a Llama layer, q/k/v over the residual stream itself), op by op over a prompt."""

    def __init__(self, head):
        fc = head.fc
        self.fc = fc.projection() if isinstance(fc, quant.Q4Linear) else fastlinear.PackedProjection(fc.weight, fc.bias)
        layer = head.layer
        self.stack = _Layers([layer], head.config, head.rotary, True, head.norm.weight.dtype, head.norm.weight.device,
                             layer_op=False)
        self.layer = self.stack.layers[0]
        self.hidden_norm, self.embed_norm = layer.hidden_norm, layer.input_layernorm
        self.norm_before_residual = layer.norm_before_residual
        self.rms_norm = _q4_rms_norm if self.stack.q4_norm and self.layer.blocks else _rms_norm
        # Where every product is 4-bit, only q/k/v has a bias and the norms share one epsilon, the layer as one C++ call
        # (specviz::q4_eagle3_layer: the same ops as below, the same bits) for the few tokens of a drafting step.
        blocks = self.layer.blocks
        self.layer_op = (self.stack.one_op and hasattr(torch.ops.specviz, "q4_eagle3_layer") and blocks is not None
                         and self.hidden_norm.variance_epsilon == blocks[2])

    def new_cache(self) -> KVCache:
        return self.stack.new_cache()

    @torch.inference_mode()
    def __call__(self, features: torch.Tensor, embeds: torch.Tensor, position_ids: torch.Tensor, cache: KVCache,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        """features (T, 3·H) from the target or (T, H) the head's own outputs, embeds (T, H), position_ids (1, T) →
        h (T, H) before the final norm."""
        x = self.fc(features) if features.shape[-1] != embeds.shape[-1] else features
        stack, layer, norm = self.stack, self.layer, self.rms_norm
        past, end = cache.length, cache.length + x.shape[0]
        cos, sin, mask, attend, one_op = stack.prepare(x, cache, position_ids, mask)
        if self.layer_op and one_op:
            _, post_norm, eps, qkv, qkv_bias, o, gate_up, down = layer.blocks
            y = torch.ops.specviz.q4_eagle3_layer(
                x.contiguous(), embeds.contiguous(), self.hidden_norm.weight, self.embed_norm.weight, post_norm, eps,
                self.norm_before_residual, qkv, qkv_bias, o, gate_up, down, cos, sin, cache.keys[0], cache.values[0],
                past, mask, layer.scaling, stack.heads, stack.kv_heads)
            cache.length = end
            return y
        normed = norm(self.hidden_norm, x)
        qkv = layer.qkv(torch.cat([norm(self.embed_norm, embeds), normed], dim=-1))
        y = (normed if self.norm_before_residual else x) + layer.o_proj(
            attend(layer, qkv, cos, sin, cache.keys[0], cache.values[0], past, mask))
        gate_up = layer.gate_up(norm(layer.post_attention_norm, y))
        cache.length = end
        return y + layer.down_proj(F.silu(gate_up[:, : stack.intermediate]) * gate_up[:, stack.intermediate :])


_built: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # module -> (weights signature, fast path)
_built_lock = threading.Lock()


def _signature(module) -> tuple:
    """Identity and version of every weight the fused copies come from: a change means rebuild. (Tensors made
    under inference_mode keep no version counter; for them only a new tensor, dtype or device is seen.)"""
    return tuple((p.data_ptr(), 0 if p.is_inference() else p._version, p.dtype, p.device)
                 for p in module.parameters())


def _cached(module, weights, build):
    if unsupported_reason(module) is not None:
        return None
    signature = _signature(weights)
    with _built_lock:
        held = _built.get(module)
        if held is None or held[0] != signature:
            held = (signature, build(module))
            _built[module] = held
    return held[1]


def for_model(model) -> FastDecoder | None:
    """The FastDecoder of this model (built once and kept while the model lives), or None where not covered.
    A weight replaced, moved, cast or changed in place through autograd-visible ops triggers a rebuild; writes
    through `.data`, to inference tensors, or to the config do not (specviz makes none of them)."""
    return _cached(model, model.get_decoder(), FastDecoder)


def for_eagle(head) -> FastEagleHead | None:
    """The FastEagleHead of this EagleHead (built once, like for_model), or None where not covered."""
    return _cached(head, head, FastEagleHead)


def for_eagle3(head) -> FastEagle3Head | None:
    """The FastEagle3Head of this Eagle3Head (built once, like for_model), or None where not covered."""
    return _cached(head, head, FastEagle3Head)
