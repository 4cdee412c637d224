"""Tiny end-to-end runs: data -> EAGLE / Medusa / draft trainers on a random 2-layer model, in seconds."""

import json
from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specviz.errors import SpecvizError
from specviz.models.heads import EagleHead, MedusaHeads, build_draft_model
from specviz.train.data import (
    DataConfig,
    build_dataset,
    draft_vocabulary,
    load_split,
    read_index,
    read_instructions,
    token_counts,
)
from specviz.train.loop import TrainConfig

VOCAB = 128
EOS = 2


class ByteTokenizer:
    """Just what the data job needs: a chat template that turns text into ids, and an eos id."""

    eos_token_id = EOS

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        text = "".join(m["content"] for m in messages)
        return [1] + [3 + (b % (VOCAB - 3)) for b in text.encode()][:24] + [1]


def tiny_target():
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=VOCAB, eos_token_id=EOS, pad_token_id=EOS,
                      tie_word_embeddings=False)  # tied random weights just repeat the last token
    model = LlamaForCausalLM(cfg).eval().requires_grad_(False)
    with torch.no_grad():  # peaked enough that greedy text has structure (entropy ~1.7 nats) to learn
        model.model.embed_tokens.weight.mul_(20)
        model.lm_head.weight.mul_(20)
    return model


def tiny_data_config(root, **settings) -> DataConfig:
    """40 prompts written under `root`: 8 held out, 32 for training, in shards of 8, answers of up to 20 tokens."""
    prompts = root / "prompts.jsonl"
    with prompts.open("w") as f:
        for i in range(40):
            f.write(json.dumps({"id": i, "instruction": f"question number {i} about {'abc' * (i % 5)}"}) + "\n")
    return DataConfig(**{"model_path": "unused", "out_dir": str(root / "cache"), "prompts_path": str(prompts),
                         "n_prompts": 32, "n_val": 8, "max_new_tokens": 20, "shard_size": 8, "batch_size": 4,
                         **settings})


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    target = tiny_target()
    cfg = tiny_data_config(root)
    index = build_dataset(cfg, target, ByteTokenizer())
    return target, cfg, index, root


def test_data_shards_index_and_resume(dataset):
    target, cfg, index, _ = dataset
    assert [s["split"] for s in index["shards"]].count("val") == 1
    assert sum(s["n_seqs"] for s in index["shards"] if s["split"] == "train") == 32
    train = load_split(cfg.out_dir, "train")
    tokens, feats, plen = train.sequence(0)
    assert feats.shape == (len(tokens), 64) and feats.dtype == torch.float16
    with torch.no_grad():  # cached features are the target's final hidden states
        ref = target.model(input_ids=tokens[None]).last_hidden_state[0]
    assert torch.allclose(feats.float(), ref, atol=2e-2, rtol=1e-2)
    again = build_dataset(cfg, target, ByteTokenizer())  # every shard already there: nothing regenerated
    assert again["shards"] == index["shards"]
    with pytest.raises(SpecvizError, match=r"other settings \(n_val 8 -> 4\)"):  # held-out prompts would leak
        build_dataset(replace(cfg, n_val=4), target, ByteTokenizer())
    assert read_index(cfg.out_dir)["shards"] == index["shards"]  # and the index is as it was
    counts = token_counts(cfg.out_dir)
    vocab = draft_vocabulary(counts, 16, EOS)
    assert vocab[0] == EOS and len(vocab) == 16 and len(set(vocab.tolist())) == 16
    rest = counts[vocab[1:]]
    assert torch.all(rest[:-1] >= rest[1:]), "a prefix of the draft vocabulary must be its most frequent tokens"
    assert rest[-1] >= counts[[t for t in range(len(counts)) if t not in set(vocab.tolist())]].max()


def test_later_train_shards_first_then_the_rest(dataset, tmp_path):
    """--first-train-shard makes the later prompts' shards under their own names; a run without it fills in the
    earlier ones, and the two runs together hold exactly what one full run holds."""
    target, cfg, index, _ = dataset
    later = replace(cfg, out_dir=str(tmp_path / "later"), first_train_shard=2)
    names = [s["name"] for s in build_dataset(later, target, ByteTokenizer())["shards"]]
    assert names == ["train-00002", "train-00003", "val-00000"]
    filled = build_dataset(replace(later, first_train_shard=0), target, ByteTokenizer())
    assert [s["name"] for s in filled["shards"]] == [s["name"] for s in index["shards"]]
    for split in ("train", "val"):
        ours, full = load_split(later.out_dir, split), load_split(cfg.out_dir, split)
        assert torch.equal(ours.tokens, full.tokens) and torch.equal(ours.offsets, full.offsets)


def test_auxiliary_layer_features_are_those_layers_inputs(dataset, tmp_path):
    """--aux-layers caches the inputs of the named decoder layers side by side (EAGLE-3's fused features), equal
    to a clean forward's to fp16 rounding, the final features unchanged; data made without them cannot be
    extended with them (one dataset, one making)."""
    target, cfg, _, _ = dataset
    layers = (1, 0, 2)  # any order (2, the last entry of transformers' hidden_states, is the normed output)
    aux = replace(cfg, out_dir=str(tmp_path / "aux"), n_prompts=8, aux_layers=layers)
    build_dataset(aux, target, ByteTokenizer())
    val, plain = load_split(aux.out_dir, "val"), load_split(cfg.out_dir, "val")
    assert torch.equal(val.tokens, plain.tokens) and torch.equal(val.features, plain.features)
    assert plain.aux_features is None and val.aux_features.shape == (len(val.tokens), 3 * 64)
    for i in range(len(val)):
        tokens, _, _ = val.sequence(i)
        a, b = int(val.offsets[i]), int(val.offsets[i + 1])
        with torch.no_grad():
            states = target.model(input_ids=tokens[None], output_hidden_states=True).hidden_states
        ref = torch.cat([states[j][0] for j in layers], dim=-1)
        assert torch.allclose(val.aux_features[a:b].float(), ref, atol=2e-2, rtol=1e-2)
    with pytest.raises(SpecvizError, match="aux_layers"):
        build_dataset(replace(cfg, aux_layers=layers), target, ByteTokenizer())


def test_eagle3_default_layers():
    from specviz.models.eagle3 import default_aux_layers

    assert default_aux_layers(30) == (2, 15, 27) and default_aux_layers(32) == (2, 16, 29)


def test_benchmark_prompts_refused(tmp_path):
    bad = tmp_path / "mt_bench.jsonl"
    bad.write_text('{"instruction": "x"}\n')
    with pytest.raises(ValueError):
        read_instructions(str(bad))


def run_config(kind, dataset, tmp_path, **kw):
    _, cfg, _, _ = dataset
    base = dict(kind=kind, model_path="unused", data_dir=cfg.out_dir, out=str(tmp_path / kind),
                work_dir=str(tmp_path / "runs"), steps=60, batch_seqs=4, lr=3e-3, warmup=5, eval_seqs=8,
                draft_vocab_size=64)
    base.update(kw)
    return TrainConfig(**base)


def first_last(kind, tmp_path, key):
    from specviz.train.loop import History

    state = torch.load(tmp_path / "runs" / kind / "checkpoint.pt", weights_only=True)
    losses = History(**state["history"]).losses
    return losses[0][key], losses[-1][key]


def test_eagle_trains_and_loads(dataset, tmp_path):
    from specviz.train.eagle import train_eagle

    target = dataset[0]
    metrics = train_eagle(run_config("eagle", dataset, tmp_path, unroll=2), target)
    first, last = first_last("eagle", tmp_path, "vloss")
    assert last < first
    head = EagleHead.load(tmp_path / "eagle", target.config)
    assert head.draft_vocab is not None and (tmp_path / "eagle" / "PROVENANCE.md").exists()
    assert 0.0 <= metrics["fp32"]["acc1"] <= 1.0


def test_eagle_goes_on_from_a_trained_head(dataset, tmp_path):
    """--init: the second run starts where the first one's file ended (same numbers before any step), keeps its
    draft vocabulary even when asked for another size, and carries the first run's provenance. --loss-vocab: the
    distribution loss over a prefix of that vocabulary (the stored vocabulary stays whole)."""
    from specviz.train.eagle import train_eagle

    target = dataset[0]
    first = train_eagle(run_config("eagle", dataset, tmp_path, unroll=1, steps=40), target)
    again = run_config("eagle", dataset, tmp_path, unroll=1, steps=40, init=str(tmp_path / "eagle"),
                       out=str(tmp_path / "eagle-2"), work_dir=str(tmp_path / "runs-2"), draft_vocab_size=32, lr=1e-3,
                       loss_vocab=16)
    second = train_eagle(again, target)
    assert second[f"initial head ({tmp_path / 'eagle'})"] == first["fp16 (shipped)"]
    old, new = (EagleHead.load(tmp_path / name, target.config) for name in ("eagle", "eagle-2"))
    assert torch.equal(old.draft_vocab, new.draft_vocab) and len(new.draft_vocab) == 64
    assert not torch.equal(old.fc.weight, new.fc.weight)
    provenance = (tmp_path / "eagle-2" / "PROVENANCE.md").read_text()
    assert "## How the initial head was made" in provenance and provenance.count("## Validation") == 2
    assert "soft CE(p, q) over the 16 most frequent tokens of the 64-token draft vocabulary" in provenance
    assert "inputs of target layers" not in provenance and "--aux-layers" not in provenance  # final states only
    with pytest.raises(ValueError, match="no draft vocabulary"):
        from specviz.models.heads import write_weights

        write_weights(tmp_path / "bare", dict(old.state_dict()), {"kind": "eagle"}, torch.float16)
        train_eagle(run_config("eagle", dataset, tmp_path, init=str(tmp_path / "bare")), target)


@pytest.fixture(scope="module")
def aux_dataset(dataset, tmp_path_factory):
    """The same prompts with the inputs of layers 0, 1 and 1 cached (a 2-layer target's EAGLE-3 features)."""
    target, cfg, _, _ = dataset
    aux = replace(cfg, out_dir=str(tmp_path_factory.mktemp("aux") / "cache"), aux_layers=(0, 1, 1))
    return target, aux, build_dataset(aux, target, ByteTokenizer()), None


def test_eagle3_trains_with_training_time_test_and_ships_if_better(aux_dataset, tmp_path):
    """Three unrolled draft steps: every step's loss falls, the head loads from its speculators-layout folder with
    the data's layers, and a second run that does not beat it is written aside, not over it."""
    from specviz.models.eagle3 import Eagle3Head
    from specviz.train.eagle3 import train_eagle3

    target = aux_dataset[0]
    metrics = train_eagle3(run_config("eagle3", aux_dataset, tmp_path, unroll=3, steps=80, loss_vocab=32), target)
    for k in range(3):
        first, last = first_last("eagle3", tmp_path, f"ploss{k}")
        assert last < first, f"step {k} did not learn"
    head = Eagle3Head.load(tmp_path / "eagle3", target.config)
    assert head.aux_layers == (0, 1, 1) and head.lm_head is None and head.draft_vocab_size == 64
    assert bool(head.t2d[head.draft_ids()].all()) and int(head.t2d.sum()) == 64
    assert metrics["fp32"]["acc1"] > 2 * metrics["random head"]["acc1"]
    assert set(metrics["fp32"]) == {"acc1", "acc2_given1", "acc3_given2", "positions"}
    shipped = (tmp_path / "eagle3" / "model.safetensors").read_bytes()
    worse = run_config("eagle3", aux_dataset, tmp_path, unroll=1, steps=2, lr=1e-6, work_dir=str(tmp_path / "r2"))
    train_eagle3(worse, target)
    assert (tmp_path / "eagle3" / "model.safetensors").read_bytes() == shipped
    assert (tmp_path / "r2" / "eagle3" / "not-shipped" / "model.safetensors").is_file()
    written = (tmp_path / "eagle3" / "PROVENANCE.md").read_text()  # the data's layer inputs, and how to make them
    assert "and the inputs of target layers [0, 1, 1] side by side" in written and " --aux-layers 0,1,1 " in written
    again = run_config("eagle3", aux_dataset, tmp_path, unroll=3, steps=25, init=str(tmp_path / "eagle3"), bf16=True,
                       loss_vocab=32, out=str(tmp_path / "eagle3-b"), work_dir=str(tmp_path / "r3"))
    second = train_eagle3(again, target)  # --init (under bf16 autocast): it goes on from the trained head
    assert second[f"initial head ({tmp_path / 'eagle3'})"] == metrics["fp16 (shipped)"]  # judged before any step
    state = torch.load(tmp_path / "r3" / "eagle3" / "checkpoint.pt", weights_only=True)
    from specviz.train.loop import History

    assert History(**state["history"]).losses[0]["ploss0"] < first_last("eagle3", tmp_path, "ploss0")[0]
    provenance = (tmp_path / "eagle3-b" / "PROVENANCE.md").read_text()
    assert "Started from the head in" in provenance and "## How the initial head was made" in provenance
    assert provenance.count("## Validation") == 2


def test_eagle3_needs_data_with_auxiliary_layers(dataset, tmp_path):
    from specviz.train.eagle3 import train_eagle3

    with pytest.raises(ValueError, match="aux-layers eagle3"):
        train_eagle3(run_config("eagle3", dataset, tmp_path), dataset[0])


def test_medusa_trains_and_loads(dataset, tmp_path):
    from specviz.train.medusa import train_medusa

    target = dataset[0]
    train_medusa(run_config("medusa", dataset, tmp_path, medusa_heads=2), target)
    first, last = first_last("medusa", tmp_path, "ce0")
    assert last < first
    heads = MedusaHeads.load(tmp_path / "medusa", target.config)
    assert heads.num_heads == 2 and not heads.own_projection


def test_draft_trains_and_builds(dataset, tmp_path):
    from specviz.train.draft import train_draft

    target = dataset[0]
    train_draft(run_config("draft", dataset, tmp_path, draft_layers=(1,), lr=1e-3), target)
    first, last = first_last("draft", tmp_path, "kl")
    assert last < first
    draft = build_draft_model(target, tmp_path / "draft")
    assert draft.config.num_hidden_layers == 1
    assert draft.get_input_embeddings().weight is target.get_input_embeddings().weight
    assert draft.get_output_embeddings().weight is target.get_output_embeddings().weight


def test_resume_continues_from_checkpoint(dataset, tmp_path):
    from specviz.train.medusa import train_medusa

    target = dataset[0]
    train_medusa(run_config("medusa", dataset, tmp_path, medusa_heads=1, steps=20), target)
    train_medusa(run_config("medusa", dataset, tmp_path, medusa_heads=1, steps=30, resume=True), target)
    state = torch.load(tmp_path / "runs" / "medusa" / "checkpoint.pt", weights_only=True)
    assert state["history"]["finished_steps"] == 30
    # the first window after resuming at 20 holds 5 steps (21-25), not log_every = 25: its mean is a mean
    history = state["history"]
    loss = {step: means["ce0"] for step, means in zip(history["steps"], history["losses"])}  # head 0's cross-entropy
    assert list(loss) == [20, 25, 30] and 0.5 < loss[25] / loss[30] < 2, loss


@torch.no_grad()
def test_depth2_training_pass_equals_sequential_drafting():
    """The masked depth-2 pass sees exactly what the drafter sees when it drafts a second token."""
    from transformers import DynamicCache

    from specviz.train.eagle import run_depths

    target = tiny_target()
    head = EagleHead(target.config).eval()
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(1, 9, 64, generator=g)  # (B, L, H)
    tokens = torch.randint(0, VOCAB, (1, 9), generator=g)  # (B, L) the next tokens
    pos = torch.arange(9)[None]
    embed = target.get_input_embeddings()
    out1, out2 = run_depths(head, embed, feats, tokens, pos, depth=2)
    for s in (1, 4, 8):
        cache = DynamicCache()
        head(feats[:, :s], embed(tokens[:, :s]), pos[:, :s], past_key_values=cache)  # true context 0..s-1
        again = head(out1[:, s - 1 : s], embed(tokens[:, s : s + 1]), pos[:, s : s + 1], past_key_values=cache)
        torch.testing.assert_close(out2[:, s], again[:, 0], atol=1e-5, rtol=1e-5)


def test_cli_builds_the_training_config():
    from specviz.train.cli import build_train_parser, train_config

    argv = ["draft", "--steps", "7", "--draft-layers", "0", "5", "--max-minutes", "2", "--resume"]
    cfg = train_config(build_train_parser().parse_args(argv), argv)
    assert (cfg.kind, cfg.steps, cfg.draft_layers, cfg.max_minutes, cfg.resume) == ("draft", 7, (0, 5), 2.0, True)
    assert cfg.out == "assets/draft-smollm2-135m" and cfg.command.endswith("--resume")
