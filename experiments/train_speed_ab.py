"""One EAGLE training step (forward + backward, depth 2, 8 sequences of 250 tokens, one thread) with the
distribution loss over 16,384 draft-vocabulary rows against 4,096 (`train eagle --loss-vocab`), side by side.

    .venv/bin/python experiments/train_speed_ab.py      (needs the fetched smollm2-135m; under a minute)
"""
import statistics
import time

import torch
from transformers import AutoConfig

from specviz.models.heads import EagleHead
from specviz.train.common import default_model_path
from specviz.train.eagle import make_step_loss
from specviz.train.loop import Batch, TrainConfig


def training_step(config) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    head, embed = EagleHead(config), torch.nn.Embedding(config.vocab_size, config.hidden_size)
    rows, length = 8, 250
    positions = torch.arange(length).expand(rows, length)
    batch = Batch(torch.randint(0, 1000, (rows, length)), torch.randn(rows, length, config.hidden_size), positions,
                  torch.ones(rows, length, dtype=torch.bool), positions > 60)
    cfg = TrainConfig(kind="eagle", model_path="", data_dir="", out="", unroll=2)
    for vocab in (16384, 4096):
        step = make_step_loss(head, embed, torch.randn(vocab, config.hidden_size) * 0.05, cfg)
        times = []
        for _ in range(5):
            started = time.perf_counter()
            loss, _ = step(batch)
            loss.backward()
            times.append(time.perf_counter() - started)
        print(f"EAGLE step, loss over {vocab} rows: {statistics.median(times[1:]):.2f} s (median of 4 after a warm-up)")


if __name__ == "__main__":
    training_step(AutoConfig.from_pretrained(str(default_model_path())))
