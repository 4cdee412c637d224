"""Train the EAGLE head on cached target features.

At position t the head reads (f_t, emb(x_{t+1})) and regresses f_{t+1}. Loss, as the reference
(SafeAILab/EAGLE `eagle/train/main.py`): SmoothL1(prediction, f_{t+1}) + p_weight * CE(p, q), where p is the target's
distribution softmax(lm_head(f_{t+1})) and q the head's softmax(lm_head(prediction)); here both over the reduced
draft vocabulary (the drafter uses that vocabulary too). Input features get uniform noise, as the reference does.

Depth 2 (`unroll=2`, and always in the evaluation): the head's own prediction f^_{t+1} is fed back at position t+1
with emb(x_{t+2}), attending to the true-feature entries of positions <= t through a 4D mask, exactly what it
sees when drafting a second token.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from specviz.models.heads import EagleHead

from .loop import Batch, TrainConfig

log = logging.getLogger("specviz.train.eagle")


def shift_inputs(batch: Batch):
    """Head inputs at t = 0..L-2 and its targets f_{t+1}."""
    feats = batch.features[:, :-1]  # (B, L-1, H) f_t
    next_tokens = batch.tokens[:, 1:]  # (B, L-1) x_{t+1}
    targets = batch.features[:, 1:]  # (B, L-1, H) f_{t+1}
    mask = batch.valid[:, 1:] & batch.response[:, :-1]  # (B, L-1) loss positions: t >= P-1 and t+1 real
    return feats, next_tokens, targets, batch.position_ids[:, :-1], mask


def depth2_mask(batch: int, length: int, dtype) -> torch.Tensor:
    """Queries are the L fed-back entries; keys are L cached true entries then the L new ones.

    Fed-back entry s (feature f^_s predicted at s-1) sees true entries j <= s-1 and itself. (B, 1, L, 2L)
    """
    s = torch.arange(length)[:, None]  # (L, 1)
    j = torch.arange(length)[None, :]  # (1, L)
    sees_true = j <= s - 1
    sees_new = j == s
    allowed = torch.cat([sees_true, sees_new], dim=1)  # (L, 2L)
    mask = torch.zeros(length, 2 * length, dtype=dtype).masked_fill(~allowed, float("-inf"))
    return mask[None, None].expand(batch, 1, length, 2 * length)


def run_depths(head: EagleHead, embed, feats, next_tokens, pos, depth: int, noise: float = 0.0):
    """[depth-1 predictions, depth-2 predictions, ...] each (B, L-1, H); depth k+1 at s uses depth k at s-1."""
    inputs = feats + noise * (torch.rand_like(feats) - 0.5) if noise > 0 else feats
    emb = embed(next_tokens)  # (B, L-1, H)
    cache = DynamicCache() if depth > 1 else None
    outs = [head(inputs, emb, pos, past_key_values=cache)]
    for _ in range(1, depth):
        fed = torch.cat([outs[-1][:, :1] * 0, outs[-1][:, :-1]], dim=1)  # (B, L-1, H) f^_s from s-1
        mask = depth2_mask(fed.shape[0], fed.shape[1], fed.dtype)
        step_cache = DynamicCache()  # fresh copy of the true entries' keys for each depth
        step_cache.update(*cache_layer(cache), 0)
        outs.append(head(fed, emb, pos, past_key_values=step_cache, attention_mask=mask))
    return outs


def cache_layer(cache: DynamicCache) -> tuple[torch.Tensor, torch.Tensor]:
    layer = cache.layers[0]
    return layer.keys, layer.values


def eagle_losses(pred, targets, mask, w_vocab, p_weight: float):
    """SmoothL1 on features + p_weight * soft CE over the draft vocabulary, averaged over loss positions."""
    pred, targets = pred[mask], targets[mask]  # (N, H): only loss positions pay for the vocabulary matmul
    vloss = F.smooth_l1_loss(pred, targets, reduction="none").mean(-1).mean()
    with torch.no_grad():
        p = torch.softmax(targets @ w_vocab.T, dim=-1)  # (N, Vd)
    logq = torch.log_softmax(pred @ w_vocab.T, dim=-1)  # (N, Vd)
    ploss = -(p * logq).sum(-1).mean()
    with torch.no_grad():
        agree = (logq.argmax(-1) == p.argmax(-1)).float().mean()
    return vloss + p_weight * ploss, {"vloss": vloss.item(), "ploss": ploss.item(), "acc": agree.item()}


def make_step_loss(head: EagleHead, embed, w_vocab, cfg: TrainConfig):
    def step_loss(batch: Batch):
        feats, next_tokens, targets, pos, mask = shift_inputs(batch)
        outs = run_depths(head, embed, feats, next_tokens, pos, cfg.unroll, cfg.noise)
        total, stats = eagle_losses(outs[0], targets, mask, w_vocab, cfg.p_weight)
        for d, pred in enumerate(outs[1:], start=2):
            m2 = mask & (torch.arange(mask.shape[1]) >= 1)  # depth 2 needs a prediction from s-1
            loss_d, stats_d = eagle_losses(pred, targets, m2, w_vocab, cfg.p_weight)
            total = total + loss_d
            stats.update({f"{k}{d}": v for k, v in stats_d.items()})
        return total, stats

    return step_loss


@torch.no_grad()
def evaluate(head: EagleHead, target, batches, draft_vocab: torch.Tensor | None) -> dict:
    """Greedy agreement with the target on response positions.

    acc1: argmax q at depth 1 equals the target's next token argmax p. acc2_given1: depth 2 equals the target's
    token given depth 1 was right (the chance a second drafted token is accepted). Argmax over the draft vocabulary.
    """
    embed, w = target.get_input_embeddings(), target.lm_head.weight
    vocab = draft_vocab if draft_vocab is not None else torch.arange(w.shape[0])
    w_vocab = w[vocab]
    n1 = c1 = n2 = c2 = 0
    for batch in batches:
        feats, next_tokens, targets, pos, mask = shift_inputs(batch)
        out1, out2 = run_depths(head, embed, feats, next_tokens, pos, depth=2)
        truth = torch.full(mask.shape, -1)  # (B, L-1) target token at t+2 (full vocabulary), on loss positions
        truth[mask] = (targets[mask] @ w.T).argmax(-1)
        d1 = torch.zeros_like(mask)
        d1[mask] = vocab[(out1[mask] @ w_vocab.T).argmax(-1)] == truth[mask]  # (B, L-1)
        d2 = torch.zeros_like(mask)
        d2[mask] = vocab[(out2[mask] @ w_vocab.T).argmax(-1)] == truth[mask]
        n1 += int(mask.sum())
        c1 += int((d1 & mask).sum())
        prev_ok = torch.cat([torch.zeros_like(d1[:, :1]), d1[:, :-1]], dim=1)  # depth 1 right at s-1
        m2 = mask & prev_ok
        n2 += int(m2.sum())
        c2 += int((d2 & m2).sum())
    return {"acc1": c1 / max(1, n1), "acc2_given1": c2 / max(1, n2), "positions": n1}


def load_training_data(cfg: TrainConfig, target=None, vocab: torch.Tensor | None = None):
    """(target, train set, val set, draft vocabulary, coverage of the response tokens by that vocabulary).

    The vocabulary is `vocab` when given (a head trained before brings its own), else the data's most frequent
    tokens."""
    from .common import load_target
    from .data import load_split, training_vocabulary

    target = target if target is not None else load_target(cfg.model_path)[0]
    train_set, val_set = load_split(cfg.data_dir, "train"), load_split(cfg.data_dir, "val")
    if vocab is None:
        vocab = training_vocabulary(cfg.data_dir, cfg.draft_vocab_size)
    val_counts = torch.bincount(val_set.tokens[response_positions(val_set)], minlength=target.config.vocab_size)
    coverage = float(val_counts[vocab].sum() / val_counts.sum())  # of held-out response tokens
    return target, train_set, val_set, vocab, coverage


def response_positions(data) -> torch.Tensor:
    """Indices into `data.tokens` of every response token. (N,)"""
    return torch.cat([torch.arange(int(a) + int(p), int(b)) for a, b, p in
                      zip(data.offsets[:-1], data.offsets[1:], data.prompt_lens)])


def initial_head(cfg: TrainConfig, target) -> EagleHead:
    """A random head, or the one in `cfg.init` with its draft vocabulary (a fresh head's is None until chosen)."""
    if not cfg.init:
        return EagleHead(target.config)
    head = EagleHead.load(cfg.init, target.config)
    if head.draft_vocab is None:
        raise ValueError(f"{cfg.init} has no draft vocabulary to go on training it with")
    return head


def train_eagle(cfg: TrainConfig, target=None) -> dict:
    from .common import load_target, set_seed
    from .loop import eval_batches, train
    from .report import save_trained

    assert cfg.unroll in (1, 2), "unroll beyond depth 2 is not implemented"
    set_seed(cfg.seed)
    target = target if target is not None else load_target(cfg.model_path)[0]
    head = initial_head(cfg, target)
    target, train_set, val_set, vocab, coverage = load_training_data(cfg, target, head.draft_vocab)
    head.draft_vocab = vocab
    loss_rows = vocab[: cfg.loss_vocab] if cfg.loss_vocab else vocab  # frequency order: a prefix is the most frequent
    embed, w_vocab = target.get_input_embeddings(), target.lm_head.weight[loss_rows]
    before_name, before_head = (f"initial head ({cfg.init})", head) if cfg.init else ("random head", EagleHead(target.config))
    before = (before_name, evaluate(before_head.eval(), target, eval_batches(val_set, cfg), vocab))
    log.info("eagle: %s %s; draft vocab %d covers %.4f of response tokens", *before, len(vocab), coverage)
    earlier = Path(cfg.init or ".", "PROVENANCE.md")  # read now: --out may be the same folder
    earlier = earlier.read_text() if cfg.init and earlier.exists() else f"(no PROVENANCE.md in {cfg.init})\n"
    history = train(cfg, head, make_step_loss(head, embed, w_vocab, cfg), train_set)
    extra = {"target": "smollm2-135m", "draft_vocab_size": len(vocab), "draft_vocab_coverage": round(coverage, 4),
             "draft_vocab_order": "frequency",
             "feature": "target final hidden state (after the final norm)", "input": "fc(cat(embedding, feature))"}
    notes = [
        f"Head: EAGLE-1/2 layout, fc(cat(emb(x_(t+1)), f_t)) + 1 decoder layer without input norm, no final norm; "
        f"{sum(p.numel() for p in head.parameters())} parameters; target embedding and LM head reused, not stored.",
        f"Loss: SmoothL1(f^_(t+1), f_(t+1)) + {cfg.p_weight} x soft CE(p, q) over "
        + (f"the {len(loss_rows)} most frequent tokens of the " if len(loss_rows) < len(vocab) else "the ")
        + f"{len(vocab)}-token draft vocabulary (the most frequent tokens of the training prompts and responses, "
        f"unseen ones by id, + eos; it covers {coverage:.2%} of the held-out response tokens); "
        f"uniform input-feature noise U(-{cfg.noise / 2}, {cfg.noise / 2}); loss on response positions only.",
        f"Depth-2 training (feeding the head's own prediction back): {'yes' if cfg.unroll == 2 else 'no'}.",
        "Shipped fp16; the validation numbers below are measured both before and after rounding to fp16.",
    ]
    if cfg.init:
        notes.insert(0, f"Started from the head in `{cfg.init}` (its weights and its draft vocabulary; fresh optimizer "
                        "state and learning-rate schedule); how that one was made is appended below.")
        extra["initialised_from"] = cfg.init
    metrics = save_trained(cfg, head, lambda: evaluate(head, target, eval_batches(val_set, cfg), vocab),
                           before, history, "EAGLE head for SmolLM2-135M-Instruct", extra, notes)
    if cfg.init:  # keep the chain: how the starting head was made
        path = Path(cfg.out, "PROVENANCE.md")
        path.write_text(path.read_text() + "\n## How the initial head was made\n\n" +
                        earlier.replace("\n#", "\n##").split("\n", 1)[-1])
    log.info("eagle: %s", metrics)
    return metrics
