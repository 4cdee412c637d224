"""Where specviz keeps what it fetches and builds: fetched models, training data, compiled kernels."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def cache_root() -> Path:
    """`$SPECVIZ_CACHE` if set, else the platform's user cache folder for specviz."""
    override = os.environ.get("SPECVIZ_CACHE")
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("specviz"))
