"""Train an EAGLE-3 head on cached target features, with training-time test.

At position t the head reads g_t, the inputs of three target layers side by side (the data job's aux_features),
and emb(x_{t+1}); q at t should match the target's p_{t+1} = softmax(lm_head(f_{t+1})), f the final normed hidden
state. There is no feature-regression loss (EAGLE-3 drops it): only the soft cross-entropy against p, over the
draft vocabulary.

Training-time test (`unroll` = S draft steps): step 0 is the pass above over the whole sequence. Step k feeds the
head's own step-(k-1) output from position s-1 in place of the fused feature at s (with the true token x_{s+1}),
exactly what the drafter does k tokens deep, and its entry at s sees what a depth-(k+1) node sees when drafting:
the true entries at positions <= s-k, and its own chain's entries, step i at position s-k+i (i = 1..k). Every step
predicts the same token at s; step k's loss weighs step_decay**k and counts positions s >= k.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import torch

from specviz.models.eagle3 import Eagle3Head

from .loop import Batch, TrainConfig

log = logging.getLogger("specviz.train.eagle3")


def step_mask(length: int, step: int, dtype) -> torch.Tensor:
    """Additive mask of draft step `step` >= 1: queries are its L entries, keys the L entries of each of the steps
    0..step (step 0 the true features), side by side. Entry s sees step 0 at j <= s - step and step i at
    j = s - step + i. (1, 1, L, (step + 1) · L)"""
    s = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    blocks = [j <= s - step] + [j == s - step + i for i in range(1, step + 1)]
    allowed = torch.cat(blocks, dim=1)
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, float("-inf"))[None, None]


def unrolled(head: Eagle3Head, fused, embeds, positions, steps: int) -> list[torch.Tensor]:
    """[h of step 0, ..., h of step steps-1], each (B, T, H) before the head's final norm. fused (B, T, 3·H) the
    target's features at t, embeds (B, T, H) of x_{t+1}, positions (B, T)."""
    h, past = head(fused, embeds, positions)
    outs = [h]
    for k in range(1, steps):
        fed = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)  # step k-1's output from s - 1
        h, past = head(fed, embeds, positions, past, step_mask(fed.shape[1], k, fed.dtype))
        outs.append(h)
    return outs


def shifted(batch: Batch):
    """The head's inputs at t = 0..L-2 (fused features, next tokens, positions), the targets f_{t+1}, and the loss
    positions: t+1 real and t >= P - 1 (x_{t+2} a response token after the first; the same positions the EAGLE-2
    head is judged on)."""
    if batch.aux is None:
        raise ValueError("these sequences have no auxiliary layer features; make the data with --aux-layers eagle3")
    return (batch.aux[:, :-1], batch.tokens[:, 1:], batch.position_ids[:, :-1], batch.features[:, 1:],
            batch.valid[:, 1:] & batch.response[:, :-1])


def make_step_loss(head: Eagle3Head, embed, w_loss, cfg: TrainConfig):
    """Σ_k step_decay**k · CE(p, q_k) over the loss vocabulary rows w_loss (Vl, H), on the loss positions."""

    def step_loss(batch: Batch):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            return losses(batch)

    def losses(batch: Batch):
        fused, next_tokens, pos, targets, mask = shifted(batch)
        outs = unrolled(head, fused, embed(next_tokens), pos, cfg.unroll)
        total, stats = 0.0, {}
        later = torch.arange(mask.shape[1])
        for k, h in enumerate(outs):
            m = mask & (later >= k)  # a step-k chain starts k positions back
            if not bool(m.any()):  # no loss position this deep in this batch
                continue
            with torch.no_grad(), torch.autocast("cpu", enabled=False):  # the teacher's p in fp32, whatever runs
                p = torch.softmax(targets[m].float() @ w_loss.float().T, dim=-1)  # (N, Vl)
            logq = torch.log_softmax(head.norm(h[m]) @ w_loss.T, dim=-1)
            ce = -(p * logq).sum(-1).mean()
            total = total + cfg.step_decay ** k * ce
            stats[f"ploss{k}"] = ce.item()
            stats[f"acc{k}"] = (logq.argmax(-1) == p.argmax(-1)).float().mean().item()
        return total, stats

    return step_loss


@torch.no_grad()
def evaluate(head: Eagle3Head, target, batches, steps: int = 3) -> dict:
    """Greedy agreement with the target on response positions, the measures the EAGLE-2 head is judged by.

    acc1: argmax q at depth 1 (over the draft vocabulary, mapped by d2t) equals the target's argmax p (over its
    whole vocabulary). acc2_given1: at depth 2 given depth 1 was right at s-1 (the chance a second drafted token
    is accepted); acc3_given2: at depth 3 given depths 1 and 2 were right."""
    embed, w = target.get_input_embeddings(), target.lm_head.weight
    ids = head.draft_ids()
    w_draft = head.lm_head.weight if head.lm_head is not None else w[ids]
    right, total = [0] * steps, [0] * steps
    for batch in batches:
        fused, next_tokens, pos, targets, mask = shifted(batch)
        outs = unrolled(head, fused, embed(next_tokens), pos, steps)
        truth = (targets @ w.T).argmax(-1)  # (B, T) the target's token x_{t+2}
        chain = mask.clone()  # depths 1..k right along the chain that ends at s
        for k, h in enumerate(outs):
            ok = ids[(head.norm(h) @ w_draft.T).argmax(-1)] == truth
            if k:
                chain = mask & torch.cat([torch.zeros_like(chain[:, :1]), chain[:, :-1]], dim=1)
            total[k] += int(chain.sum())
            right[k] += int((chain & ok).sum())
            chain = chain & ok
    names = ["acc1", "acc2_given1", "acc3_given2"][:steps]
    return {**{n: c / max(1, t) for n, c, t in zip(names, right, total)}, "positions": total[0]}


def eagle2_baseline(target, val_set, cfg: TrainConfig) -> tuple[str, dict] | None:
    """The shipped EAGLE-2 head on the same held-out sequences (its trained draft vocabulary), for comparison."""
    from specviz.paths import ASSETS

    from .eagle import evaluate as evaluate_eagle2
    from .loop import eval_batches

    folder = ASSETS / "eagle-smollm2-135m"
    if Path(cfg.model_path).name != "smollm2-135m" or not (folder / "model.safetensors").is_file():
        return None
    from specviz.models.heads import EagleHead

    head = EagleHead.load(folder, target.config).float().eval()
    return f"EAGLE-2 head (assets/{folder.name})", evaluate_eagle2(head, target, eval_batches(val_set, cfg),
                                                                    head.draft_vocab)


def draft_mapping(vocab: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) of a draft vocabulary `vocab` (target ids), its draft ids in ascending target-id order as the
    published heads have them: draft id i is target token i + d2t[i]."""
    ids = vocab.sort().values
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(len(ids)), t2d


def new_head(target, aux_layers, vocab: torch.Tensor) -> Eagle3Head:
    """A random head for `target`: one layer of the target's own shape, the target's LM head rows reused."""
    cfg = target.config
    layer = dict(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                 num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                 head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
                 vocab_size=cfg.vocab_size, rms_norm_eps=cfg.rms_norm_eps,
                 max_position_embeddings=cfg.max_position_embeddings, hidden_act=cfg.hidden_act,
                 rope_parameters=dict(cfg.rope_parameters))  # the target's rotary base and scaling
    head = Eagle3Head(layer, cfg.hidden_size, len(vocab), aux_layers, own_lm_head=False)
    d2t, t2d = draft_mapping(vocab, cfg.vocab_size)
    head.d2t.copy_(d2t)
    head.t2d.copy_(t2d)
    return head


def train_eagle3(cfg: TrainConfig, target=None) -> dict:
    from .common import load_target, set_seed
    from .data import read_index, token_counts
    from .eagle import load_training_data
    from .loop import eval_batches, train
    from .report import save_trained

    if cfg.unroll < 1:
        raise ValueError("unroll (training-time test steps) must be >= 1")
    set_seed(cfg.seed)
    target = target if target is not None else load_target(cfg.model_path)[0]
    aux_layers = tuple(read_index(Path(cfg.data_dir)).get("config", {}).get("aux_layers") or ())
    if not aux_layers:
        raise ValueError(f"{cfg.data_dir} has no auxiliary layer features; make the data with "
                         "`specviz train data --aux-layers eagle3`")
    if cfg.init:  # go on training a head made before (its weights and draft vocabulary)
        head = Eagle3Head.load(cfg.init, target.config).float()
        if head.lm_head is not None:
            raise ValueError(f"{cfg.init} has its own LM head; training here scores q with the target's LM head rows "
                             "and would leave it untrained")
        if head.aux_layers != aux_layers:
            raise ValueError(f"{cfg.init} fuses layers {head.aux_layers}; the data has {aux_layers}")
        target, train_set, val_set, vocab, coverage = load_training_data(cfg, target, head.draft_ids())
        vocab = vocab[token_counts(cfg.data_dir)[vocab].argsort(descending=True)]  # frequency order, for loss_rows
    else:
        target, train_set, val_set, vocab, coverage = load_training_data(cfg, target)
        head = new_head(target, aux_layers, vocab)
    loss_rows = vocab[: cfg.loss_vocab] if cfg.loss_vocab else vocab  # frequency order: a prefix is the most frequent
    embed, w_loss = target.get_input_embeddings(), target.lm_head.weight[loss_rows]
    baseline = eagle2_baseline(target, val_set, cfg)
    # the head it starts from (or a random one), judged on these held-out sequences before any step
    start, label = (head, f"initial head ({cfg.init})") if cfg.init else (new_head(target, aux_layers, vocab), "random head")
    before = (label, evaluate(start.eval(), target, eval_batches(val_set, cfg)))
    earlier = None
    if cfg.init:  # how the starting head was made, read now (--out may be the same folder), its title dropped
        made = Path(cfg.init, "PROVENANCE.md")
        earlier = (made.read_text().replace("\n#", "\n##").split("\n", 1)[-1] if made.is_file()
                   else f"(no PROVENANCE.md in {cfg.init})\n")
    log.info("eagle3: %s %s; draft vocab %d covers %.4f of response tokens", *before, len(vocab), coverage)
    shipped = Path(cfg.out, "model.safetensors")
    previous = None
    if shipped.is_file():  # ship if better: the head already in --out, judged on the same held-out sequences
        there = Eagle3Head.load(cfg.out, target.config).float().eval()
        if there.aux_layers == aux_layers:  # a head over other layers cannot be judged on these features
            previous = evaluate(there, target, eval_batches(val_set, cfg))
    history = train(cfg, head, make_step_loss(head, embed, w_loss, cfg), train_set)
    candidate = evaluate(head, target, eval_batches(val_set, cfg))
    if previous is not None and expected_length(candidate) <= expected_length(previous):
        out = str(Path(cfg.work_dir) / "eagle3" / "not-shipped")
        log.info("eagle3: %s does not beat the head in %s (%s); written to %s instead", candidate, cfg.out,
                 previous, out)
        cfg = replace(cfg, out=out)
    extra = {"target": Path(cfg.model_path).name, "draft_vocab_size": len(vocab),
             "draft_vocab_coverage": round(coverage, 4), "feature": f"inputs of target layers {list(aux_layers)}",
             "training_time_test_steps": cfg.unroll}
    notes = [
        f"Head: EAGLE-3 layout (speculators), fc(3 x {target.config.hidden_size} -> {target.config.hidden_size}) over "
        f"the inputs of target layers {list(aux_layers)}, one decoder layer over [input_norm(emb) ; hidden_norm(x)], "
        f"final norm; {sum(p.numel() for p in head.parameters())} parameters; the target's embedding and its LM "
        "head rows at the draft ids reused, not stored.",
        "Loss: soft CE(p, q) only (no feature regression) over "
        + (f"the {len(loss_rows)} most frequent tokens of the " if len(loss_rows) < len(vocab) else "the ")
        + f"{len(vocab)}-token draft vocabulary (the most frequent tokens of the training prompts and responses, "
        f"+ eos; it covers {coverage:.2%} of the held-out response tokens); loss on response positions only.",
        f"Training-time test: {cfg.unroll} draft steps, step k fed the head's own step-(k-1) output and weighted "
        f"{cfg.step_decay}^k." + (" The head's products under bf16 autocast (weights, optimizer state and the "
                                   "target's p in fp32)." if cfg.bf16 else ""),
        "Shipped fp16; the validation numbers below are measured both before and after rounding to fp16"
        + (f", beside the {baseline[0]} on the same held-out sequences (its acc3_given2 is not measured)."
           if baseline else "."),
    ]
    if cfg.init:
        notes.insert(0, f"Started from the head in `{cfg.init}` (its weights and draft vocabulary; fresh optimizer "
                        "state and learning-rate schedule); how that one was made is appended below.")
    if previous is not None:
        notes.append(f"The head that was in {shipped.parent} before: {previous}.")
    metrics = save_trained(cfg, head, lambda: evaluate(head, target, eval_batches(val_set, cfg)), before, history,
                           "EAGLE-3 head for SmolLM2-135M-Instruct", extra, notes, fp32=candidate)
    if baseline:
        metrics[baseline[0]] = baseline[1]
        add_to_provenance(Path(cfg.out), baseline)
    if earlier is not None:  # keep the chain: how the starting head was made
        path = Path(cfg.out, "PROVENANCE.md")
        path.write_text(path.read_text() + "\n## How the initial head was made\n\n" + earlier)
    log.info("eagle3: %s", metrics)
    return metrics


def expected_length(metrics: dict) -> float:
    """The chain's expected accepted tokens from the per-depth agreement (1 + a1 + a1·a2 + a1·a2·a3 ...)."""
    total, run = 1.0, 1.0
    for key in ("acc1", "acc2_given1", "acc3_given2"):
        if key in metrics:
            run *= metrics[key]
            total += run
    return total


def add_to_provenance(folder: Path, baseline: tuple[str, dict]) -> None:
    import json

    path = folder / "PROVENANCE.md"
    text = path.read_text()
    path.write_text(text.replace("## Command", f"Beside it, the {baseline[0]} on the same held-out sequences:\n\n"
                                 f"```json\n{json.dumps(baseline[1], indent=2)}\n```\n\n## Command", 1))
