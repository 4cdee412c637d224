"""An independent small draft model proposing a chain of K tokens, each drawn from its q."""
from __future__ import annotations

import torch
from transformers import DynamicCache

from specviz import sampling
from specviz.drafters.base import Drafter, DraftRequest
from specviz.kvcache import crop_cache
from specviz.tree import DraftTree
from specviz.verify import top_n


class DraftModelDrafter(Drafter):
    name = "draft"

    def __init__(self, model, k: int = 4, vocab_size: int | None = None):
        self.model = model
        self.k = k
        self.vocab_size = vocab_size  # score only the ids the target shares
        self.cache = DynamicCache(config=model.config)
        self.cached: list[int] = []  # token ids whose keys/values are in self.cache

    def options(self) -> dict:
        return {"k": self.k, "draft_model": getattr(self.model.config, "_name_or_path", "") or "draft"}

    def propose(self, request: DraftRequest) -> DraftTree:
        tree = DraftTree()
        ids = request.ids.tolist()
        new = ids[self._reuse(ids) :]
        for _ in range(min(self.k, request.max_depth)):
            logits = self._forward(new)  # (V,) for the next position
            shown = sampling.display_probs(logits, request.sampling)
            sampling.check_probs(shown, "draft")
            if request.sampling.greedy:
                token, q_dist = int(logits.argmax()), None
            else:
                q_dist = sampling.process(logits, request.sampling).cpu()
                token = sampling.sample(q_dist, request.generator)
            tree.add(token, len(tree) - 1, q=float(shown[token]), q_dist=q_dist, q_top=top_n(shown, request.n_top))
            new = [token]
        return tree

    def _reuse(self, ids: list[int]) -> int:
        """Keep the cached prefix that still matches the committed ids; return how many ids are cached."""
        n = 0
        limit = min(len(self.cached), len(ids) - 1)  # the last id must be fed to get the next logits
        while n < limit and self.cached[n] == ids[n]:
            n += 1
        crop_cache(self.cache, n)
        self.cached = ids[:n]
        return n

    @torch.inference_mode()
    def _forward(self, new: list[int]) -> torch.Tensor:
        device = self.model.device
        out = self.model(
            input_ids=torch.tensor([new], device=device),
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.cached += new
        return out.logits[0, -1, : self.vocab_size]
