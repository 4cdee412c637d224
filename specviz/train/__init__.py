"""`train {data,eagle,medusa,draft}`: self-distillation data, then the three draft topologies for one target.

    python -m specviz.train data  [--n-prompts 2400] [--max-minutes 38]
    python -m specviz.train eagle --out assets/eagle-smollm2-135m [--steps N] [--max-minutes M] [--resume]
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from dataclasses import fields
from pathlib import Path

import torch

from .common import default_data_dir, default_model_path
from .data import DataConfig, build_dataset
from .loop import TrainConfig

DEFAULT_OUT = {"eagle": "assets/eagle-smollm2-135m", "medusa": "assets/medusa-smollm2-135m",
               "draft": "assets/draft-smollm2-135m"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specviz train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="kind", required=True)
    d = sub.add_parser("data", help="generate the target's responses and cache its features")
    add_common(d)
    d.add_argument("--n-prompts", type=int, default=DataConfig.n_prompts)
    d.add_argument("--n-val", type=int, default=DataConfig.n_val)
    d.add_argument("--max-new-tokens", type=int, default=DataConfig.max_new_tokens)
    d.add_argument("--batch-size", type=int, default=DataConfig.batch_size)
    d.add_argument("--shard-size", type=int, default=DataConfig.shard_size)
    d.add_argument("--first-train-shard", type=int, default=0,
                   help="make train shards from this one on (a later run can fill in the earlier ones)")
    d.add_argument("--prompts", default=DataConfig.prompts_path)
    for kind in ("eagle", "medusa", "draft"):
        t = sub.add_parser(kind, help=f"train the {kind} drafter from the cached data")
        add_common(t)
        t.add_argument("--out", default=DEFAULT_OUT[kind])
        t.add_argument("--work-dir", default="runs")
        t.add_argument("--steps", type=int, default=2000)
        t.add_argument("--batch-seqs", type=int, default=8)
        t.add_argument("--max-len", type=int, default=TrainConfig.max_len)
        t.add_argument("--lr", type=float, default=None)
        t.add_argument("--warmup", type=int, default=TrainConfig.warmup)
        t.add_argument("--eval-seqs", type=int, default=TrainConfig.eval_seqs)
        t.add_argument("--draft-vocab-size", type=int, default=TrainConfig.draft_vocab_size)
        t.add_argument("--ckpt-minutes", type=float, default=TrainConfig.ckpt_minutes)
        t.add_argument("--resume", action="store_true", help="continue from the checkpoint in --work-dir")
        if kind == "eagle":
            t.add_argument("--noise", type=float, default=TrainConfig.noise)
            t.add_argument("--p-weight", type=float, default=TrainConfig.p_weight)
            t.add_argument("--unroll", type=int, default=TrainConfig.unroll, choices=(1, 2))
            t.add_argument("--loss-vocab", type=int, default=TrainConfig.loss_vocab,
                           help="soft CE over the N most frequent draft-vocabulary tokens (0: all); the drafter "
                                "drafts from the 4096 most frequent by default, and 4096 makes a step about 2x faster")
            t.add_argument("--init", default=None,
                           help="start from this EAGLE asset folder (keeps its draft vocabulary), e.g. to go on "
                                "training the shipped head on newly made data")
        if kind == "medusa":
            t.add_argument("--medusa-heads", type=int, default=TrainConfig.medusa_heads)
            t.add_argument("--medusa-layers", type=int, default=TrainConfig.medusa_layers)
        if kind == "draft":
            t.add_argument("--draft-layers", type=int, nargs="+", default=list(TrainConfig.draft_layers),
                           help="target layers copied into the draft (their count is the draft's depth)")
    return p


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-path", default=str(default_model_path()))
    p.add_argument("--data-dir", default=str(default_data_dir()))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-minutes", type=float, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


def train_config(args, argv: list[str]) -> TrainConfig:
    names = {f.name for f in fields(TrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in names and v is not None}
    if "draft_layers" in values:
        values["draft_layers"] = tuple(values["draft_layers"])
    command = "python -m specviz.train " + " ".join(shlex.quote(a) for a in argv)
    return TrainConfig(command=command, **values)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.kind == "data":
        cfg = DataConfig(model_path=args.model_path, out_dir=args.data_dir, prompts_path=args.prompts,
                         n_prompts=args.n_prompts, n_val=args.n_val, seed=args.seed,
                         max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                         shard_size=args.shard_size, max_minutes=args.max_minutes,
                         first_train_shard=args.first_train_shard)
        build_dataset(cfg)
        return 0
    cfg = train_config(args, argv)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    if args.kind == "eagle":
        from .eagle import train_eagle as run
    elif args.kind == "medusa":
        from .medusa import train_medusa as run
    else:
        from .draft import train_draft as run
    run(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
