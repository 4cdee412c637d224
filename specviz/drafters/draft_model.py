"""An independent small draft model proposing a chain of K tokens, each drawn from its q."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

import torch

from specviz.decoding import sampling
from specviz.decoding.costs import interpolate, verify_curve
from specviz.decoding.drafter import Drafter, DraftRequest
from specviz.decoding.policy import STOP_CAP, STOP_CONFIDENCE, STOP_COST
from specviz.decoding.tree import DraftTree
from specviz.decoding.verify import top_n
from specviz.drafters.base import DRAFT_VOCAB, DraftTiming, vocab_projection
from specviz.drafters.options import construct, draft_vocabulary
from specviz.drafters.spec import DrafterSpec, K, Option
from specviz.errors import SpecvizError
from specviz.kernels import fastdecoder, quant
from specviz.kernels.kvcache import crop_cache, new_cache
from specviz.models.compat import logit_postprocessing
from specviz.models.heads import build_draft_model
from specviz.models.parts import Part

if TYPE_CHECKING:
    from specviz.models.loading import LoadedModels


class DraftModelDrafter(Drafter):
    name = "draft"

    def __init__(self, model: Any, k: int = 4, vocab_size: int | None = None, draft_vocab: torch.Tensor | None = None,
                 adaptive: bool = False, verify_cost: Callable[[int], float] | None = None):
        """draft_vocab: (Vd,) the only ids the draft may propose (None = all): its LM head is then computed over
        those rows only, which on a CPU is most of a small draft's cost. Still lossless: the target verifies
        over its whole vocabulary, and an id outside draft_vocab just has q = 0.
        adaptive (with verify_cost: n -> seconds): draft at most k tokens, but stop as soon as the chance that
        the chain so far is all accepted (the product of the draft's own q, its estimate) times one target step
        is worth less than one more draft step, as measured in this run."""
        self.model = model
        self.k = k
        self.adaptive = adaptive and verify_cost is not None
        self.verify_cost = verify_cost
        self.token_cost = DraftTiming()  # one draft forward of one token
        self.vocab_size = vocab_size  # score only the ids the target shares
        self.fast = fastdecoder.for_model(model)  # None: transformers' own forward
        self.head = quant.q8_head(model) or model.get_output_embeddings()  # the GGUF's 8-bit head under --weights q4
        self.cache = new_cache(self.fast, model.config)
        self.cached: list[int] = []  # token ids whose keys/values are in self.cache
        self.vocab: torch.Tensor | None = None
        if draft_vocab is not None:
            postprocessing = logit_postprocessing(model.config)
            if postprocessing is not None:  # the reduced head computes lm_head(hidden) over some rows only
                raise SpecvizError(f"a reduced draft vocabulary needs a draft whose logits are lm_head(hidden); "
                                   f"this one post-processes them ({postprocessing}): use draft_vocab=full")
            head = model.get_output_embeddings().weight
            self.full = vocab_size or head.shape[0]
            self.vocab = draft_vocab[draft_vocab < self.full].to(head.device)
            self.project = vocab_projection(model, self.vocab, head.dtype)  # (1, H) -> (1, Vd)

    def options(self) -> dict[str, Any]:
        return {"k": self.k, "adaptive": self.adaptive,
                "draft_model": getattr(self.model.config, "_name_or_path", "") or "draft",
                "draft_vocab": None if self.vocab is None else int(self.vocab.numel())}

    def propose(self, request: DraftRequest) -> DraftTree:
        tree = DraftTree()
        ids = request.ids.tolist()
        new = ids[self._reuse(ids) :]
        cap = min(self.k, request.max_depth)
        chances: list[float] = []  # the draft's estimate of P(the first i drafted tokens are all accepted), by i
        draft_s = self.token_cost.seconds or 0.0  # one draft forward, for the run's draft-length policy
        tree.stop = STOP_CAP
        for _ in range(cap):
            chain = chances[-1] if chances else 1.0
            if (self.adaptive and self.verify_cost is not None and self.token_cost.exceeds(chain * self.verify_cost(1))) \
                    or not self.policy.worth_drafting(chances, draft_s, cap):
                tree.stop = STOP_COST
                break
            started = time.perf_counter()
            logits = self._forward(new)  # (V,) for the next position
            shown = sampling.display_probs(logits, request.sampling)
            sampling.check_probs(shown, "draft")
            if request.sampling.greedy:
                token, q_dist = int(logits.argmax()), None
            else:
                q_dist = sampling.process(logits, request.sampling).cpu()
                token = sampling.sample(q_dist, request.generator)
            tree.add(token, len(tree) - 1, q=float(shown[token]), q_dist=q_dist, q_top=top_n(shown, request.n_top))
            if len(new) == 1:  # a one-token draft step (the first of a step also catches up on committed tokens)
                self.token_cost.add(time.perf_counter() - started)
            new = [token]
            chances.append(chain * float(shown[token]))
        kept = self.policy.length(chances, spent_s=len(chances) * draft_s)  # the forwards are spent
        if kept < len(tree):  # its own q says the last tokens are not worth verifying
            tree.keep_first(kept)
            tree.stop = STOP_CONFIDENCE
        tree.forwards = len(chances)  # one forward per drafted token, kept or dropped
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
        """Logits (V,) for the position after `new`; -inf outside the draft vocabulary when there is one."""
        ids = torch.tensor(new, device=self.model.device)
        self.cached += new
        if self.fast is not None:
            hidden = self.fast(ids, self.cache)[-1]
            if self.vocab is None:  # the fast path covers only models whose logits are lm_head(hidden)
                return self.head(hidden)[: self.vocab_size]
        elif self.vocab is None:
            out = self.model(input_ids=ids[None], cache=self.cache, use_cache=True, logits_to_keep=1)
            last: torch.Tensor = out.logits[0, -1, : self.vocab_size]
            return last
        else:
            hidden = self.model.get_decoder()(input_ids=ids[None], cache=self.cache, use_cache=True).last_hidden_state[0, -1]
        logits = torch.full((self.full,), float("-inf"), device=hidden.device)
        logits[self.vocab] = self.project(hidden[None])[0].float()
        return logits


def build(models: LoadedModels, k: int, options: dict[str, Any]) -> DraftModelDrafter:
    draft = models.part("draft")
    if draft is None:
        raise SpecvizError(
            f"no draft model is set for '{models.name}': pass --draft-model PATH_OR_ID "
            "(or draft_model=... in the API), or pick another drafter"
        )
    vocab = draft_vocabulary(draft, options.pop("draft_vocab", "trained"))
    cost = interpolate(verify_curve(models)) if options.get("adaptive") else None
    return construct(DraftModelDrafter, "draft", options, draft, k=k, vocab_size=models.vocab_size,
                     draft_vocab=vocab, verify_cost=cost)


# a small draft distilled here, sharing the target's embedding and LM head (specviz.models.heads.build_draft_model);
# a draft model of the target's family is loaded as a model instead (--draft-model)
PART = Part("draft", lambda folder, target, dtype: build_draft_model(target, folder, dtype), "specviz train draft",
            "specviz.train.draft:train_draft")

SPEC = DrafterSpec(
    "draft", "an independent small draft model proposes a chain of K tokens", build, part=PART,
    options=(K, Option("adaptive", bool, False, "stop the chain once the draft's own estimate says one more token "
                       "no longer pays under the measured verify cost"),
             DRAFT_VOCAB),
    chain=True, variant="draft:adaptive=true")
