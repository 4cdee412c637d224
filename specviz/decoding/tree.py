"""A draft tree and what verification needs from it: attention mask, position ids, paths.

A chain (the independent draft model, n-gram lookup) is the tree in which node i's parent is node i - 1.
Node indices are topological: a node's parent always has a smaller index (-1 is the root, the last
committed token, which is fed to the target together with the nodes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

ROOT = -1


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    # q of each node's token under the draft distribution it was drawn from; None = no q (a point mass).
    q: list[float | None] = field(default_factory=list)
    # The (V,) processed draft distribution each node was drawn from, for the residual; None = point mass.
    q_dist: list[torch.Tensor | None] = field(default_factory=list)
    # The draft's path score (product of q along the path) where a drafter ranks nodes; else None.
    scores: list[float | None] = field(default_factory=list)
    # Top-N of the draft distribution each node was drawn from, as [token, prob] pairs, for display.
    q_top: list[list[list[Any]] | None] = field(default_factory=list)
    # Construction stages for the UI (EAGLE-2 expansion and rerank); drafters may leave it empty.
    build: list[dict[str, Any]] = field(default_factory=list)
    # Why the draft stopped where it did (one of specviz.decoding.policy.STOPS); None where a drafter does not say.
    stop: str | None = None
    # Draft-model forwards run to draft it, counting any whose tokens were then dropped (None: not counted)
    forwards: int | None = None

    def add(self, token: int, parent: int, q: float | None = None, q_dist: torch.Tensor | None = None,
            score: float | None = None, q_top: list[list[Any]] | None = None) -> int:
        assert parent < len(self.tokens), "parents must come before their children"
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.q.append(q)
        self.q_dist.append(q_dist)
        self.scores.append(score)
        self.q_top.append(q_top)
        return len(self.tokens) - 1

    def __len__(self) -> int:
        return len(self.tokens)

    def keep_first(self, n: int) -> None:
        """Drop every node from index n on (their parents come first, so what is kept is still a tree)."""
        for nodes in (self.tokens, self.parents, self.q, self.q_dist, self.scores, self.q_top):
            del nodes[n:]

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def depths(self) -> list[int]:
        """Depth of each node; the root's children have depth 1."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p == ROOT else out[p] + 1)
        return out

    def children(self) -> dict[int, list[int]]:
        """Children of each node (and of ROOT) in index order: the order verification tries them."""
        kids: dict[int, list[int]] = {ROOT: []}
        for i, p in enumerate(self.parents):
            kids.setdefault(i, [])
            kids[p].append(i)
        return kids

    def path_to(self, node: int) -> list[int]:
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def leaf_paths(self) -> list[list[int]]:
        kids = self.children()
        return [self.path_to(i) for i in range(len(self)) if not kids[i]]

    def position_ids(self, past_len: int, device: torch.device | str | None = None) -> torch.Tensor:
        """(1, n + 1) positions of the root (at past_len) and of each node (past_len + depth)."""
        return torch.tensor([[past_len] + [past_len + d for d in self.depths()]], device=device)

    def attention_mask(self, past_len: int, dtype: torch.dtype = torch.float32,
                       device: torch.device | str | None = None) -> torch.Tensor:
        """(1, 1, n + 1, past_len + n + 1) additive mask: every input sees the cached context, the root and
        its own ancestors (and itself), nothing else. Row 0 is the root."""
        n = len(self)
        allowed = torch.from_numpy(self._ancestry())  # (n + 1, n + 1) bool
        mask = torch.zeros(1, 1, n + 1, past_len + n + 1, dtype=dtype)
        mask[0, 0, :, past_len:].masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask.to(device)

    def _ancestry(self) -> np.ndarray:
        """(n + 1, n + 1) bool: row r (0 the root, i + 1 node i) marks the root, r's ancestors and r itself.
        Each row is built as one Python integer, bit j for input j (a node's row is its parent's plus its own
        bit), then unpacked at once: a per-node tensor operation cost about 8 µs a node."""
        n = len(self)
        rows = [1]
        for i, p in enumerate(self.parents):
            rows.append(rows[p + 1] | (1 << (i + 1)))
        width = (n + 1 + 7) // 8
        packed = np.frombuffer(b"".join(r.to_bytes(width, "little") for r in rows), dtype=np.uint8)
        return np.unpackbits(packed.reshape(n + 1, width), axis=1, bitorder="little")[:, : n + 1].astype(bool)
