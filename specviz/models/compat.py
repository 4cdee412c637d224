"""What a model must satisfy to run in specviz: logits = lm_head(hidden), and a draft that shares the target's
vocabulary."""
from __future__ import annotations

import torch

from specviz.errors import SpecvizError

# Config fields of models whose logits are not plain lm_head(hidden) (Gemma-2's softcapping, Cohere's scale, …)
LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def logit_postprocessing(config) -> str | None:
    """The config field that post-processes this model's logits, or None when logits = lm_head(hidden)."""
    for name in LOGIT_POSTPROCESSING:
        if getattr(config, name, None) not in (None, 1, 1.0):
            return name
    return None


def embedding_rows(model: torch.nn.Module) -> int:
    """Token ids a model can read and score: rows of its input embedding (and of its output head, if any)."""
    rows = model.get_input_embeddings().weight.shape[0]
    head = model.get_output_embeddings()
    if head is not None:
        rows = min(rows, head.weight.shape[0])
    return rows


def shared_vocab_size(target: torch.nn.Module, draft: torch.nn.Module | None) -> int:
    """Ids both models score; embeddings are often padded (e.g. to a multiple of 64), differently per model."""
    rows = embedding_rows(target)
    return rows if draft is None else min(rows, embedding_rows(draft))


def first_difference(vocab: dict[str, int], other: dict[str, int]) -> str:
    """Describe the lowest token id where two vocabularies disagree."""
    by_id, other_by_id = ({i: t for t, i in v.items()} for v in (vocab, other))
    for token_id in range(max(len(by_id), len(other_by_id), max(by_id, default=0) + 1)):
        mine, theirs = by_id.get(token_id), other_by_id.get(token_id)
        if mine != theirs:
            return f"first difference at id {token_id}: target {mine!r}, draft {theirs!r}"
    return "same ids, but different tokens map to them"


def check_same_vocabulary(target: torch.nn.Module, draft: torch.nn.Module, tokenizer, draft_tokenizer) -> None:
    """Speculative decoding compares p and q token by token, so both models must use one vocabulary.

    Decided: the tokenizers must map the same strings to the same ids (draft_tokenizer None skips this),
    and each model's embedding must have a row for every id the tokenizer produces. Rows beyond that are
    padding, and the two models may pad differently; `shared_vocab_size` gives the width to compare on.
    """
    vocab = tokenizer.get_vocab()
    if draft_tokenizer is not None:
        draft_vocab = draft_tokenizer.get_vocab()
        if draft_vocab != vocab:
            raise SpecvizError(
                f"the draft's tokenizer differs from the target's: target has {len(vocab):,} tokens, draft has "
                f"{len(draft_vocab):,}; {first_difference(vocab, draft_vocab)}. "
                "A draft must share the target's vocabulary."
            )
    needed = max(vocab.values(), default=-1) + 1
    for role, model in (("target", target), ("draft", draft)):
        rows = embedding_rows(model)
        if rows < needed:
            raise SpecvizError(
                f"the tokenizer has {needed:,} token ids but the {role} model's embedding has only {rows:,} rows: "
                "the models do not share the tokenizer's vocabulary."
            )
