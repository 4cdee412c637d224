"""Drafter registry: a name → a fresh drafter for one run."""
from __future__ import annotations

from specviz.decoding.costs import interpolate, verify_curve
from specviz.drafters.base import Drafter, DraftRequest, NoDraft, Outcome
from specviz.drafters.draft_model import DraftModelDrafter
from specviz.drafters.eagle import EagleDrafter, TreeShape
from specviz.drafters.medusa import MedusaDrafter
from specviz.drafters.ngram import NgramDrafter
from specviz.errors import SpecvizError

DRAFTERS = ("none", "ngram", "draft", "medusa", "eagle2")


def available(models) -> list[str]:
    """The drafters that can run on these models (the draft model and heads may be missing)."""
    names = ["none", "ngram"]
    for name, part in (("draft", "draft"), ("medusa", "medusa"), ("eagle2", "eagle")):
        if getattr(models, part, None) is not None:
            names.append(name)
    return names


def variants(models) -> list[str]:
    """Variants worth running beside the plain drafters by default (the bench, the race, the Benchmarks page):
    the draft chain with its adaptive stop (the fastest drafter measured here at temperature 1, and faster than
    a fixed K at 0; the plain `draft` keeps a fixed K, as transformers' assisted generation does) and EAGLE-2
    with prompt lookup grafted onto its tree (the fastest at temperature 0)."""
    ready = available(models)
    return [v for v, base in (("draft:adaptive=true", "draft"), ("eagle2:lookup=4", "eagle2")) if base in ready]


def parse_spec(spec: str) -> tuple[str, dict]:
    """'eagle2:draft_vocab=full:total_tokens=32' -> ('eagle2', {'draft_vocab': 'full', 'total_tokens': 32}).

    A drafter with options is a variant that the CLI, the API and the bench can run beside the default one."""
    name, *parts = spec.strip().split(":")
    options: dict = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise SpecvizError(f"drafter option '{part}' in '{spec}' is not KEY=VALUE")
        options[key.strip()] = _option_value(value.strip())
    return name, options


BOOLEANS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
BOOLEAN_OPTIONS = ("adaptive", "early_stop", "typical")
INTEGER_OPTIONS = ("k", "depth", "top_k", "max_ngram", "min_ngram", "lookup")


def _option_value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return BOOLEANS.get(text.lower(), text)


def _check_types(name: str, options: dict) -> None:
    for key, value in options.items():
        if key in BOOLEAN_OPTIONS and not isinstance(value, bool):
            raise SpecvizError(f"{name} option {key} must be true or false, got {value!r}")
        if key in INTEGER_OPTIONS and (isinstance(value, bool) or not isinstance(value, int)):
            raise SpecvizError(f"{name} option {key} must be a whole number, got {value!r}")


# eagle2's default draft vocabulary: the 4,096 most frequent tokens of its trained one (16,384 for the shipped head).
# Side by side in five runs on this machine (README, "Tree budget ..."), τ stayed within 0.01 and the drafter was
# 2-5 % faster: the drafting LM-head product reads a quarter of the bytes. `eagle2:draft_vocab=trained` runs the whole.
EAGLE_DRAFT_VOCAB = 4096


def default_draft_vocab(name: str, heads):
    """The draft_vocab choice a drafter gets when none is given (see EAGLE_DRAFT_VOCAB)."""
    trained = getattr(heads, "draft_vocab", None)
    if name == "eagle2" and trained is not None and len(trained) > EAGLE_DRAFT_VOCAB and not _sorted_by_id(trained):
        return EAGLE_DRAFT_VOCAB
    return "trained"


def _sorted_by_id(vocab) -> bool:
    return len(vocab) > 1 and bool((vocab[1:] > vocab[:-1]).all())


def draft_vocabulary(heads, choice="trained"):
    """The token ids a head may draft: "trained" (what it was trained with), "full" (None: every token), or N
    (the N most frequent, a prefix of a frequency-ordered trained vocabulary)."""
    trained = getattr(heads, "draft_vocab", None)  # a draft model has one only if it was shipped with one
    if choice == "trained":
        return trained
    if choice == "full":
        return None
    if isinstance(choice, int) and not isinstance(choice, bool) and choice > 0:
        if trained is None:
            raise SpecvizError("this drafter has no trained draft vocabulary to take the most frequent tokens from; "
                               "use draft_vocab=full (the default for it)")
        if len(trained) <= choice:
            return trained
        if _sorted_by_id(trained):
            raise SpecvizError("this head's draft vocabulary is sorted by id, not by frequency: draft_vocab=N needs "
                               "a head trained by this version (or use draft_vocab=full / trained)")
        return trained[:choice]
    raise SpecvizError(f"draft_vocab must be 'trained', 'full' or a positive number of tokens, got {choice!r}")


def _construct(cls, name: str, options: dict, *args, **fixed) -> Drafter:
    """cls(*args, **fixed, **options), with a clear message for an option the drafter does not take."""
    import inspect

    parameters = list(inspect.signature(cls).parameters)
    accepted = set(parameters[len(args):]) - set(fixed)  # not the ones given positionally
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise SpecvizError(f"unknown {name} option(s): {', '.join(unknown)}; it takes: {', '.join(sorted(accepted))}")
    return cls(*args, **fixed, **options)


def make_drafter(name: str, models, k: int = 4, options: dict | None = None) -> Drafter:
    """models: a specviz.models.LoadedModels (target, draft, heads ...). options: drafter-specific settings.

    name may carry options itself ('eagle2:total_tokens=16', see parse_spec); `options` override them."""
    name, spec_options = parse_spec(name)
    options = {**spec_options, **(options or {})}
    _check_types(name, options)
    k = options.pop("k", k)
    if k < 1:
        raise SpecvizError(f"k (draft length) must be >= 1, got {k}")
    if name == "none":
        if options:
            raise SpecvizError(f"drafter 'none' takes no options, got: {', '.join(options)}")
        return NoDraft()
    if name == "ngram":
        return _construct(NgramDrafter, name, options, k=k)
    if name == "draft":
        if getattr(models, "draft", None) is None:
            raise SpecvizError(
                f"no draft model is set for '{models.name}': pass --draft-model PATH_OR_ID "
                "(or draft_model=... in the API), or pick another drafter"
            )
        vocab = draft_vocabulary(models.draft, options.pop("draft_vocab", "trained"))
        cost = interpolate(verify_curve(models)) if options.get("adaptive") else None
        return _construct(DraftModelDrafter, name, options, models.draft, k=k, vocab_size=models.vocab_size,
                          draft_vocab=vocab, verify_cost=cost)
    if name in ("eagle2", "medusa"):
        part = "eagle" if name == "eagle2" else "medusa"
        heads = models.head(part, options.pop("head", None))  # head=FOLDER: one trained elsewhere, e.g. to compare
        if heads is None:
            raise SpecvizError(f"no {name} head is available for '{models.name}'; train one with `python -m specviz train {part}`")
        vocab = draft_vocabulary(heads, options.pop("draft_vocab", default_draft_vocab(name, heads)))
        if name == "medusa":
            options.setdefault("total_tokens", "auto")  # the fixed tree, cut to what pays off on this machine
            cost = interpolate(verify_curve(models)) if options["total_tokens"] == "auto" else None
            return _construct(MedusaDrafter, name, options, heads, models.target, draft_vocab=vocab, verify_cost=cost)
        shape = TreeShape(**{key: options.pop(key) for key in ("depth", "top_k", "total_tokens", "early_stop") if key in options})
        graft = options.pop("lookup", 0)
        if options:
            raise SpecvizError(f"unknown eagle2 options: {', '.join(options)}")
        cost = interpolate(verify_curve(models)) if shape.total_tokens == "auto" else None
        return EagleDrafter(heads, models.target, shape, draft_vocab=vocab, verify_cost=cost, lookup=graft)
    raise SpecvizError(f"unknown drafter '{name}'; choose one of: {', '.join(DRAFTERS)}")


__all__ = ["DRAFTERS", "available", "variants", "Drafter", "DraftRequest", "NoDraft", "Outcome", "make_drafter", "parse_spec"]
