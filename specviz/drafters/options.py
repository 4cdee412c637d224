"""Drafter options: the 'name:key=value' spec, the draft vocabulary, and building a drafter from its options with
a clear message for one it does not take (specviz/drafters/spec.py declares what each drafter takes)."""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from specviz.decoding.drafter import Drafter
from specviz.errors import SpecvizError, shown

if TYPE_CHECKING:
    import torch

D = TypeVar("D", bound=Drafter)


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """'eagle2:draft_vocab=full:total_tokens=32' -> ('eagle2', {'draft_vocab': 'full', 'total_tokens': 32}).

    A drafter with options is a variant that the CLI, the API and the bench can run beside the default one."""
    name, *parts = spec.strip().split(":")
    options: dict[str, Any] = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise SpecvizError(f"drafter option {shown(part)} in {shown(spec)} is not KEY=VALUE")
        options[key.strip()] = _option_value(value.strip())
    return name, options


def drafter_name(spec: str) -> str:
    """The registry name a drafter spec starts with, its options not read: 'eagle2:lookup=4' -> 'eagle2'."""
    return spec.strip().split(":", 1)[0]


BOOLEANS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def _option_value(text: str) -> int | float | bool | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return BOOLEANS.get(text.lower(), text)


# eagle2's default draft vocabulary: the 4,096 most frequent tokens of its trained one (16,384 for the shipped head).
# The drafting LM-head product then reads a quarter of the bytes, for a τ within 0.01 of the whole vocabulary's
# (docs/performance.md, the draft-vocabulary bench). `eagle2:draft_vocab=trained` runs the whole.
EAGLE_DRAFT_VOCAB = 4096


def default_draft_vocab(name: str, heads: object) -> int | str:
    """The draft_vocab choice a drafter gets when none is given (see EAGLE_DRAFT_VOCAB)."""
    trained = getattr(heads, "draft_vocab", None)
    if name == "eagle2" and trained is not None and len(trained) > EAGLE_DRAFT_VOCAB and not _sorted_by_id(trained):
        return EAGLE_DRAFT_VOCAB
    return "trained"


def _sorted_by_id(vocab: torch.Tensor) -> bool:
    return len(vocab) > 1 and bool((vocab[1:] > vocab[:-1]).all())


def draft_vocabulary(heads: object, choice: int | str = "trained") -> torch.Tensor | None:
    """The token ids a head may draft: "trained" (what it was trained with), "full" (None: every token), or N
    (the N most frequent, a prefix of a frequency-ordered trained vocabulary)."""
    trained: torch.Tensor | None = getattr(heads, "draft_vocab", None)  # a draft model has one only if shipped with one
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
    raise SpecvizError(f"draft_vocab must be 'trained', 'full' or a positive number of tokens, got {shown(choice)}")


def construct(cls: Callable[..., D], name: str, options: dict[str, Any], *args: Any, **fixed: Any) -> D:
    """cls(*args, **fixed, **options), with a clear message for an option the drafter does not take."""
    parameters = list(inspect.signature(cls).parameters)
    accepted = set(parameters[len(args):]) - set(fixed)  # not the ones given positionally
    unknown = sorted(set(options) - accepted)
    if unknown:
        takes = ", ".join(sorted(accepted | {"k"} if "k" in fixed else accepted)) or "none"
        raise SpecvizError(f"unknown {name} option(s): {', '.join(unknown)}; it takes: {takes}")
    return cls(*args, **fixed, **options)
