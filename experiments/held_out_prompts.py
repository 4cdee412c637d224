"""The training data's held-out prompts as a prompt file the bench reads: the first `--limit` of the `n_val`
instructions `specviz train data` keeps out of training (its own choice, specviz.train.data.chosen_prompts), with
their category (math word problems, coding, open QA, role play, ...). The drafters were never trained on them, so
they measure the heads on prompts of other kinds than MT-bench's.

    .venv/bin/python experiments/held_out_prompts.py --limit 40 --out runs/held-out-40.jsonl
    .venv/bin/python -m specviz bench --prompts runs/held-out-40.jsonl --drafters none,eagle2,eagle3 ...
"""
import argparse
import collections
import json
import sys

from specviz.train.data import DataConfig, chosen_prompts


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    cfg = DataConfig(n_prompts=0)  # the held-out prompts only
    with open(cfg.prompts_path) as f:  # by "\n" only, as read_instructions reads it (rows hold U+2028)
        rows = [json.loads(line) for line in f if line.strip()]
    held_out = [rows[i] for i, _ in chosen_prompts(cfg, AutoTokenizer.from_pretrained(cfg.model_path))][: args.limit]
    with open(args.out, "w") as f:
        for row in held_out:
            f.write(json.dumps({"id": row["id"], "category": row["category"], "instruction": row["instruction"]}) + "\n")
    counts = collections.Counter(row["category"] for row in held_out)
    print(f"{len(held_out)} held-out prompts to {args.out}: " + ", ".join(f"{n} {c}" for c, n in counts.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
