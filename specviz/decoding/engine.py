"""The decoding loop for every topology: propose → verify → commit, yielding an event per step.

`stream` is the one code path; `generate`, the CLI, the pages and the benchmark all consume its events.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, overload

import torch

from specviz.decoding import events as ev
from specviz.decoding import sampling
from specviz.decoding.costs import synchronize
from specviz.decoding.drafter import Drafter, DraftRequest, Outcome
from specviz.decoding.metrics import Metrics
from specviz.decoding.policy import STOP_SLOWER
from specviz.decoding.settings import DecodeSettings
from specviz.decoding.target import Target
from specviz.decoding.tree import DraftTree
from specviz.decoding.verify import Verdict, top_n
from specviz.errors import SpecvizError
from specviz.kernels.kvcache import keep_cache_entries

# Prompt tokens in the first prefill forward. A run's cancel flag is read between forwards, so a long prompt holds the
# engine for at most one chunk's time after a cancel; the products of a chunk this long already run at full speed.
PREFILL_CHUNK = 256
# Later chunks are sized to take the first one's time (never under PREFILL_FLOOR_S): a token's time grows with the
# positions cached before it, by its attention (over 8,000 of them, 135M parameters on 2 cores, the attention
# outweighs the token's products 4 to 1), so chunks of one size would each be slower than the last, and so would a
# cancel's wait. Never fewer than MIN_PREFILL_CHUNK tokens, twice the most the one-op path takes (forwards that short
# attend in it, slower over a long past: specviz.kernels.fastdecoder.ONE_OP_MAX_TOKENS); at that floor a chunk can
# take longer than the first (over 8,000 positions here, about as long).
MIN_PREFILL_CHUNK = 32
PREFILL_FLOOR_S = 0.1  # chunks quicker than this are not shrunk: a cancel waits no longer than a person notices


def prefill_slices(n: int, clock: Callable[[], float] = time.perf_counter) -> Iterator[slice]:
    """The forwards that cache n prompt tokens, as consecutive slices. The first takes PREFILL_CHUNK tokens, the
    second half as many (a second point on the line below); each later one as many as fit in the first's time, a
    token's time taken as a straight line in its position (its products, plus attention over the positions before
    it) through the first chunk's time per token and the last one's. Each chunk is timed by `clock` from its yield
    to the request for the next slice, over the consumer's forward, so the sizes follow this machine's speed (what
    is cached hardly does: the 4-bit path caches the same bits in any chunks up to fastdecoder.LONG_PAST positions,
    and past them, and on fp32, the same to rounding)."""
    start, size = 0, PREFILL_CHUNK
    first: tuple[float, float] | None = None  # the first chunk's middle position and time per token
    budget = 0.0  # seconds a chunk may take
    while start < n:
        end = min(start + size, n)
        began = clock()
        yield slice(start, end)
        middle, per_token = (start + end) / 2, max(clock() - began, 1e-9) / (end - start)
        if first is None:
            first, budget, size = (middle, per_token), max(per_token * PREFILL_CHUNK, PREFILL_FLOOR_S), size // 2
        else:
            slope = max(0.0, (per_token - first[1]) / (middle - first[0]))
            ahead = per_token + slope * (end + size / 2 - middle)  # a token's time in the next chunk, this one's size
            size = max(MIN_PREFILL_CHUNK, min(PREFILL_CHUNK, round(budget / ahead)))
        start = end


TREE_ROOM = 160  # cache positions reserved past the prompt and the budget for a step's draft tree (at most 129 served)


@dataclass
class Result:
    text: str
    token_ids: list[int]
    stats: dict[str, Any]
    stop_reason: str


class TokenText:
    """Token id → display text, memoised (one decode per distinct token)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.memo: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        text = self.memo.get(token)
        if text is None:
            text = self.memo[token] = self.tokenizer.decode([token])
        return text

    @overload
    def top(self, pairs: list[list[Any]]) -> list[list[Any]]: ...
    @overload
    def top(self, pairs: None) -> None: ...
    def top(self, pairs: list[list[Any]] | None) -> list[list[Any]] | None:
        return None if pairs is None else [[t, self(t), p] for t, p in pairs]


class Detokenizer:
    """Text that became final as tokens are committed (a token may end in half a UTF-8 character)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, ids: list[int]) -> str:
        self.ids += ids
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        return self._emit(text)

    def flush(self) -> str:
        return self._emit(self.tokenizer.decode(self.ids, skip_special_tokens=True))

    def _emit(self, text: str) -> str:
        delta = text[len(self.emitted) :]
        self.emitted = text
        return delta


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if value is not None:
            ids |= set(value) if isinstance(value, (list, tuple)) else {value}
    return ids


def decode(
    target_model: Any,
    tokenizer: Any,
    drafter: Drafter,
    prompt_ids: list[int],
    settings: DecodeSettings,
    model_name: str = "custom",
    prompt_text: str = "",
    vocab_size: int | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Iterator[ev.Event]:
    """Run one decode and yield its events: start, one step per target forward, done.

    vocab_size: score only ids below it (the ids target and draft share) when their embeddings are padded
    to different sizes. cancelled: read between the prompt's prefill chunks (the one long stretch without an
    event); once it returns True the run ends there, with no done event. Between steps, closing the generator
    is how a consumer stops it."""
    target = Target(target_model, vocab_size)
    _check_lengths(prompt_ids, settings.max_new_tokens, target.max_positions)
    run = _Run(target, tokenizer, drafter, settings, cancelled or (lambda: False))
    yield ev.Start(
        model=model_name,
        drafter=drafter.name,
        sampling={"temperature": settings.sampling.temperature, "top_p": settings.sampling.top_p, "top_k": settings.sampling.top_k},
        options=drafter.options(),
        seed=settings.seed,
        max_new_tokens=settings.max_new_tokens,
        prompt_text=prompt_text,
        prompt_token_ids=list(prompt_ids),
        device=str(target.device),
        dtype=str(target_model.dtype).removeprefix("torch."),
        lossy=drafter.lossy,
        k_policy=drafter.policy.kind,
    )
    yield from run.steps(prompt_ids)


def _check_lengths(prompt_ids: list[int], max_new_tokens: int, max_positions: int) -> None:
    if not prompt_ids:
        raise SpecvizError("the prompt is empty")
    if max_new_tokens <= 0:
        raise SpecvizError(f"max_new_tokens must be > 0, got {max_new_tokens}")
    if len(prompt_ids) >= max_positions:
        raise SpecvizError(f"the prompt has {len(prompt_ids)} tokens; this model's context is {max_positions}")
    if len(prompt_ids) + max_new_tokens > max_positions:
        raise SpecvizError(
            f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds this model's "
            f"context of {max_positions} tokens"
        )


class _Run:
    """The state of one decode: caches, committed ids, the random generator, the metrics."""

    def __init__(self, target: Target, tokenizer: Any, drafter: Drafter, settings: DecodeSettings,
                 cancelled: Callable[[], bool]):
        self.target = target
        self.cancelled = cancelled
        self.drafter = drafter
        self.settings = settings
        self.text = TokenText(tokenizer)
        self.detok = Detokenizer(tokenizer)
        self.eos = eos_ids(target.model, tokenizer)
        self.generator = torch.Generator().manual_seed(settings.seed)
        self.cache = target.new_cache()
        self.metrics = Metrics()

    def steps(self, prompt_ids: list[int]) -> Iterator[ev.Event]:
        started = time.perf_counter()
        ids = list(prompt_ids)
        if not self._prefill(ids):
            return
        generated: list[int] = []
        stop_reason = None
        while stop_reason is None:
            step_started = self._now()
            budget = self.settings.max_new_tokens - len(generated)
            if self.drafter.policy.draft_now():
                tree = self.drafter.propose(
                    DraftRequest(
                        ids=torch.tensor(ids),
                        max_depth=budget - 1,  # the step always adds a replacement or bonus token too
                        sampling=self.settings.sampling,
                        generator=self.generator,
                        n_top=self.settings.n_top,
                    )
                )
            else:  # drafting has been slower than plain steps in this run: a plain step (policy.StepRates)
                tree = DraftTree(stop=STOP_SLOWER, forwards=0)
            drafted = self._now()
            past_len = len(ids) - 1
            hidden, p, verdict = self._verify(ids[-1], tree, past_len)
            verified = self._now()

            new = [tree.tokens[i] for i in verdict.path] + [verdict.token]
            kinds = ["accepted"] * len(verdict.path) + [verdict.kind if len(tree) else "autoregressive"]
            new, kinds, stop_reason = self._truncate(new, kinds, budget)
            # a drafted token the test accepted past an end-of-sequence cut is never committed: not counted
            n_accepted = min(len(verdict.path), len(new))
            keep_cache_entries(self.cache, past_len, verdict.path)
            ids += new
            generated += new
            features = hidden[[0] + [i + 1 for i in verdict.path[: len(new) - 1]]] if self.drafter.needs_features else None
            self.drafter.observe(Outcome(accepted=n_accepted, committed=new, features=features))
            self.drafter.policy.observe(max(tree.depths(), default=0), len(verdict.path))
            self.metrics.observe(
                max_depth=max(tree.depths(), default=0),
                n_drafted=len(tree),
                n_accepted=n_accepted,
                n_committed=len(new),
                draft_s=drafted - step_started,
                verify_s=verified - drafted,
            )
            self.drafter.policy.observe_step(self._now() - step_started, len(new))
            yield self._step_event(tree, p, verdict, new, kinds, past_len, step_started, drafted, verified, started)
        wall = time.perf_counter() - started
        yield ev.Done(
            text=self.detok.emitted + (delta := self.detok.flush()),
            token_ids=generated,
            stop_reason=stop_reason,
            stats=self.metrics.summary(wall),
            text_delta=delta,
        )

    def _now(self) -> float:
        """perf_counter once the device has finished its queued work (on CUDA kernels run asynchronously, so
        draft and verify times would otherwise be the time to launch them); on the CPU just perf_counter."""
        synchronize(self.target.device)
        return time.perf_counter()

    def _prefill(self, ids: list[int]) -> bool:
        """Cache every prompt token but the last (the last is the root of the first step), in prefill_slices' chunks,
        reading the cancel flag between them; False when the run was cancelled."""
        reserve = getattr(self.cache, "reserve", None)  # room for the whole run at once: no doubling, no copy
        if reserve is not None:
            reserve(len(ids) + self.settings.max_new_tokens + TREE_ROOM)
        chunks = []  # (T, H) features of each chunk, for a drafter that drafts from them
        for part in prefill_slices(len(ids) - 1, self._now):
            if self.cancelled():
                return False
            hidden = self.target.forward(ids[part], self.cache, logits=False, layers=self.drafter.feature_layers)[0]
            if self.drafter.needs_features:
                chunks.append(hidden)
        if self.cancelled():
            return False
        self.drafter.start(torch.tensor(ids), torch.cat(chunks) if chunks else None)
        return True

    def _verify(self, root: int, tree: DraftTree, past_len: int) -> tuple[torch.Tensor, torch.Tensor, Verdict]:
        """One target forward over root + nodes, then the acceptance test."""
        position_ids = mask = None
        if not tree.is_chain:
            device = self.target.device
            position_ids = tree.position_ids(past_len, device=device)
            mask = tree.attention_mask(past_len, dtype=self.target.model.dtype, device=device)
        hidden, logits = self.target.forward([root] + tree.tokens, self.cache, position_ids, mask,
                                             layers=self.drafter.feature_layers)
        p = sampling.display_probs(logits, self.settings.sampling).cpu()  # (n + 1, V)
        sampling.check_probs(p, "target")
        rule_settings = self.settings.sampling
        verdict = self.drafter.acceptance(tree, p, rule_settings.greedy, self.generator, self.settings.n_top,
                                          logits=logits, temperature=rule_settings.temperature)
        return hidden, p, verdict

    def _truncate(self, new: list[int], kinds: list[str], budget: int) -> tuple[list[int], list[str], str | None]:
        """Stop at the first end-of-sequence token or at the token budget."""
        for i, token in enumerate(new):
            if token in self.eos:
                return new[: i + 1], kinds[: i + 1], "eos"
        if len(new) >= budget:
            return new[:budget], kinds[:budget], "max_new_tokens"
        return new, kinds, None

    def _annotate(self, stage: dict[str, Any]) -> dict[str, Any]:
        """Add the text of each candidate token of a tree-building stage."""
        if "candidates" in stage:
            stage = dict(stage, candidates=[dict(c, text=self.text(c["token"])) for c in stage["candidates"]])
        return stage

    def _step_event(self, tree: DraftTree, p: torch.Tensor, verdict: Verdict, new: list[int], kinds: list[str], past_len: int,
                    step_started: float, drafted: float, verified: float, started: float) -> ev.Step:
        text, n_top = self.text, self.settings.n_top
        depths = tree.depths()
        p_of_node = p[torch.tensor(tree.parents, dtype=torch.long) + 1, torch.tensor(tree.tokens, dtype=torch.long)].tolist() if len(tree) else []
        nodes = [
            ev.DraftNode(
                id=i,
                token=tree.tokens[i],
                text=text(tree.tokens[i]),
                parent=tree.parents[i],
                depth=depths[i],
                q=tree.q[i],
                score=tree.scores[i],
                q_top=text.top(tree.q_top[i]),
                p=p_of_node[i],
            )
            for i in range(len(tree))
        ]
        tests = [
            ev.Test(t.node, t.token, text(t.token), t.p, t.q, t.alpha, t.u, t.accepted, text.top(t.residual_top),
                    rule=t.rule, threshold=t.threshold)
            for t in verdict.tests
        ]
        rows = [-1] + verdict.path
        tops = [top_n(p[r + 1], n_top) for r in rows[:-1]]
        # at temperature 0 the verdict's final distribution is p after the last accepted row: its top-n is reused
        greedy_top = verdict.final_dist_top if self.settings.sampling.greedy else None
        tops.append(greedy_top if greedy_top is not None else top_n(p[rows[-1] + 1], n_top))
        now = time.perf_counter()
        elapsed = now - started
        return ev.Step(
            step=self.metrics.steps,
            position=past_len,
            drafted=len(tree),
            accepted=kinds.count("accepted"),
            nodes=nodes,
            build=[self._annotate(stage) for stage in tree.build],
            target=[ev.TargetRow(node=r, p_top=text.top(top)) for r, top in zip(rows, tops)],
            tests=tests,
            accepted_path=verdict.path,
            final={
                "token": verdict.token,
                "text": text(verdict.token),
                "kind": verdict.kind if len(tree) else "autoregressive",
                "dist_top": text.top(verdict.final_dist_top),
            },
            committed=[ev.Committed(t, text(t), k) for t, k in zip(new, kinds)],
            text_delta=self.detok.push(new),
            timing={
                "draft_ms": (drafted - step_started) * 1e3,
                "verify_ms": (verified - drafted) * 1e3,
                "step_ms": (now - step_started) * 1e3,
                "elapsed_s": elapsed,
                "tokens_per_s": self.metrics.new_tokens / elapsed if elapsed > 0 else 0.0,
            },
            lossy=self.drafter.lossy,
            stop=tree.stop,
            draft_forwards=tree.forwards,
        )
