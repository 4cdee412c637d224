"""Medusa: K heads on the target's last feature f_t; head k proposes x_{t+2+k}. A fixed sparse tree picks
which top-ranked tokens of each head to combine; verification is the shared tree rule (lossless)."""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch

from specviz.decoding.costs import interpolate, verify_curve
from specviz.decoding.drafter import Drafter, DraftRequest, Outcome
from specviz.decoding.policy import STOP_CAP, STOP_COST, STOP_NO_MATCH
from specviz.decoding.tree import ROOT, DraftTree
from specviz.decoding.verify import Typical, top_n
from specviz.drafters.base import DRAFT_VOCAB, check_total_tokens, check_vocab_covers, vocab_projection
from specviz.drafters.eagle import HEAD, VerifyCost, tree_budget
from specviz.drafters.options import construct, default_draft_vocab, draft_vocabulary
from specviz.drafters.spec import DrafterSpec, Option, head_of
from specviz.errors import SpecvizError
from specviz.models import heads as trained
from specviz.models.parts import Part

if TYPE_CHECKING:
    from specviz.models.loading import LoadedModels

# Each path lists, per depth, the rank of the token taken from that depth's head: [0, 1] is head 0's best
# token followed by head 1's second best. 20 nodes: small enough that verifying them stays cheap on a CPU.
DEFAULT_TREE = (
    (0,), (1,), (2,), (3,),
    (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0),
    (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0), (0, 0, 2),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (0, 1, 0, 0), (1, 0, 0, 0),
)


def check_tree(paths: Iterable[Iterable[int]], num_heads: int) -> tuple[tuple[int, ...], ...]:
    """Paths sorted parents-first; every prefix must be present and no deeper than the number of heads."""
    ordered = tuple(sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p)))
    for p in ordered:
        if not p or len(p) > num_heads or min(p) < 0:
            raise SpecvizError(f"Medusa tree path {list(p)}: needs 1..{num_heads} non-negative ranks")
        if len(p) > 1 and p[:-1] not in ordered:
            raise SpecvizError(f"Medusa tree path {list(p)} has no parent {list(p[:-1])} in the tree")
    return ordered


class MedusaDrafter(Drafter):
    name = "medusa"
    needs_features = True

    def __init__(self, heads: Any, target: Any, tree: Iterable[Iterable[int]] = DEFAULT_TREE,
                 draft_vocab: torch.Tensor | None = None, typical: bool = False, epsilon: float = 0.09,
                 delta: float = 0.3, total_tokens: int | str | None = None, verify_cost: VerifyCost | None = None):
        """typical=True: Medusa's typical acceptance at temperature > 0. It is not lossless, so the run's
        events are all marked lossy; the default is the lossless rule.
        total_tokens: None keeps the whole fixed tree; an int or "auto" (with verify_cost: n -> seconds) keeps
        only the best nodes by path score, as the EAGLE-2 drafter does."""
        check_total_tokens("medusa", total_tokens, whole_tree_allowed=True)
        if typical:
            self.acceptance = Typical(hard_cap=epsilon, entropy_factor=delta)
        self.heads = heads
        self.lm_head = target.get_output_embeddings().weight  # (V, H)
        self.vocab = draft_vocab
        self.dtype = next(heads.parameters()).dtype  # specviz.models.draft_dtype: bf16 on CPUs with bf16 products
        # heads that share the target's LM head project onto its draft-vocabulary rows, sliced once here
        self.project: Callable[[torch.Tensor], torch.Tensor] | None = None
        if not heads.own_projection:
            self.project = vocab_projection(target, draft_vocab, self.dtype)  # (K, H) -> (K, Vd)
        self.total_tokens = total_tokens
        self.verify_cost = verify_cost
        self.paths = check_tree(tree, heads.num_heads)
        self.max_rank = max(max(p) for p in self.paths) + 1
        check_vocab_covers("medusa", draft_vocab, self.max_rank)
        self.feature: torch.Tensor | None = None  # (H,) the target's feature just before the root
        self.stop = STOP_CAP  # why this step's tree stopped (set by _prune)

    def options(self) -> dict[str, Any]:
        return {"heads": self.heads.num_heads, "tree_nodes": len(self.paths), "typical_acceptance": self.lossy,
                "total_tokens": self.total_tokens,
                "draft_vocab": None if self.vocab is None else int(self.vocab.numel())}

    def start(self, prompt_ids: torch.Tensor, features: torch.Tensor | None) -> None:
        self.feature = None if features is None or features.shape[0] == 0 else features[-1]

    def observe(self, outcome: Outcome) -> None:
        assert outcome.features is not None  # needs_features: the loop passes them
        self.feature = outcome.features[-1]

    @torch.inference_mode()
    def propose(self, request: DraftRequest) -> DraftTree:
        tree = DraftTree(stop=STOP_NO_MATCH)
        if self.feature is None:
            return tree
        hidden = self.heads(self.feature[None, None].to(self.dtype))  # (1, 1, K, H)
        tree.forwards = 1  # one pass of the heads gives every depth
        if self.project is not None:
            logits = self.project(hidden[0, 0]).float()  # (K, Vd)
        else:
            logits = self.heads.logits(hidden, self.lm_head, self.vocab)[0, 0].float()  # (K, Vd)
        q = torch.softmax(logits, dim=-1)
        probs, ranked = q.topk(self.max_rank, dim=-1)  # (K, R)
        if self.vocab is not None:
            ranked = self.vocab.to(ranked.device)[ranked]
        probs, ranked = probs.tolist(), ranked.tolist()
        score: dict[tuple[int, ...], float] = {(): 1.0}
        for path in self.paths:  # parents first, so the parent's score is known
            score[path] = score[path[:-1]] * probs[len(path) - 1][path[-1]]
        paths = [p for p in self.paths if len(p) <= request.max_depth]
        paths = self._prune(paths, score)
        tops = [self._top(q[head], request.n_top) for head in range(q.shape[0])]
        node_of: dict[tuple[int, ...], int] = {}
        for path in paths:
            head, rank = len(path) - 1, path[-1]
            parent = ROOT if len(path) == 1 else node_of[path[:-1]]
            node_of[path] = tree.add(ranked[head][rank], parent, q=probs[head][rank], score=score[path], q_top=tops[head])
        tree.stop = self.stop
        return tree

    def _prune(self, paths: list[tuple[int, ...]], score: dict[tuple[int, ...], float]) -> list[tuple[int, ...]]:
        """Keep the best paths by score (a parent never scores below its child): as many as the run's draft-length
        policy says pay, at most `total_tokens` (tree_budget)."""
        ranked = sorted(paths, key=lambda p: (-score[p], len(p)))
        keep = tree_budget(self.policy, [score[p] for p in ranked], self.total_tokens, self.verify_cost)
        self.stop = STOP_COST if keep < len(ranked) and keep != self.total_tokens else STOP_CAP
        chosen = set(ranked[:keep])
        return [p for p in paths if p in chosen and all(p[:i] in chosen for i in range(1, len(p)))]

    def _top(self, q_head: torch.Tensor, n: int) -> list[list[Any]]:
        pairs = top_n(q_head, n)
        if self.vocab is not None:
            pairs = [[int(self.vocab[i]), p] for i, p in pairs]
        return pairs


def build(models: LoadedModels, k: int, options: dict[str, Any]) -> MedusaDrafter:
    heads = head_of(models, "medusa", options, "medusa", "specviz train medusa")
    vocab = draft_vocabulary(heads, options.pop("draft_vocab", default_draft_vocab("medusa", heads)))
    options.setdefault("total_tokens", "auto")  # the fixed tree, cut to what pays off on this machine
    cost = interpolate(verify_curve(models)) if options["total_tokens"] == "auto" else None
    return construct(MedusaDrafter, "medusa", options, heads, models.target, draft_vocab=vocab, verify_cost=cost)


def _default(option: str) -> Any:
    return inspect.signature(MedusaDrafter).parameters[option].default


# the Medusa heads (specviz.models.heads.MedusaHeads): ours, or published ones
PART = Part("medusa", lambda folder, target, dtype: trained.MedusaHeads.load(folder, target.config),
            "specviz train medusa", "specviz.train.medusa:train_medusa")

SPEC = DrafterSpec(
    "medusa", "Medusa heads on the target's features propose a fixed tree", build, part=PART,
    options=(Option("total_tokens", int, "auto", "nodes of the fixed tree kept: auto (the best by path score under "
                    "the measured verify cost) or a fixed number", low=1, high=128, words=("auto",)),
             DRAFT_VOCAB,
             Option("typical", bool, False, "Medusa's typical acceptance at temperature > 0: faster, NOT lossless "
                    "(the run's events are marked lossy)"),
             Option("epsilon", float, _default("epsilon"), "typical acceptance: the hard cap of the threshold",
                    low=0, high=1, open_interval=True),
             Option("delta", float, _default("delta"), "typical acceptance: the factor on exp(-entropy)",
                    low=0, high=1, open_interval=True),
             Option("tree", object, DEFAULT_TREE, "the fixed tree as paths of per-head ranks (Python API only)",
                    served=False),
             HEAD),
    verify_cost=True)
