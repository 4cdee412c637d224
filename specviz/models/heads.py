"""Draft modules that ride on a frozen target: the EAGLE head, Medusa heads, and the small independent draft.

Conventions (p = target, q = draft). f_t is the target's final hidden state at position t (the normed output of
its last decoder layer, the input of its LM head), so `lm_head(f_t)` gives p(x_{t+1} | x_{<=t}).

* EAGLE head (EAGLE-1/2 layout, SafeAILab/EAGLE `eagle/model/cnets1.py`): at position t it reads f_t and the
  embedding of x_{t+1}, as `fc(cat(embedding, feature))`, then one decoder layer of the target's family whose
  input norm is removed, no final norm, and predicts f_{t+1}. q = softmax(lm_head(prediction)).
* Medusa heads (FasterDecoding/Medusa `medusa/model/medusa_model.py`): head k reads f_t and predicts x_{t+2+k}
  (x_{t+1} comes from the target's own LM head); a head is `n` blocks `x + SiLU(Linear(x))` and a projection.
* Independent draft: a small model of the target's family sharing the target's embedding matrix.

Weights are read from safetensors or from a `torch.save` file opened with `weights_only=True` (never plain pickle).
"""

from __future__ import annotations

import copy
import importlib
import json
import logging
from pathlib import Path

import torch
from torch import nn

from specviz.atomic import save_tensors_atomically, write_atomically
from specviz.errors import SpecvizError

log = logging.getLogger("specviz.models.heads")

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "medusa_lm_head.safetensors", "medusa_lm_head.pt")


# ---------------------------------------------------------------------------------------------- file helpers


def weights_file(path: str | Path) -> Path:
    """`path` itself if it is a file, else the first known weights file inside the folder."""
    path = Path(path)
    if path.is_file():
        return path
    for name in WEIGHT_FILES:
        if (path / name).is_file():
            return path / name
    raise SpecvizError(f"no weights found at {path} (looked for {', '.join(WEIGHT_FILES)})")


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors from safetensors, or from a torch.save file restricted to tensors (`weights_only=True`)."""
    file = weights_file(path)
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(file))
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError for anything that is not plain tensors/containers
        raise SpecvizError(f"{file} is not a plain tensor file (refused to unpickle arbitrary objects): {exc}") from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SpecvizError(f"{file} must hold a flat dict of tensors")
    return state


def write_weights(folder: str | Path, state: dict[str, torch.Tensor], config: dict, dtype: torch.dtype) -> Path:
    """`model.safetensors` (floating tensors cast to `dtype`, integer ones kept) and `config.json`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cast = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in state.items()}
    save_tensors_atomically(cast, folder / "model.safetensors")
    write_atomically(folder / "config.json", json.dumps(config, indent=2) + "\n")
    return folder


def read_config(path: str | Path) -> dict:
    path = Path(path)
    file = (path if path.is_dir() else path.parent) / "config.json"
    return json.loads(file.read_text()) if file.is_file() else {}


def match_state_dict(own: dict[str, torch.Tensor], state: dict[str, torch.Tensor], source: str) -> dict:
    """Keep the keys of `own` (a module's state dict); report dropped ones; raise on missing keys or shapes."""
    dropped = sorted(k for k in state if k not in own)
    missing = sorted(k for k in own if k not in state)
    if missing:
        raise SpecvizError(f"{source}: missing weights {missing[:6]}{' …' if len(missing) > 6 else ''}")
    if dropped:
        log.warning("%s: ignored unexpected weights %s", source, dropped)
    for k, v in own.items():
        if state[k].shape != v.shape:
            raise SpecvizError(f"{source}: {k} has shape {tuple(state[k].shape)}, expected {tuple(v.shape)}")
    return {k: state[k].to(own[k].dtype) for k in own}


# ---------------------------------------------------------------------------------------------- target family


def family_classes(config) -> tuple[type, type]:
    """(DecoderLayer, RotaryEmbedding) classes of the target's model family, found through its model type."""
    name = config.model_type
    try:
        module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        pretrained = next(getattr(module, n) for n in dir(module) if n.endswith("PreTrainedModel") and n[0] != "_")
        layer_name = pretrained._no_split_modules[0]  # e.g. "LlamaDecoderLayer"
        rotary_name = layer_name.replace("DecoderLayer", "RotaryEmbedding")
        return getattr(module, layer_name), getattr(module, rotary_name)
    except (ImportError, StopIteration, AttributeError, IndexError, TypeError) as exc:
        raise SpecvizError(f"no decoder layer/rotary embedding found for model type {name!r}") from exc


def one_layer_config(target_config):
    """A 1-layer copy of the target's config, with an attention implementation that takes 4D float masks."""
    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = 1
    cfg.layer_types = None if getattr(cfg, "layer_types", None) is None else cfg.layer_types[:1]
    cfg._attn_implementation = "sdpa"
    return cfg


def causal_mask(batch: int, new: int, cached: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive mask where new position i (absolute cached+i) sees keys 0..cached+i. (B, 1, T, S)"""
    q = torch.arange(new, device=device)[:, None] + cached  # (T, 1)
    k = torch.arange(cached + new, device=device)[None, :]  # (1, S)
    mask = torch.zeros(new, cached + new, dtype=dtype, device=device)
    mask.masked_fill_(k > q, float("-inf"))
    return mask[None, None].expand(batch, 1, new, cached + new)


# ---------------------------------------------------------------------------------------------- EAGLE


class EagleHead(nn.Module):
    """fc(cat(emb(x_{t+1}), f_t)) -> one decoder layer (no input norm, no final norm) -> predicted f_{t+1}."""

    def __init__(self, target_config, fc_bias: bool = True):
        super().__init__()
        cfg = one_layer_config(target_config)
        layer_cls, rotary_cls = family_classes(cfg)
        hidden = cfg.hidden_size
        self.config = cfg
        self.fc = nn.Linear(2 * hidden, hidden, bias=fc_bias)  # some published heads were trained without bias
        layer = layer_cls(cfg, layer_idx=0)
        layer.input_layernorm = nn.Identity()  # the reference's first (only) layer has no input norm
        self.layers = nn.ModuleList([layer])
        self.rotary_emb = rotary_cls(config=cfg)
        self.register_buffer("draft_vocab", None, persistent=False)  # (Vd,) int64 or None = full vocabulary

    def forward(self, features, input_embeds, position_ids, past_key_values=None, attention_mask=None):
        """features, input_embeds: (B, T, H); position_ids: (B, T); attention_mask: None or (B, 1, T, S) additive.

        Returns the predicted next features (B, T, H). `past_key_values` (a DynamicCache) is updated in place.
        """
        x = self.fc(torch.cat([input_embeds, features], dim=-1))  # (B, T, H); order as in the reference
        batch, new = x.shape[:2]
        cached = past_key_values.get_seq_length() if past_key_values is not None else 0
        if attention_mask is None and cached > 0 and new > 1:
            # sdpa's is_causal aligns to the top-left corner, which is wrong once a cache holds earlier keys
            attention_mask = causal_mask(batch, new, cached, x.dtype, x.device)
        elif attention_mask is not None:
            attention_mask = attention_mask.to(x.dtype)
        cos_sin = self.rotary_emb(x, position_ids)
        return self.layers[0](
            x, attention_mask=attention_mask, position_ids=position_ids, cache=past_key_values,
            use_cache=past_key_values is not None, position_embeddings=cos_sin,
        )  # (B, T, H)

    @classmethod
    def load(cls, path, target_config) -> "EagleHead":
        """Our safetensors folder, or a published EAGLE-1/2 `pytorch_model.bin` (its `embed_tokens` is dropped)."""
        state = read_state_dict(path)
        draft_vocab = state.pop("draft_vocab", None)
        head = cls(target_config, fc_bias="fc.bias" in state)
        head.load_state_dict(match_state_dict(head.state_dict(), state, str(path)))
        if draft_vocab is not None:
            head.draft_vocab = draft_vocab.long()
        return head.eval()

    def save(self, path, config_extra: dict, dtype: torch.dtype = torch.float16) -> Path:
        state = dict(self.state_dict())
        if self.draft_vocab is not None:
            state["draft_vocab"] = self.draft_vocab
        config = {"kind": "eagle", "layout": "eagle-1/2 (cnets1.py)", "hidden_size": self.config.hidden_size,
                  "model_type": self.config.model_type, "dtype": str(dtype).removeprefix("torch."), **config_extra}
        return write_weights(path, state, config, dtype)


# ---------------------------------------------------------------------------------------------- Medusa


class ResBlock(nn.Module):
    """x + SiLU(Linear(x)). Zero weight and bias start it as the exact identity (the reference zeroes only the
    weight, leaving x + SiLU(bias))."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x):
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    """K heads over f_t; head k predicts x_{t+2+k}. `heads[k]` is Sequential(ResBlock × n[, Linear(H, V)]).

    With `own_projection=False` (what we ship) every head reuses the target's frozen LM head, so the state dict
    holds only `k.j.linear.{weight,bias}`; the published layout adds `k.n.weight` (H -> V) per head.
    """

    def __init__(self, target_config, num_heads: int = 4, num_layers: int = 1, own_projection: bool = False):
        super().__init__()
        hidden, vocab = target_config.hidden_size, target_config.vocab_size
        self.num_heads, self.num_layers, self.own_projection = num_heads, num_layers, own_projection
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden) for _ in range(num_layers)],
                          *([nn.Linear(hidden, vocab, bias=False)] if own_projection else []))
            for _ in range(num_heads)
        )
        self.register_buffer("draft_vocab", None, persistent=False)  # (Vd,) int64 or None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (B, T, H) target final hidden states -> (B, T, K, H) per-head hidden outputs."""
        return torch.stack([head[: self.num_layers](hidden) for head in self.heads], dim=2)

    def logits(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor, vocab: torch.Tensor | None = None):
        """hidden: (B, T, K, H) from forward; lm_head_weight: (V, H); vocab: (Vd,) ids or None -> (B, T, K, V')."""
        out = []
        for k, head in enumerate(self.heads):
            weight = head[self.num_layers].weight if self.own_projection else lm_head_weight  # (V, H)
            if vocab is not None:
                weight = weight[vocab]
            out.append(hidden[:, :, k] @ weight.T)  # (B, T, V')
        return torch.stack(out, dim=2)

    def state_dict_for_layout(self) -> dict[str, torch.Tensor]:
        """Keys as the reference's `medusa_head` ModuleList: `k.j.linear.weight`, `k.n.weight`."""
        return {k.removeprefix("heads."): v for k, v in self.state_dict().items()}

    @classmethod
    def load(cls, path, target_config) -> "MedusaHeads":
        """Our folder (shared LM head) or a published `medusa_lm_head.pt`/safetensors (own projections)."""
        state = read_state_dict(path)
        draft_vocab = state.pop("draft_vocab", None)
        num_heads, num_layers, own = medusa_layout(state, str(path))
        heads = cls(target_config, num_heads, num_layers, own)
        state = {f"heads.{k}": v for k, v in state.items()}
        heads.load_state_dict(match_state_dict(heads.state_dict(), state, str(path)))
        if draft_vocab is not None:
            heads.draft_vocab = draft_vocab.long()
        return heads.eval()

    def save(self, path, config_extra: dict, dtype: torch.dtype = torch.float16) -> Path:
        state = self.state_dict_for_layout()
        if self.draft_vocab is not None:
            state["draft_vocab"] = self.draft_vocab
        config = {"kind": "medusa", "medusa_num_heads": self.num_heads, "medusa_num_layers": self.num_layers,
                  "own_projection": self.own_projection, "predicts": "head k at position t predicts x_{t+2+k}",
                  "dtype": str(dtype).removeprefix("torch."), **config_extra}
        return write_weights(path, state, config, dtype)


def medusa_layout(state: dict[str, torch.Tensor], source: str) -> tuple[int, int, bool]:
    """(num_heads, num_layers, own_projection) read off the keys `k.j.linear.weight` / `k.n.weight`."""
    try:
        heads = {int(k.split(".")[0]) for k in state}
        layers = {int(k.split(".")[1]) for k in state if k.startswith("0.") and ".linear." in k}
    except ValueError as exc:
        raise SpecvizError(f"{source}: not a Medusa state dict (keys like '0.0.linear.weight' expected)") from exc
    if not heads or heads != set(range(len(heads))) or layers != set(range(len(layers))):
        raise SpecvizError(f"{source}: not a Medusa state dict (keys like '0.0.linear.weight' expected)")
    own = f"0.{len(layers)}.weight" in state
    return len(heads), len(layers), own


# ---------------------------------------------------------------------------------------------- small draft


def build_draft_model(target, assets_dir, dtype: torch.dtype | None = None):
    """The small independent draft as a standard `*ForCausalLM` sharing the target's embedding and LM head.

    dtype (default: the target's): another dtype gives the draft its own copy of them in that dtype instead
    (specviz.models.draft_dtype runs the draft in bf16 where the CPU multiplies bf16 in hardware).

    `assets_dir` holds `config.json` (the draft's transformers config) and `model.safetensors` with only the
    draft's own weights (`model.layers.*`, `model.norm.weight`).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    assets_dir = Path(assets_dir)
    cfg = AutoConfig.from_pretrained(str(assets_dir))
    embedding = target.get_input_embeddings()
    if cfg.vocab_size != embedding.weight.shape[0] or cfg.hidden_size != embedding.weight.shape[1]:
        raise SpecvizError(f"draft at {assets_dir} does not fit this target's embedding {tuple(embedding.weight.shape)}")
    draft = AutoModelForCausalLM.from_config(cfg, dtype=embedding.weight.dtype)
    state = read_state_dict(assets_dir)
    own = {k: v for k, v in draft.state_dict().items() if "embed_tokens" not in k and not k.startswith("lm_head")}
    draft.load_state_dict(match_state_dict(own, state, str(assets_dir)), strict=False)
    if dtype is not None and dtype != embedding.weight.dtype:
        from specviz.models.device import cast_parameters

        cast_parameters(draft, dtype)  # its own weights only (the shared ones are not attached yet); fp32 rotary
    share_embedding(draft, target, dtype)
    draft.draft_vocab = None  # (Vd,) by falling frequency, when the folder has one: what the drafter may propose
    if (assets_dir / DRAFT_VOCAB_FILE).is_file():
        from safetensors.torch import load_file

        draft.draft_vocab = load_file(str(assets_dir / DRAFT_VOCAB_FILE))["draft_vocab"].long()
    return draft.eval().requires_grad_(False)


def share_embedding(draft, target, dtype: torch.dtype | None = None) -> None:
    """Point the draft's input embedding and output head at the target's (one matrix when the target ties them).
    With a dtype other than the target's they get frozen copies in that dtype (still one when tied)."""
    embedding, head = target.get_input_embeddings(), target.get_output_embeddings().weight
    if dtype is not None and dtype != embedding.weight.dtype:
        copies = {}  # original tensor -> its copy, so tied matrices stay tied

        def copy(weight):
            if id(weight) not in copies:
                copies[id(weight)] = nn.Parameter(weight.detach().to(dtype), requires_grad=False)
            return copies[id(weight)]

        embedding = nn.Embedding.from_pretrained(copy(embedding.weight), freeze=True, padding_idx=embedding.padding_idx)
        embedding.weight = copy(target.get_input_embeddings().weight)
        head = copy(head)
    draft.set_input_embeddings(embedding)
    draft.get_output_embeddings().weight = head


def draft_config(target_config, num_layers: int):
    """The draft's config: the target's, with fewer layers."""
    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = num_layers
    cfg.layer_types = None if getattr(cfg, "layer_types", None) is None else cfg.layer_types[:num_layers]
    return cfg


DRAFT_VOCAB_FILE = "draft_vocab.safetensors"


def save_draft_model(draft, path, config_extra: dict, dtype: torch.dtype = torch.float16,
                     draft_vocab: torch.Tensor | None = None) -> Path:
    """Only the draft's own weights (no embedding), and its transformers config with our notes in `specviz`;
    beside them, optionally, the ids it may draft (frequency order) in DRAFT_VOCAB_FILE."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v for k, v in draft.state_dict().items() if "embed_tokens" not in k and not k.startswith("lm_head")}
    config = json.loads(draft.config.to_json_string())  # what save_pretrained would write
    config["dtype"] = str(dtype).removeprefix("torch.")
    config["specviz"] = {"kind": "draft", "shares_target_embedding": True, **config_extra}
    save_tensors_atomically({k: v.to(dtype).contiguous() for k, v in state.items()}, path / "model.safetensors")
    write_atomically(path / "config.json", json.dumps(config, indent=2) + "\n")
    if draft_vocab is not None:
        save_tensors_atomically({"draft_vocab": draft_vocab.to(torch.int64).contiguous()}, path / DRAFT_VOCAB_FILE)
    return path
