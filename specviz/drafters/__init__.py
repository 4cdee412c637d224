"""Drafter registry: a name → a fresh drafter for one run."""
from __future__ import annotations

from specviz.drafters.base import Drafter, DraftRequest, NoDraft, Outcome
from specviz.drafters.draft_model import DraftModelDrafter
from specviz.drafters.eagle import EagleDrafter, TreeShape
from specviz.drafters.medusa import MedusaDrafter
from specviz.drafters.ngram import NgramDrafter
from specviz.costs import forward_latency, interpolate
from specviz.errors import SpecvizError

DRAFTERS = ("none", "ngram", "draft", "medusa", "eagle2")


def available(models) -> list[str]:
    """The drafters that can run on these models (the draft model and heads may be missing)."""
    names = ["none", "ngram"]
    for name, part in (("draft", "draft"), ("medusa", "medusa"), ("eagle2", "eagle")):
        if getattr(models, part, None) is not None:
            names.append(name)
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
    if name in ("eagle2", "medusa"):
        part = "eagle" if name == "eagle2" else "medusa"
        heads = getattr(models, part, None)
        if heads is None:
            raise SpecvizError(f"no {name} head is available for '{models.name}'; train one with `python -m specviz train {part}`")
        if name == "medusa":
            options.setdefault("total_tokens", "auto")  # the fixed tree, cut to what pays off on this machine
            cost = interpolate(forward_latency(models.target)) if options["total_tokens"] == "auto" else None
            return MedusaDrafter(heads, models.target, draft_vocab=heads.draft_vocab, verify_cost=cost, **options)
        shape = TreeShape(**{key: options.pop(key) for key in ("depth", "top_k", "total_tokens") if key in options})
        if options:
            raise SpecvizError(f"unknown eagle2 options: {', '.join(options)}")
        cost = interpolate(forward_latency(models.target)) if shape.total_tokens == "auto" else None
        return EagleDrafter(heads, models.target, shape, draft_vocab=heads.draft_vocab, verify_cost=cost)
    raise SpecvizError(f"unknown drafter '{name}'; choose one of: {', '.join(DRAFTERS)}")


__all__ = ["DRAFTERS", "available", "Drafter", "DraftRequest", "NoDraft", "Outcome", "make_drafter"]
