"""The trained parts drafters draft with (an EAGLE head, Medusa heads, a distilled draft model ...): each drafter's
spec (specviz/drafters/) names its part and how to load and train it, and registers it here, so that loading
(specviz.models.loading) finds a part's loader by the part's name without knowing any drafter."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from specviz.errors import SpecvizError

# (folder, target model, dtype it will run in) -> the part, on the CPU or the target's device, any dtype
Loader = Callable[[Path, Any, torch.dtype], torch.nn.Module]


@dataclass(frozen=True)
class Part:
    """A trained part: its name (a LoadedModels part, e.g. models.parts["eagle"], and the kind a preset ships in
    assets/), how to load it from a folder, and how to train one."""

    name: str
    load: Loader
    train: str = ""  # the command that trains one, shown when none is loaded: "specviz train eagle"
    # the training entry point as "module:function", called with a specviz.train.loop.TrainConfig (written as a
    # path, not imported: training lies above the drafters); "" for a part trained elsewhere
    trainer: str = ""
    four_bit: bool = False  # beside a 4-bit target its products go 4-bit too (specviz.models.loading.load_trained)


PARTS: dict[str, Part] = {}  # name -> part, filled by specviz.drafters as it registers each drafter's spec


def register_part(part: Part) -> None:
    known = PARTS.get(part.name)
    if known is not None and known != part:
        raise SpecvizError(f"a different trained part named '{part.name}' is already registered")
    PARTS[part.name] = part


def part_of(name: str) -> Part:
    part = PARTS.get(name)
    if part is None:
        raise SpecvizError(f"no drafter declares a trained part named '{name}'; known: {', '.join(PARTS) or 'none'}")
    return part
