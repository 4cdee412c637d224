"""`specviz train {data,eagle,eagle3,medusa,draft}`: self-distillation data, then the trained draft topologies."""
from __future__ import annotations

import argparse
import importlib
import logging
import shlex
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable

import torch

from specviz.errors import SpecvizError
from specviz.train.common import default_data_dir, default_model_path
from specviz.train.data import DataConfig, build_dataset
from specviz.train.loop import TrainConfig

TRAIN_DOC = """`train {data,eagle,eagle3,medusa,draft}`: self-distillation data, then the trained draft topologies for one
target.

    specviz train data  [--n-prompts 2400] [--max-minutes 38] [--aux-layers eagle3]
    specviz train eagle --out assets/eagle-smollm2-135m [--steps N] [--max-minutes M] [--resume]
    specviz train eagle3 --data-dir DATA_MADE_WITH_AUX_LAYERS [--unroll 3] [--max-minutes M] [--resume]
"""

DEFAULT_OUT = {"eagle": "assets/eagle-smollm2-135m", "eagle3": "assets/eagle3-smollm2-135m", "medusa": "assets/medusa-smollm2-135m",
               "draft": "assets/draft-smollm2-135m"}


def build_train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specviz train", description=TRAIN_DOC,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="kind", required=True)
    d = sub.add_parser("data", help="generate the target's responses and cache its features")
    add_train_common(d)
    d.add_argument("--n-prompts", type=int, default=DataConfig.n_prompts)
    d.add_argument("--n-val", type=int, default=DataConfig.n_val)
    d.add_argument("--max-new-tokens", type=int, default=DataConfig.max_new_tokens)
    d.add_argument("--batch-size", type=int, default=DataConfig.batch_size)
    d.add_argument("--shard-size", type=int, default=DataConfig.shard_size)
    d.add_argument("--first-train-shard", type=int, default=0,
                   help="make train shards from this one on (a later run can fill in the earlier ones)")
    d.add_argument("--prompts", default=DataConfig.prompts_path)
    d.add_argument("--answers-dir", default=None,
                   help="keep each shard's answers here (small compressed files, committed to git) and rebuild "
                        "the features of shards found there instead of generating them (default: "
                        "data/answers/<target>/ in the working directory, committed to git in the repository; 'none': keep none)")
    d.add_argument("--aux-layers", default="",
                   help="also cache the inputs of these decoder layers (comma-separated, or 'eagle3': layers 2, "
                        "N/2 and N-3 of an N-layer target, the EAGLE-3 default), for `train eagle3`")
    for kind in ("eagle", "eagle3", "medusa", "draft"):
        t = sub.add_parser(kind, help=f"train the {kind} drafter from the cached data")
        add_train_common(t)
        t.add_argument("--out", default=DEFAULT_OUT[kind])
        t.add_argument("--work-dir", default="runs")
        t.add_argument("--steps", type=int, default=2000)
        t.add_argument("--batch-seqs", type=int, default=8)
        t.add_argument("--max-len", type=int, default=TrainConfig.max_len)
        t.add_argument("--lr", type=float, default=None)
        t.add_argument("--warmup", type=int, default=TrainConfig.warmup)
        t.add_argument("--eval-seqs", type=int, default=TrainConfig.eval_seqs)
        t.add_argument("--draft-vocab-size", type=int, default=8192 if kind == "eagle3" else TrainConfig.draft_vocab_size)
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
        if kind == "eagle3":
            t.add_argument("--unroll", type=int, default=3,
                           help="training-time test: draft steps, each fed the head's own output from the step before")
            t.add_argument("--step-decay", type=float, default=TrainConfig.step_decay,
                           help="loss weight of draft step k is this to the power k")
            t.add_argument("--loss-vocab", type=int, default=4096,
                           help="soft CE over the N most frequent draft-vocabulary tokens (0: all); the LM head "
                                "rows are the target's and stay fixed, so only the head's output is shaped by it")
            t.add_argument("--bf16", action="store_true",
                           help="run the products under bf16 autocast (about 1.6x faster on a CPU with native bf16)")
            t.add_argument("--init", default=None, help="go on training the EAGLE-3 head in this folder")
        if kind == "medusa":
            t.add_argument("--medusa-heads", type=int, default=TrainConfig.medusa_heads)
            t.add_argument("--medusa-layers", type=int, default=TrainConfig.medusa_layers)
        if kind == "draft":
            t.add_argument("--draft-layers", type=int, nargs="+", default=list(TrainConfig.draft_layers),
                           help="target layers copied into the draft (their count is the draft's depth)")
    return p


def aux_layer_ids(spec: str, model_path: str) -> tuple[int, ...]:
    """'' -> (); '2,15,27' -> (2, 15, 27); 'eagle3' -> EAGLE-3's default layers for the target's depth."""
    if not spec:
        return ()
    if spec == "eagle3":
        from transformers import AutoConfig

        from specviz.models.eagle3 import default_aux_layers

        return default_aux_layers(AutoConfig.from_pretrained(model_path).num_hidden_layers)
    try:
        return tuple(int(x) for x in spec.split(","))
    except ValueError:
        raise SpecvizError(f"--aux-layers takes layer numbers like 2,15,27 or 'eagle3', got {spec!r}") from None


def answers_dir(spec: str | None, model_path: str) -> str:
    """None -> data/answers/<target> in the working directory (the repository's, from its root); 'none' or '' -> no answers kept."""
    if spec is None:
        from specviz.train.answers import ANSWERS_ROOT

        return str(ANSWERS_ROOT / Path(model_path).name)
    return "" if spec.lower() in ("", "none") else spec


def add_train_common(p: argparse.ArgumentParser) -> None:
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
    command = "python -m specviz train " + " ".join(shlex.quote(a) for a in argv)
    return TrainConfig(command=command, **values)


def train_main(argv: list[str]) -> int:
    args = build_train_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.kind == "data":
        cfg = DataConfig(model_path=args.model_path, out_dir=args.data_dir, prompts_path=args.prompts,
                         n_prompts=args.n_prompts, n_val=args.n_val, seed=args.seed,
                         max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                         shard_size=args.shard_size, max_minutes=args.max_minutes,
                         first_train_shard=args.first_train_shard,
                         aux_layers=aux_layer_ids(args.aux_layers, args.model_path),
                         answers_dir=answers_dir(args.answers_dir, args.model_path))
        build_dataset(cfg)
        return 0
    cfg = train_config(args, argv)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    trainer(args.kind)(cfg)
    return 0


def trainer(kind: str) -> Callable[[TrainConfig], Any]:
    """The training entry point the drafter spec declaring the part `kind` names ("module:function")."""
    from specviz.models.parts import part_of

    module, _, function = part_of(kind).trainer.partition(":")
    if not function:
        raise SpecvizError(f"the part '{kind}' names no trainer")
    run: Callable[[TrainConfig], Any] = getattr(importlib.import_module(module), function)
    return run


def cmd_train(args) -> int:
    return train_main(args.rest)


def register(sub) -> None:
    tr = sub.add_parser("train", help="train draft heads / the draft model (see `train --help`)", add_help=False)
    tr.add_argument("rest", nargs=argparse.REMAINDER)
    tr.set_defaults(run=cmd_train)

