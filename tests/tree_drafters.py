"""Tree drafters for tests: full top-b trees from a tiny draft model (every child a point mass)."""
from __future__ import annotations

import torch

from specviz.decoding.drafter import Drafter, DraftRequest
from specviz.decoding.tree import ROOT, DraftTree


class TopBTree(Drafter):
    """At every node, the b most likely tokens of the draft model become children, down to `depth`.
    With `cheat=True` the target's own greedy token is put first at each depth-1.. level, so long
    paths get accepted and the cache gather of deep, non-contiguous paths is exercised."""

    name = "test-tree"

    def __init__(self, draft, b=2, depth=3, cheat_target=None):
        self.draft, self.b, self.depth, self.cheat = draft, b, depth, cheat_target

    @torch.no_grad()
    def _next(self, model, ids):
        return model(torch.tensor([ids])).logits[0, -1]

    def propose(self, request: DraftRequest) -> DraftTree:
        tree = DraftTree()
        context = request.ids.tolist()
        frontier = [(ROOT, [])]
        for _ in range(min(self.depth, request.max_depth)):
            nxt = []
            for node, path in frontier:
                q = torch.softmax(self._next(self.draft, context + path), -1)
                tokens = q.topk(self.b).indices.tolist()
                if self.cheat is not None:
                    best = int(self._next(self.cheat, context + path).argmax())
                    tokens = [t for t in tokens if t != best][: self.b - 1] + [best]  # the right one last
                for t in tokens:
                    nxt.append((tree.add(t, node, q=float(q[t])), path + [t]))
            frontier = nxt
        return tree
