"""The training loop shared by the three trainers: batches from the feature cache, AdamW with warmup + cosine,
time-based checkpoints that `--resume` picks up, and a loss history for the provenance note."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
from tqdm import tqdm

from specviz.atomic import replacing

from .data import FeatureSet

log = logging.getLogger("specviz.train")


@dataclass
class TrainConfig:
    kind: str  # eagle | eagle3 | medusa | draft
    model_path: str
    data_dir: str
    out: str  # asset folder
    work_dir: str = "runs"  # checkpoints and logs (git-ignored)
    steps: int = 2000
    batch_seqs: int = 8
    max_len: int = 448  # longer sequences keep their last max_len tokens (prompt start is cut)
    lr: float = 1e-3
    warmup: int = 100
    grad_clip: float = 0.5  # clip by value, as the EAGLE reference does
    seed: int = 0
    max_minutes: float | None = None  # training-time budget (resumed runs count earlier time); the schedule fits it
    ckpt_minutes: float = 3.0
    eval_seqs: int = 128
    draft_vocab_size: int = 16384  # 96.8% of held-out response tokens (8192: 93.8%)
    resume: bool = False
    # EAGLE
    noise: float = 0.2  # uniform feature noise U(-noise/2, noise/2) on the head's input features
    p_weight: float = 0.1  # weight of the distribution loss (the reference's p_w; v_w = 1)
    unroll: int = 1  # 2: also train depth 2, feeding the head's own prediction back as the feature
    loss_vocab: int = 0  # the distribution loss over the N most frequent draft-vocabulary tokens (0: all of them)
    init: str = ""  # an EAGLE asset folder to start from (its weights and draft vocabulary) instead of a random head
    # EAGLE-3 (unroll: the training-time test's draft steps)
    step_decay: float = 0.8  # loss weight of draft step k is step_decay**k
    bf16: bool = False  # products under bf16 autocast (faster where the CPU multiplies bf16; weights stay fp32)
    # Medusa
    medusa_heads: int = 4
    medusa_layers: int = 1
    medusa_decay: float = 0.8  # loss weight of head k is decay**k
    # draft
    draft_layers: tuple[int, ...] = (0, 1, 2)  # target layers that initialise the draft's layers
    command: str = ""  # the exact command line, for the provenance note


@dataclass
class Batch:
    tokens: torch.Tensor  # (B, L) int64, right padded with 0
    features: torch.Tensor  # (B, L, H) float32
    position_ids: torch.Tensor  # (B, L) int64 absolute positions
    valid: torch.Tensor  # (B, L) bool: real (non-pad) positions
    response: torch.Tensor  # (B, L) bool: positions t >= prompt_len - 1 (f_t predicts a response token)
    aux: torch.Tensor | None = None  # (B, L, 3·H) float32: the auxiliary layers' features, where the data has them


def make_batch(data: FeatureSet, idx: list[int], max_len: int) -> Batch:
    seqs = [data.sequence(i) for i in idx]
    width = min(max_len, max(len(t) for t, _, _ in seqs))
    hidden = data.features.shape[1]
    tokens = torch.zeros(len(idx), width, dtype=torch.long)
    feats = torch.zeros(len(idx), width, hidden)
    pos = torch.zeros(len(idx), width, dtype=torch.long)
    valid = torch.zeros(len(idx), width, dtype=torch.bool)
    response = torch.zeros(len(idx), width, dtype=torch.bool)
    aux = None if data.aux_features is None else torch.zeros(len(idx), width, data.aux_features.shape[1])
    for row, (i, (tok, feat, plen)) in enumerate(zip(idx, seqs)):
        start = max(0, len(tok) - max_len)
        n = len(tok) - start
        tokens[row, :n] = tok[start:]
        feats[row, :n] = feat[start:].float()
        pos[row, :n] = torch.arange(start, len(tok))
        valid[row, :n] = True
        response[row, :n] = pos[row, :n] >= plen - 1
        if aux is not None:
            aux[row, :n] = data.aux_features[int(data.offsets[i]) + start: int(data.offsets[i + 1])].float()
    return Batch(tokens, feats, pos, valid, response, aux)


def train_batches(data: FeatureSet, cfg: TrainConfig, first_step: int) -> Iterator[Batch]:
    """Step i draws its sequences from seed + i, so a resumed run sees the same batches."""
    for step in range(first_step, cfg.steps):
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        idx = torch.randint(len(data), (cfg.batch_seqs,), generator=g).tolist()
        yield make_batch(data, idx, cfg.max_len)


def eval_batches(data: FeatureSet, cfg: TrainConfig) -> Iterator[Batch]:
    n = min(cfg.eval_seqs, len(data))
    for k in range(0, n, cfg.batch_seqs):
        yield make_batch(data, list(range(k, min(n, k + cfg.batch_seqs))), cfg.max_len)


def lr_at(step: int, cfg: TrainConfig, seconds: float = 0.0) -> float:
    """Linear warmup, then cosine down to 5% over whichever budget runs out first: steps or minutes."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    if cfg.max_minutes:
        progress = max(progress, seconds / (60 * cfg.max_minutes))
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


@dataclass
class History:
    steps: list[int] = field(default_factory=list)
    losses: list[dict] = field(default_factory=list)  # running means over each logging window
    seconds: float = 0.0
    finished_steps: int = 0

    def summary(self, points: int = 6) -> list[str]:
        if not self.steps:
            return []
        picks = sorted({round(i * (len(self.steps) - 1) / (points - 1)) for i in range(points)})
        return [f"step {self.steps[i]}: " + ", ".join(f"{k} {v:.4f}" for k, v in self.losses[i].items())
                for i in picks]


def checkpoint_path(cfg: TrainConfig) -> Path:
    return Path(cfg.work_dir) / cfg.kind / "checkpoint.pt"


def train(
    cfg: TrainConfig,
    module: torch.nn.Module,
    step_loss: Callable[[Batch], tuple[torch.Tensor, dict]],
    data: FeatureSet,
    log_every: int = 25,
) -> History:
    """Run (or resume) the optimisation of `module`'s trainable parameters. Returns the loss history."""
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    history, first = History(), 0
    ckpt = checkpoint_path(cfg)
    if cfg.resume and ckpt.exists():
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        module.load_state_dict(state["module"])
        opt.load_state_dict(state["optimizer"])
        history = History(**state["history"])
        first = history.finished_steps
        log.info("%s: resumed from %s at step %d", cfg.kind, ckpt, first)
    ckpt.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        history.finished_steps = step_done
        with replacing(ckpt) as temp:
            torch.save({"module": module.state_dict(), "optimizer": opt.state_dict(),
                        "history": asdict(history), "config": asdict(cfg)}, temp)

    start = last_ckpt = time.time()
    base_seconds = history.seconds
    window: dict[str, float] = {}
    in_window = 0  # steps summed in `window` (a resumed run's first window may be short)
    step_done = first
    module.train()
    bar = tqdm(train_batches(data, cfg, first), total=cfg.steps, initial=first, desc=cfg.kind, mininterval=10)
    for step, batch in enumerate(bar, start=first):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg, history.seconds)
        loss, stats = step_loss(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_value_(params, cfg.grad_clip)
        opt.step()
        step_done = step + 1
        for k, v in stats.items():
            window[k] = window.get(k, 0.0) + float(v)
        in_window += 1
        if step_done % log_every == 0 or step_done == cfg.steps:
            means = {k: v / in_window for k, v in window.items()}
            history.steps.append(step_done)
            history.losses.append(means)
            window, in_window = {}, 0
            bar.set_postfix({k: f"{v:.3f}" for k, v in means.items()})
            log.info("%s step %d lr %.2e %s", cfg.kind, step_done, lr_at(step, cfg, history.seconds),
                     " ".join(f"{k} {v:.4f}" for k, v in means.items()))
        history.seconds = base_seconds + time.time() - start
        if time.time() - last_ckpt > 60 * cfg.ckpt_minutes:
            save()
            last_ckpt = time.time()
        if cfg.max_minutes is not None and history.seconds > 60 * cfg.max_minutes:
            log.info("%s: time budget reached at step %d", cfg.kind, step_done)
            break
    save()
    module.eval()
    return history
