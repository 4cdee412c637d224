#!/usr/bin/env bash
# Retrain the three shipped drafters from the cached self-distillation data, each in its own time box, into a
# staging folder; then ship (copy into assets/) each one whose held-out top-1 agreement beats the shipped one.
#   scripts/retrain_all.sh [EAGLE_MIN MEDUSA_MIN DRAFT_MIN]      (logs and checkpoints in runs/retrain/)
# A budget of 0 skips that drafter. RESUME=1 continues each from its checkpoint in runs/retrain/ (on whatever data
# is cached now); a budget then counts the earlier minutes too, and the learning rate restarts from where the
# cosine schedule stands at that share of the new budget.
# DATA_DIR=folder trains on the data cached there (`train data --data-dir`); EAGLE_ARGS adds options to the EAGLE
# stage, overriding the defaults below. The shipped EAGLE head's last stage (40 minutes from the head before it,
# docs/training.md) is, in this form:
#   DATA_DIR=runs/data EAGLE_ARGS="--init assets/eagle-smollm2-135m --steps 20000 --lr 3e-4 --warmup 50 --loss-vocab 4096" \
#       scripts/retrain_all.sh 40 0 0
set -uo pipefail  # a failed stage leaves its staging folder empty; the others still ship
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
EAGLE_MIN=${1:-28}; MEDUSA_MIN=${2:-10}; DRAFT_MIN=${3:-10}
RESUME_FLAG=$([ "${RESUME:-0}" = 1 ] && echo --resume)
DATA_FLAG=${DATA_DIR:+--data-dir $DATA_DIR}
STAGE=runs/retrain/assets; mkdir -p "$STAGE" runs/retrain
train() {  # kind minutes extra-args...
    local kind=$1 minutes=$2; shift 2
    rm -rf "$STAGE/$kind-smollm2-135m"  # only what this invocation trains can ship
    [ "$minutes" = 0 ] && return
    $PY -m specviz.train "$kind" --threads 2 --steps 8000 --max-minutes "$minutes" --batch-seqs 8 $RESUME_FLAG $DATA_FLAG \
        --out "$STAGE/$kind-smollm2-135m" --work-dir "runs/retrain/$kind" "$@" 2>&1 | tee -a "runs/retrain/$kind.log"
}
train eagle "$EAGLE_MIN" --unroll 2 --lr 5e-4 ${EAGLE_ARGS:-}  # later options win (argparse)
train medusa "$MEDUSA_MIN" --lr 1e-3
train draft "$DRAFT_MIN" --lr 2e-3 --draft-layers 0 1 2
$PY - "$STAGE" <<'PY'
import json, shutil, sys
from pathlib import Path

stage, assets = Path(sys.argv[1]), Path("assets")
def top1(folder):
    config = json.loads((folder / "config.json").read_text())
    val = (config.get("specviz") or config)["val"]["fp16 (shipped)"]
    value = val.get("acc1", val.get("top1_draft_vocab", val.get("top1")))  # what the drafter proposes from
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
