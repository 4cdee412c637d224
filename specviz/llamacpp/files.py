"""The GGUF files llama-server is started with for a preset: the target's own (read out of its wheel) and our
drafters exported for llama.cpp (specviz/llamacpp/export.py), written into the cache once and reused."""
from __future__ import annotations

from pathlib import Path

from specviz.paths import cache_root

DRAFT_FILES = {"draft-simple": "draft", "draft-eagle3": "eagle3"}  # --spec-type -> the exported drafter it loads


def ggufs(model: str, spec_types: list[str] | tuple[str, ...] = ()) -> dict[str, Path]:
    """{"target": the preset's GGUF} and, where a spec type drafts, {"draft", "eagle3"}: a pretrained pair's own
    draft GGUF (qwen2.5-coder's 0.5B: the same file our `draft` reads), else our drafters exported."""
    from specviz.llamacpp.export import export_all, target_gguf
    from specviz.models.presets import PRESETS
    from specviz.models.quantized import fetch_gguf

    if not any(kind in DRAFT_FILES for kind in spec_types):
        return {"target": target_gguf(model)}
    preset = PRESETS.get(model)
    if preset is not None and preset.draft is not None:  # no heads are trained for a pair: its draft is its own
        return {"target": target_gguf(model), "draft": fetch_gguf(preset.draft)}
    out = cache_root() / "llama.cpp" / "drafters" / model
    files = {kind: out / f"{kind}.gguf" for kind in ("target", "eagle3", "draft")}
    if all(f.exists() for f in files.values()):
        return files
    return export_all(out, model=model)
