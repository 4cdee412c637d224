"""Our drafters as GGUF files that an unmodified llama-server loads beside the target's own GGUF.

    specviz export llamacpp --out DIR [--model smollm2-135m] [--assets DIR] [--dtype f32]

writes three files:
* DIR/target.gguf: the preset's GGUF (hard-linked, or copied), the file specviz's 4-bit weights come from;
* DIR/eagle3.gguf: the EAGLE-3 head, for
  `llama-server -m DIR/target.gguf -md DIR/eagle3.gguf --spec-type draft-eagle3`;
* DIR/draft.gguf: the independent draft, for `llama-server -m DIR/target.gguf -md DIR/draft.gguf --spec-type draft-simple`.

The layout is what llama.cpp (build 11434: src/llama-arch.cpp, src/models/eagle3.cpp, src/llama-model.cpp) reads:
* eagle3.gguf has the architecture `eagle3`: the usual `eagle3.*` sizes of its one decoder layer (its own rope
  base: the head was trained with 10,000, the target uses 100,000), `eagle3.target_layers` (the three target
  layers whose inputs the head fuses), `eagle3.target_hidden_size`, `eagle3.norm_before_residual`. Tensors:
  `fc.weight`, `blk.0.attn_norm` (the norm of the token embedding), `blk.0.attn_norm_2` (the norm of the feature),
  the layer's `attn_q/k/v/output` and `ffn_norm/gate/up/down`, `output_norm`, `output.weight` and `d2t`.
  `output.weight` is the target's LM head rows at the draft ids, which the shipped head reuses and does not store:
  without it llama.cpp multiplies by the target's whole LM head and then aborts, as its logits are not the size of
  `d2t`. `d2t` holds absolute target ids (int64; draft logit i goes to target token d2t[i]), where the shipped head
  stores offsets (i + d2t[i]). No `token_embd`: llama.cpp takes the target's, as specviz does; no `t2d`: llama.cpp
  reads none, and refuses a file with tensors it did not ask for.
* draft.gguf is a plain `llama`: the draft's layers and final norm, and the target's embedding as `token_embd`
  (the shipped draft shares it and does not store it), which is its LM head too (tied, as the target's). It drafts
  over the whole vocabulary, as llama.cpp drafts; specviz's default draws from its trained 16,384 tokens
  (`draft:draft_vocab=full` drafts as llama.cpp does).
* Both carry the target's vocabulary (every `tokenizer.*` key copied from the target's GGUF): llama.cpp checks that
  a draft's vocabulary matches the target's, and sizes the EAGLE-3 head's scattered logits by its own.
* q and k rows are reordered for llama.cpp's rotary layout (it rotates adjacent pairs, transformers the two halves
  of each head), as llama.cpp's converter does for every Llama model.

Tensors are written in f32 by default: f32 holds the shipped fp16 weights and the target's embedding (8-bit blocks
in its GGUF, widened) exactly, and llama.cpp multiplies f32 weights by f32 activations, as specviz runs these
drafters with SPECVIZ_DRAFT_DTYPE=float32, so the two engines differ only in summation order. `--dtype f16` halves
the files (the head's own weights stay exact; the embedding rows round, and llama.cpp rounds activations to f16 for
f16 products). Norms are always f32 (ggml multiplies by them in f32). Each file is written whole or not at all.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from specviz.atomic import replacing
from specviz.errors import SpecvizError
from specviz.paths import ASSETS

DTYPES = {"f32": np.float32, "f16": np.float16}
FILE_TYPES = {"f32": 0, "f16": 1}  # general.file_type: llama.cpp's LLAMA_FTYPE_ALL_F32, LLAMA_FTYPE_MOSTLY_F16
# a Llama decoder layer's tensors: transformers' name -> llama.cpp's (blk.N.<name>.weight)
LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
EAGLE3_LAYER = {**LAYER, "hidden_norm": "attn_norm_2"}  # the head's norm of the feature (input_layernorm: of the embedding)


@dataclass
class TargetGGUF:
    """What the exports take from the target's GGUF."""

    path: Path
    arch: str  # general.architecture, e.g. "llama"
    layers: int
    hidden: int
    tokenizer: dict[str, tuple[Any, Any, Any]]  # every tokenizer.* key: name -> (value, type, element type)
    embedding: np.ndarray  # (V, H) float32, the token embedding widened from its blocks
    lm_head: np.ndarray | None  # (V, H) float32 `output.weight`; None: tied to the embedding

    @property
    def vocab(self) -> int:
        return int(self.embedding.shape[0])

    @property
    def head(self) -> np.ndarray:
        """(V, H) the LM head: its own, or the embedding when tied."""
        return self.embedding if self.lm_head is None else self.lm_head


def field_value(field) -> tuple[Any, Any, Any]:
    """(value, type, element type) of a GGUFReader field, strings kept as their bytes (copied unchanged)."""
    from gguf import GGUFValueType

    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        sub = field.types[-1]
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]) for i in field.data], kind, sub
        return field.contents(), kind, sub
    if kind == GGUFValueType.STRING:
        return bytes(field.parts[-1]), kind, None
    return field.contents(), kind, None


def read_target(path: str | os.PathLike) -> TargetGGUF:
    """The target's sizes, vocabulary and embedding (and LM head when it has its own) from its GGUF."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    path = Path(path)
    reader = GGUFReader(path)
    fields = reader.fields
    arch = fields["general.architecture"].contents()
    if arch != "llama":
        raise SpecvizError(f"{path}: a '{arch}' GGUF; this export writes drafters for Llama-family targets")
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors or "tokenizer.ggml.tokens" not in fields:
        raise SpecvizError(f"{path}: no token_embd.weight or no tokenizer.ggml.tokens: not a complete model GGUF")

    def widened(name: str) -> np.ndarray:
        tensor = tensors[name]
        return np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)

    return TargetGGUF(
        path=path, arch=arch, layers=int(fields[f"{arch}.block_count"].contents()),
        hidden=int(fields[f"{arch}.embedding_length"].contents()),
        tokenizer={name: field_value(f) for name, f in fields.items() if name.startswith("tokenizer.")},
        embedding=widened("token_embd.weight"),
        lm_head=widened("output.weight") if "output.weight" in tensors else None)


def rope_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """q or k rows (heads·d, …) reordered from transformers' rotary layout (each head's first half rotates with its
    second) to llama.cpp's (adjacent pairs): within a head, rows (2, d/2) are read as (d/2, 2).
    specviz.models.quantized.unpermuted_rows undoes it."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def layer_tensors(state: dict[str, torch.Tensor], prefix: str, block: int, names: dict[str, str], heads: int,
                  kv_heads: int) -> dict[str, torch.Tensor]:
    """One decoder layer's weights (`prefix` + transformers' names) under llama.cpp's names (blk.<block>.…), q and k
    in llama.cpp's rotary layout."""
    out = {}
    for ours, theirs in names.items():
        weight = state[f"{prefix}{ours}.weight"]
        if ours == "self_attn.q_proj":
            weight = rope_rows(weight, heads)
        elif ours == "self_attn.k_proj":
            weight = rope_rows(weight, kv_heads)
        out[f"blk.{block}.{theirs}.weight"] = weight
    return out


def rope_theta(config: dict) -> float:
    """The rotary base of a transformers config (`rope_parameters` or the older `rope_theta`); plain rotary only."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise SpecvizError(f"rope type {kind!r}: this export writes plain rotary positions only")
    return float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))


def llama_sizes(arch: str, config: dict, layers: int, vocab: int) -> dict[str, tuple[Any, str]]:
    """The `<arch>.*` sizes llama.cpp reads for a Llama-shaped stack of `layers` layers: key -> (value, type name)."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return {f"{arch}.context_length": (config["max_position_embeddings"], "UINT32"),
            f"{arch}.embedding_length": (config["hidden_size"], "UINT32"),
            f"{arch}.block_count": (layers, "UINT32"),
            f"{arch}.feed_forward_length": (config["intermediate_size"], "UINT32"),
            f"{arch}.attention.head_count": (heads, "UINT32"),
            f"{arch}.attention.head_count_kv": (config.get("num_key_value_heads") or heads, "UINT32"),
            f"{arch}.attention.layer_norm_rms_epsilon": (float(config["rms_norm_eps"]), "FLOAT32"),
            f"{arch}.rope.freq_base": (rope_theta(config), "FLOAT32"),
            f"{arch}.rope.dimension_count": (head_dim, "UINT32"),
            f"{arch}.vocab_size": (vocab, "UINT32")}


# ---------------------------------------------------------------------------------------------- the two drafters


def eagle3_gguf(assets_dir: Path, target: TargetGGUF) -> tuple[str, dict, dict[str, torch.Tensor]]:
    """(arch, keys, tensors) of the EAGLE-3 head in `assets_dir`; its checks are Eagle3Head.load's."""
    from specviz.models.eagle3 import Eagle3Head

    sizes = SimpleNamespace(num_hidden_layers=target.layers, hidden_size=target.hidden, vocab_size=target.vocab)
    head = Eagle3Head.load(assets_dir, sizes)
    if len(head.aux_layers) != 3:
        raise SpecvizError(f"{assets_dir}: llama.cpp's EAGLE-3 fuses exactly 3 target layers; this head fuses {head.aux_layers}")
    config = head.config.to_dict()
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise SpecvizError(f"{assets_dir}: llama.cpp's EAGLE-3 layer has no biases; this head has some")
    state = {k: v.detach().float() for k, v in head.state_dict().items()}
    ids = head.draft_ids()  # (Vd,) the target token of each draft id
    lm_head = state["lm_head.weight"] if head.lm_head is not None else torch.from_numpy(target.head)[ids]
    tensors = {"fc.weight": state["fc.weight"],
               **layer_tensors(state, "layer.", 0, EAGLE3_LAYER, config["num_attention_heads"],
                               config.get("num_key_value_heads") or config["num_attention_heads"]),
               "output_norm.weight": state["norm.weight"], "output.weight": lm_head, "d2t": ids.to(torch.int64)}
    keys = {**llama_sizes("eagle3", config, 1, target.vocab),
            "eagle3.target_layers": (list(head.aux_layers), "INT32 ARRAY"),
            "eagle3.target_hidden_size": (head.target_hidden_size, "UINT32"),
            "eagle3.norm_before_residual": (bool(head.layer.norm_before_residual), "BOOL")}
    return "eagle3", keys, tensors


def draft_gguf(assets_dir: Path, target: TargetGGUF) -> tuple[str, dict, dict[str, torch.Tensor]]:
    """(arch, keys, tensors) of the independent draft in `assets_dir` (its own layers and norm; the target's
    embedding added as token_embd, and its LM head as output where the target does not tie them)."""
    from specviz.models.heads import read_config, read_state_dict

    config = read_config(assets_dir)
    if not config.get("specviz", {}).get("shares_target_embedding", False):
        raise SpecvizError(f"{assets_dir}: not a draft that shares the target's embedding")
    if config.get("model_type") != "llama":
        raise SpecvizError(f"{assets_dir}: a '{config.get('model_type')}' draft; this export writes Llama drafts")
    if (config["vocab_size"], config["hidden_size"]) != target.embedding.shape:
        raise SpecvizError(f"{assets_dir}: the draft is {config['vocab_size']} x {config['hidden_size']}, the "
                           f"target's embedding {target.embedding.shape}")
    layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    state = {k: v.float() for k, v in read_state_dict(assets_dir).items()}
    check_draft_state(state, config, str(assets_dir))
    tensors = {"token_embd.weight": torch.from_numpy(target.embedding)}
    for i in range(layers):
        tensors.update(layer_tensors(state, f"model.layers.{i}.", i, LAYER, heads, kv_heads))
    tensors["output_norm.weight"] = state["model.norm.weight"]
    if target.lm_head is not None:  # an untied target: the draft shares its LM head too
        tensors["output.weight"] = torch.from_numpy(target.lm_head)
    return "llama", llama_sizes("llama", config, layers, target.vocab), tensors


def check_draft_state(state: dict[str, torch.Tensor], config: dict, source: str) -> None:
    """The draft's own weights are exactly a Llama stack's (the names and shapes the config gives, nothing else)."""
    hidden, inner, heads = config["hidden_size"], config["intermediate_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = (config.get("num_key_value_heads") or heads) * head_dim
    shapes = {"input_layernorm": (hidden,), "post_attention_layernorm": (hidden,),
              "self_attn.q_proj": (heads * head_dim, hidden), "self_attn.k_proj": (kv, hidden),
              "self_attn.v_proj": (kv, hidden), "self_attn.o_proj": (hidden, heads * head_dim),
              "mlp.gate_proj": (inner, hidden), "mlp.up_proj": (inner, hidden), "mlp.down_proj": (hidden, inner)}
    expected = {f"model.layers.{i}.{name}.weight": shape for i in range(config["num_hidden_layers"])
                for name, shape in shapes.items()}
    expected["model.norm.weight"] = (hidden,)
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or extra:
        raise SpecvizError(f"{source}: not the weights of a {config['num_hidden_layers']}-layer Llama draft "
                           f"(missing {missing[:4]}, unexpected {extra[:4]})")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise SpecvizError(f"{source}: {name} has shape {tuple(state[name].shape)}, expected {shape}")


# ---------------------------------------------------------------------------------------------- writing


def write_gguf(path: Path, arch: str, name: str, keys: dict, tensors: dict[str, torch.Tensor],
               tokenizer: dict, dtype: str = "f32") -> Path:
    """One GGUF file, written whole or not at all: `keys` (key -> (value, "UINT32" | "FLOAT32" | "BOOL" |
    "INT32 ARRAY")), the target's tokenizer keys, and the tensors: 1-D floats (norms) in f32, other floats in
    `dtype`, integers as they are (d2t: int64)."""
    from gguf import GGUFValueType, GGUFWriter

    if dtype not in DTYPES:
        raise SpecvizError(f"unknown GGUF dtype {dtype!r}: use {' or '.join(DTYPES)}")
    with replacing(path) as temp:
        writer = GGUFWriter(temp, arch)  # writes general.architecture
        writer.add_name(name)
        writer.add_file_type(FILE_TYPES[dtype])
        for key, (value, kind) in keys.items():
            if kind.endswith(" ARRAY"):
                writer.add_key_value(key, value, GGUFValueType.ARRAY, GGUFValueType[kind.split()[0]])
            else:
                writer.add_key_value(key, value, GGUFValueType[kind])
        for key, (value, kind, sub) in tokenizer.items():
            writer.add_key_value(key, value, kind, sub)
        for tensor_name, tensor in tensors.items():
            array = tensor.detach().cpu().contiguous().numpy()
            if array.dtype.kind == "f":
                array = array.astype(np.float32 if array.ndim == 1 else DTYPES[dtype])
            writer.add_tensor(tensor_name, array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return path


def export_eagle3(assets_dir: Path, target: TargetGGUF, out: Path, dtype: str = "f32") -> Path:
    arch, keys, tensors = eagle3_gguf(Path(assets_dir), target)
    return write_gguf(out, arch, f"EAGLE-3 head ({Path(assets_dir).name})", keys, tensors, target.tokenizer, dtype)


def export_draft(assets_dir: Path, target: TargetGGUF, out: Path, dtype: str = "f32") -> Path:
    arch, keys, tensors = draft_gguf(Path(assets_dir), target)
    return write_gguf(out, arch, f"draft model ({Path(assets_dir).name})", keys, tensors, target.tokenizer, dtype)


def target_gguf(model: str) -> Path:
    """The preset's GGUF, fetched if missing (the model must be fetched)."""
    from specviz.models.presets import PRESETS
    from specviz.models.quantized import fetch_gguf

    if model not in PRESETS:
        raise SpecvizError(f"unknown preset {model!r}: the llama.cpp export takes one of {', '.join(PRESETS)}")
    source = PRESETS[model].target
    if not source.gguf_name.endswith(".gguf"):
        raise SpecvizError(f"{model}: its target is not a GGUF")
    return fetch_gguf(source)


def export_all(out: str | os.PathLike, model: str = "smollm2-135m", assets: str | os.PathLike = ASSETS,
               dtype: str = "f32") -> dict[str, Path]:
    """DIR/target.gguf and the drafters shipped for `model` (see the module's docstring); returns {"target",
    "eagle3", "draft": path} for the files written."""
    from specviz.train.export_vllm import link_or_copy

    if dtype not in DTYPES:
        raise SpecvizError(f"unknown GGUF dtype {dtype!r}: use {' or '.join(DTYPES)}")
    out, assets = Path(out).resolve(), Path(assets)
    source = target_gguf(model)
    target = read_target(source)
    out.mkdir(parents=True, exist_ok=True)
    files = {"target": out / "target.gguf"}
    link_or_copy(source, files["target"])
    if (assets / f"eagle3-{model}" / "model.safetensors").is_file():
        files["eagle3"] = export_eagle3(assets / f"eagle3-{model}", target, out / "eagle3.gguf", dtype)
    if (assets / f"draft-{model}" / "model.safetensors").is_file():
        files["draft"] = export_draft(assets / f"draft-{model}", target, out / "draft.gguf", dtype)
    return files


SPEC_TYPES = {"eagle3": "draft-eagle3", "draft": "draft-simple"}  # file -> the llama-server --spec-type it goes with


def server_commands(files: dict[str, Path]) -> list[str]:
    """The llama-server command line for each exported drafter."""
    return [f"llama-server -m {files['target']} -md {files[kind]} --spec-type {spec}"
            for kind, spec in SPEC_TYPES.items() if kind in files]
