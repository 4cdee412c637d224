"""Self-distillation data: the target answers instruction prompts, then its final hidden states are cached.

Layout of the cache folder (default `<SPECVIZ_CACHE or ~/.cache/specviz>/train/smollm2-135m/`):

    index.json            config, target, list of finished shards (rewritten atomically after each shard)
    val-00000.safetensors one shard: `tokens` (N,) int32 prompt+response ids of every sequence, concatenated
    train-00000.safetensors         `features` (N, H) fp16 target final hidden state (input of the LM head)
                                    `offsets` (n+1,) int64 sequence starts in `tokens`
                                    `prompt_lens` (n,) int64
                                    `token_counts` (V,) int64 target token frequency over the responses
                                    `aux_features` (N, 3H) fp16, with `--aux-layers`: the inputs of those
                                    decoder layers side by side (what an EAGLE-3 head fuses)

With an answers folder (`answers_dir`, the CLI's default `data/answers/<target>/`, committed to git), each shard's
answers are kept there too as a small compressed file (see answers.py), and a shard whose answers are found there
is rebuilt with one teacher-forced forward pass instead of being generated: the cache can be remade on another
machine at a fraction of the cost.

Features cover every position (prompt too), because an EAGLE head attends over the prompt's features at
inference. Position t holds f_t, which the target's LM head maps to the distribution of token t+1.
Responses are greedy (temperature 0, the headline benchmark setting), stop at eos, and keep the eos.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from specviz.atomic import save_tensors_atomically, write_atomically
from specviz.errors import SpecvizError
from specviz.kernels import fastlinear

from . import answers
from .common import default_data_dir, default_model_path, load_target

log = logging.getLogger("specviz.train.data")

# The training prompts live in the `shared` folder beside the repository (not shipped with the app).
PROMPTS_PATH = str(Path(__file__).resolve().parents[3] / "shared" / "data" / "instruct_mix.jsonl")
FORBIDDEN_PROMPTS = ("mt_bench",)  # benchmark prompts must never become training data


@dataclass(frozen=True)
class DataConfig:
    model_path: str = str(default_model_path())
    out_dir: str = str(default_data_dir())
    prompts_path: str = PROMPTS_PATH
    n_prompts: int = 3000  # training prompts (validation prompts come on top)
    n_val: int = 128  # held-out prompts: the first n_val of the shuffled order, fixed whatever n_prompts is
    seed: int = 0
    max_new_tokens: int = 144
    max_prompt_tokens: int = 320  # longer prompts are skipped (rare; keeps batches compact)
    shard_size: int = 64
    batch_size: int = 16
    max_minutes: float | None = None  # stop cleanly after the shard that crosses this; rerun to resume
    first_train_shard: int = 0  # train shards before this one are left for a later run (new prompts first)
    # decoder layers whose inputs are cached too, side by side (EAGLE-3's low, middle and high features; () none)
    aux_layers: tuple[int, ...] = ()
    answers_dir: str = ""  # keep each shard's answers here and rebuild from those found ("": none; see answers.py)


@dataclass
class FeatureSet:
    """All sequences of one split, concatenated."""

    tokens: torch.Tensor  # (N,) int64
    features: torch.Tensor  # (N, H) fp16
    offsets: torch.Tensor  # (n+1,) int64
    prompt_lens: torch.Tensor  # (n,) int64
    aux_features: torch.Tensor | None = None  # (N, len(aux_layers) * H) fp16, where the data has them

    def __len__(self) -> int:
        return len(self.prompt_lens)

    def sequence(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.tokens[a:b], self.features[a:b], int(self.prompt_lens[i])


# ---------------------------------------------------------------------------------------------- prompts


def read_instructions(path: str) -> list[str]:
    if any(name in Path(path).name for name in FORBIDDEN_PROMPTS):
        raise ValueError(f"{path} is a benchmark file; it must not be used for training")
    with open(path) as f:
        return [json.loads(line)["instruction"] for line in f if line.strip()]


def chat_prompt_ids(tokenizer, instruction: str) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": instruction}], add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers may return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def chosen_prompts(cfg: DataConfig, tokenizer) -> list[tuple[int, list[int]]]:
    """(row of the prompts file, prompt token ids) of the n_val + n_prompts prompts the data uses, in order:
    seeded shuffle, over-long prompts skipped, the held-out ones first."""
    instructions = read_instructions(cfg.prompts_path)
    order = np.random.default_rng(cfg.seed).permutation(len(instructions))
    wanted = cfg.n_val + cfg.n_prompts
    chosen: list[tuple[int, list[int]]] = []
    for i in order:
        ids = chat_prompt_ids(tokenizer, instructions[i])
        if len(ids) <= cfg.max_prompt_tokens:
            chosen.append((int(i), ids))
        if len(chosen) == wanted:
            break
    return chosen


def select_prompts(cfg: DataConfig, tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """(val, train) prompt token lists (chosen_prompts')."""
    chosen = [ids for _, ids in chosen_prompts(cfg, tokenizer)]
    return chosen[: cfg.n_val], chosen[cfg.n_val :]


def shard_plan(val: list, train: list, shard_size: int, first_train_shard: int = 0) -> list[tuple[str, list, int]]:
    """[(name, prompts, position of prompts[0] in val + train)]: val shards, then train shards from
    `first_train_shard` on (names count from the start of the prompt order whatever it is, so a later run can fill
    in the ones skipped)."""
    plan = []
    for split, prompts, first, offset in (("val", val, 0, 0), ("train", train, first_train_shard, len(val))):
        for k in range(first * shard_size, len(prompts), shard_size):
            plan.append((f"{split}-{k // shard_size:05d}", prompts[k : k + shard_size], offset + k))
    return plan


# ---------------------------------------------------------------------------------------------- generation


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # (B, P)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)  # (B, P)
    for row, s in enumerate(seqs):
        ids[row, width - len(s) :] = torch.tensor(s)
        mask[row, width - len(s) :] = 1
    return ids, mask


def right_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # (B, L)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)  # (B, L)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = torch.tensor(s)
        mask[row, : len(s)] = 1
    return ids, mask


def cut_at_eos(new_tokens: list[int], eos_id: int) -> list[int]:
    """Keep the response up to and including its first eos (the heads must learn to predict eos)."""
    return new_tokens[: new_tokens.index(eos_id) + 1] if eos_id in new_tokens else new_tokens


@torch.inference_mode()
def greedy_with_features(target, prompts: list[list[int]], max_new_tokens: int, eos_id: int,
                         aux_layers: tuple[int, ...] = ()):
    """Greedy responses and the final hidden state of every prompt+response position, from one `generate`.

    The prefill yields the prompt's features and each decode step the feature of the token it was fed; one extra
    step feeds the last generated column so that every row's final token has its feature too. Rows that stopped
    early are fed eos (= pad) afterwards, which is exactly their final token. Returns [(tokens, (n, H) fp16)], or
    with aux_layers [(tokens, (n, H) fp16, (n, len(aux_layers) * H) fp16)]: the inputs of those decoder layers
    (transformers' hidden_states[i] is the input of layer i), side by side in that order.
    """
    ids, mask = left_pad(prompts, eos_id)  # (B, P)
    out = target.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=eos_id, pad_token_id=eos_id, return_dict_in_generate=True, output_hidden_states=True,
    )
    seq = out.sequences  # (B, P + new)
    steps = [h[-1] for h in out.hidden_states]  # the last entry is the normed final hidden state
    full_mask = torch.cat([mask, torch.ones_like(seq[:, ids.shape[1] :])], dim=1)  # (B, P + new)
    last = target.model(
        input_ids=seq[:, -1:], attention_mask=full_mask, cache=out.past_key_values,
        position_ids=full_mask.sum(1, keepdim=True) - 1, output_hidden_states=bool(aux_layers),
    )
    hidden = torch.cat([*steps, last.last_hidden_state], dim=1)  # (B, P + new, H), aligned with seq
    aux = None
    if aux_layers:
        per_step = [torch.cat([h[i] for i in aux_layers], dim=-1) for h in (*out.hidden_states, last.hidden_states)]
        aux = torch.cat(per_step, dim=1)  # (B, P + new, len(aux_layers) * H)
    results = []
    for row, prompt in enumerate(prompts):
        response = cut_at_eos(seq[row, ids.shape[1] :].tolist(), eos_id)
        start, end = ids.shape[1] - len(prompt), ids.shape[1] + len(response)
        item = (prompt + response, hidden[row, start:end].to(torch.float16))
        results.append(item if aux is None else (*item, aux[row, start:end].to(torch.float16)))
    return results


@torch.inference_mode()
def teacher_forced_features(target, seqs: list[list[int]], eos_id: int, aux_layers: tuple[int, ...] = ()):
    """The features of finished sequences from one forward pass (right padding leaves causal positions untouched):
    [((n, H) fp16,)] per sequence, or with aux_layers [((n, H) fp16, (n, len(aux_layers) * H) fp16)] as
    greedy_with_features gives them."""
    ids, mask = right_pad(seqs, eos_id)  # (B, L)
    out = target.model(input_ids=ids, attention_mask=mask, output_hidden_states=bool(aux_layers))
    hidden = out.last_hidden_state  # (B, L, H)
    aux = torch.cat([out.hidden_states[i] for i in aux_layers], dim=-1) if aux_layers else None  # (B, L, 3H)
    return [(hidden[row, : len(s)].to(torch.float16),) if aux is None else
            (hidden[row, : len(s)].to(torch.float16), aux[row, : len(s)].to(torch.float16))
            for row, s in enumerate(seqs)]


def shard_rows(prompts: list[list[int]]) -> list[int]:
    """The order a shard keeps its prompts in: longest first, so that similar lengths share a generation batch."""
    return sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))


def generate_shard(target, prompts: list[list[int]], cfg: DataConfig, eos_id: int) -> tuple[list[int], list]:
    """(rows, [(tokens, features, aux features?)]): the target's greedy answers to prompts[rows[i]], row by row."""
    rows, items = shard_rows(prompts), []
    for k in range(0, len(rows), cfg.batch_size):
        batch = [prompts[i] for i in rows[k : k + cfg.batch_size]]
        items.extend(greedy_with_features(target, batch, cfg.max_new_tokens, eos_id, tuple(cfg.aux_layers)))
    return rows, items


def rebuild_shard(target, prompts: list[list[int]], rows: list[int], responses: list[list[int]], cfg: DataConfig,
                  eos_id: int) -> list:
    """[(tokens, features, aux features?)] of stored answers (row i: prompts[rows[i]] + responses[i]), teacher-forced
    a batch of similar lengths at a time: equal to the generation pass's to fp16 rounding."""
    seqs = [prompts[r] + list(a) for r, a in zip(rows, responses)]
    by_length = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    items: list = [None] * len(seqs)
    for k in range(0, len(seqs), cfg.batch_size):
        batch = by_length[k : k + cfg.batch_size]
        feats = teacher_forced_features(target, [seqs[i] for i in batch], eos_id, tuple(cfg.aux_layers))
        for i, f in zip(batch, feats):
            items[i] = (seqs[i], *f)
    return items


def assemble_shard(items: list, prompt_lens: list[int], vocab_size: int) -> dict:
    """The shard file's tensors from [(tokens, features, aux features?)] and each row's prompt length."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for (tokens, *_), plen in zip(items, prompt_lens):
        counts += torch.bincount(torch.tensor(tokens[plen:], dtype=torch.long), minlength=vocab_size)
    lengths = torch.tensor([len(tokens) for tokens, *_ in items])
    shard = {
        "tokens": torch.tensor([t for tokens, *_ in items for t in tokens], dtype=torch.int32),
        "features": torch.cat([item[1] for item in items]),
        "offsets": torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]),
        "prompt_lens": torch.tensor(prompt_lens, dtype=torch.int64),
        "token_counts": counts,
    }
    if len(items[0]) > 2:
        shard["aux_features"] = torch.cat([item[2] for item in items])
    return shard


# ---------------------------------------------------------------------------------------------- the job


def read_index(out_dir: str | Path) -> dict:
    path = Path(out_dir) / "index.json"
    return json.loads(path.read_text()) if path.exists() else {}


# What decides the contents of the shards already on disk: a rerun that changes one of these would mix two
# datasets (with another n_val, held-out prompts would become training ones). n_prompts may grow: that resumes.
# (The model and prompts paths are left out: the same files may sit elsewhere on another machine.)
MAKING = (*answers.MAKING, "aux_layers")  # what must not change between runs of one cache


def check_same_making(previous: dict, cfg: DataConfig, out: Path) -> None:
    # JSON keeps tuples as lists; an index made before aux_layers existed has none
    made = {"aux_layers": [], **previous} if previous else {}
    now = {key: list(v) if isinstance(v := getattr(cfg, key), tuple) else v for key in MAKING}
    changed = [f"{key} {made[key]!r} -> {now[key]!r}" for key in MAKING if key in made and made[key] != now[key]]
    if changed:
        raise SpecvizError(f"{out} holds data made with other settings ({'; '.join(changed)}): rerun with the same "
                           "ones to add to it, or choose another --data-dir")


def build_dataset(cfg: DataConfig, target=None, tokenizer=None) -> dict:
    """Make and cache every shard not yet on disk: rebuilt from its stored answers where cfg.answers_dir has them,
    else generated (and its answers stored there). Returns the index."""
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if target is None:
        target, tokenizer = load_target(cfg.model_path)
        fastlinear.pack_linears(target)  # inference only here: about 2x faster generation on a CPU
    eos_id = int(tokenizer.eos_token_id)
    index = read_index(out)
    check_same_making(index.get("config", {}), cfg, out)
    done = {s["name"]: s for s in index.get("shards", [])}
    val, train = select_prompts(cfg, tokenizer)
    plan = shard_plan(val, train, cfg.shard_size, cfg.first_train_shard)
    where = answers.folder(cfg)
    log.info("data: %d val + %d train prompts in %d shards, %d already done; answers in %s", len(val), len(train),
             len(plan), len(done), where)
    start = time.time()
    for name, prompts, first in plan:
        # a shard on disk is done unless it is a last, partial one that a larger n_prompts has grown since
        if name in done and done[name]["n_seqs"] == len(prompts) and (out / f"{name}.safetensors").exists():
            if where is not None and not answers.path_of(where, name).exists():
                keep_answers_of_cached_shard(out, where, name, prompts, first, cfg, done[name]["seconds"])
            continue
        t0 = time.time()
        stored = answers.matching(where, name, prompts, first) if where is not None else None
        if stored is not None:
            rows = [p - first for p in stored.positions]
            items = rebuild_shard(target, prompts, rows, stored.responses, cfg, eos_id)
        else:
            rows, items = generate_shard(target, prompts, cfg, eos_id)
            if where is not None:  # the answers first: a shard killed after them is rebuilt, not generated again
                answers.write(where, answers.from_rows(name, prompts, first, rows, [t for t, *_ in items],
                                                       time.time() - t0), cfg, Path(cfg.model_path).name)
        shard = assemble_shard(items, [len(prompts[r]) for r in rows], target.config.vocab_size)
        save_tensors_atomically(shard, out / f"{name}.safetensors")
        n_resp = int(shard["token_counts"].sum())
        done[name] = {
            "name": name, "split": name.split("-")[0], "n_seqs": len(prompts),
            "n_tokens": int(shard["tokens"].numel()), "n_response_tokens": n_resp,
            "seconds": round(time.time() - t0, 1),
            **({"rebuilt": True, "answers_seconds": stored.seconds} if stored is not None else {}),
        }
        index = {
            "config": asdict(cfg), "hidden_size": target.config.hidden_size,
            "vocab_size": target.config.vocab_size, "eos_token_id": eos_id,
            "shards": sorted(done.values(), key=lambda s: s["name"]),
        }
        write_atomically(out / "index.json", json.dumps(index, indent=2))
        log.info("shard %s: %d seqs, %d response tokens, %s in %.0f s (%.1f resp tok/s)", name, len(prompts), n_resp,
                 "rebuilt from stored answers" if stored is not None else "generated", time.time() - t0,
                 n_resp / (time.time() - t0))
        if cfg.max_minutes is not None and time.time() - start > 60 * cfg.max_minutes:
            log.info("data: time budget reached; rerun with the same arguments to resume")
            break
    return index


def keep_answers_of_cached_shard(out: Path, where: Path, name: str, prompts: list[list[int]], first: int,
                                 cfg: DataConfig, seconds: float) -> None:
    """Store the answers of a shard cached before its answers were kept (its tokens hold them)."""
    from safetensors import safe_open

    with safe_open(str(out / f"{name}.safetensors"), "pt") as f:
        tokens, offsets = f.get_tensor("tokens").tolist(), f.get_tensor("offsets").tolist()
    rows = shard_rows(prompts)
    seqs = [tokens[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    if len(seqs) != len(rows) or any(s[: len(prompts[r])] != prompts[r] for r, s in zip(rows, seqs)):
        log.warning("shard %s in %s does not hold this plan's prompts in order; its answers are not kept", name, out)
        return
    answers.write(where, answers.from_rows(name, prompts, first, rows, seqs, seconds), cfg, Path(cfg.model_path).name)


# ---------------------------------------------------------------------------------------------- reading


def load_split(data_dir: str | Path, split: str, max_seqs: int | None = None) -> FeatureSet:
    """One split's sequences, with the auxiliary layers' features where every shard has them."""
    data_dir = Path(data_dir)
    shards = [s for s in read_index(data_dir).get("shards", []) if s["split"] == split]
    if not shards:
        raise FileNotFoundError(f"no finished {split} shards in {data_dir}; run `train data` first")
    tokens, feats, aux, lengths, plens = [], [], [], [], []
    for s in shards:
        d = load_file(str(data_dir / f"{s['name']}.safetensors"))
        tokens.append(d["tokens"].long())
        feats.append(d["features"])
        aux.append(d.get("aux_features"))
        lengths.append(d["offsets"].diff())
        plens.append(d["prompt_lens"])
        if max_seqs is not None and sum(len(p) for p in plens) >= max_seqs:
            break
    lengths_t, plens_t = torch.cat(lengths), torch.cat(plens)
    n = len(plens_t) if max_seqs is None else min(max_seqs, len(plens_t))
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths_t.cumsum(0)])
    end = int(offsets[n])
    aux_t = torch.cat(aux)[:end] if all(a is not None for a in aux) else None
    return FeatureSet(torch.cat(tokens)[:end], torch.cat(feats)[:end], offsets[: n + 1], plens_t[:n], aux_t)


def token_counts(data_dir: str | Path) -> torch.Tensor:
    """Target token frequency over the training responses and prompts (the target often copies). (V,) int64"""
    data_dir = Path(data_dir)
    total = None
    for s in read_index(data_dir)["shards"]:
        if s["split"] != "train":
            continue
        shard = load_file(str(data_dir / f"{s['name']}.safetensors"))
        counts = shard["token_counts"].clone()  # responses
        tokens, starts = shard["tokens"].long(), shard["offsets"][:-1]
        for start, plen in zip(starts.tolist(), shard["prompt_lens"].tolist()):
            counts += torch.bincount(tokens[start : start + plen], minlength=len(counts))
        total = counts if total is None else total + counts
    return total


def draft_vocabulary(counts: torch.Tensor, size: int, eos_id: int) -> torch.Tensor:
    """The `size` most frequent tokens, eos first, then by falling frequency. (Vd,) int64

    Frequency order lets a drafter use a prefix of it (`draft_vocab=N`): the N most frequent tokens.

    Unseen tokens are ranked by id (lower first): BPE ids follow merge order, a rough frequency prior. With the
    small self-distillation set this matters: on held-out responses, 8192 tokens cover 91.5% by counts alone and
    93.8% with the prior and prompt counts; 16384 cover 96.8%.
    """
    vocab = len(counts)
    score = counts.double() + 0.5 * (1 - torch.arange(vocab, dtype=torch.double) / vocab)
    score[eos_id] = float("inf")
    return torch.topk(score, size).indices  # topk returns them by falling score


def training_vocabulary(data_dir: str | Path, size: int) -> torch.Tensor:
    """The draft vocabulary of the cached data: its `size` most frequent tokens, eos first (see draft_vocabulary)."""
    counts = token_counts(data_dir)
    return draft_vocabulary(counts, min(size, len(counts)), read_index(data_dir)["eos_token_id"])
