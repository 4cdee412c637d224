"""The training data's held-out prompts as a prompt file the bench reads: the first `--limit` of the `n_val`
instructions `specviz train data` keeps out of training (same seed, same shuffle, same skip of over-long prompts),
with their category (math word problems, coding, open QA, role play, ...). The drafters were never trained on
them, so they measure the heads on prompts of other kinds than MT-bench's.

    .venv/bin/python experiments/held_out_prompts.py --limit 40 --out runs/held-out-40.jsonl
    .venv/bin/python -m specviz bench --prompts runs/held-out-40.jsonl --drafters none,eagle2,eagle3 ...
"""
import argparse
import collections
import json
import sys

import numpy as np

from specviz.train.data import DataConfig, chat_prompt_ids, select_prompts


def held_out(cfg: DataConfig, tokenizer) -> list[dict]:
    """The val rows of select_prompts (specviz/train/data.py), as rows of the prompt file."""
    with open(cfg.prompts_path) as f:  # by "\n" only, as read_instructions reads it (rows hold U+2028)
        rows = [json.loads(line) for line in f if line.strip()]
    order = np.random.default_rng(cfg.seed).permutation(len(rows))
    chosen = []
    for i in order:
        if len(chat_prompt_ids(tokenizer, rows[i]["instruction"])) <= cfg.max_prompt_tokens:
            chosen.append(rows[i])
        if len(chosen) == cfg.n_val:
            return chosen
    return chosen


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    cfg = DataConfig(n_prompts=0)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
    rows = held_out(cfg, tokenizer)
    val, _ = select_prompts(cfg, tokenizer)  # the data job's own choice: the same prompts, in the same order
    assert [chat_prompt_ids(tokenizer, row["instruction"]) for row in rows] == val
    rows = rows[: args.limit]
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps({"id": row["id"], "category": row["category"], "instruction": row["instruction"]}) + "\n")
    counts = collections.Counter(row["category"] for row in rows)
    print(f"{len(rows)} held-out prompts to {args.out}: " + ", ".join(f"{n} {c}" for c, n in counts.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
