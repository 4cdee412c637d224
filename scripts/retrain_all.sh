#!/usr/bin/env bash
# Retrain the three shipped drafters from the cached self-distillation data, each in its own time box, into a
# staging folder; then ship (copy into assets/) each one whose held-out top-1 agreement beats the shipped one.
#   scripts/retrain_all.sh [EAGLE_MIN MEDUSA_MIN DRAFT_MIN]      (logs and checkpoints in runs/retrain/)
set -uo pipefail  # a failed stage leaves its staging folder empty; the others still ship
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
EAGLE_MIN=${1:-28}; MEDUSA_MIN=${2:-10}; DRAFT_MIN=${3:-10}
STAGE=runs/retrain/assets; mkdir -p "$STAGE" runs/retrain
$PY -m specviz.train eagle --threads 2 --steps 8000 --max-minutes "$EAGLE_MIN" --unroll 2 --lr 5e-4 --batch-seqs 8 \
    --out "$STAGE/eagle-smollm2-135m" --work-dir runs/retrain/eagle 2>&1 | tee runs/retrain/eagle.log
$PY -m specviz.train medusa --threads 2 --steps 8000 --max-minutes "$MEDUSA_MIN" --lr 1e-3 --batch-seqs 8 \
    --out "$STAGE/medusa-smollm2-135m" --work-dir runs/retrain/medusa 2>&1 | tee runs/retrain/medusa.log
$PY -m specviz.train draft --threads 2 --steps 8000 --max-minutes "$DRAFT_MIN" --lr 2e-4 --batch-seqs 8 \
    --draft-layers 0 14 29 --out "$STAGE/draft-smollm2-135m" --work-dir runs/retrain/draft 2>&1 | tee runs/retrain/draft.log
$PY - "$STAGE" <<'PY'
import json, shutil, sys
from pathlib import Path

stage, assets = Path(sys.argv[1]), Path("assets")
def top1(folder):
    config = json.loads((folder / "config.json").read_text())
    val = (config.get("specviz") or config)["val"]["fp16 (shipped)"]
    value = val.get("acc1", val.get("top1"))
    return value[0] if isinstance(value, list) else value
for name in ("eagle-smollm2-135m", "medusa-smollm2-135m", "draft-smollm2-135m"):
    new, old = stage / name, assets / name
    if not (new / "model.safetensors").is_file():
        print(f"{name}: no new weights"); continue
    better = not (old / "config.json").is_file() or top1(new) > top1(old)
    print(f"{name}: held-out top-1 {top1(old) if (old / 'config.json').is_file() else None} -> {top1(new)}:",
          "shipping" if better else "keeping the old one")
    if better:
        shutil.rmtree(old, ignore_errors=True)
        shutil.copytree(new, old)
PY
