"""One description per drafter: its name, what it needs loaded, its help text, its options (type, default,
bounds) and how to build it. The registry (specviz/drafters/__init__.py) holds these; the CLI's checks, the
service's allow-list and bounds, the app's help and tree controls and docs/drafters.md are all read from them."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

from specviz.decoding.drafter import Drafter
from specviz.errors import SpecvizError, shown
from specviz.models.parts import Part

if TYPE_CHECKING:
    import torch

    from specviz.models.loading import LoadedModels


@dataclass(frozen=True)
class Option:
    """One drafter option, as `name:key=value` or `drafter_options={key: value}` give it."""

    name: str
    type: type  # bool, int, float or str; object for a structure only the Python API can pass (Medusa's tree)
    default: object  # what the drafter uses when the option is not given
    help: str
    low: float | None = None  # the smallest value anywhere (numbers)
    high: float | None = None  # the largest a service accepts from a client (the CLI and the API take more)
    words: tuple[str, ...] = ()  # words taken instead of a number: "auto", "trained", "full"
    open_interval: bool = False  # low < value < high, as for a probability that must not be 0 or 1
    served: bool = True  # a service's client may set it (not a folder on the server, not a Python structure)

    def check(self, drafter: str, value: Any, served: bool = False) -> None:
        """A SpecvizError that names the drafter, the option and what it takes, when `value` does not fit."""
        if self.type is object or (isinstance(value, str) and value in self.words):
            return
        if self.type is bool:
            if not isinstance(value, bool):
                raise SpecvizError(f"{drafter} option {self.name} must be true or false, got {shown(value)}")
            return
        if self.type is str:
            if not isinstance(value, str):
                raise SpecvizError(f"{drafter} option {self.name} must be text, got {shown(value)}")
            return
        number = int if self.type is int else (int, float)
        # an int is compared as it is: math.isfinite would convert it to a float, which overflows past 1.8e308
        if isinstance(value, bool) or not isinstance(value, number) or (isinstance(value, float) and not math.isfinite(value)):
            raise SpecvizError(f"{drafter} option {self.name} must be {self.takes(served)}, got {shown(value)}")
        high = self.high if served else None
        below = self.low is not None and (value <= self.low if self.open_interval else value < self.low)
        above = high is not None and (value >= high if self.open_interval else value > high)
        if below or above:
            raise SpecvizError(f"{drafter} option {self.name} must be {self.takes(served)}, got {shown(value)}")

    def takes(self, served: bool = False) -> str:
        """What the option takes, in words: 'a whole number from 1 to 16 or auto'."""
        if self.type is bool:
            return "true or false"
        if self.type in (str, object):
            return "text" if self.type is str else "a Python value (API only)"
        kind = "a whole number" if self.type is int else "a number"
        high = self.high if served else None
        if self.open_interval and self.low is not None and self.high is not None:
            span = f" between {_number(self.low)} and {_number(self.high)} (exclusive)"
        elif self.low is not None and high is not None:
            span = f" from {_number(self.low)} to {_number(high)}"
        elif self.low is not None:
            span = f" >= {_number(self.low)}"
        else:
            span = ""
        return kind + span + "".join(f" or {w}" for w in self.words)


def _number(x: float) -> str:
    return f"{int(x):,}" if x == int(x) else f"{x:g}"


# the decode setting k as a drafter option (`ngram:k=6`), for the chain drafters that use it
K = Option("k", int, 4, "draft length: tokens proposed per step", low=1, high=16)


@dataclass(frozen=True)
class DrafterSpec:
    """A drafter as the rest of specviz sees it. `build(models, k, options)` gets options already checked
    against `options` and returns a fresh drafter for one run."""

    name: str
    help: str  # one line for the CLI, the app's drafter menu and docs/drafters.md
    build: Callable[..., Drafter]
    needs: str | None = None  # the part of specviz.models.LoadedModels it drafts with: draft, medusa, eagle, eagle3
    options: tuple[Option, ...] = ()
    tree: bool = False  # grows the EAGLE-2 dynamic tree: the app's tree controls apply to it
    # proposes one chain of up to K tokens, each tested in turn: the chain speedup formula (1 - α^(K+1)) / (1 - α)
    # of the Cost page applies to it
    chain: bool = False
    # its default settings read the measured verify-cost curve (a node budget of "auto"): a backend or service
    # that loads a part it drafts with measures the curve up front (specviz.drafters.reads_verify_cost)
    verify_cost: bool = False
    variant: str | None = None  # a variant worth running beside it by default (bench, race, service)
    # the trained part it drafts with: its name (then `needs`), loader and trainer; loading finds it by name
    part: Part | None = None

    def __post_init__(self) -> None:
        if self.part is not None:
            if self.needs not in (None, self.part.name):
                raise SpecvizError(f"drafter '{self.name}' needs '{self.needs}' but declares the part '{self.part.name}'")
            object.__setattr__(self, "needs", self.part.name)

    def option(self, name: str) -> Option | None:
        return next((o for o in self.options if o.name == name), None)

    def check(self, options: dict[str, Any], served: bool = False) -> None:
        """Every option known and of the right type and range; `served`: as a service's client sent them (the
        options it may not set are refused, and numbers are held to their `high`)."""
        offered = [o for o in self.options if o.served or not served]
        unknown = sorted(set(options) - {o.name for o in offered})
        if unknown:
            if not offered:
                raise SpecvizError(f"drafter '{self.name}' takes no options, got: {', '.join(unknown)}")
            takes = ", ".join(o.name for o in offered)
            if served:
                raise SpecvizError(f"{self.name} option(s) {', '.join(unknown)} are not offered by the service; it "
                                   f"takes: {takes}")
            raise SpecvizError(f"unknown {self.name} options: {', '.join(unknown)}; it takes: {takes}")
        for option in offered:
            if option.name in options:
                option.check(self.name, options[option.name], served)

    def available(self, models: LoadedModels) -> bool:
        """Can it run on these models (the draft model and the heads may be missing)?"""
        if self.needs is None:
            return True
        find = getattr(models, "part", None)  # LoadedModels.part; a stand-in may hold the part as an attribute
        return (find(self.needs) if callable(find) else getattr(models, self.needs, None)) is not None


def head_of(models: LoadedModels, part: str, options: dict[str, Any], drafter: str, train: str) -> torch.nn.Module:
    """The head a drafter drafts with: the one in `head=FOLDER` (taken out of options), else the loaded one; a
    clear message when there is none. `train`: the command that makes one."""
    head = models.head(part, options.pop("head", None))
    if head is None:
        raise SpecvizError(f"no {drafter} head is available for '{models.name}'; train one with `{train}` or pass "
                           f"one: {drafter}:head=FOLDER")
    return head


def to_table(specs: Iterable[DrafterSpec]) -> str:
    """The README's drafter table: every registered drafter, what it does, the loaded part it needs and the names
    of its options (`specviz drafters --table`; docs/drafters.md gives what each option takes)."""
    lines = ["| drafter | what it does | needs | options |", "|---|---|---|---|"]
    for spec in specs:
        options = ", ".join(f"`{o.name}`" for o in spec.options) or "none"
        lines.append(f"| `{spec.name}` | {spec.help} | {f'`{spec.needs}`' if spec.needs else ''} | {options} |")
    return "\n".join(lines)


def to_markdown(specs: Iterable[DrafterSpec]) -> str:
    """docs/drafters.md: every registered drafter, what it needs and its options (`specviz drafters` prints it)."""
    lines = ["# Drafters", "", "Written by `specviz drafters --markdown > docs/drafters.md` from each drafter's spec",
             "(specviz/drafters/); a test checks that it is current. `served`: a client of `specviz serve` may set it,",
             "up to `high` (the CLI and the Python API take more).", ""]
    for spec in specs:
        needs = f" Needs the loaded `{spec.needs}`." if spec.needs else ""
        variant = f" Run beside it by default: `{spec.variant}`." if spec.variant else ""
        lines += [f"## `{spec.name}`", "", f"{spec.help}.{needs}{variant}", ""]
        if spec.options:
            lines += ["| option | takes | default | served | what it does |", "|---|---|---|---|---|"]
            for o in spec.options:
                default = "(all paths)" if o.type is object else "" if o.default is None else f"`{o.default}`"
                lines.append(f"| `{o.name}` | {o.takes(served=True)} | {default} | {'yes' if o.served else 'no'} | {o.help} |")
            lines.append("")
    return "\n".join(lines)
