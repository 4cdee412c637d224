"""The model cache: one folder per model key under `specviz.paths.cache_root()`, filled by one fetch at a time."""
from __future__ import annotations

import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from specviz.errors import SpecvizError
from specviz.paths import cache_root

if TYPE_CHECKING:
    from specviz.models.files import ModelFile, Preset


def model_dir(key: str) -> Path:
    """Where the model with this key lives (or will live) in the cache."""
    return cache_root() / key


def is_fetched(key: str) -> bool:
    """True when <cache>/<key>/ holds a loadable model (config.json and model.safetensors)."""
    folder = model_dir(key)
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def missing_files(preset: Preset) -> list[ModelFile]:
    """The preset's model files not in the cache yet: its target's, then its draft's."""
    return [f for f in (preset.target, preset.draft) if f is not None and not is_fetched(f.key)]


@contextmanager
def cache_lock(root: Path, key: str, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on <root>/.lock-<key> so that one process at a time fetches a model.
    on_wait() is called once, before waiting, when another holds the lock.

    The lock file stays behind on purpose: deleting it would let two processes lock two different files.
    Where fcntl does not exist (Windows) there is no lock; the final os.replace still keeps the cache whole.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(root / f".lock-{key}", "a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"specviz: waiting for another process that is fetching {key} …", file=sys.stderr)
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def remove_stale_temp_dirs(root: Path, key: str) -> None:
    """Delete temp folders a killed fetch of `key` left behind (call only while holding its lock)."""
    for stale in root.glob(f".tmp-{key}-*"):
        shutil.rmtree(stale, ignore_errors=True)


def refuse_incomplete_folder(folder: Path) -> None:
    """A folder that exists without being a complete model was not made by fetch: ask before touching it."""
    if folder.exists():
        raise SpecvizError(
            f"{folder} exists but is not a complete model (it needs config.json and model.safetensors). "
            "Delete it and fetch again."
        )
