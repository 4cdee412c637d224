"""Where specviz finds what ships with it (the trained drafters) and keeps what it fetches and builds (fetched
models, training data, compiled kernels)."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

# The drafters trained for the presets, one folder each (<kind>-<model>/): package data, installed with specviz.
ASSETS = Path(__file__).resolve().parent / "assets"


def cache_root() -> Path:
    """`$SPECVIZ_CACHE` if set, else the platform's user cache folder for specviz."""
    override = os.environ.get("SPECVIZ_CACHE")
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("specviz"))
