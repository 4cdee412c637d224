"""Files written whole or not at all: a temporary file beside the target, renamed onto it once complete.

Readers see the old file or the whole new one; a write that fails (full disk, an exception in the producer,
Ctrl-C) leaves no temporary file behind. One place for the reports, traces, training checkpoints and shards."""
from __future__ import annotations

import itertools
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from specviz.errors import SpecvizError

_serial = itertools.count()  # temp names unique within this process; the pid keeps processes apart


@contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path` (its folder made if missing) to write to; it replaces `path` when
    the block ends without an error and is removed when it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}-{next(_serial)}.tmp")  # plain open: the umask's permissions
    try:
        yield temp
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def write_atomically(path: str | os.PathLike, text: str) -> None:
    with replacing(path) as temp:
        temp.write_text(text, encoding="utf-8")


def save_tensors_atomically(tensors: dict, path: str | os.PathLike) -> None:
    """A safetensors file written whole or not at all (a failed save leaves the old file, e.g. a shipped one)."""
    from safetensors.torch import save_file

    with replacing(path) as temp:
        temp.touch()  # a plain create gets the umask's permissions; save_file's own file would be 0600
        mode = temp.stat().st_mode & 0o777
        save_file(tensors, str(temp))
        os.chmod(temp, mode)


def check_writable(path: str | os.PathLike) -> None:
    """Before a long run: fail now, not after it, when `path` could not be written (folders `replacing` would
    make are fine)."""
    path = Path(path)
    if path.is_dir():
        raise SpecvizError(f"cannot write {path}: it is a folder")
    folder = path.resolve().parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise SpecvizError(f"cannot write {path}: {folder} is not a writable folder")
