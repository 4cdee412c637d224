#!/usr/bin/env bash
# The embedded-model benches behind README.md and docs/performance.md, one after another (about 1.5-2.5 hours on
# 2 CPU cores, by how busy the machine is): the 80 MT-bench questions at T = 0 with every drafter and the
# transformers peers, the floor run (`none` alone), the same at T = 1, and the variants on 6 questions. Each
# report is written only when its run ends (atomically); progress goes to runs/readme-benches/*.log.
#   scripts/readme_benches.sh [t0 floor t1 variants eagle3-t0 eagle3-t1 eagle3-stages default q4]   (default: the first four, in that order)
#   (eagle3-t0 / eagle3-t1: EAGLE-2 beside EAGLE-3 alone, without peers, for docs/training.md; T1_LIMIT questions at T = 1;
#    default: the default weights (the GGUF's blocks on 8-bit activations) with every drafter beside llama-server plain on
#    the same file (2 threads and 1), for README.md, DEFAULT_LIMIT questions (needs `make llamacpp`); q4: the same blocks
#    on fp32 activations beside llama-cpp-python (needs `make peers`);
#    the others run the fp32 copy, the model docs/performance.md's sections 1-8 measure)
#   (eagle3-stages: the default weights, EAGLE-2 beside the shipped EAGLE-3 head and the head in runs/eagle3-before
#    (the head its last stage started from, `train eagle3 --init`), on the 80 MT-bench questions and on 40 of the
#    training data's held-out prompts (experiments/held_out_prompts.py), for docs/training.md)
#   EXTRA=eagle2:head=runs/old-eagle scripts/readme_benches.sh t0    (more drafters beside the usual ones in t0 and t1,
#                                                                   e.g. a head trained before, to compare in one run)
# Run it from a quiet machine: anything else running shifts the absolute speeds (the ratios less so, since every
# bench interleaves its methods prompt by prompt).
set -uo pipefail  # a failed bench is reported; the others still run
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
QUESTIONS=${QUESTIONS:-../shared/data/mt_bench.jsonl}
ALL="none,ngram,draft,draft:adaptive=true,medusa,eagle2,eagle2:lookup=4,eagle3,eagle3:lookup=4${EXTRA:+,$EXTRA}"
EAGLES="none,eagle2,eagle2:lookup=4,eagle3,eagle3:lookup=4"
mkdir -p runs/readme-benches
bench() {  # name args...
    local name=$1; shift
    echo "$(date -u +%FT%TZ) $name: python -m specviz bench $*" | tee -a runs/readme-benches/runs.txt
    $PY -m specviz bench "$@" > "runs/readme-benches/$name.out" 2> "runs/readme-benches/$name.log" \
        || echo "$(date -u +%FT%TZ) $name failed (exit $?): see runs/readme-benches/$name.log" | tee -a runs/readme-benches/runs.txt
}
for part in ${@:-t0 floor t1 variants}; do
    case $part in
        t0) bench t0 --weights fp32 --prompts "$QUESTIONS" --max-new-tokens 128 --temperature 0 --drafters "$ALL" \
                --json-out specviz/bench/data/reference-t0.json --md-out docs/results/bench-smollm2-t0.md ;;
        floor) bench floor --weights fp32 --drafters none --no-peers --prompts "$QUESTIONS" --max-new-tokens 128 --verify-sizes 1 \
                --json-out docs/results/bench-floor-t0.json --md-out docs/results/bench-floor-t0.md ;;
        t1) bench t1 --weights fp32 --prompts "$QUESTIONS" --max-new-tokens 128 --temperature 1.0 --drafters "$ALL" \
                --json-out docs/results/bench-smollm2-t1-80.json --md-out docs/results/bench-smollm2-t1-80.md ;;
        variants) bench variants --weights fp32 --prompts "$QUESTIONS" --limit 6 --max-new-tokens 128 --temperature 0 --no-peers \
                --verify-sizes 0 --drafters eagle2,eagle2:total_tokens=16,eagle2:early_stop=false,eagle2:draft_vocab=trained,eagle2:lookup=4,medusa,draft,draft:adaptive=true \
                --json-out docs/results/bench-variants.json --md-out docs/results/bench-variants.md ;;
        eagle3-t0) bench eagle3-t0 --weights fp32 --prompts "$QUESTIONS" --max-new-tokens 128 --temperature 0 --drafters "$EAGLES" --no-llama-cpp \
                --no-peers --quick --json-out docs/results/bench-eagle3-t0.json --md-out docs/results/bench-eagle3-t0.md ;;
        eagle3-t1) bench eagle3-t1 --weights fp32 --prompts "$QUESTIONS" --limit "${T1_LIMIT:-80}" --max-new-tokens 128 --temperature 1.0 \
                --drafters "$EAGLES" --no-peers --no-llama-cpp --quick \
                --json-out docs/results/bench-eagle3-t1.json --md-out docs/results/bench-eagle3-t1.md ;;
        default) bench default --prompts "$QUESTIONS" --limit "${DEFAULT_LIMIT:-80}" --max-new-tokens 128 --temperature 0 \
                --drafters none,ngram,draft:adaptive=true,medusa,eagle2,eagle2:lookup=4,eagle3,eagle3:lookup=4 --no-peers --quick \
                --no-llama-cpp --llama-server plain plain:threads=1 --json-out docs/results/bench-default-t0.json --md-out docs/results/bench-default-t0.md ;;
        eagle3-stages)
            STAGES="none,eagle2,eagle2:lookup=4,eagle3:head=runs/eagle3-before,eagle3,eagle3:lookup=4"
            bench eagle3-stages-mt --prompts "$QUESTIONS" --max-new-tokens 128 --temperature 0 --drafters "$STAGES" \
                --no-peers --no-llama-cpp --quick \
                --json-out docs/results/bench-eagle3-stages-t0.json --md-out docs/results/bench-eagle3-stages-t0.md
            [ -f runs/held-out-40.jsonl ] || { $PY experiments/held_out_prompts.py --limit 40 --out runs/held-out-40.part \
                && mv runs/held-out-40.part runs/held-out-40.jsonl; } \
                || echo "$(date -u +%FT%TZ) held-out prompts failed (exit $?)" | tee -a runs/readme-benches/runs.txt
            bench eagle3-stages-held-out --prompts runs/held-out-40.jsonl --max-new-tokens 128 --temperature 0 \
                --drafters "$STAGES" --no-peers --no-llama-cpp --quick --json-out docs/results/bench-eagle3-held-out-t0.json \
                --md-out docs/results/bench-eagle3-held-out-t0.md ;;
        q4) bench q4 --weights q4 --prompts "$QUESTIONS" --max-new-tokens 128 --temperature 0 \
                --drafters none,ngram,eagle2,eagle2:lookup=4 --no-peers --quick \
                --json-out docs/results/bench-q4-llamacpp-t0.json --md-out docs/results/bench-q4-llamacpp-t0.md ;;
        *) echo "unknown part '$part': choose from t0 floor t1 variants eagle3-t0 eagle3-t1 eagle3-stages default q4" >&2; exit 2 ;;
    esac
done
