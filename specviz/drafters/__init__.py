"""The drafters: one module per topology, each declaring its SPEC (specviz/drafters/spec.py: name, needs, help,
options with bounds, build); this registry turns a name (with options: 'eagle2:lookup=4') into a fresh drafter for
one run. The CLI, the service and the app ask the registry; none of them lists drafters or options of its own.

    base.py         `none`, and what the drafters share     ngram.py        prompt lookup
    draft_model.py  an independent small draft model         medusa.py       Medusa heads, a fixed tree
    eagle.py        an EAGLE head growing the EAGLE-2 dynamic tree
    eagle3.py       an EAGLE-3 head (three fused target layers) on the same tree
    spec.py         DrafterSpec and Option                   options.py      the spec parser, the draft vocabulary

The interface every drafter implements (Drafter, DraftRequest, Outcome) lives beside the loop that calls it, in
specviz/decoding/drafter.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from specviz.decoding.costs import interpolate, verify_curve
from specviz.decoding.drafter import Drafter, DraftRequest, Outcome
from specviz.decoding.policy import COST, DEFAULT_K_POLICY, LengthPolicy, check_k_policy
from specviz.drafters import base, draft_model, eagle, eagle3, medusa, ngram
from specviz.drafters.base import PLAIN, NoDraft
from specviz.drafters.options import EAGLE_DRAFT_VOCAB, default_draft_vocab, draft_vocabulary, drafter_name, parse_spec
from specviz.drafters.spec import DrafterSpec, K, Option
from specviz.errors import SpecvizError
from specviz.models.parts import register_part

if TYPE_CHECKING:
    from specviz.models.loading import LoadedModels

# name -> its spec, in the order menus list them; a new drafter is one more line here
REGISTRY: dict[str, DrafterSpec] = {spec.name: spec for spec in (
    base.SPEC,
    ngram.SPEC,
    draft_model.SPEC,
    medusa.SPEC,
    eagle.SPEC,
    eagle3.SPEC,
)}
for _spec in REGISTRY.values():  # loading finds each trained part's loader by its name
    if _spec.part is not None:
        register_part(_spec.part)

# The drafter a run gets when it names none (the API, the CLI, a backend, a service's /v1/runs): it needs no
# trained part, so it runs on any model.
DEFAULT = "ngram"
# The defaults chosen among what a model can run: the first of each list that is available. They differ on
# purpose: a service's chat route serves answers, so it takes the fastest at temperature 0 (EAGLE-2 with prompt
# lookup grafted on) and otherwise DEFAULT; the app teaches, so it starts on the published EAGLE-2 tree without
# the graft, then the other trained drafters, then the untrained ones.
SERVICE_PREFERRED = ("eagle2:lookup=4", "eagle2", DEFAULT)
APP_PREFERRED = ("eagle2", "medusa", "draft", DEFAULT, PLAIN)


def first_available(preferred: Iterable[str], offered: Iterable[str], fallback: str) -> str:
    """The first drafter spec of `preferred` whose drafter is among `offered` (registry names), else `fallback`."""
    names = set(offered)
    return next((d for d in preferred if drafter_name(d) in names), fallback)


def register(spec: DrafterSpec) -> None:
    """Add a drafter defined outside this package (a plug-in, a test's toy): from then on the CLI, the API, the
    service and the app offer it like the built-in ones."""
    if spec.name in REGISTRY:
        raise SpecvizError(f"a drafter named '{spec.name}' is already registered")
    if ":" in spec.name or not spec.name.strip():
        raise SpecvizError(f"a drafter name must be non-empty and hold no ':', got {spec.name!r}")
    if spec.part is not None:
        register_part(spec.part)
    REGISTRY[spec.name] = spec


def unregister(name: str) -> None:
    REGISTRY.pop(name, None)


def spec_of(name: str) -> DrafterSpec:
    """The spec of a drafter by its name (without options); a clear message for an unknown one."""
    spec = REGISTRY.get(name)
    if spec is None:
        raise SpecvizError(f"unknown drafter '{name}'; choose one of: {', '.join(REGISTRY)}")
    return spec


def available(models: LoadedModels) -> list[str]:
    """The drafters that can run on these models (the draft model and heads may be missing)."""
    return [name for name, spec in REGISTRY.items() if spec.available(models)]


def reads_verify_cost(models: LoadedModels) -> bool:
    """Will a drafter these models can run read the measured verify-cost curve with its default settings (the
    cost-aware draft length, a tree budget of "auto")? A backend or service that warms up measures the curve then,
    not in a client's first run. Every drafter but `none` does, by its default k_policy."""
    return any(name != PLAIN and spec.available(models) for name, spec in REGISTRY.items())


def variants(models: LoadedModels) -> list[str]:
    """Variants worth running beside the plain drafters by default (the bench, the race, the Benchmarks page),
    as each spec names them: the draft chain with its adaptive stop (among the fastest at temperature 1 in
    docs/performance.md, and faster than a fixed K at 0; the plain `draft` keeps a fixed K, as transformers'
    assisted generation does) and EAGLE-2 with prompt lookup grafted onto its tree (the fastest at temperature 0)."""
    return [spec.variant for spec in REGISTRY.values() if spec.variant and spec.available(models)]


def check_options(name: str, options: dict[str, Any] | None = None, served: bool = False) -> tuple[DrafterSpec, dict[str, Any]]:
    """A drafter spec ('eagle2:lookup=4') and extra options, checked against the drafter's spec without building
    anything: (its spec, the merged options). `served`: as a service's client sent them."""
    name, spec_options = parse_spec(name)
    return check_named(name, {**spec_options, **(options or {})}, served)


def check_named(name: str, options: dict[str, Any], served: bool = False) -> tuple[DrafterSpec, dict[str, Any]]:
    """check_options for a drafter already parsed: its registry name and its options, nothing parsed again."""
    spec = spec_of(name)
    own = dict(options)
    if "k_policy" in own:  # every drafter takes it (specviz.decoding.policy)
        check_k_policy(own.pop("k_policy"))
    if "k" in own and spec.option("k") is None and not served:
        K.check(name, own["k"])  # the decode setting k: every drafter takes it, the chain drafters use it
        spec.check({key: value for key, value in own.items() if key != "k"})
    else:
        spec.check(own, served)
    return spec, options


def make_drafter(name: str, models: LoadedModels, k: int = 4, options: dict[str, Any] | None = None) -> Drafter:
    """models: a specviz.models.LoadedModels (target, draft, heads ...). options: drafter-specific settings.

    name may carry options itself ('eagle2:total_tokens=16', see parse_spec); `options` override them."""
    name, spec_options = parse_spec(name)
    return build_drafter(name, models, k, {**spec_options, **(options or {})})


def build_drafter(name: str, models: LoadedModels, k: int = 4, options: dict[str, Any] | None = None) -> Drafter:
    """make_drafter for a drafter already parsed (a specviz.backends.Run's): its registry name and its options,
    checked against its spec; a k among the options wins over `k`. k_policy=cost (the default) or fixed: how
    many tokens it drafts a step (specviz.decoding.policy); cost reads the verify-cost curve measured for these
    models (once per loaded model)."""
    spec, options = check_named(name, dict(options or {}))
    k = options.pop("k", k)
    k_policy = options.pop("k_policy", DEFAULT_K_POLICY)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise SpecvizError(f"k (draft length) must be >= 1, got {k}")
    drafter = spec.build(models, k, options)
    if k_policy == COST and not isinstance(drafter, NoDraft):
        drafter.policy = LengthPolicy(COST, interpolate(verify_curve(models)))
    return drafter


__all__ = ["APP_PREFERRED", "DEFAULT", "EAGLE_DRAFT_VOCAB", "PLAIN", "REGISTRY", "SERVICE_PREFERRED", "DraftRequest",
           "Drafter", "DrafterSpec", "NoDraft", "Option", "Outcome", "available", "build_drafter", "check_named",
           "check_options", "default_draft_vocab", "draft_vocabulary", "drafter_name", "first_available",
           "make_drafter", "parse_spec", "reads_verify_cost", "register", "spec_of", "unregister", "variants"]
