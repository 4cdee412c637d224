"""Drafter registry: a name → a fresh drafter for one run."""
from __future__ import annotations

from specviz.drafters.base import Drafter, DraftRequest, NoDraft, Outcome
from specviz.drafters.draft_model import DraftModelDrafter
from specviz.drafters.ngram import NgramDrafter
from specviz.errors import SpecvizError

DRAFTERS = ("none", "ngram", "draft")


def available(models) -> list[str]:
    """The drafters that can run on these models (the draft model and heads may be missing)."""
    names = ["none", "ngram"]
    if getattr(models, "draft", None) is not None:
        names.append("draft")
    return names


def make_drafter(name: str, models, k: int = 4, options: dict | None = None) -> Drafter:
    """models: a specviz.models.LoadedModels (target, draft, heads ...). options: drafter-specific settings."""
    options = dict(options or {})
    if k < 1:
        raise SpecvizError(f"k (draft length) must be >= 1, got {k}")
    if name == "none":
        return NoDraft()
    if name == "ngram":
        return NgramDrafter(k=k, **options)
    if name == "draft":
        if getattr(models, "draft", None) is None:
            raise SpecvizError(
                f"no draft model is set for '{models.name}': pass --draft-model PATH_OR_ID "
                "(or draft_model=... in the API), or pick another drafter"
            )
        return DraftModelDrafter(models.draft, k=k, vocab_size=models.vocab_size, **options)
    raise SpecvizError(f"unknown drafter '{name}'; choose one of: {', '.join(DRAFTERS)}")


__all__ = ["DRAFTERS", "available", "Drafter", "DraftRequest", "NoDraft", "Outcome", "make_drafter"]
