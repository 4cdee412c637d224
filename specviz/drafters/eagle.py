"""EAGLE-2: a one-layer head drafts over the target's features and grows a dynamic tree.

The head reads (f_t, emb(x_{t+1})) and predicts f_{t+1}; q = softmax(lm_head(f̂)) over the draft vocabulary.
Tree (EAGLE-2): at each depth expand the `top_k` children of each of the current `top_k` frontier nodes,
score every node by the product of q along its path, keep the best `top_k` as the next frontier, and at the
end keep the best `total_tokens` nodes of the whole tree. Children are deterministic (top-k), so verification
treats each as a point mass; that keeps the output exactly the target's.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from specviz.decoding.costs import interpolate, verify_curve
from specviz.decoding.drafter import Drafter, DraftRequest, Outcome
from specviz.decoding.policy import STOP_CAP, STOP_COST, STOP_NO_MATCH, LengthPolicy, best_length
from specviz.decoding.tree import ROOT, DraftTree
from specviz.drafters.base import DRAFT_VOCAB, DraftTiming, check_total_tokens, check_vocab_covers, vocab_projection
from specviz.drafters.ngram import lookup
from specviz.drafters.options import EAGLE_DRAFT_VOCAB, default_draft_vocab, draft_vocabulary
from specviz.drafters.spec import DrafterSpec, Option, head_of
from specviz.errors import SpecvizError
from specviz.kernels import fastdecoder
from specviz.kernels.kvcache import crop_cache, new_cache
from specviz.models import heads
from specviz.models.parts import Part

if TYPE_CHECKING:
    from specviz.models.loading import LoadedModels

VerifyCost = Callable[[int], float]  # n tokens -> seconds of one verify forward (specviz.decoding.costs)


@dataclass(frozen=True)
class TreeShape:
    depth: int = 5
    top_k: int = 4
    # "auto": per step, the cut that maximises expected tokens per second under this machine's measured
    # verify-cost curve (on a 2-core CPU a big tree costs several 1-token steps; on a GPU almost nothing)
    total_tokens: int | str = "auto"
    # with "auto": stop expanding once even the best case of one more depth (every kept node's path accepted
    # and extended) would save less target time than that depth costs to draft, as measured in this run
    early_stop: bool = True

    def __post_init__(self) -> None:
        for key in ("depth", "top_k"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecvizError(f"eagle2 option {key} must be a whole number >= 1, got {value!r}")
        check_total_tokens("eagle2", self.total_tokens)


@dataclass
class Candidate:
    cid: int
    parent: int  # parent cid, ROOT for depth 1
    token: int
    q: float | None  # None for a grafted lookup token (no q)
    log_score: float  # sum of log q along the path
    depth: int
    entry: int = -1  # index of its head-cache entry once expanded
    hidden: torch.Tensor | None = None  # (H,) the head's prediction at this node once expanded


class EagleDrafter(Drafter):
    name = "eagle2"
    needs_features = True

    def __init__(self, head: torch.nn.Module, target: Any, shape: TreeShape = TreeShape(),
                 draft_vocab: torch.Tensor | None = None, verify_cost: VerifyCost | None = None, lookup: int = 0):
        """head: specviz.models.heads.EagleHead; target: the target model (its embedding and LM head are reused).
        draft_vocab: (Vd,) token ids the head may propose (None = all). verify_cost: n -> seconds, for "auto".
        lookup: graft up to this many tokens of prompt lookup (n-gram) onto the tree (0: none); see _graft_lookup."""
        if lookup < 0:
            raise SpecvizError(f"{self.name} option lookup must be >= 0 (tokens of prompt lookup to graft), got {lookup}")
        check_vocab_covers(self.name, draft_vocab, shape.top_k)
        self.head = head
        self.embed = target.get_input_embeddings()
        self.vocab = draft_vocab
        # the head's dtype (specviz.models.draft_dtype: bf16 on CPUs with bf16 products; fp32 with 4-bit products
        # beside a 4-bit target) for all drafting products
        weight = next(head.parameters())
        self.device, self.dtype = weight.device, weight.dtype
        self.shape = shape
        self.verify_cost = verify_cost
        self.project_dtype = self.dtype  # what `project` takes (_attach may choose another)
        self._attach(target)
        self.committed = 0  # head-cache entries that belong to committed tokens
        self.pending: tuple[torch.Tensor, list[int]] | None = None  # features and tokens not yet fed
        self.last: torch.Tensor | None = None  # (H,) head output of the last committed entry: it predicts the root's successor
        self.depth_cost = DraftTiming(cold=1)  # one more depth; the run's first expansion is cold, not counted
        self.lookup = lookup
        self.lookup_hits, self.lookup_tries = 1, 2  # grafted tokens accepted / tried, from a Beta(1, 1) prior
        self.grafted: list[int] = []  # this step's grafted tokens that the budget kept (a path from the root)

    def options(self) -> dict[str, Any]:
        return {"depth": self.shape.depth, "top_k": self.shape.top_k, "total_tokens": self.shape.total_tokens,
                "early_stop": self.shape.early_stop and self.verify_cost is not None,
                "draft_vocab": None if self.vocab is None else int(self.vocab.numel()), "lookup": self.lookup}

    def _attach(self, target: Any) -> None:
        """The head's drafting pieces: `project`, hidden (P, H) -> logits over the draft vocabulary (P, Vd), the
        drafting hot spot; and the head's cache (the lean layer's, else transformers')."""
        # the target's 8-bit head rows on the default weights, else the rows in draft_dtype (`projection_dtype`, set
        # where a 4-bit head was loaded): vocab_projection
        self.project_dtype = getattr(self.head, "projection_dtype", self.dtype)
        self.project: Callable[[torch.Tensor], torch.Tensor] = vocab_projection(target, self.vocab, self.project_dtype)
        self.fast: fastdecoder.FastEagleHead | fastdecoder.FastEagle3Head | None = fastdecoder.for_eagle(self.head)  # None: the head's own (transformers) layer
        self.cache = new_cache(self.fast, self.head.config)

    def _crop(self, length: int) -> None:
        """Forget head-cache entries from `length` on (the last step's drafted nodes)."""
        crop_cache(self.cache, length)

    # ---- per-run state: the head's cache follows the committed sequence --------------------------------------
    def start(self, prompt_ids: torch.Tensor, features: torch.Tensor | None) -> None:
        # a new run: the head's cache and what it predicts belong to the previous run's text, if any
        self.committed, self.pending, self.last, self.grafted = 0, None, None, []
        self.lookup_hits, self.lookup_tries = 1, 2
        if features is not None and features.shape[0] > 0:
            self.pending = (features, prompt_ids[1:].tolist())  # pairs (f_t, x_{t+1}), t = 0 .. L - 2

    def observe(self, outcome: Outcome) -> None:
        # The root and each accepted node now have true features; pair them with the tokens that follow them.
        assert outcome.features is not None  # needs_features: the loop passes them
        if self.pending is None:
            self.pending = (outcome.features, outcome.committed)
        else:  # a step that did not ask for a draft: the head catches up on both at its next draft
            features, tokens = self.pending
            self.pending = (torch.cat([features, outcome.features]), tokens + outcome.committed)
        if self.grafted:  # scored once, on the step that verified them
            hits, tries = accepted_along(self.grafted, outcome)
            self.lookup_hits += hits
            self.lookup_tries += tries
            self.grafted = []

    @torch.inference_mode()
    def _catch_up(self) -> None:
        self._crop(self.committed)
        if self.pending is None:
            return
        features, tokens = self.pending
        n = min(features.shape[0], len(tokens))
        device = self.device
        positions = torch.arange(self.committed, self.committed + n, device=device)[None]
        out = self._head(features[:n].to(self.dtype), self._embed(torch.tensor(tokens[:n], device=device)), positions)
        self.committed += n
        self.last = out[-1]
        self.pending = None

    # ---- drafting -----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, request: DraftRequest) -> DraftTree:
        self._catch_up()
        self.grafted = []
        shape = self.shape
        depth = min(shape.depth, request.max_depth)
        if self.last is None or depth <= 0:
            return DraftTree(stop=STOP_CAP if depth <= 0 else STOP_NO_MATCH)
        candidates: list[Candidate] = []
        build: list[dict[str, Any]] = []
        frontier = self._children(self.last[None], [None], candidates, shape.top_k)
        entries: list[int] = []  # head-cache entry index -> candidate cid, for the tree mask
        expanded = 0  # head passes past the first (which read the committed text)
        for d in range(1, depth + 1):
            kept = sorted(frontier, key=lambda c: -c.log_score)[: shape.top_k]
            build.append(self._stage(d, frontier, kept))
            if d == depth:
                break
            if self._not_worth_deeper(kept):
                build[-1]["stopped_early"] = True
                break
            started = time.perf_counter()
            hidden = self._expand(kept, candidates, entries)  # (k, H) predicted features of the kept nodes
            expanded += 1
            frontier = self._children(hidden, kept, candidates, shape.top_k)
            self.depth_cost.add(time.perf_counter() - started)
        grafted = self._graft_lookup(request.ids, depth, candidates) if self.lookup else []
        if grafted:
            build.append({"stage": "lookup", "rate": self.lookup_rate,
                          "candidates": [_described(c) for c in grafted], "kept": [c.cid for c in grafted]})
        tree = self._rerank(candidates, build, grafted)
        tree.forwards = 1 + expanded
        return tree

    def _graft_lookup(self, ids: torch.Tensor, depth: int, candidates: list[Candidate]) -> list[Candidate]:
        """Prompt lookup's continuation of the context as one more branch of the tree. Where it agrees with the
        head's candidates it reuses them (their score becomes the larger of the two), elsewhere it adds nodes. A
        grafted token at depth d scores r^d, r the share of grafted tokens accepted so far in this run (of those the
        budget kept and whose parent was accepted), and the auto budget weighs it against the head's nodes. Grafted
        nodes are point masses, like every node of this tree.
        Lookup: the last 3 (else 2) tokens found earlier in the context; a 1-token match is too weak a signal."""
        rate = self.lookup_rate
        path: list[Candidate] = []
        parent, log_score = ROOT, 0.0
        for d, token in enumerate(lookup(ids, min(self.lookup, depth), max_ngram=3, min_ngram=2), 1):
            log_score += math.log(rate)
            node = next((c for c in candidates if c.parent == parent and c.depth == d and c.token == token), None)
            if node is None:
                node = Candidate(len(candidates), parent, token, q=None, log_score=log_score, depth=d)
                candidates.append(node)
            node.log_score = max(node.log_score, log_score)
            path.append(node)
            parent = node.cid
        return path

    def _not_worth_deeper(self, kept: list[Candidate]) -> bool:
        """Σ of the kept path scores bounds the expected accepted nodes one depth further; each saves at most one
        target step. Stop when that bound is worth less than drafting the depth costs."""
        cost = self.verify_cost or self.policy.cost
        if not self.shape.early_stop or cost is None:
            return False
        bound = sum(math.exp(c.log_score) for c in kept)
        return self.depth_cost.exceeds(bound * cost(1))

    def _children(self, hidden: torch.Tensor, parents: Sequence[Candidate | None], candidates: list[Candidate],
                  k: int) -> list[Candidate]:
        """top-k tokens of q for each parent: hidden (P, H) → new candidates."""
        log_q = torch.log_softmax(self.project(hidden).float(), dim=-1)  # (P, Vd)
        values, ids = log_q.topk(k, dim=-1)
        if self.vocab is not None:
            ids = self.vocab.to(ids.device)[ids]
        new: list[Candidate] = []
        for parent, vals, toks in zip(parents, values.tolist(), ids.tolist()):
            base = 0.0 if parent is None else parent.log_score
            for lq, tok in zip(vals, toks):
                c = Candidate(len(candidates), ROOT if parent is None else parent.cid, tok, math.exp(lq),
                              base + lq, 1 if parent is None else parent.depth + 1)
                candidates.append(c)
                new.append(c)
        return new

    def _expand(self, kept: list[Candidate], candidates: list[Candidate], entries: list[int]) -> torch.Tensor:
        """Feed the kept nodes to the head (each sees the committed entries and its own ancestors)."""
        device = self.device
        n_before = len(entries)
        parents_hidden = torch.stack([self._hidden_of(c, candidates) for c in kept])  # (k, H)
        tokens = torch.tensor([c.token for c in kept], device=device)
        positions = torch.tensor([[self.committed - 1 + c.depth for c in kept]], device=device)
        total = self.committed + n_before + len(kept)
        rows, columns = [], []  # each kept node sees its own entry and its expanded ancestors'
        for row, c in enumerate(kept):
            c.entry = n_before + row
            entries.append(c.cid)
            node: Candidate | None = c
            while node is not None and node.entry >= 0:
                rows.append(row)
                columns.append(self.committed + node.entry)
                node = candidates[node.parent] if node.parent != ROOT else None
        mask = torch.full((1, 1, len(kept), total), torch.finfo(parents_hidden.dtype).min, device=device)
        mask[..., : self.committed] = 0.0
        mask[0, 0, rows, columns] = 0.0  # one indexed write, not one a node
        out = self._head(parents_hidden, self._embed(tokens), positions, mask)  # (k, H)
        for c, h in zip(kept, out):
            c.hidden = h
        return out

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        embedded: torch.Tensor = self.embed(tokens)
        return embedded.to(self.dtype)

    def _head(self, features: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
              mask: torch.Tensor | None = None) -> torch.Tensor:
        """features, embeds (T, H), positions (1, T), mask None or (1, 1, T, S) → predicted features (T, H);
        extends self.cache."""
        predicted: torch.Tensor
        if self.fast is not None:
            predicted = self.fast(features, embeds, positions, self.cache, mask)
        else:
            predicted = self.head(features[None], embeds[None], positions, self.cache, mask)[0]
        return predicted

    def _hidden_of(self, c: Candidate, candidates: list[Candidate]) -> torch.Tensor:
        """The feature that precedes candidate c: the head's prediction at its parent (or at the root)."""
        hidden = self.last if c.parent == ROOT else candidates[c.parent].hidden
        assert hidden is not None  # the root is caught up, and a parent is expanded before its children
        return hidden

    @property
    def lookup_rate(self) -> float:
        """The share of grafted tokens accepted so far in this run (with its Beta(1, 1) prior)."""
        return self.lookup_hits / self.lookup_tries

    def _rerank(self, candidates: list[Candidate], build: list[dict[str, Any]],
                grafted: Sequence[Candidate] = ()) -> DraftTree:
        ranked = sorted(candidates, key=lambda c: (-c.log_score, c.depth))
        budget = tree_budget(self.policy, [math.exp(c.log_score) for c in ranked], self.shape.total_tokens,
                             self.verify_cost)
        stop = STOP_COST if budget < len(ranked) and budget != self.shape.total_tokens else STOP_CAP
        if any(stage.get("stopped_early") for stage in build):
            stop = STOP_COST
        chosen = ranked[:budget]
        chosen_ids = {c.cid for c in chosen}
        # a parent always scores at least its child, but guard ties: drop nodes whose parent was cut
        chosen = [c for c in chosen if c.parent == ROOT or c.parent in chosen_ids]
        chosen.sort(key=lambda c: (c.depth, -c.log_score))  # parents before children; better siblings first
        tree, node_of = DraftTree(), dict[int, int]()
        for c in chosen:
            if c.parent != ROOT and c.parent not in node_of:
                continue
            parent = ROOT if c.parent == ROOT else node_of[c.parent]
            node_of[c.cid] = tree.add(c.token, parent, q=c.q, score=math.exp(c.log_score))
        self.grafted = [c.token for c in grafted if c.cid in node_of]  # a prefix of the grafted path
        build.append({"stage": "rerank", "total_tokens": len(tree), "kept": list(node_of),
                      "node_ids": [[cid, n] for cid, n in node_of.items()]})
        tree.build = build
        tree.stop = stop
        return tree

    @staticmethod
    def _stage(depth: int, frontier: list[Candidate], kept: list[Candidate]) -> dict[str, Any]:
        return {
            "stage": "expand",
            "depth": depth,
            "candidates": [_described(c) for c in frontier],
            "kept": [c.cid for c in kept],
        }


def accepted_along(path: list[int], outcome: Outcome) -> tuple[int, int]:
    """(accepted, tried) tokens of a drafted path from the root this step: the accepted path followed it for as
    many tokens as it agrees with it, and each of its tokens whose parent was accepted was tried. `committed` may
    be shorter than the accepted path (cut at end of text), so it bounds the count too."""
    n = min(outcome.accepted, len(path), len(outcome.committed))
    hits = 0
    while hits < n and outcome.committed[hits] == path[hits]:
        hits += 1
    return hits, min(len(path), hits + 1)


def _described(c: Candidate) -> dict[str, Any]:
    return {"cid": c.cid, "parent_cid": c.parent, "token": c.token, "q": None if c.q is None else round(c.q, 6),
            "score": round(math.exp(c.log_score), 8)}


def tree_budget(policy: LengthPolicy, chances: list[float], total_tokens: int | str | None,
                verify_cost: VerifyCost | None) -> int:
    """Nodes kept of a tree whose candidates, ranked best first, have these path chances. Cost-aware: the run's
    policy's length, at most total_tokens where it is a number. Fixed: total_tokens (None: every node; "auto":
    the same rule on verify_cost, as before the policy existed). A budget the curve sizes with no number set stays
    within the sizes the curve was measured at (root and nodes), never trusting its extrapolation."""
    cap = total_tokens if isinstance(total_tokens, int) else len(chances)
    curve = policy.cost if policy.sized else verify_cost if isinstance(total_tokens, str) else None
    if curve is not None and not isinstance(total_tokens, int):
        cap = min(cap, getattr(curve, "measured_up_to", cap + 1) - 1)
    if policy.sized:
        return policy.length(chances[:cap])
    return cap if curve is None else best_length(chances[:cap], curve)


def build(models: LoadedModels, k: int, options: dict[str, Any]) -> EagleDrafter:
    heads = head_of(models, "eagle", options, "eagle2", "specviz train eagle")
    vocab = draft_vocabulary(heads, options.pop("draft_vocab", default_draft_vocab("eagle2", heads)))
    shape, graft, cost = tree_options(models, options, "eagle2")
    return EagleDrafter(heads, models.target, shape, draft_vocab=vocab, verify_cost=cost, lookup=graft)


def tree_options(models: LoadedModels, options: dict[str, Any], name: str) -> tuple[TreeShape, int, VerifyCost | None]:
    """The dynamic-tree drafters' shared options, taken out of `options`: the tree's shape (depth, top_k,
    total_tokens, early_stop), lookup=N (prompt lookup grafted on) and, for total_tokens=auto, the measured verify
    cost it sizes the tree by (else None). Any option left is an error."""
    shape = TreeShape(**{key: options.pop(key) for key in ("depth", "top_k", "total_tokens", "early_stop") if key in options})
    graft = options.pop("lookup", 0)
    if options:
        raise SpecvizError(f"unknown {name} options: {', '.join(options)}")
    return shape, graft, interpolate(verify_curve(models)) if shape.total_tokens == "auto" else None


# The dynamic tree's options, shared by eagle2 and eagle3 (the app's tree controls are drawn from these).
TREE_OPTIONS = (
    Option("depth", int, TreeShape.depth, "tree depth: drafted tokens one step can commit at most", low=1, high=12),
    Option("top_k", int, TreeShape.top_k, "children expanded per depth", low=1, high=16),
    Option("total_tokens", int, TreeShape.total_tokens, "nodes kept for verification: auto (what pays under this "
           "machine's measured verify cost) or a fixed number", low=1, high=128, words=("auto",)),
    Option("early_stop", bool, TreeShape.early_stop, "with total_tokens=auto: stop growing once one more depth costs "
           "more to draft than it can save"),
    Option("lookup", int, 0, "prompt-lookup tokens grafted onto the tree as one more branch (0 = off)", low=0, high=16),
)
HEAD = Option("head", str, None, "a head folder on this machine instead of the loaded one", served=False)

# the EAGLE-1/2 head (specviz.models.heads.EagleHead): ours, or a published one
PART = Part("eagle", lambda folder, target, dtype: heads.EagleHead.load(folder, target.config), "specviz train eagle",
            "specviz.train.eagle:train_eagle", four_bit=True)

SPEC = DrafterSpec(
    "eagle2", "EAGLE-2: a feature-level draft head grows a dynamic tree", build, part=PART,
    options=(*TREE_OPTIONS, Option("draft_vocab", int, EAGLE_DRAFT_VOCAB, DRAFT_VOCAB.help + f" (default: the "
                                   f"{EAGLE_DRAFT_VOCAB:,} most frequent, where the head was trained with more)",
                                   low=1, high=DRAFT_VOCAB.high, words=DRAFT_VOCAB.words,
                                   served=DRAFT_VOCAB.served), HEAD),
    tree=True, verify_cost=True, variant="eagle2:lookup=4")
