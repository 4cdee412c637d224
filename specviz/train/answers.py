"""The self-distilled answers as small files that travel with the repository.

A data cache's features are large (about 1.2 KB a token, 4.7 KB with EAGLE-3's three layers) and stay on the
machine that made them; the answers they come from are token ids, about 10 KB a shard of 64 answers once
compressed. The data job writes one answers file per shard into a folder committed to git, and when it finds the
file of a shard it is about to make, it rebuilds that shard's features with one teacher-forced forward pass over
the stored answers instead of generating them again (`data.rebuild_shard`).

The folder is `<answers_dir>/<making>/`, `making` naming the settings that decide the answers (prompts file, seed,
held-out count, answer and prompt length limits, shard size), so answers made otherwise never mix. The features'
layers are not among them: the same answers serve an EAGLE-2 cache and an EAGLE-3 one. One file a shard,
`train-00150.json.xz` (xz-compressed JSON, readable with `xz -dc`):

    name            the shard's name, as in the cache
    making          the settings above, spelled out
    target          the target's folder name
    prompt_sha256   digest of the rows' prompt token ids: answers to other prompt tokens (another tokenizer or
                    chat template) are refused, not rebuilt
    positions       (n,) each row's prompt in the shuffled prompt order (the held-out prompts first, then training)
    responses       (n,) each row's response token ids, eos kept
    seconds         how long generating the shard took
"""

from __future__ import annotations

import hashlib
import json
import lzma
from dataclasses import dataclass
from pathlib import Path

from specviz.atomic import replacing
from specviz.errors import SpecvizError

# Where the CLI's data job keeps answers by default: a folder of the working directory, as the trainer's --out is
# (from the repository's root, its data/answers/, committed to git); training data, never read at run time.
ANSWERS_ROOT = Path("data") / "answers"
FORMAT = 1
SUFFIX = ".json.xz"


@dataclass(frozen=True)
class Answers:
    """One shard's answers: row i answers the prompt at `positions[i]` of the shuffled order with `responses[i]`."""

    name: str
    positions: list[int]
    responses: list[list[int]]
    prompt_sha256: str
    seconds: float = 0.0


# The settings of a DataConfig that decide which prompts a shard holds and how they are answered (with the
# prompts file); the data job's own MAKING adds what decides its features.
MAKING = ("seed", "n_val", "max_new_tokens", "max_prompt_tokens", "shard_size")


def making(cfg) -> dict:
    return {"prompts": Path(cfg.prompts_path).stem, **{key: getattr(cfg, key) for key in MAKING}}


def folder(cfg) -> Path | None:
    """Where this making's answers live under cfg.answers_dir (None: the job keeps no answers)."""
    if not cfg.answers_dir:
        return None
    m = making(cfg)
    name = (f"{m['prompts']}-seed{m['seed']}-val{m['n_val']}-new{m['max_new_tokens']}"
            f"-plen{m['max_prompt_tokens']}-shard{m['shard_size']}")
    return Path(cfg.answers_dir) / name


def prompt_digest(prompts: list[list[int]]) -> str:
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps(p, separators=(",", ":")).encode() + b"\n")
    return h.hexdigest()


def path_of(where: Path, name: str) -> Path:
    return where / f"{name}{SUFFIX}"


def write(where: Path, answers: Answers, cfg, target_name: str) -> Path:
    """The shard's answers file, written whole or not at all (a temporary file renamed onto it)."""
    doc = {"format": FORMAT, "name": answers.name, "making": making(cfg), "target": target_name,
           "prompt_sha256": answers.prompt_sha256, "seconds": round(answers.seconds, 1),
           "positions": answers.positions, "responses": answers.responses}
    path = path_of(where, answers.name)
    with replacing(path) as temp:
        with lzma.open(temp, "wt", encoding="utf-8", preset=9) as f:
            json.dump(doc, f, separators=(",", ":"))
    return path


def read(where: Path, name: str) -> Answers | None:
    path = path_of(where, name)
    if not path.is_file():
        return None
    with lzma.open(path, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("format") != FORMAT or doc.get("name") != name:
        raise SpecvizError(f"{path} is not an answers file of shard {name} (format {doc.get('format')!r})")
    return Answers(name, doc["positions"], doc["responses"], doc["prompt_sha256"], doc.get("seconds", 0.0))


def matching(where: Path, name: str, prompts: list[list[int]], first: int) -> Answers | None:
    """The stored answers of shard `name` when they answer exactly its planned prompts (`prompts`, the first at
    position `first` of the shuffled order); None when there are none or they cover other positions (a last,
    partial shard that has grown since). Answers to the same positions with other prompt tokens are an error."""
    answers = read(where, name)
    if answers is None or sorted(answers.positions) != list(range(first, first + len(prompts))):
        return None
    if prompt_digest([prompts[p - first] for p in answers.positions]) != answers.prompt_sha256:
        raise SpecvizError(f"{path_of(where, name)} answers other prompt tokens than this tokenizer and chat "
                           "template make: move that folder aside, or pass another --answers-dir")
    return answers


def from_rows(name: str, prompts: list[list[int]], first: int, rows: list[int], seqs: list[list[int]],
              seconds: float) -> Answers:
    """A shard's answers from its sequences: row i holds prompt `rows[i]` of `prompts` followed by its answer."""
    chosen = [prompts[r] for r in rows]
    responses = [seq[len(p):] for p, seq in zip(chosen, seqs)]
    return Answers(name, [first + r for r in rows], responses, prompt_digest(chosen), seconds)
