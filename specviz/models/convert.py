"""GGUF -> safetensors: dequantize a fetched checkpoint once into a folder `from_pretrained` loads."""
from __future__ import annotations

from pathlib import Path

import torch

from specviz.errors import SpecvizError


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF checkpoint to fp32 and save it as config.json + model.safetensors + tokenizer files.

    `save_pretrained` refuses a model loaded from GGUF (it counts as quantized), so the state dict is saved
    directly, without `lm_head.weight` when it is tied to the embedding (from_pretrained ties it back).
    """
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.contiguous() for name, tensor in state.items()},
              str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def convert_or_explain(gguf_path: Path, out_dir: Path) -> None:
    """convert_gguf, with whatever transformers raises turned into a message that names the step."""
    try:
        convert_gguf(gguf_path, out_dir)
    except (SpecvizError, OSError):
        raise
    except Exception as err:  # transformers raises many kinds (ValueError, KeyError, …) for unsupported files
        raise SpecvizError(f"could not convert {gguf_path.name} to safetensors: {err}") from err
