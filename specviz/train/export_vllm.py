"""Export a target and its shipped drafters in the layouts vLLM loads.

    python -m specviz.train.export_vllm --out DIR [--model smollm2-135m] [--assets assets] [--tokens 3]

writes three folders:
* DIR/target: the converted target as vLLM resolves it (`architectures: ["LlamaForCausalLM"]`; the cache's
  config says `LlamaModel`, which vLLM takes for a bare model without an LM head), weights hard-linked (or copied)
  from the cache, its tokenizer and chat template beside them.
* DIR/draft: the independent draft as a plain transformers folder, for `{"method": "draft_model",
  "model": "DIR/draft"}`: its own layers plus the target's embedding, which the shipped draft shares and does not
  store (tied, so it is the LM head too). vLLM drafts over the full vocabulary; specviz over the draft's own
  (draft_vocab.safetensors, not exported).
* DIR/eagle3: the EAGLE-3 head in the speculators layout vLLM 0.32 reads (its `SpeculatorsConfig` and
  `Eagle3LlamaForCausalLM`): `speculators_config` with one greedy proposal method of `--tokens` tokens and the
  verifier DIR/target, `transformer_layer_config` for the head's one decoder layer (`num_hidden_layers: 1`: vLLM
  builds that many layers), and in the weights `lm_head.weight`, the target's LM head rows at the draft ids
  (which the shipped head reuses and does not store), beside `d2t` (draft id i is target token i + d2t[i]) and
  `t2d`. vLLM shares the target's embedding with it, as specviz does.

`vllm serve DIR/eagle3` then serves the target with the head (the verifier is an absolute path); so does
`LLM(model="DIR/target", speculative_config={"method": "eagle3", "model": "DIR/eagle3",
"num_speculative_tokens": 3})`.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import torch

from specviz.atomic import save_tensors_atomically, write_atomically
from specviz.errors import SpecvizError
from specviz.models.heads import read_config, read_state_dict
from specviz.paths import ASSETS

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                   "generation_config.json")
CAUSAL_LM = ["LlamaForCausalLM"]


def export_all(out: str | os.PathLike, model: str = "smollm2-135m", assets: str | os.PathLike = ASSETS,
               tokens: int = 3) -> dict[str, Path]:
    """The three folders under `out` (see the module's docstring); returns {"target", "draft", "eagle3": path}."""
    from specviz.models.loading import locate

    out, assets = Path(out).resolve(), Path(assets)
    source = Path(locate(model))
    target = export_target(source, out / "target")
    folders = {"target": target}
    if (assets / f"draft-{model}" / "model.safetensors").is_file():
        folders["draft"] = export_draft(assets / f"draft-{model}", target, out / "draft")
    if (assets / f"eagle3-{model}" / "model.safetensors").is_file():
        folders["eagle3"] = export_eagle3(assets / f"eagle3-{model}", target, out / "eagle3", tokens)
    return folders


def export_target(source: Path, out: Path) -> Path:
    """The cached target with a causal-LM architecture; its weights linked, not rewritten."""
    config = read_config(source)
    if config.get("model_type") != "llama":
        raise SpecvizError(f"{source}: a '{config.get('model_type')}' model; this export knows Llama-family targets")
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "config.json", json.dumps({**config, "architectures": CAUSAL_LM}, indent=2) + "\n")
    link_or_copy(source / "model.safetensors", out / "model.safetensors")
    copy_tokenizer(source, out)
    return out


def export_draft(assets_dir: Path, target: Path, out: Path) -> Path:
    """The shipped draft's layers and norm, with the target's embedding added (in the target's dtype, as specviz
    runs it), as a standalone LlamaForCausalLM with tied embeddings."""
    config = read_config(assets_dir)
    notes = config.pop("specviz", {})
    if not notes.get("shares_target_embedding", False):
        raise SpecvizError(f"{assets_dir}: not a draft that shares the target's embedding")
    if not config.get("tie_word_embeddings", False):
        raise SpecvizError(f"{assets_dir}: the draft's LM head is not its embedding; this export adds only the embedding")
    state = read_state_dict(assets_dir)
    embedding = target_embedding(target)
    if embedding.shape != (config["vocab_size"], config["hidden_size"]):
        raise SpecvizError(f"{assets_dir}: the draft is {config['vocab_size']} x {config['hidden_size']}, the target's "
                           f"embedding {tuple(embedding.shape)}")
    state["model.embed_tokens.weight"] = embedding
    out.mkdir(parents=True, exist_ok=True)
    save_tensors_atomically({k: v.contiguous() for k, v in state.items()}, out / "model.safetensors")
    config = {**config, "architectures": CAUSAL_LM, "dtype": str(embedding.dtype).removeprefix("torch.")}
    write_atomically(out / "config.json", json.dumps(config, indent=2) + "\n")
    copy_tokenizer(target, out)
    return out


def export_eagle3(assets_dir: Path, target: Path, out: Path, tokens: int = 3) -> Path:
    """The shipped EAGLE-3 head (speculators names already) with what vLLM needs added: the speculators_config,
    a one-layer transformer_layer_config, and lm_head.weight."""
    config = read_config(assets_dir)
    if config.get("speculators_model_type") != "eagle3":
        raise SpecvizError(f"{assets_dir}: not an EAGLE-3 head in the speculators layout")
    if tokens < 1:
        raise SpecvizError(f"--tokens must be >= 1, got {tokens}")
    state = read_state_dict(assets_dir)
    layers = sorted({int(k.split(".")[1]) for k in state if k.startswith("layers.")})
    if layers != [0]:
        raise SpecvizError(f"{assets_dir}: vLLM's EAGLE-3 reads one decoder layer; the head has layers {layers}")
    d2t = state["d2t"]  # (Vd,) int64 offsets: draft id i is target token i + d2t[i]
    ids = torch.arange(len(d2t)) + d2t
    if "lm_head.weight" not in state:  # the shipped head reuses the target's LM head rows at its draft ids
        state["lm_head.weight"] = target_lm_head(target)[ids].to(torch.float32)
    layer = {**config["transformer_layer_config"], "num_hidden_layers": len(layers)}
    config = {**config, "transformer_layer_config": layer, "speculators_config": speculators_config(target, tokens)}
    out.mkdir(parents=True, exist_ok=True)
    save_tensors_atomically({k: v.contiguous() for k, v in state.items()}, out / "model.safetensors")
    write_atomically(out / "config.json", json.dumps(config, indent=2) + "\n")
    return out


def speculators_config(target: Path, tokens: int) -> dict:
    """What vLLM's SpeculatorsConfig validates: one proposal method with its token count, and the verifier."""
    return {"algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": tokens, "verifier_accept_k": 1,
                                  "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": str(target.resolve()), "architectures": CAUSAL_LM}}


def target_embedding(target: Path) -> torch.Tensor:
    """(V, H) the target's input embedding, in its stored dtype."""
    from safetensors import safe_open

    with safe_open(str(target / "model.safetensors"), "pt") as f:
        return f.get_tensor("model.embed_tokens.weight")


def target_lm_head(target: Path) -> torch.Tensor:
    """(V, H) the target's LM head: its own, or the embedding when tied."""
    from safetensors import safe_open

    with safe_open(str(target / "model.safetensors"), "pt") as f:
        if "lm_head.weight" in f.keys():
            return f.get_tensor("lm_head.weight")
    if not read_config(target).get("tie_word_embeddings", False):
        raise SpecvizError(f"{target}: no lm_head.weight and the embeddings are not tied")
    return target_embedding(target)


def link_or_copy(source: Path, dest: Path) -> None:
    """A hard link where both lie on one file system (the cache's weights are large), else a copy."""
    if dest.exists() and os.path.samefile(source, dest):
        return
    dest.unlink(missing_ok=True)
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)


def copy_tokenizer(source: Path, out: Path) -> None:
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specviz.train.export_vllm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder to write target/, draft/ and eagle3/ into")
    parser.add_argument("--model", default="smollm2-135m", help="the target: a preset or a model key")
    parser.add_argument("--assets", default=str(ASSETS), help="where the shipped drafters lie (draft-MODEL, eagle3-MODEL)")
    parser.add_argument("--tokens", type=int, default=3, help="the EAGLE-3 head's speculative tokens per step")
    args = parser.parse_args(argv)
    try:
        folders = export_all(args.out, args.model, args.assets, args.tokens)
    except SpecvizError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name, folder in folders.items():
        print(f"{name}: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
