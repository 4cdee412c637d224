"""What does `train eagle3 --bf16` (bf16 autocast) save per training step against fp32?

One EAGLE-3 training step (three unrolled draft steps, loss over 4,096 rows, forward and backward) on a synthetic
batch of 8 sequences of 300 tokens, fp32 and bf16 autocast alternated, three rounds; prints seconds per step.
Worth it only on a CPU that multiplies bf16 natively (avx512_bf16 / amx_bf16).

    .venv/bin/python experiments/train_bf16_ab.py
"""
import time

import torch

from specviz.models.cache import model_dir
from specviz.train.common import load_target
from specviz.train.eagle3 import make_step_loss, new_head
from specviz.train.loop import Batch, TrainConfig

torch.set_num_threads(2)
torch.manual_seed(0)
target = load_target(str(model_dir("smollm2-135m")))[0]
head = new_head(target, (2, 15, 27), torch.arange(8192))
B, L, H = 8, 300, target.config.hidden_size
positions = torch.arange(L).repeat(B, 1)
batch = Batch(torch.randint(0, 8000, (B, L)), torch.randn(B, L, H), positions, torch.ones(B, L, dtype=torch.bool),
              positions > 100, torch.randn(B, L, 3 * H))
for rep in range(3):
    for bf16 in (False, True):
        cfg = TrainConfig(kind="eagle3", model_path="", data_dir="", out="", unroll=3, bf16=bf16)
        step = make_step_loss(head, target.get_input_embeddings(), target.lm_head.weight[:4096], cfg)
        started = time.perf_counter()
        step(batch)[0].backward()
        print(f"round {rep}: {'bf16 autocast' if bf16 else 'fp32'} {time.perf_counter() - started:.2f} s")
