"""How often prompt lookup's continuation is right, by depth and by match length, along the target's own greedy
answers: for every position of every answer, the continuation that lookup (3-token, else 2-token match) proposes
from the context so far is compared with the tokens the target actually wrote next. A token at depth d counts as
tried when the tokens before it were right, so each figure is a conditional acceptance rate: what the single
rate r of eagle2:lookup's r^d scores averages over (experiments/results/lookup-depth.txt;
experiments/results/lookup-rates-ab.md tried one rate per match length and depth instead, with no measurable gain).

    .venv/bin/python experiments/lookup_depth.py [--prompts FILE.jsonl] [--limit 24] [--every 700]

The default prompts are every 700th row of the training instructions (../shared/data/instruct_mix.jsonl), not the
MT-bench questions the benchmark reports on.
"""
import argparse
import sys

import torch

from specviz import api, bench, models
from specviz.drafters.ngram import lookup_match


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default="../shared/data/instruct_mix.jsonl")
    ap.add_argument("--limit", type=int, default=24)
    ap.add_argument("--every", type=int, default=700)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    loaded = models.load("smollm2-135m", device="cpu")
    prompts = bench.load_prompts(args.prompts)[:: args.every][: args.limit]
    counts = {}  # (match length, depth) -> [right, tried]
    for prompt in prompts:
        answer = api.generate(prompt.text, models=loaded, drafter="none", max_new_tokens=args.max_new_tokens).token_ids
        ids = api.encode_prompt(loaded.tokenizer, prompt.text) + answer
        for position in range(len(ids) - len(answer), len(ids)):
            n, proposal = lookup_match(torch.tensor(ids[:position]), args.depth, max_ngram=3, min_ngram=2)
            for d, token in enumerate(proposal[: len(ids) - position]):
                tally = counts.setdefault((n, d + 1), [0, 0])
                tally[1] += 1
                if token != ids[position + d]:
                    break
                tally[0] += 1
    print(f"{len(prompts)} prompts from {args.prompts}, greedy answers of {args.max_new_tokens} tokens")
    print("match  depth  tried  right/tried")
    for (n, d), (right, tried) in sorted(counts.items()):
        print(f"{n:5d}  {d:5d}  {tried:5d}  {right / tried:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
