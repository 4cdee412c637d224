"""The drafters: one module per topology, each with its Drafter and a `build(models, k, options)` that checks
its own options; this registry turns a name (with options: 'eagle2:lookup=4') into a fresh drafter for one run.

    base.py         the interface (propose / observe, the acceptance rule a drafter brings) and `none`
    ngram.py        prompt lookup                   draft_model.py  an independent small draft model
    medusa.py       Medusa heads, a fixed tree      eagle.py        an EAGLE head growing the EAGLE-2 dynamic tree
    eagle3.py       an EAGLE-3 head (three fused target layers) on the same tree
    options.py      the spec parser, option types, the draft vocabulary
"""
from __future__ import annotations

from specviz.drafters import base, draft_model, eagle, eagle3, medusa, ngram
from specviz.drafters.base import Drafter, DraftRequest, NoDraft, Outcome
from specviz.drafters.options import EAGLE_DRAFT_VOCAB, check_types, default_draft_vocab, draft_vocabulary, parse_spec
from specviz.errors import SpecvizError

# name -> build(models, k, options): the drafter for one run
BUILDERS = {"none": base.build, "ngram": ngram.build, "draft": draft_model.build, "medusa": medusa.build,
            "eagle2": eagle.build, "eagle3": eagle3.build}
DRAFTERS = tuple(BUILDERS)
NEEDS = {"draft": "draft", "medusa": "medusa", "eagle2": "eagle", "eagle3": "eagle3"}  # the part of LoadedModels a drafter needs


def available(models) -> list[str]:
    """The drafters that can run on these models (the draft model and heads may be missing)."""
    return [name for name in DRAFTERS if name not in NEEDS or getattr(models, NEEDS[name], None) is not None]


def variants(models) -> list[str]:
    """Variants worth running beside the plain drafters by default (the bench, the race, the Benchmarks page):
    the draft chain with its adaptive stop (among the fastest at temperature 1 in docs/performance.md, and faster
    than a fixed K at 0; the plain `draft` keeps a fixed K, as transformers' assisted generation does) and EAGLE-2
    with prompt lookup grafted onto its tree (the fastest there at temperature 0)."""
    ready = available(models)
    return [v for v, base in (("draft:adaptive=true", "draft"), ("eagle2:lookup=4", "eagle2")) if base in ready]


def make_drafter(name: str, models, k: int = 4, options: dict | None = None) -> Drafter:
    """models: a specviz.models.LoadedModels (target, draft, heads ...). options: drafter-specific settings.

    name may carry options itself ('eagle2:total_tokens=16', see parse_spec); `options` override them."""
    name, spec_options = parse_spec(name)
    options = {**spec_options, **(options or {})}
    check_types(name, options)
    k = options.pop("k", k)
    if k < 1:
        raise SpecvizError(f"k (draft length) must be >= 1, got {k}")
    if name not in BUILDERS:
        raise SpecvizError(f"unknown drafter '{name}'; choose one of: {', '.join(DRAFTERS)}")
    return BUILDERS[name](models, k, options)


__all__ = ["BUILDERS", "DRAFTERS", "EAGLE_DRAFT_VOCAB", "DraftRequest", "Drafter", "NoDraft", "Outcome", "available",
           "default_draft_vocab", "draft_vocabulary", "make_drafter", "parse_spec", "variants"]
