"""Train the small independent draft: a few decoder layers of the target's family that see only token ids,
share the target's embedding (input and tied output), and are distilled with KL(p || q) at response positions,
both renormalised over the draft vocabulary (the only tokens the drafter proposes). Its layers start as copies of
some of the target's layers (by default its first ones), its norm as the target's.

Why the first layers: held-out top-1 over the draft vocabulary, 60 steps each at lr 1e-3
(`.venv/bin/python experiments/draft_init.py`): layers (0, 1, 2) start at 0.056 and reach 0.32; (0, 14, 29), the
first shipped choice, start at 0.002 and reach 0.27. The loss is over the draft vocabulary because that is the
distribution the drafter proposes from; it also spares two thirds of the LM-head products of a step."""

from __future__ import annotations

import logging

import torch

from specviz.models.heads import (
    DRAFT_VOCAB_FILE,
    draft_config,
    save_draft_model,
    share_embedding,
)

from .loop import Batch, TrainConfig

log = logging.getLogger("specviz.train.draft")


def init_draft(target, layers: tuple[int, ...]):
    """A `*ForCausalLM` with len(layers) layers copied from the target, its final norm, and its embedding."""
    from transformers import AutoModelForCausalLM

    draft = AutoModelForCausalLM.from_config(draft_config(target.config, len(layers)), dtype=torch.float32)
    for i, src in enumerate(layers):
        draft.model.layers[i].load_state_dict(target.model.layers[src].state_dict())
    draft.model.norm.load_state_dict(target.model.norm.state_dict())
    share_embedding(draft, target)  # frozen: the target has requires_grad False
    return draft


def draft_and_target(draft, w: torch.Tensor, batch: Batch):
    """(log q, log p) at response positions over the rows of `w` (the full LM head or its draft-vocabulary rows),
    each (N, rows)."""
    hidden = draft.model(input_ids=batch.tokens, position_ids=batch.position_ids).last_hidden_state  # (B, L, H)
    mask = batch.response & batch.valid  # (B, L)
    logq = torch.log_softmax(hidden[mask] @ w.T, dim=-1)  # (N, V)
    with torch.no_grad():
        logp = torch.log_softmax(batch.features[mask] @ w.T, dim=-1)  # (N, V)
    return logq, logp


def make_step_loss(draft, w: torch.Tensor):
    def step_loss(batch: Batch):
        logq, logp = draft_and_target(draft, w, batch)
        kl = (logp.exp() * (logp - logq)).sum(-1).mean()
        with torch.no_grad():
            acc = (logq.argmax(-1) == logp.argmax(-1)).float().mean()
        return kl, {"kl": kl.item(), "acc": acc.item()}

    return step_loss


@torch.no_grad()
def evaluate(draft, target, batches, draft_vocab: torch.Tensor | None = None) -> dict:
    """top1: argmax q equals argmax p (greedy acceptance of one drafted token); kl: mean KL(p || q);
    expected_accept: mean of sum_x min(p, q) (acceptance rate of one token under sampling at temperature 1);
    top1_draft_vocab: the same as top1 with q's argmax taken over draft_vocab only, as the shipped drafter does."""
    w = target.lm_head.weight
    n = hit = hit_vocab = 0
    kl = overlap = 0.0
    for batch in batches:
        logq, logp = draft_and_target(draft, w, batch)
        n += len(logq)
        truth = logp.argmax(-1)
        hit += int((logq.argmax(-1) == truth).sum())
        if draft_vocab is not None:
            hit_vocab += int((draft_vocab[logq[:, draft_vocab].argmax(-1)] == truth).sum())
        kl += float((logp.exp() * (logp - logq)).sum())
        overlap += float(torch.minimum(logp.exp(), logq.exp()).sum())
    out = {"top1": round(hit / max(1, n), 4), "kl": round(kl / max(1, n), 4),
           "expected_accept_T1": round(overlap / max(1, n), 4), "positions": n}
    if draft_vocab is not None:
        out["top1_draft_vocab"] = round(hit_vocab / max(1, n), 4)
    return out


def train_draft(cfg: TrainConfig, target=None) -> dict:
    from .common import load_target, set_seed
    from .data import load_split, training_vocabulary
    from .loop import eval_batches, train
    from .report import fp16_round_trip, write_provenance

    set_seed(cfg.seed)
    target = target if target is not None else load_target(cfg.model_path)[0]
    train_set, val_set = load_split(cfg.data_dir, "train"), load_split(cfg.data_dir, "val")
    vocab = training_vocabulary(cfg.data_dir, cfg.draft_vocab_size)
    draft = init_draft(target, cfg.draft_layers)
    baseline = evaluate(draft, target, eval_batches(val_set, cfg), vocab)
    log.info("draft: initial %s", baseline)
    history = train(cfg, draft, make_step_loss(draft, target.lm_head.weight[vocab]), train_set)
    metrics = {"fp32": evaluate(draft, target, eval_batches(val_set, cfg), vocab)}
    fp16_round_trip(draft.model.layers)
    fp16_round_trip(draft.model.norm)
    metrics["fp16 (shipped)"] = evaluate(draft, target, eval_batches(val_set, cfg), vocab)
    metrics["initial (copied layers, untrained)"] = baseline
    log.info("draft: %s", metrics)
    save_draft_model(draft, cfg.out, {"target": "smollm2-135m", "init_from_target_layers": list(cfg.draft_layers),
                                      "draft_vocab_size": len(vocab), "val": metrics}, draft_vocab=vocab)
    own = sum(p.numel() for n, p in draft.named_parameters() if "embed_tokens" not in n)
    notes = [
        f"Model: {len(cfg.draft_layers)} decoder layers of the target's family (hidden {target.config.hidden_size}), "
        f"initialised from target layers {list(cfg.draft_layers)} and the target's final norm; embedding and tied "
        f"LM head are the target's (not stored); {own} own parameters.",
        f"Loss: KL(p || q) at response positions, p and q renormalised over the {len(vocab)}-token draft vocabulary "
        "(p from the cached target features); the draft sees token ids only.",
        f"Draft vocabulary: the {len(vocab)} most frequent target tokens of the training data, by falling frequency "
        f"(`{DRAFT_VOCAB_FILE}`); the drafter proposes only those (`draft:draft_vocab=full` lifts it).",
        "Build it with `specviz.models.heads.build_draft_model(target, 'assets/draft-smollm2-135m')`.",
        "Shipped fp16; validation numbers are measured before and after rounding to fp16.",
    ]
    write_provenance(cfg, "Small independent draft for SmolLM2-135M-Instruct", history, metrics, notes)
    return metrics
