"""Adding a drafter that drafts with weights of its own is still its file and its registry line: a toy drafter
defined here, whose spec declares its trained part (a name, a loader, a trainer), is trained for a few steps on the
tiny model, saved, loaded through its spec, and decodes at temperature 0 exactly as `none` does."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import specviz
from specviz import drafters
from specviz.decoding.drafter import Drafter, DraftRequest
from specviz.decoding.tree import ROOT, DraftTree
from specviz.drafters import DrafterSpec, K
from specviz.drafters.eagle import HEAD
from specviz.drafters.spec import head_of
from specviz.models.loading import LoadedModels, load_trained
from specviz.models.parts import PARTS, Part
from specviz.train.cli import trainer
from specviz.train.loop import TrainConfig

from tiny import TinyTokenizer, tiny_llama

VOCAB = 64


class Bigram(torch.nn.Module):
    """One linear layer over the target's embedding of the last token: logits (V,) for the next one."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.out = torch.nn.Linear(hidden, vocab)

    def forward(self, embeds: torch.Tensor) -> torch.Tensor:  # (T, H) -> (T, V)
        out: torch.Tensor = self.out(embeds)
        return out


def load(folder: Path, target, dtype: torch.dtype) -> Bigram:
    config = json.loads((folder / "config.json").read_text())
    head = Bigram(config["hidden"], config["vocab"])
    head.load_state_dict(load_file(str(folder / "model.safetensors")))
    return head


def train(cfg: TrainConfig) -> None:
    """Teach the head the target's greedy next token after random contexts, then save it into cfg.out."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(cfg.model_path).eval()
    embed = target.get_input_embeddings()
    head = Bigram(embed.embedding_dim, target.config.vocab_size)
    generator = torch.Generator().manual_seed(cfg.seed)
    optimizer = torch.optim.Adam(head.parameters(), lr=cfg.lr)
    for _ in range(cfg.steps):
        ids = torch.randint(0, target.config.vocab_size, (cfg.batch_seqs, 8), generator=generator)
        with torch.no_grad():
            wanted = target(input_ids=ids).logits.argmax(-1)  # (B, T)
            embeds = embed(ids)  # (B, T, H)
        loss = torch.nn.functional.cross_entropy(head(embeds).flatten(0, 1), wanted.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(head.state_dict(), str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({"hidden": embed.embedding_dim, "vocab": target.config.vocab_size}))


class BigramDrafter(Drafter):
    """Proposes a greedy chain from the head: each token a point mass (no q), so verification is exact."""

    name = "bigram"

    def __init__(self, head: Bigram, target, k: int = 4):
        self.head, self.embed, self.k = head, target.get_input_embeddings(), k
        self.dtype = next(head.parameters()).dtype  # loaded in specviz.models.draft_dtype (bf16 on some CPUs)

    @torch.inference_mode()
    def propose(self, request: DraftRequest) -> DraftTree:
        tree, parent, token = DraftTree(), ROOT, int(request.ids[-1])
        for _ in range(min(self.k, request.max_depth)):
            token = int(self.head(self.embed(torch.tensor([token])).to(self.dtype))[0].argmax())
            parent = tree.add(token, parent)
        return tree


def build(models: LoadedModels, k: int, options: dict) -> BigramDrafter:
    head = head_of(models, "bigram", options, "bigram", PART.train)
    return BigramDrafter(head, models.target, k)  # type: ignore[arg-type]


PART = Part("bigram", load, "a test's train()", f"{__name__}:train")
SPEC = DrafterSpec("bigram", "a bigram head over the target's embeddings proposes a chain (a toy)", build,
                   options=(K, HEAD), chain=True, part=PART)


@pytest.fixture
def toy():
    drafters.register(SPEC)
    yield SPEC
    drafters.unregister(SPEC.name)
    PARTS.pop(PART.name, None)


@pytest.fixture
def target_dir(tmp_path):
    target = tiny_llama(vocab_size=VOCAB, seed=3)
    target.save_pretrained(tmp_path / "target")
    return tmp_path / "target"


def test_its_spec_declares_the_part_it_needs(toy):
    assert SPEC.needs == "bigram" and PARTS["bigram"] is PART
    with pytest.raises(specviz.SpecvizError, match="needs 'eagle' but declares the part 'bigram'"):
        DrafterSpec("other", "x", build, needs="eagle", part=PART)


def test_trained_saved_loaded_through_its_spec_it_decodes_as_none_does(toy, target_dir, tmp_path):
    out = tmp_path / "bigram"
    trainer("bigram")(TrainConfig(kind="bigram", model_path=str(target_dir), data_dir="", out=str(out), steps=40,
                                  lr=3e-2))
    target = tiny_llama(vocab_size=VOCAB, seed=3).eval()
    models = LoadedModels("tiny", target, None, TinyTokenizer(VOCAB), target.device, target.dtype)
    assert "bigram" not in drafters.available(models)  # nothing loaded yet
    models.parts["bigram"] = load_trained("bigram", out, target)  # through its part's loader
    assert "bigram" in drafters.available(models) and not models.parts["bigram"].training
    runs = {d: specviz.generate("hello there", models=models, drafter=d, max_new_tokens=24, temperature=0.0)
            for d in (drafters.PLAIN, "bigram:k=3")}
    assert runs["bigram:k=3"].token_ids == runs[drafters.PLAIN].token_ids
    assert runs["bigram:k=3"].stats["drafted"] > 0 and runs["bigram:k=3"].stats["accepted"] > 0  # it learned some
    by_folder = specviz.generate("hello there", models=models, drafter=f"bigram:head={out}", max_new_tokens=8)
    assert by_folder.token_ids == runs[drafters.PLAIN].token_ids[:8]  # head=FOLDER loads through the spec too
