"""Answers that travel: the data job keeps each shard's answers as a small compressed file, and a cache remade from
them (one teacher-forced forward pass a shard, no generation) holds what the generating run made, to fp16 rounding."""

import json
import lzma
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_train import ByteTokenizer, tiny_data_config, tiny_target

from specviz.errors import SpecvizError
from specviz.train import answers
from specviz.train.data import DataConfig, build_dataset, load_split


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A cache with EAGLE-3-style features, generated, its answers kept in a folder of their own."""
    root = tmp_path_factory.mktemp("answers")
    cfg = tiny_data_config(root, model_path="tiny", aux_layers=(1, 0, 2), answers_dir=str(root / "answers"))
    target = tiny_target()
    return target, cfg, build_dataset(cfg, target, ByteTokenizer())


def no_generation(*args, **kwargs):
    raise AssertionError("a shard with stored answers must be rebuilt, not generated")


def assert_equal_to_fp16_rounding(rebuilt: torch.Tensor, generated: torch.Tensor) -> None:
    """Row by row no further apart than rounding to fp16 moves a vector: relative L2 distance at most fp16's unit
    roundoff, 2^-11. (The two passes sum in other orders and batch shapes; fp32 keeps that far below it: 1.8e-4 at
    most on SmolLM2-135M. Element by element is too strict a test: a value near zero in a row of large ones
    carries the row's absolute error.)"""
    a, b = rebuilt.float(), generated.float()
    distance = (a - b).norm(dim=-1) / b.norm(dim=-1).clamp(min=1e-6)  # (N,)
    assert float(distance.max()) <= 2.0 ** -11, float(distance.max())


def test_a_cache_rebuilt_from_the_answers_equals_the_generated_one(made, tmp_path, monkeypatch):
    target, cfg, index = made
    where = answers.folder(cfg)
    assert sorted(p.name for p in where.iterdir()) == [f"{s['name']}.json.xz" for s in index["shards"]]
    with lzma.open(answers.path_of(where, "train-00001"), "rt") as f:
        doc = json.load(f)
    assert doc["positions"] and sorted(doc["positions"]) == list(range(8 + 8, 8 + 16))  # after the 8 held out
    assert doc["making"]["max_new_tokens"] == 20 and doc["target"] == "tiny"

    monkeypatch.setattr(target, "generate", no_generation)
    again = replace(cfg, out_dir=str(tmp_path / "again"))
    rebuilt = build_dataset(again, target, ByteTokenizer())
    assert all(s.get("rebuilt") for s in rebuilt["shards"])
    assert [s["n_response_tokens"] for s in rebuilt["shards"]] == [s["n_response_tokens"] for s in index["shards"]]
    for split in ("val", "train"):
        new, old = load_split(again.out_dir, split), load_split(cfg.out_dir, split)
        for key in ("tokens", "offsets", "prompt_lens"):
            assert torch.equal(getattr(new, key), getattr(old, key)), key
        assert_equal_to_fp16_rounding(new.features, old.features)
        assert_equal_to_fp16_rounding(new.aux_features, old.aux_features)
    with pytest.raises(AssertionError):  # the check is able to fail: features of the neighbouring position
        assert_equal_to_fp16_rounding(new.features[1:], old.features[:-1])


def test_only_the_answers_making_names_their_folder(made):
    _, cfg, _ = made
    assert answers.folder(replace(cfg, aux_layers=())) == answers.folder(cfg)  # one set of answers, any layers
    assert answers.folder(replace(cfg, max_new_tokens=21)) != answers.folder(cfg)
    assert answers.folder(replace(cfg, answers_dir="")) is None
    from specviz.train.cli import answers_dir

    assert answers_dir(None, "/models/smollm2-135m") == str(answers.ANSWERS_ROOT / "smollm2-135m")  # the committed one
    assert answers_dir("none", "/models/smollm2-135m") == "" and answers_dir("elsewhere", "m") == "elsewhere"


def test_answers_of_a_cache_made_without_them_are_kept_from_its_tokens(made, tmp_path, monkeypatch):
    target, cfg, _ = made
    monkeypatch.setattr(target, "generate", no_generation)
    later = replace(cfg, answers_dir=str(tmp_path / "kept"))
    build_dataset(later, target, ByteTokenizer())  # every shard cached: its answers are read off its tokens
    for path in sorted(answers.folder(cfg).iterdir()):
        name = path.name.removesuffix(answers.SUFFIX)
        kept, made_then = answers.read(answers.folder(later), name), answers.read(answers.folder(cfg), name)
        assert replace(kept, seconds=0) == replace(made_then, seconds=0)  # (the cache's time includes saving)


def test_an_answers_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    cfg = DataConfig(answers_dir=str(tmp_path))
    first = answers.Answers("train-00000", [3, 4], [[5, 6, 2], [7, 2]], answers.prompt_digest([[1], [1]]), 1.0)
    answers.write(tmp_path, first, cfg, "tiny")

    def half_then_fail(doc, f, **kwargs):
        f.write(json.dumps(doc)[:20])
        raise OSError("disk full")

    monkeypatch.setattr(answers.json, "dump", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        answers.write(tmp_path, replace(first, positions=[4, 3]), cfg, "tiny")
    with pytest.raises(OSError, match="disk full"):
        answers.write(tmp_path, replace(first, name="train-00001"), cfg, "tiny")
    assert [p.name for p in tmp_path.iterdir()] == ["train-00000.json.xz"]  # no temporary file, no half file
    assert answers.read(tmp_path, "train-00000") == first


def test_answers_to_other_prompt_tokens_are_refused_and_a_grown_shard_is_made_again(made, tmp_path):
    target, cfg, _ = made
    copied = tmp_path / "answers"
    shutil.copytree(cfg.answers_dir, copied)

    class OtherTemplate(ByteTokenizer):
        def apply_chat_template(self, messages, **kwargs):
            return super().apply_chat_template(messages, **kwargs)[:-1] + [0]  # another end-of-turn token

    other = replace(cfg, out_dir=str(tmp_path / "other"), answers_dir=str(copied))
    with pytest.raises(SpecvizError, match="other prompt tokens"):
        build_dataset(other, target, OtherTemplate())

    fewer = replace(cfg, n_prompts=28, out_dir=str(tmp_path / "fewer"), answers_dir=str(tmp_path / "fewer-answers"))
    build_dataset(fewer, target, ByteTokenizer())  # its last train shard holds 4 prompts
    grown = replace(fewer, n_prompts=32, out_dir=str(tmp_path / "grown"))
    index = build_dataset(grown, target, ByteTokenizer())
    assert [s["name"] for s in index["shards"] if not s.get("rebuilt")] == ["train-00003"]
    assert len(answers.read(answers.folder(grown), "train-00003").positions) == 8
    # grown in its own cache: the partial shard there is made again with all its prompts, not kept as it was
    index = build_dataset(replace(fewer, n_prompts=32), target, ByteTokenizer())
    assert {s["name"]: s["n_seqs"] for s in index["shards"]}["train-00003"] == 8
    assert len(load_split(fewer.out_dir, "train")) == 32


MODEL = Path(os.environ.get("SPECVIZ_CACHE") or Path.home() / ".cache" / "specviz") / "smollm2-135m"


@pytest.mark.skipif(not (MODEL / "model.safetensors").exists(), reason=f"target weights not at {MODEL}")
def test_the_real_targets_rebuilt_features_equal_its_generated_ones():
    """SmolLM2-135M as the data job runs it (packed linears): three answers generated in one batch, then their
    final and EAGLE-3 features rebuilt by one teacher-forced pass."""
    from specviz.kernels import fastlinear
    from specviz.train.common import load_target
    from specviz.train.data import chat_prompt_ids, generate_shard, rebuild_shard

    target, tokenizer = load_target(MODEL)
    fastlinear.pack_linears(target)
    prompts = [chat_prompt_ids(tokenizer, p) for p in ("Name three primary colours.", "What is 17 times 3?",
                                                       "Translate 'good morning' into French.")]
    cfg = DataConfig(batch_size=3, max_new_tokens=24, aux_layers=(2, 15, 27))
    eos = int(tokenizer.eos_token_id)
    rows, generated = generate_shard(target, prompts, cfg, eos)
    responses = [tokens[len(prompts[r]):] for r, (tokens, *_) in zip(rows, generated)]
    for (tokens, feats, aux), (again, feats2, aux2) in zip(generated, rebuild_shard(target, prompts, rows, responses,
                                                                                    cfg, eos)):
        assert again == tokens
        assert_equal_to_fp16_rounding(feats2, feats)
        assert_equal_to_fp16_rounding(aux2, aux)
