"""EAGLE-3: a head over three of the target's layers grows the same EAGLE-2 dynamic tree.

What changes against eagle2 (specviz/drafters/eagle.py), and only that:
* the target hands over the inputs of three decoder layers side by side (low, middle, high: the head's
  `aux_layers`), not its final hidden state; the head fuses them with fc (3·H → H);
* when drafting deeper, the head's own output h (before its final norm) is fed back in place of the fused feature,
  as it was trained to (training-time test), instead of a regressed copy of the target's feature;
* q comes from the head's final norm and an LM head over its draft vocabulary (its own, or the target's rows at
  the draft ids), and draft id i is target token i + d2t[i].
The tree, its budget, the lookup graft and verification are eagle2's: every node is a point mass, so the output is
exactly the target's.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch

from specviz.drafters.base import packed_rows, vocab_projection
from specviz.drafters.eagle import HEAD, TREE_OPTIONS, EagleDrafter, TreeShape, VerifyCost, tree_options
from specviz.drafters.spec import DrafterSpec, head_of
from specviz.errors import SpecvizError
from specviz.kernels import fastdecoder
from specviz.models.eagle3 import Eagle3Head as Head
from specviz.models.parts import Part

if TYPE_CHECKING:
    from specviz.models.eagle3 import Eagle3Head
    from specviz.models.loading import LoadedModels


class Eagle3Drafter(EagleDrafter):
    name = "eagle3"
    head: Eagle3Head

    def __init__(self, head: Eagle3Head, target: Any, shape: TreeShape = TreeShape(), verify_cost: VerifyCost | None = None,
                 lookup: int = 0):
        """head: specviz.models.eagle3.Eagle3Head (its draft vocabulary comes with it, as d2t)."""
        ids = head.draft_ids()
        d2t = head.get_buffer("d2t")  # (Vd,) target id - draft id
        identity = len(ids) == target.config.vocab_size and bool((d2t == 0).all())
        self.feature_layers = tuple(head.aux_layers)  # the engine passes these layers' inputs as the features
        super().__init__(head, target, shape, draft_vocab=None if identity else ids, verify_cost=verify_cost,
                         lookup=lookup)

    def _attach(self, target: Any) -> None:
        head = self.head
        # a 4-bit head's projection is as eagle2's (base.vocab_projection)
        self.project_dtype = dtype = getattr(head, "projection_dtype", self.dtype)
        if head.lm_head is not None:  # a published head's own LM head over its draft vocabulary
            projection = packed_rows(head.lm_head.weight, None, dtype)
        else:  # the target's LM head rows at the draft ids (the embedded model's head stores none)
            projection = vocab_projection(target, self.vocab, dtype)
        self.project = lambda hidden: projection(head.norm(hidden))  # the norm in the head's dtype
        self.fast = fastdecoder.for_eagle3(head)  # None: the module runs, its cache a (keys, values) pair
        self.cache = self.fast.new_cache() if self.fast is not None else None

    def _crop(self, length: int) -> None:
        if self.fast is not None:
            super()._crop(length)
        elif self.cache is not None:
            self.cache = tuple(t[:, :, :length] for t in self.cache)

    def _head(self, features: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
              mask: torch.Tensor | None = None) -> torch.Tensor:
        """features (T, 3·H) fused target features or (T, H) the head's own outputs fed back; embeds (T, H) →
        h (T, H) before the final norm; extends the cache."""
        if self.fast is not None:
            return super()._head(features, embeds, positions, mask)
        out, self.cache = self.head(features[None], embeds[None], positions, self.cache, mask)
        predicted: torch.Tensor = out[0]
        return predicted

    def options(self) -> dict[str, Any]:
        return {**super().options(), "aux_layers": list(self.feature_layers)}


def build(models: LoadedModels, k: int, options: dict[str, Any]) -> Eagle3Drafter:
    head = cast("Eagle3Head", head_of(models, "eagle3", options, "eagle3", "specviz train eagle3"))  # published or trained here
    shape, graft, cost = tree_options(models, options, "eagle3")
    if head.draft_vocab_size < shape.top_k:
        raise SpecvizError(f"eagle3 ranks {shape.top_k} candidates per position but the head's draft vocabulary has "
                           f"only {head.draft_vocab_size} tokens")
    return Eagle3Drafter(head, models.target, shape, verify_cost=cost, lookup=graft)


# the EAGLE-3 head (specviz.models.eagle3.Eagle3Head): ours, or one in the SafeAILab or speculators layout
PART = Part("eagle3", lambda folder, target, dtype: Head.load(folder, target.config), "specviz train eagle3",
            "specviz.train.eagle3:train_eagle3", four_bit=True)

SPEC = DrafterSpec("eagle3", "EAGLE-3: a head over three fused target layers grows the same dynamic tree", build,
                   part=PART, options=(*TREE_OPTIONS, HEAD), tree=True, verify_cost=True)
