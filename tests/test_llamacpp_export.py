"""Our drafters as GGUF files for llama.cpp (specviz.llamacpp.export, `specviz export llamacpp`).

The layout tests read the files back with gguf's GGUFReader and need only the fetched target (`make fetch`): the
architecture, keys and vocabulary llama.cpp reads, every tensor's name, shape and type, that `d2t` and the EAGLE-3
head's `output.weight` hold the target's rows at the draft ids, that every weight equals ours, and that our layer
layout (names, rotary row order) turns the target's own fp32 weights into exactly the tensors of the target's GGUF,
which llama.cpp's converter wrote. A failed write leaves no file.

The llama-server tests (`make llamacpp`; skipped, saying why, without it) run it over the target's GGUF with each
exported drafter and compare it with specviz's on the same text at T = 0: both draft after the same contexts, and
their steps must agree context by context (experiments/llamacpp_parity.py --forced runs the full comparison), on any
CPU; and they run the exported draft alone against ours. Planted faults fail them: `d2t` written as offsets (as the
shipped head stores them) made llama.cpp accept 0 of 138 drafted chains, and q and k left in transformers' row order
made the exported draft alone part from ours at the first token.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from specviz.errors import SpecvizError

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "specviz" / "assets"
MODEL = "smollm2-135m"


def needs_target() -> None:
    from specviz import models

    if not models.is_fetched(MODEL):
        pytest.skip(f"needs the fetched {MODEL} (run `make fetch`)")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    """The export, made through the command line."""
    from specviz.cli.main import main

    needs_target()
    out = tmp_path_factory.mktemp("llamacpp-export")
    assert main(["export", "llamacpp", "--out", str(out)]) == 0
    return {name: out / f"{name}.gguf" for name in ("target", "eagle3", "draft")}


def read(path: Path):
    import gguf

    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    return reader.fields, tensors


def array(tensor) -> torch.Tensor:
    """A GGUF tensor as transformers holds it: (rows, columns), the reverse of GGUF's dimension order."""
    return torch.from_numpy(np.array(tensor.data)).reshape(tuple(int(n) for n in reversed(tensor.shape)))


def value(fields, key: str):
    return fields[key].contents()


@pytest.fixture(scope="module")
def cache_embedding() -> torch.Tensor:
    """(V, H) the target's embedding from the fp32 cache (the LM head too: tied), not from the GGUF."""
    from safetensors import safe_open

    from specviz.models.cache import model_dir

    needs_target()
    with safe_open(str(model_dir(MODEL) / "model.safetensors"), "pt") as f:
        return f.get_tensor("model.embed_tokens.weight")


def shipped(folder: str) -> dict[str, torch.Tensor]:
    from specviz.models.heads import read_state_dict

    return {k: v.float() if v.is_floating_point() else v for k, v in read_state_dict(ASSETS / folder).items()}


def unpermuted(weight: torch.Tensor, heads: int) -> torch.Tensor:
    from specviz.models.quantized import unpermuted_rows

    return weight[unpermuted_rows(weight.shape[0], heads)]


LAYER_NAMES = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
OURS = {"attn_norm": "input_layernorm", "attn_norm_2": "hidden_norm", "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
        "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj"}


def check_layer(tensors, block: int, state: dict[str, torch.Tensor], prefix: str, names: list[str]) -> None:
    """Every tensor of blk.<block> equals our weight, q and k once their rotary row order is undone."""
    for name in names:
        theirs = array(tensors[f"blk.{block}.{name}.weight"])
        if name == "attn_q":
            theirs = unpermuted(theirs, 9)
        elif name == "attn_k":
            theirs = unpermuted(theirs, 3)
        assert torch.equal(theirs, state[f"{prefix}{OURS[name]}.weight"]), name


def test_target_tokenizer_is_carried(exported):
    """Both drafters carry the target's vocabulary, key for key (llama.cpp checks a draft's against the target's)."""
    target, _ = read(exported["target"])
    for name in ("eagle3", "draft"):
        fields, _ = read(exported[name])
        keys = sorted(k for k in target if k.startswith("tokenizer."))
        assert keys == sorted(k for k in fields if k.startswith("tokenizer."))
        for key in keys:
            assert fields[key].types == target[key].types, key
            assert fields[key].contents() == target[key].contents(), key


def test_eagle3_metadata(exported):
    import json

    config = json.loads((ASSETS / "eagle3-smollm2-135m" / "config.json").read_text())
    fields, _ = read(exported["eagle3"])
    assert value(fields, "general.architecture") == "eagle3"
    assert value(fields, "eagle3.target_layers") == config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert value(fields, "eagle3.target_hidden_size") == 576
    assert value(fields, "eagle3.norm_before_residual") is False
    assert value(fields, "eagle3.block_count") == 1
    assert value(fields, "eagle3.embedding_length") == 576
    assert value(fields, "eagle3.attention.head_count") == 9 and value(fields, "eagle3.attention.head_count_kv") == 3
    assert value(fields, "eagle3.rope.freq_base") == 10000.0  # the head's own base, not the target's 100,000
    assert value(fields, "eagle3.vocab_size") == 49152


def test_eagle3_tensors_are_the_shipped_head(exported, cache_embedding):
    import gguf

    _, tensors = read(exported["eagle3"])
    layer = [*LAYER_NAMES, "attn_norm_2"]
    assert set(tensors) == {"fc.weight", "output_norm.weight", "output.weight", "d2t",
                            *(f"blk.0.{n}.weight" for n in layer)}  # no token_embd, no t2d: llama.cpp reads neither
    assert tuple(tensors["fc.weight"].shape) == (3 * 576, 576)
    assert tuple(tensors["blk.0.attn_q.weight"].shape) == (2 * 576, 576)  # q, k, v read [embedding ; feature]
    assert tuple(tensors["output.weight"].shape) == (576, 8192)
    assert tensors["d2t"].tensor_type == gguf.GGMLQuantizationType.I64
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for n, t in tensors.items() if n != "d2t")

    state = shipped("eagle3-smollm2-135m")
    ids = torch.arange(8192) + state["d2t"]  # the shipped head stores offsets: draft id i is token i + d2t[i]
    d2t = array(tensors["d2t"])
    assert torch.equal(d2t, ids) and not torch.equal(d2t, torch.arange(8192))  # absolute ids, not offsets
    rows = array(tensors["output.weight"])
    assert torch.equal(rows, cache_embedding[ids])  # the target's (tied) LM head rows at the draft ids
    assert not torch.equal(rows, cache_embedding[:8192])
    assert torch.equal(array(tensors["fc.weight"]), state["fc.weight"])
    assert torch.equal(array(tensors["output_norm.weight"]), state["norm.weight"])
    check_layer(tensors, 0, state, "layers.0.", layer)


def test_draft_model_tensors_are_ours(exported, cache_embedding):
    fields, tensors = read(exported["draft"])
    assert value(fields, "general.architecture") == "llama"
    assert value(fields, "llama.block_count") == 3
    assert value(fields, "llama.rope.freq_base") == 100000.0
    assert set(tensors) == {"token_embd.weight", "output_norm.weight",
                            *(f"blk.{i}.{n}.weight" for i in range(3) for n in LAYER_NAMES)}  # tied: no output.weight
    assert torch.equal(array(tensors["token_embd.weight"]), cache_embedding)  # the target's, which it shares
    state = shipped("draft-smollm2-135m")
    assert torch.equal(array(tensors["output_norm.weight"]), state["model.norm.weight"])
    for block in range(3):
        check_layer(tensors, block, state, f"model.layers.{block}.", LAYER_NAMES)


def test_layer_layout_is_the_one_llamacpp_wrote_for_the_target(exported):
    """Our names and rotary row order, applied to the target's own fp32 layers, give exactly the tensors in the
    target's GGUF (dequantized; the cache's fp32 weights are those values widened)."""
    import gguf
    from gguf.quants import dequantize
    from safetensors import safe_open

    from specviz.llamacpp.export import LAYER, layer_tensors
    from specviz.models.cache import model_dir

    _, tensors = read(exported["target"])
    with safe_open(str(model_dir(MODEL) / "model.safetensors"), "pt") as f:
        for block in (0, 29):
            prefix = f"model.layers.{block}."
            state = {k: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}
            ours = layer_tensors(state, prefix, block, LAYER, heads=9, kv_heads=3)
            assert len(ours) == 9
            for name, weight in ours.items():
                t = tensors[name]
                theirs = torch.from_numpy(dequantize(t.data, t.tensor_type)) if t.tensor_type != gguf.GGMLQuantizationType.F32 \
                    else array(t)
                assert torch.equal(theirs.reshape(weight.shape), weight), name
            q = state[prefix + "self_attn.q_proj.weight"]
            assert not torch.equal(ours[f"blk.{block}.attn_q.weight"], q)  # the row order does change


def test_f16_keeps_the_norms_f32(tmp_path):
    import gguf

    from specviz.llamacpp.export import export_eagle3, read_target, target_gguf

    needs_target()
    path = export_eagle3(ASSETS / "eagle3-smollm2-135m", read_target(target_gguf(MODEL)), tmp_path / "h.gguf", "f16")
    _, tensors = read(path)
    types = {n: t.tensor_type for n, t in tensors.items()}
    assert types["blk.0.attn_norm.weight"] == types["output_norm.weight"] == gguf.GGMLQuantizationType.F32
    assert types["fc.weight"] == types["output.weight"] == gguf.GGMLQuantizationType.F16
    state = shipped("eagle3-smollm2-135m")  # stored in fp16: f16 holds it exactly
    assert torch.equal(array(tensors["fc.weight"]).float(), state["fc.weight"])


def test_a_failed_write_leaves_no_file(tmp_path, monkeypatch):
    import gguf

    from specviz.llamacpp.export import write_gguf

    out = tmp_path / "x.gguf"
    out.write_bytes(b"the file before")

    def fail(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", fail)
    with pytest.raises(OSError, match="disk full"):
        write_gguf(out, "llama", "x", {}, {"a.weight": torch.ones(2, 2)}, {})
    assert out.read_bytes() == b"the file before"
    assert [p.name for p in tmp_path.iterdir()] == ["x.gguf"]  # no temporary file left


def test_unknown_preset_is_one_line(tmp_path, capsys):
    from specviz.cli.main import main

    assert main(["export", "llamacpp", "--out", str(tmp_path), "--model", "nosuch"]) == 2
    assert "unknown preset 'nosuch'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_a_pretrained_pair_drafts_on_its_own_draft_gguf(monkeypatch):
    """llama-server's draft-simple lane for qwen2.5-coder loads the pair's own 0.5B GGUF, as our `draft` does,
    and exports nothing; a preset without a draft GGUF is exported."""
    from specviz.llamacpp import export, files
    from specviz.models import quantized

    monkeypatch.setattr(export, "target_gguf", lambda model: Path(f"/cache/{model}.gguf"))
    monkeypatch.setattr(quantized, "fetch_gguf", lambda model_file: Path(f"/cache/{model_file.key}.gguf"))
    exported = []
    monkeypatch.setattr(export, "export_all", lambda out, model: exported.append(model) or {"target": Path("t")})
    assert files.ggufs("qwen2.5-coder", ["draft-simple"]) == {
        "target": Path("/cache/qwen2.5-coder.gguf"), "draft": Path("/cache/qwen2.5-coder-0.5b.gguf")}
    assert files.ggufs("qwen2.5-coder", ["plain"]) == {"target": Path("/cache/qwen2.5-coder.gguf")}
    assert "eagle3" not in files.ggufs("qwen2.5-coder", ["draft-eagle3"])  # the lane then says it ships none
    assert exported == []
    monkeypatch.setattr(files, "cache_root", lambda: Path("/nonexistent-cache"))
    files.ggufs("smollm2-135m", ["draft-simple"])
    assert exported == ["smollm2-135m"]


def test_a_head_with_other_sizes_is_refused(tmp_path):
    """A target of another width than the head's: a SpecvizError naming it, and no file."""
    from specviz.llamacpp.export import TargetGGUF, export_eagle3

    other = TargetGGUF(tmp_path / "t.gguf", "llama", 30, 960, {}, np.zeros((49152, 960), np.float32), None)
    with pytest.raises(SpecvizError, match="target hidden size"):
        export_eagle3(ASSETS / "eagle3-smollm2-135m", other, tmp_path / "h.gguf")
    assert not (tmp_path / "h.gguf").exists()


# ---------------------------------------------------------------------------------------------- in llama-server
# Both engines draft on the same text: each prompt followed by the first j tokens of the target's greedy answer
# (j = 0, 2, 4, ...), one drafting step each. Left to commit their own text, the two part at the first near-tie of
# their targets' two best logits (each rounds activations to 8 bits and sums in its own order; on one CPU at token
# 17 in the median, elsewhere sooner) and from there each drafter is measured on different text.
PROMPTS, MAX_TOKENS, STRIDE = 3, 48, 2
# On the same context the two steps differ only where a near-tie flips the target's greedy token or the drafter's
# top token in one engine and not the other (each rounds activations to 8 bits and sums in its own order; the EAGLE-3
# head also reads features the two targets round differently). On 6 questions, a context every 2 answer tokens, on an
# AVX2 host (docs/results/llamacpp-parity.md), the draft model's steps differed on 6 of 144 contexts and the EAGLE-3
# head's on 10 of 144. NEAR_TIE bounds that rate at about twice the larger, for CPUs that round otherwise; a
# test differing on more contexts than Binomial(compared, NEAR_TIE) gives with chance ALPHA fails. A drafter llama.cpp
# read wrongly (d2t as offsets, rows in the wrong order) agrees only where both accept nothing.
NEAR_TIE = 0.15
# Flips go either way, so on each position the contexts where only one engine accepted split evenly between the
# engines; McNemar's exact test rejects a one-sided split (a drafter that is systematically better or worse in one
# engine) at this level.
ALPHA = 0.001


def most_differing(compared: int) -> int:
    """The most contexts of `compared` on which the two engines' steps may differ by near-ties alone."""
    from scipy.stats import binom

    return int(binom.ppf(1 - ALPHA, compared, NEAR_TIE))


def parity():
    """experiments/llamacpp_parity.py as a module (both sides of the comparison)."""
    spec = importlib.util.spec_from_file_location("llamacpp_parity", ROOT / "experiments" / "llamacpp_parity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def server_binary() -> Path:
    from specviz.llamacpp.build import installed

    binary = installed()
    if binary is None:
        pytest.skip("no llama-server installed: run `make llamacpp` (or set SPECVIZ_LLAMA_SERVER)")
    return binary


@pytest.fixture(scope="module")
def ours():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECVIZ_DRAFT_DTYPE", "float32")  # the drafters in fp32, as the f32 GGUFs run in llama.cpp
        yield parity().load_ours()


@pytest.fixture(scope="module")
def contexts(ours) -> list[list[int]]:
    module = parity()
    prompts = module.encode(PROMPTS, ours.tokenizer)
    return module.forced_contexts(prompts, module.reference_texts(ours, prompts, MAX_TOKENS), STRIDE)


@pytest.mark.slow
@pytest.mark.llamacpp
@pytest.mark.parametrize("label,draft,spec_type,drafter,options,k", parity().RUNS, ids=["eagle3", "draft"])
def test_llama_server_accepts_what_specviz_accepts(server_binary, exported, ours, contexts, label, draft, spec_type,
                                                   drafter, options, k):
    module = parity()
    theirs = module.forced_llama(server_binary, exported, spec_type, draft, k, contexts, threads=2)
    mine = module.forced_ours(ours, drafter, options, k, contexts)
    result = module.paired(theirs, mine, k)
    said = f"{label}: {result}"
    assert result["llama_drafted"] >= 0.9 * len(contexts), said  # it loaded the drafter and drafted after each
    assert result["compared"] >= 0.9 * len(contexts), said
    assert sum(result["per_position"]["llama"]) > 0, said  # a head llama.cpp read wrongly accepts nothing
    first = result["per_position"]
    assert first["llama"][0] >= 0.5 * first["ours"][0], said  # nor much less than ours
    assert result["compared"] - result["same"] <= most_differing(result["compared"]), said
    assert min(result["p_values"]) >= ALPHA, said


def test_the_paired_comparison_catches_a_drafter_that_accepts_less():
    """paired() on planted steps: the same steps agree; a drafter accepting one token fewer wherever it accepted
    any is caught by both the agreement and McNemar's test; flips that go either way are not."""
    module = parity()
    ours = [(a % 4, 3) for a in range(80)]
    assert module.paired(ours, ours, 3)["same"] == 80
    worse = module.paired([(max(0, a - 1), n) for a, n in ours], ours, 3)
    assert 80 - worse["same"] > most_differing(80) and min(worse["p_values"]) < ALPHA
    flips = [(a ^ 1 if i % 10 == 0 else a, n) for i, (a, n) in enumerate(ours)]
    even = module.paired(flips, ours, 3)
    assert 80 - even["same"] <= most_differing(80) and min(even["p_values"]) >= ALPHA


@pytest.mark.slow
@pytest.mark.llamacpp
def test_the_exported_draft_alone_decodes_as_ours(server_binary, exported, ours):
    """draft.gguf as llama-server's only model gives specviz's draft model's greedy tokens: no target between them,
    so this is the draft's arithmetic alone (both f32)."""
    module = parity()
    result = module.draft_alone(server_binary, exported, ours, module.encode(2, ours.tokenizer), 32)
    assert result["same"] == 2, result["parted"]
