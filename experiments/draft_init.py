"""Which target layers should the independent draft start from? For each choice, the held-out top-1 agreement
(argmax of q over the draft vocabulary equals the target's argmax) of the copied layers untrained and after a short
training run with the trainer's own loss (KL(p || q) over the draft vocabulary), every choice on the same batches.
Needs the self-distillation cache (`python -m specviz.train data ...`).

    .venv/bin/python experiments/draft_init.py [--layers 0,1,2 0,14,29] [--steps 60] [--lr 1e-3]

Measured on the 2-core development machine (60 steps, lr 1e-3, 32 held-out sequences): (0, 1, 2) 0.056 -> 0.32;
(0, 14, 29) 0.002 -> 0.27; (0, 1, 29) 0.000 -> 0.28; at lr 3e-3 (0, 1, 2) reached 0.34; four layers (0, 1, 2, 3)
0.34 at lr 1e-3 for 27 % more time a step.
"""
import argparse
import sys
import time

import torch

from specviz.train.common import default_data_dir, default_model_path, load_target, set_seed
from specviz.train.data import load_split, training_vocabulary
from specviz.train.draft import evaluate, init_draft, make_step_loss
from specviz.train.loop import TrainConfig, eval_batches, train_batches


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", nargs="+", default=["0,1,2", "0,14,29"])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-seqs", type=int, default=32)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    cfg = TrainConfig(kind="draft", model_path=str(default_model_path()), data_dir=str(default_data_dir()), out="",
                      steps=args.steps, eval_seqs=args.eval_seqs)
    target = load_target(cfg.model_path)[0]
    train_set, val_set = load_split(cfg.data_dir, "train"), load_split(cfg.data_dir, "val")
    vocab = training_vocabulary(cfg.data_dir, cfg.draft_vocab_size)
    w_vocab = target.lm_head.weight[vocab]
    for spec in args.layers:
        layers = tuple(int(x) for x in spec.split(","))
        set_seed(cfg.seed)
        draft = init_draft(target, layers)
        before = evaluate(draft, target, eval_batches(val_set, cfg), vocab)["top1_draft_vocab"]
        params = [p for p in draft.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
        step_loss, start = make_step_loss(draft, w_vocab), time.time()
        for step, batch in enumerate(train_batches(train_set, cfg, 0)):
            for group in opt.param_groups:
                group["lr"] = args.lr * min(1.0, (step + 1) / 20)
            loss, _ = step_loss(batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_value_(params, cfg.grad_clip)
            opt.step()
        per_step = (time.time() - start) / args.steps
        after = evaluate(draft, target, eval_batches(val_set, cfg), vocab)["top1_draft_vocab"]
        print(f"layers {layers}: top-1 {before:.3f} untrained -> {after:.3f} after {args.steps} steps at lr "
              f"{args.lr:g} ({per_step:.2f} s a step)", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
