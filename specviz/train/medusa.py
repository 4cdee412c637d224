"""Train Medusa heads on cached target features (Medusa-1: the target stays frozen).

Head k reads f_t and predicts x_{t+2+k} (as in FasterDecoding/Medusa, whose training loss pairs head i's logits at t
with labels[t + 2 + i]). We distil: the label is the target's own distribution at t+1+k, softmax(lm_head(f_{t+1+k})),
over the reduced draft vocabulary, and head k's loss is weighted decay**k.
"""

from __future__ import annotations

import logging

import torch

from specviz.models.heads import MedusaHeads

from .loop import Batch, TrainConfig

log = logging.getLogger("specviz.train.medusa")


def head_pairs(batch: Batch, k: int):
    """Inputs f_t and the target feature f_{t+1+k} whose LM-head distribution head k must match."""
    length = batch.tokens.shape[1]
    inputs = batch.features[:, : length - 1 - k]  # (B, L-1-k, H)
    targets = batch.features[:, 1 + k :]  # (B, L-1-k, H)
    mask = batch.response[:, : length - 1 - k] & batch.valid[:, 1 + k :]  # (B, L-1-k)
    return inputs, targets, mask


def make_step_loss(heads: MedusaHeads, w_vocab: torch.Tensor, cfg: TrainConfig):
    def step_loss(batch: Batch):
        hidden = heads(batch.features)  # (B, L, K, H)
        total, stats = 0.0, {}
        for k in range(heads.num_heads):
            _, targets, mask = head_pairs(batch, k)
            pred = hidden[:, : targets.shape[1], k][mask]  # (N, H) loss positions only
            with torch.no_grad():
                p = torch.softmax(targets[mask] @ w_vocab.T, dim=-1)  # (N, Vd)
            logq = torch.log_softmax(pred @ w_vocab.T, dim=-1)  # (N, Vd)
            loss_k = -(p * logq).sum(-1).mean()
            total = total + cfg.medusa_decay**k * loss_k
            stats[f"ce{k}"] = loss_k.item()
        return total, stats

    return step_loss


@torch.no_grad()
def evaluate(heads: MedusaHeads, target, batches, draft_vocab: torch.Tensor | None) -> dict:
    """Per head: top-1 / top-5 agreement with the target's token x_{t+2+k} on response positions; and the chain
    rate (heads 0..k all right), the chance that a Medusa chain of length k+1 is accepted in full."""
    w = target.lm_head.weight
    vocab = draft_vocab if draft_vocab is not None else torch.arange(w.shape[0])
    K = heads.num_heads
    top1, top5, chain, total = [0] * K, [0] * K, [0] * K, 0
    for batch in batches:
        base = batch.response & batch.valid  # (B, L)
        hidden = heads(batch.features)  # (B, L, K, H)
        logits = torch.zeros(*base.shape, heads.num_heads, len(vocab))  # (B, L, K, Vd), filled where needed
        logits[base] = heads.logits(hidden[base][None], w, vocab)[0]
        length = batch.tokens.shape[1]
        truth_all = torch.full(base.shape, -1)  # (B, L) target's next token after each position
        real = batch.valid
        truth_all[real] = (batch.features[real] @ w.T).argmax(-1)
        ok_chain = base.clone()
        for k in range(K):
            truth = torch.full_like(truth_all, -1)
            truth[:, : length - 1 - k] = truth_all[:, 1 + k :]  # x_{t+2+k}
            mask = base.clone()
            mask[:, length - 1 - k :] = False
            mask[:, : length - 1 - k] &= batch.valid[:, 1 + k :]
            best5 = vocab[logits[:, :, k].topk(5, dim=-1).indices]  # (B, L, 5)
            hit1 = best5[..., 0] == truth
            ok_chain &= hit1 & mask
            if k == 0:
                total += int(mask.sum())
            top1[k] += int((hit1 & mask).sum())
            top5[k] += int(((best5 == truth[..., None]).any(-1) & mask).sum())
            chain[k] += int(ok_chain.sum())
    norm = max(1, total)
    return {"top1": [round(c / norm, 4) for c in top1], "top5": [round(c / norm, 4) for c in top5],
            "chain": [round(c / norm, 4) for c in chain], "positions": total}


def train_medusa(cfg: TrainConfig, target=None) -> dict:
    from .common import set_seed
    from .eagle import load_training_data
    from .loop import eval_batches, train
    from .report import save_trained

    set_seed(cfg.seed)
    target, train_set, val_set, vocab, coverage = load_training_data(cfg, target)
    w_vocab = target.lm_head.weight[vocab]
    heads = MedusaHeads(target.config, cfg.medusa_heads, cfg.medusa_layers)
    heads.draft_vocab = vocab
    baseline = evaluate(heads, target, eval_batches(val_set, cfg), vocab)  # identity blocks = the target's LM head
    history = train(cfg, heads, make_step_loss(heads, w_vocab, cfg), train_set)
    extra = {"target": "smollm2-135m", "draft_vocab_size": len(vocab), "draft_vocab_coverage": round(coverage, 4),
             "draft_vocab_order": "frequency", "projection": "the target's LM head (tied embedding), rows draft_vocab"}
    notes = [
        f"Heads: {cfg.medusa_heads} heads x {cfg.medusa_layers} residual block(s) x + SiLU(Linear(x)), zero-initialised "
        f"(identity), sharing the target's frozen LM head; {sum(p.numel() for p in heads.parameters())} parameters.",
        "Convention: head k at position t predicts x_(t+2+k) (x_(t+1) comes from the target's own LM head).",
        f"Loss: soft CE against the target's distribution at t+1+k over the {len(vocab)}-token draft vocabulary "
        f"(covers {coverage:.2%} of the held-out response tokens), weight {cfg.medusa_decay}^k; response positions only.",
        "Shipped fp16; validation numbers are measured before and after rounding to fp16.",
    ]
    untrained = "untrained (identity blocks: every head repeats the target's next-token guess)"
    metrics = save_trained(cfg, heads, lambda: evaluate(heads, target, eval_batches(val_set, cfg), vocab),
                           (untrained, baseline), history, "Medusa heads for SmolLM2-135M-Instruct", extra, notes)
    log.info("medusa: %s", metrics)
    return metrics
