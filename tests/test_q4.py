"""The 4-bit and 8-bit linear ops (specviz/kernels/csrc/blocklinear.cpp) against dequantize-then-matmul, their CPU
paths, the Q4_1, Q8_0, Q4_K, Q6_K and Q5_0 block parsers against `gguf`'s own dequantize, and a target whose projections stay 4-bit
and whose LM head stays 8-bit (specviz.models.quantized)."""
import copy
import dataclasses

import gguf
import numpy as np
import pytest
import torch
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

import specviz
from specviz import drafters, models
from specviz.decoding import engine
from specviz.decoding import verify as verify_module
from specviz.decoding.sampling import Sampling
from specviz.decoding.target import Target
from specviz.drafters import NoDraft
from specviz.drafters.ngram import NgramDrafter
from specviz.errors import SpecvizError
from specviz.kernels import blocks as gguf_blocks
from specviz.kernels import fastdecoder, quant
from specviz.models import gguf_tensors, quantized

from stats import chi_square_p_value, exact_two_tokens, sampled_two_tokens, unnormalised_residual
from tiny import TinyTokenizer, decode_settings, tiny_llama
from tree_drafters import TopBTree

needs_op = pytest.mark.skipif(not quant.available(), reason="specviz's C++ ops are not built here")
PATHS = [pytest.param(path, marks=pytest.mark.skipif(not quant.path_runs(path), reason=f"this CPU cannot run the {path} path"))
         for path in ("portable", "avx2", "avx512")]
ROWS = (1, 2, 3, 4, 5, 7, 8, 11, 16)
SHAPES = [(576, 576), (1536, 576), (576, 1536), (4099, 576), (7, 64), (33, 96)]  # (out, in); 4099: a slice of 49152 × 576


def random_q4(out, inp, seed):
    """Codes, scales, mins as a Q4_1 file holds them (scales and mins fp16 values)."""
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (out, inp // 2), generator=generator, dtype=torch.uint8)
    scales = (torch.rand(out, inp // 32, generator=generator) * 0.02).half().float()
    mins = (-torch.rand(out, inp // 32, generator=generator) * 0.15).half().float()
    return codes, scales, mins


def reference(x, weight, bias=None):
    """x · Wᵀ in float64, and the bound |x| · |W|ᵀ that fp32 rounding of that sum stays well inside."""
    exact = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    return exact, x.double().abs() @ weight.double().abs().T


def agrees(got, weight, x, bias=None) -> bool:
    exact, scale = reference(x, weight, bias)
    return bool(((got.double() - exact).abs() <= 1e-5 * scale + 1e-6).all())


@needs_op
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("out,inp", SHAPES)
def test_the_product_equals_dequantize_then_matmul(path, out, inp):
    codes, scales, mins = random_q4(out, inp, seed=out + inp)
    weight = gguf_blocks.dequantize(codes, scales, mins)
    x = torch.randn(max(ROWS), inp, generator=torch.Generator().manual_seed(1))
    for rows in ROWS:
        got = quant.q4_product(x[:rows], codes, scales, mins, path=path)
        assert got.shape == (rows, out) and agrees(got, weight, x[:rows]), rows


def random_q8(out, inp, seed):
    """Codes and scales as a Q8_0 file holds them (scales fp16 values)."""
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(-128, 128, (out, inp), generator=generator, dtype=torch.int8)
    return codes, (torch.rand(out, inp // 32, generator=generator) * 0.01).half().float()


def random_q6(out, inp, seed):
    """Codes and scales as parse_q6_k gives them from a Q6_K file: codes q - 32 in -32..31, one scale per 16 weights
    (an fp16 d per 256 times an int8 sub-block scale)."""
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(-32, 32, (out, inp), generator=generator, dtype=torch.int8)
    d = (torch.rand(out, 1, generator=generator) * 0.001).half().float()
    return codes, d * torch.randint(-128, 128, (out, inp // 16), generator=generator).float()


@needs_op
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("out,inp", SHAPES)
@pytest.mark.parametrize("blocks", [random_q8, random_q6], ids=["Q8_0", "Q6_K"])
def test_the_8_bit_product_equals_dequantize_then_matmul(path, out, inp, blocks):
    codes, scales = blocks(out, inp, seed=out + inp)
    weight = gguf_blocks.dequantize_q8(codes, scales)
    x = torch.randn(max(ROWS), inp, generator=torch.Generator().manual_seed(1))
    for rows in ROWS:
        got = quant.q8_product(x[:rows], codes, scales, path=path)
        assert got.shape == (rows, out) and agrees(got, weight, x[:rows]), rows


@needs_op
@pytest.mark.parametrize("path", PATHS)
def test_bias_and_leading_dimensions(path):
    codes, scales, mins = random_q4(40, 64, seed=3)
    bias = torch.randn(40)
    x = torch.randn(2, 3, 64)
    got = quant.q4_product(x, codes, scales, mins, bias, path=path)
    assert got.shape == (2, 3, 40)
    assert agrees(got.reshape(6, 40), gguf_blocks.dequantize(codes, scales, mins), x.reshape(6, 64), bias)


@needs_op
def test_every_path_gives_the_same_bits_whatever_the_rows_and_threads():
    """The fixed summation order: one row alone, the same row among 16, on 1 or 2 threads, on every path this
    CPU runs: the same fp32 bits."""
    q4, q8, q6 = random_q4(1537, 576, seed=5), random_q8(1537, 576, seed=6), random_q6(1537, 576, seed=9)  # 1537: a column past the blocks of 4
    products = {"q4": lambda x, path: quant.q4_product(x, *q4, path=path),
                "q8": lambda x, path: quant.q8_product(x, *q8, path=path),
                "q6": lambda x, path: quant.q8_product(x, *q6, path=path)}
    x = torch.randn(16, 576, generator=torch.Generator().manual_seed(2))
    paths = [path for path in ("portable", "avx2", "avx512") if quant.path_runs(path)]
    threads = torch.get_num_threads()
    for kind, product in products.items():
        try:
            results = []
            for count in (1, 2):
                torch.set_num_threads(count)
                for path in paths:
                    results.append(product(x, path))
                    results.append(torch.cat([product(x[r : r + 1], path) for r in range(16)]))
                    results.append(torch.cat([product(x[:5], path), product(x[5:7], path), product(x[7:], path)]))
        finally:
            torch.set_num_threads(threads)
        assert all(torch.equal(result, results[0]) for result in results), kind


@needs_op
@pytest.mark.parametrize("mutation", ["scale of the next group", "minimum dropped", "nibbles swapped"])
def test_a_planted_bug_is_caught(mutation):
    """The comparison above fails for a weight decoded slightly wrong, so it would catch that bug in the op."""
    codes, scales, mins = random_q4(576, 576, seed=7)
    x = torch.randn(4, 576, generator=torch.Generator().manual_seed(4))
    got = quant.q4_product(x, codes, scales, mins)
    if mutation == "scale of the next group":
        wrong = gguf_blocks.dequantize(codes, scales.roll(-1, dims=1), mins)
    elif mutation == "minimum dropped":
        wrong = gguf_blocks.dequantize(codes, scales, torch.zeros_like(mins))
    else:
        wrong = gguf_blocks.dequantize((codes << 4) | (codes >> 4), scales, mins)
    assert agrees(got, gguf_blocks.dequantize(codes, scales, mins), x)
    assert not agrees(got, wrong, x)


@needs_op
@pytest.mark.parametrize("mutation", ["scale of the next group", "codes off by one", "sign dropped"])
def test_a_planted_bug_in_the_8_bit_product_is_caught(mutation):
    codes, scales = random_q8(576, 576, seed=8)
    x = torch.randn(4, 576, generator=torch.Generator().manual_seed(4))
    got = torch.cat([quant.q8_product(x[:1], codes, scales), quant.q8_product(x[1:], codes, scales)])
    if mutation == "scale of the next group":
        wrong = gguf_blocks.dequantize_q8(codes, scales.roll(-1, dims=1))
    elif mutation == "codes off by one":
        wrong = gguf_blocks.dequantize_q8(codes.roll(1, dims=1), scales)
    else:
        wrong = gguf_blocks.dequantize_q8(codes.view(torch.uint8).to(torch.int16).clamp(max=127).to(torch.int8), scales)
    assert agrees(got, gguf_blocks.dequantize_q8(codes, scales), x)
    assert not agrees(got, wrong, x)


@needs_op
@pytest.mark.parametrize("path", PATHS)
def test_a_planted_bug_in_the_16_weight_scales_is_caught(path):
    """With a scale per 16 weights, each half of a group must read its own: one scale for the whole group (the
    8-bit op's Q8_0 reading) or the halves' scales swapped give products the comparison rejects."""
    codes, scales = random_q6(576, 576, seed=10)
    x = torch.randn(4, 576, generator=torch.Generator().manual_seed(4))
    got = torch.cat([quant.q8_product(x[:1], codes, scales, path=path), quant.q8_product(x[1:], codes, scales, path=path)])
    assert agrees(got, gguf_blocks.dequantize_q8(codes, scales), x)
    pairs = scales.reshape(576, -1, 2)
    assert not agrees(got, gguf_blocks.dequantize_q8(codes, pairs[..., 0].contiguous()), x)
    assert not agrees(got, gguf_blocks.dequantize_q8(codes, pairs.flip(-1).reshape(576, -1)), x)


def random_q4_k_levels(out, inp, seed):
    """Q4_K's two levels as parse_q4_k_levels gives them: codes, d and −dmin (fp16 values) per 256 weights, 6-bit sc
    and m per 32."""
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (out, inp // 2), generator=generator, dtype=torch.uint8)
    d = (torch.rand(out, inp // 256, generator=generator) * 1e-3).half().float()
    dmin = (-torch.rand(out, inp // 256, generator=generator) * 1e-3).half().float()
    sc, m = (torch.randint(0, 64, (out, inp // 32), generator=generator, dtype=torch.uint8) for _ in range(2))
    return codes, d, dmin, sc, m


def random_q6_k_levels(out, inp, seed):
    """Q6_K's two levels as parse_q6_k_levels gives them: codes q − 32, d (fp16 values) per 256, int8 sc per 16."""
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(-32, 32, (out, inp), generator=generator, dtype=torch.int8)
    d = (torch.rand(out, inp // 256, generator=generator) * 1e-3).half().float()
    return codes, d, torch.randint(-128, 128, (out, inp // 16), generator=generator, dtype=torch.int8)


TWO_LEVEL_SHAPES = [(1536, 1536), (300, 768), (33, 256), (4099, 256), (7, 512)]  # (out, in); in a multiple of 256


@needs_op
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("out,inp", TWO_LEVEL_SHAPES)
def test_the_two_level_products_give_the_widened_ones_bits(path, out, inp):
    """q4k_linear and q6k_linear read the K-quant scales in their two levels and widen them as they go: the very
    bits of q4_linear and q8_linear on the widened scales (widen_q4_k, widen_q6_k), for every row count, and so
    dequantize-then-matmul to rounding."""
    q4k, q6k = random_q4_k_levels(out, inp, seed=out), random_q6_k_levels(out, inp, seed=out + 1)
    q4, q6 = gguf_blocks.widen_q4_k(*q4k), gguf_blocks.widen_q6_k(*q6k)
    x = torch.randn(max(ROWS), inp, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(out)
    for rows in ROWS:
        got = quant.q4k_product(x[:rows], *q4k, bias, path=path)
        assert torch.equal(got, quant.q4_product(x[:rows], *q4, bias, path=path)), rows
        assert agrees(got, gguf_blocks.dequantize(*q4), x[:rows], bias), rows
        got = quant.q6k_product(x[:rows], *q6k, path=path)
        assert torch.equal(got, quant.q8_product(x[:rows], *q6, path=path)), rows
        assert agrees(got, gguf_blocks.dequantize_q8(*q6), x[:rows]), rows


@needs_op
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mutation", ["the next super-block's d", "sc of the next group", "minimums' sign dropped",
                                      "Q6_K's sc read unsigned", "Q6_K's halves swapped"])
def test_a_planted_bug_in_the_two_level_scales_is_caught(path, mutation):
    """Each group must read its own super-block's d and its own sub-scales, signed where Q6_K's are: any of these
    slips gives products the comparison rejects."""
    q4k, q6k = random_q4_k_levels(64, 768, seed=11), random_q6_k_levels(64, 768, seed=12)
    x = torch.randn(4, 768, generator=torch.Generator().manual_seed(4))
    codes, d, dmin, sc, m = q4k
    got4 = quant.q4k_product(x, *q4k, path=path)
    got6 = quant.q6k_product(x, *q6k, path=path)
    assert agrees(got4, gguf_blocks.dequantize(*gguf_blocks.widen_q4_k(*q4k)), x)
    assert agrees(got6, gguf_blocks.dequantize_q8(*gguf_blocks.widen_q6_k(*q6k)), x)
    if mutation == "the next super-block's d":
        wrong4 = gguf_blocks.dequantize(*gguf_blocks.widen_q4_k(codes, d.roll(-1, dims=1), dmin, sc, m))
        assert not agrees(got4, wrong4, x)
        assert not agrees(got6, gguf_blocks.dequantize_q8(*gguf_blocks.widen_q6_k(q6k[0], q6k[1].roll(-1, dims=1), q6k[2])), x)
    elif mutation == "sc of the next group":
        assert not agrees(got4, gguf_blocks.dequantize(*gguf_blocks.widen_q4_k(codes, d, dmin, sc.roll(-1, dims=1), m)), x)
    elif mutation == "minimums' sign dropped":
        assert not agrees(got4, gguf_blocks.dequantize(*gguf_blocks.widen_q4_k(codes, d, -dmin, sc, m)), x)
    elif mutation == "Q6_K's sc read unsigned":
        unsigned = q6k[1].repeat_interleave(16, 1) * q6k[2].view(torch.uint8).float()
        assert not agrees(got6, gguf_blocks.dequantize_q8(q6k[0], unsigned), x)
    else:
        _, scales = gguf_blocks.widen_q6_k(*q6k)
        assert not agrees(got6, gguf_blocks.dequantize_q8(q6k[0], scales.reshape(64, -1, 2).flip(-1).reshape(64, -1)), x)


@needs_op
def test_bad_two_level_shapes_are_refused():
    codes, d, dmin, sc, m = random_q4_k_levels(8, 512, seed=1)
    with pytest.raises(RuntimeError, match="multiple of 256"):
        torch.ops.specviz.q4k_linear(torch.randn(1, 288), codes[:, :144], d, dmin, sc, m, None, -1)
    with pytest.raises(RuntimeError, match="q4k_linear: sc, m"):
        torch.ops.specviz.q4k_linear(torch.randn(1, 512), codes, d, dmin, sc.view(torch.int8), m, None, -1)
    with pytest.raises(RuntimeError, match="q4k_linear: d, dmin"):
        torch.ops.specviz.q4k_linear(torch.randn(1, 512), codes, d[:, :1], dmin, sc, m, None, -1)
    codes, d, sc = random_q6_k_levels(8, 512, seed=1)
    with pytest.raises(RuntimeError, match="q6k_linear: sc"):
        torch.ops.specviz.q6k_linear(torch.randn(1, 512), codes, d, sc.view(torch.uint8), None, -1)
    with pytest.raises(ValueError, match="Q6KLinear"):
        quant.Q6KLinear(codes, d, sc[:, :4])
    with pytest.raises(ValueError, match="Q4KLinear"):
        quant.Q4KLinear(*random_q4_k_levels(8, 512, seed=1)[:4], torch.zeros(8, 8, dtype=torch.int8))


@needs_op
def test_the_path_is_forced_by_the_environment(monkeypatch):
    monkeypatch.setenv("SPECVIZ_Q4_PATH", "portable")
    assert torch.ops.specviz.q4_path(-1) == 0
    monkeypatch.setenv("SPECVIZ_Q4_PATH", "fastest")
    with pytest.raises(RuntimeError, match="SPECVIZ_Q4_PATH"):
        torch.ops.specviz.q4_path(-1)
    monkeypatch.delenv("SPECVIZ_Q4_PATH")
    assert torch.ops.specviz.q4_path(-1) == max(quant.PATHS[p] for p in ("portable", "avx2", "avx512") if quant.path_runs(p))


@needs_op
def test_bad_shapes_are_refused():
    codes, scales, mins = random_q4(8, 64, seed=1)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        torch.ops.specviz.q4_linear(torch.randn(1, 48), codes[:, :24], scales, mins, None, -1)
    with pytest.raises(RuntimeError, match="scales, mins"):
        torch.ops.specviz.q4_linear(torch.randn(1, 64), codes, scales[:, :1], mins, None, -1)
    codes, scales = random_q8(8, 64, seed=1)
    with pytest.raises(RuntimeError, match="codes \\(out, in\\) int8"):
        torch.ops.specviz.q8_linear(torch.randn(1, 64), codes.view(torch.uint8), scales, None, -1)
    with pytest.raises(RuntimeError, match="q8_linear: scales"):
        torch.ops.specviz.q8_linear(torch.randn(1, 64), codes, scales[:, :1], None, -1)
    with pytest.raises(RuntimeError, match="q8_linear: scales .* or \\(out, in / 16\\)"):
        torch.ops.specviz.q8_linear(torch.randn(1, 64), codes, torch.ones(8, 8), None, -1)


def q4_1_blocks(weight: torch.Tensor) -> np.ndarray:
    """weight (out, in) quantized by gguf's own Q4_1 quantizer: the raw bytes a GGUF would hold."""
    return gguf.quants.quantize(weight.numpy(), gguf.GGMLQuantizationType.Q4_1)


def test_the_parser_reads_q4_1_blocks_as_gguf_dequantizes_them():
    blocks = q4_1_blocks(torch.randn(24, 128, generator=torch.Generator().manual_seed(0)))
    expected = torch.from_numpy(gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_1).copy())
    assert torch.equal(gguf_blocks.dequantize(*gguf_blocks.parse_q4_1(blocks)), expected)


def test_the_parser_reads_q8_0_blocks_as_gguf_dequantizes_them():
    weight = torch.randn(24, 128, generator=torch.Generator().manual_seed(0)).numpy()
    blocks = gguf.quants.quantize(weight, gguf.GGMLQuantizationType.Q8_0)
    expected = torch.from_numpy(gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0).copy())
    codes, scales = gguf_blocks.parse_q8_0(blocks)
    assert codes.dtype == torch.int8 and codes.shape == (24, 128) and scales.shape == (24, 4)
    assert torch.equal(gguf_blocks.dequantize_q8(codes, scales), expected)


def random_k_blocks(kind, rows: int, supers: int, seed: int, scale: float = 0.01) -> np.ndarray:
    """Random raw blocks (every byte pattern is a valid block), their fp16 scales in [0, scale)."""
    size, fields = {gguf.GGMLQuantizationType.Q4_K: (144, (0, 2)), gguf.GGMLQuantizationType.Q6_K: (210, (208,)),
                    gguf.GGMLQuantizationType.Q5_0: (22, (0,))}[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, supers, size), dtype=np.uint8)
    for at in fields:
        raw[..., at : at + 2] = (rng.random((rows, supers, 1)) * scale).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, supers * size)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q5_0"])
def test_the_k_quant_and_q5_0_parsers_read_blocks_as_gguf_dequantizes_them(kind):
    """Q4_K as Q4_1 groups, Q6_K as 8-bit codes with a scale per 16, Q5_0 as 8-bit codes with a scale per 32: the
    same fp32 values, bit for bit (all 6-bit scales, minimums and high bits are exercised by random bytes)."""
    kind = getattr(gguf.GGMLQuantizationType, kind)
    blocks = 24 if kind == gguf.GGMLQuantizationType.Q5_0 else 3  # 768 weights a row either way
    raw = random_k_blocks(kind, rows=5, supers=blocks, seed=0)
    expected = torch.from_numpy(gguf.quants.dequantize(raw, kind).copy())
    if kind != gguf.GGMLQuantizationType.Q5_0:  # the two-level reading gives the same values
        levels = (gguf_blocks.parse_q4_k_levels if kind == gguf.GGMLQuantizationType.Q4_K else gguf_blocks.parse_q6_k_levels)(raw)
        assert torch.equal(quant.dequantize_blocks(levels), expected)
    if kind == gguf.GGMLQuantizationType.Q4_K:
        codes, scales, mins = gguf_blocks.parse_q4_k(raw)
        assert codes.shape == (5, 384) and scales.shape == mins.shape == (5, 24)
        got = gguf_blocks.dequantize(codes, scales, mins)
    elif kind == gguf.GGMLQuantizationType.Q6_K:
        codes, scales = gguf_blocks.parse_q6_k(raw)
        assert codes.dtype == torch.int8 and codes.shape == (5, 768) and scales.shape == (5, 48)
        assert int(codes.min()) == -32 and int(codes.max()) == 31
        got = gguf_blocks.dequantize_q8(codes, scales)
    else:
        codes, scales = gguf_blocks.parse_q5_0(raw)
        assert codes.dtype == torch.int8 and codes.shape == (5, 768) and scales.shape == (5, 24)
        assert int(codes.min()) == -16 and int(codes.max()) == 15
        got = gguf_blocks.dequantize_q8(codes, scales)
    assert torch.equal(got, expected)


def test_the_parser_reads_the_real_file_as_gguf_does():
    path = quantized.gguf_path(quantized_model_file())
    if not path.is_file():
        pytest.skip(f"no GGUF in {path.parent} (the first `load(..., weights='q4')` fetches it)")
    tensors = {t.name: t for t in gguf_tensors.tensors(path)}  # as GGUFReader reads them (test_gguf_tensors)
    for name in ("blk.0.attn_q.weight", "blk.7.ffn_down.weight", "blk.29.ffn_up.weight"):
        tensor = tensors[name]
        assert tensor.tensor_type == gguf.GGMLQuantizationType.Q4_1
        expected = torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type).copy())
        assert torch.equal(gguf_blocks.dequantize(*gguf_blocks.parse_q4_1(tensor.data)), expected), name
    head = quantized.q8_head_tensors(list(tensors.values()))  # SmolLM2's tied LM head: its Q8_0 embedding
    embedding = tensors["token_embd.weight"]
    assert head is not None and embedding.tensor_type == gguf.GGMLQuantizationType.Q8_0
    expected = torch.from_numpy(gguf.quants.dequantize(embedding.data, embedding.tensor_type).copy())
    assert torch.equal(gguf_blocks.dequantize_q8(*head), expected)


ROWS_READ = 512  # rows of each tensor the qwen parser test compares


@pytest.mark.parametrize("key,names", [
    ("qwen2.5-coder-1.5b", ("blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.ffn_down.weight", "output.weight")),
    ("qwen2.5-coder-0.5b", ("blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.1.ffn_down.weight", "output.weight")),
])
def test_the_parsers_read_the_qwen_files_as_gguf_does(key, names):
    """The Q4_K_M files of the qwen2.5-coder pair (Q4_K, Q6_K, Q5_0, Q8_0 tensors), where they have been fetched."""
    from specviz.models.presets import preset_model_files

    path = quantized.gguf_path(preset_model_files()[key])
    if not path.is_file():
        pytest.skip(f"no GGUF in {path.parent} (`load('qwen2.5-coder', weights='q4')` fetches it)")
    tensors = {t.name: t for t in gguf_tensors.tensors(path)}  # as GGUFReader reads them (test_gguf_tensors)
    parsers = {**quantized.four_bit_parsers(), **quantized.eight_bit_parsers()}
    seen = set()
    for name in names:
        tensor = tensors[name]
        rows = tensor.data[:ROWS_READ]  # every block format in full, at a fraction of a 151,936-row head's time
        parsed = parsers[tensor.tensor_type](rows)
        got = quant.dequantize_blocks(parsed)
        expected = torch.from_numpy(gguf.quants.dequantize(rows, tensor.tensor_type).copy())
        assert torch.equal(got, expected), name
        seen.add(tensor.tensor_type.name)
    assert len(seen) >= 2  # more than one format per file


def quantized_model_file():
    from specviz.models.presets import SMOLLM2_135M

    return SMOLLM2_135M


def test_unpermuted_rows_are_transformers_reverse_permutation():
    rows = torch.arange(48 * 3).reshape(48, 3).numpy()
    for heads in (4, 2, 1):
        expected = LlamaTensorProcessor()._reverse_permute_weights(rows, heads, heads)
        assert np.array_equal(rows[quantized.unpermuted_rows(48, heads).numpy()], expected)


def tiny_pair(hidden=64, **options):
    """(fp32 model, the same model with Q4Linear projections): a tiny Llama (tiny_llama's `options`) whose
    projections were quantized by gguf's Q4_1 quantizer, the fp32 one holding exactly the dequantized values."""
    model = tiny_llama(hidden=hidden, layers=2, seed=0, **options)
    tensors = {}
    with torch.no_grad():
        for index, layer in enumerate(model.model.layers):
            for block, name in quantized.PROJECTIONS.values():
                linear = getattr(getattr(layer, block), name)
                codes, scales, mins = gguf_blocks.parse_q4_1(q4_1_blocks(linear.weight))
                linear.weight.copy_(gguf_blocks.dequantize(codes, scales, mins))
                tensors[(index, block, name)] = (codes, scales, mins)
        head = gguf.quants.quantize(model.lm_head.weight.numpy(), gguf.GGMLQuantizationType.Q8_0)
        model.lm_head.weight.copy_(gguf_blocks.dequantize_q8(*gguf_blocks.parse_q8_0(head)))
    q4 = copy.deepcopy(model)
    assert quantized.replace_projections(q4, tensors) == 14
    assert quantized.attach_q8_head(q4, gguf_blocks.parse_q8_0(head))
    return model, q4, tensors


def test_the_bench_counts_the_bytes_a_q4_step_streams():
    from specviz.bench.probes import streamed_weight_bytes

    fp32, q4, tensors = tiny_pair()
    saved = sum(4 * codes.numel() * 2 - (codes.numel() + scales.numel() * 8) for codes, scales, _ in tensors.values())
    head = fp32.lm_head.weight.numel()
    saved += 4 * head - (head + head // 32 * 4)  # the 8-bit head: a byte a weight and an fp32 scale per 32
    assert streamed_weight_bytes(q4) == streamed_weight_bytes(fp32) - saved  # codes + fp32 scale and minimum


K_FORMATS = {"q_proj": "Q4_K", "k_proj": "Q4_K", "v_proj": "Q6_K", "o_proj": "Q5_0", "gate_proj": "Q4_K",
             "up_proj": "Q4_K", "down_proj": "Q6_K"}  # a Q4_K_M file's mix (its 0.5B's Q5_0 for o)


def k_quant_qwen2():
    """(fp32 Qwen2, the same with block linears): a tiny Qwen2 (biases on q, k, v) whose projections hold random
    Q4_K, Q6_K and Q5_0 blocks as a Q4_K_M file mixes them (K_FORMATS; layer 1's down Q4_K), and whose LM head is
    Q6_K; the fp32 twin holds exactly their dequantized values."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, eos_token_id=0, pad_token_id=0)
    model = Qwen2ForCausalLM(config).eval().requires_grad_(False)
    parse = {"Q4_K": gguf_blocks.parse_q4_k_levels, "Q6_K": gguf_blocks.parse_q6_k_levels, "Q5_0": gguf_blocks.parse_q5_0}
    tensors, seed = {}, 0
    with torch.no_grad():
        for index, layer in enumerate(model.model.layers):
            for block, name in quantized.PROJECTIONS.values():
                linear = getattr(getattr(layer, block), name)
                kind = "Q4_K" if (index, name) == (1, "down_proj") else K_FORMATS[name]
                out, inp = linear.weight.shape
                n_blocks = inp // (32 if kind == "Q5_0" else 256)
                seed += 1
                parsed = parse[kind](random_k_blocks(getattr(gguf.GGMLQuantizationType, kind), out, n_blocks, seed, scale=2e-4))
                linear.weight.copy_(quant.dequantize_blocks(parsed))
                tensors[(index, block, name)] = parsed
        head = gguf_blocks.parse_q6_k_levels(random_k_blocks(gguf.GGMLQuantizationType.Q6_K, 64, 1, 99, scale=2e-3))
        model.lm_head.weight.copy_(quant.dequantize_blocks(head))
    blocked = copy.deepcopy(model)
    assert quantized.replace_projections(blocked, tensors) == 14
    assert quantized.attach_q8_head(blocked, head)
    return model, blocked, tensors


@needs_op
def test_a_k_quant_target_computes_what_its_fp32_twin_does_and_decodes_losslessly():
    """Q4_K and Q6_K in their own two-level scales, Q5_0 as 8-bit codes, mixed within a layer (q, k 4-bit beside v 8-bit: their
    products side by side), a Q6_K LM head: the logits of the fp32 twin to rounding, and a drafter's greedy output
    equal to the target's alone."""
    from specviz.bench.probes import streamed_weight_bytes

    fp32, blocked, tensors = k_quant_qwen2()
    fast = fastdecoder.for_model(blocked)
    qkv = fast.stack.layers[0].qkv
    assert isinstance(qkv, quant.Concatenated) and [type(p) for p in qkv.parts] == [quant.Q4KProjection, quant.Q6KProjection]
    assert isinstance(fast.stack.layers[0].gate_up, quant.Q4KProjection)
    assert isinstance(blocked.model.layers[0].mlp.down_proj, quant.Q6KLinear)
    assert isinstance(blocked.model.layers[0].self_attn.o_proj, quant.Q8Linear)  # Q5_0
    ids = torch.tensor([[3, 17, 9, 40, 2, 11]])
    with torch.inference_mode():
        expected = fp32(ids).logits[0]
        target = Target(blocked)
        assert target.head is quantized.q8_head(blocked)
        _, logits = target.forward(ids[0].tolist(), target.new_cache())
    assert expected.abs().max() > 1  # not a degenerate model: the logits spread
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    # the bench's byte count: each projection's blocks instead of its fp32 weight, the Q6_K head instead of the fp32 one
    blocks = sum(b.numel() * b.element_size() for parsed in tensors.values() for b in parsed)
    weights = sum(quant.block_linear(parsed).weight.numel() for parsed in tensors.values())
    head = 4 * fp32.lm_head.weight.numel() - quantized.q8_head(blocked).nbytes
    assert streamed_weight_bytes(blocked) == streamed_weight_bytes(fp32) - 4 * weights + blocks - head
    prompt = [5, 9, 5, 9, 5, 9, 12]
    settings = decode_settings(max_new_tokens=24)
    alone = list(engine.decode(blocked, TinyTokenizer(64), NoDraft(), prompt, settings))[-1].token_ids
    drafted = list(engine.decode(blocked, TinyTokenizer(64), NgramDrafter(3), prompt, settings))[-1].token_ids
    assert drafted == alone and len(alone) >= 8


@needs_op
def test_a_quantized_target_computes_what_its_fp32_twin_does():
    fp32, q4, _ = tiny_pair()
    ids = torch.tensor([[3, 17, 9, 40, 2, 11]])
    with torch.inference_mode():
        expected = fp32(ids).logits
        through_transformers = q4(ids).logits
        fast = fastdecoder.for_model(q4)
        assert isinstance(fast.stack.layers[0].qkv, quant.Q4Projection)  # the primed lean decoder, 4-bit fused
        lean = q4.lm_head(fast(ids[0], fast.new_cache()))
        target = Target(q4)
        assert target.head is quantized.q8_head(q4)  # the engine's logits come from the 8-bit head
        _, logits = target.forward(ids[0].tolist(), target.new_cache())
    torch.testing.assert_close(through_transformers, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lean, expected[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits, expected[0], rtol=1e-4, atol=1e-5)


@needs_op
def test_the_one_call_layer_op_gives_the_bits_of_the_layer_run_op_by_op():
    """specviz::q4_layer (csrc/q4layer.cpp) against the lean decoder's Python loop over the same 4-bit layers: one
    token, a chain, a tree with its mask, and captured layer inputs (EAGLE-3's features), the same fp32 bits and
    the same KV cache."""
    from specviz.decoding.costs import full_tree

    _, q4, _ = tiny_pair()
    fast = fastdecoder.for_model(q4)
    assert fast.stack.layer_op  # the 4-bit layers do run as one call each
    context = torch.tensor([3, 17, 9, 40, 2, 11, 5, 8])
    tree = full_tree(5, 2)
    steps = [(torch.tensor([7]), None, None), (torch.tensor([7, 1, 30]), None, None),
             (torch.tensor([7, 1, 30, 4, 4, 9]), tree.position_ids(8), tree.attention_mask(8, dtype=torch.float32))]
    results = {}
    try:
        for layer_op in (True, False):
            fast.stack.layer_op = layer_op
            cache = fast.new_cache()
            got = [fast(context, cache, layers=(0, 1))]
            for ids, position_ids, mask in steps:
                got.append(fast(ids, cache, position_ids, mask, layers=(0, 1)))
                got.append(cache.keys[1][0, :, : cache.length].clone())
                cache.crop(len(context))
            results[layer_op] = got
    finally:
        fast.stack.layer_op = True
    flat = {k: [t for item in v for t in (item if isinstance(item, tuple) else (item,))] for k, v in results.items()}
    assert len(flat[True]) == 11 and all(torch.equal(a, b) for a, b in zip(flat[True], flat[False]))


@needs_op
@pytest.mark.parametrize("rows,width", [(1, 576), (3, 64), (16, 100)])
def test_the_layer_ops_rms_norm_is_torchs_to_rounding_and_does_not_depend_on_the_rows_beside_it(rows, width):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, width, generator=generator) * 3
    weight = torch.randn(width, generator=generator)
    got = torch.ops.specviz.rms_norm(x, weight, 1e-5)
    assert torch.allclose(got, torch.nn.functional.rms_norm(x, (width,), weight, 1e-5), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, torch.nn.functional.rms_norm(x, (width,), weight, 1e-1), rtol=1e-5, atol=1e-6)
    assert all(torch.equal(got[r], torch.ops.specviz.rms_norm(x[r : r + 1].contiguous(), weight, 1e-5)[0])
               for r in range(rows))
    with pytest.raises(RuntimeError, match="weight"):
        torch.ops.specviz.rms_norm(x, weight[:-1], 1e-5)


def test_an_8_bit_head_that_does_not_match_the_loaded_one_is_not_used():
    fp32, _, _ = tiny_pair()
    codes, scales = gguf_blocks.parse_q8_0(gguf.quants.quantize(fp32.lm_head.weight.numpy(), gguf.GGMLQuantizationType.Q8_0))
    assert not quantized.attach_q8_head(fp32, (codes, scales * 2))
    assert not quantized.attach_q8_head(fp32, None) and quantized.q8_head(fp32) is None
    assert quantized.attach_q8_head(fp32, (codes, scales)) and "specviz_q8_head" not in str(fp32.state_dict().keys())


@needs_op
def test_a_quantized_target_decodes_losslessly_with_a_drafter():
    _, q4, _ = tiny_pair()
    prompt = [5, 9, 5, 9, 5, 9, 12]
    settings = decode_settings(max_new_tokens=24)
    alone = list(engine.decode(q4, TinyTokenizer(64), NoDraft(), prompt, settings))[-1].token_ids
    drafted = list(engine.decode(q4, TinyTokenizer(64), NgramDrafter(3), prompt, settings))[-1].token_ids
    assert drafted == alone and len(alone) == 24


@needs_op
def test_a_block_that_does_not_match_the_loaded_weight_is_refused():
    fp32, _, tensors = tiny_pair()
    key = next(iter(tensors))
    codes, scales, mins = tensors[key]
    tensors[key] = (codes, scales * 2, mins)
    before = copy.deepcopy(fp32.state_dict())
    with pytest.raises(SpecvizError, match="does not match"):
        quantized.replace_projections(fp32, tensors)
    assert not quant.is_quantized(fp32)
    assert all(torch.equal(before[k], v) for k, v in fp32.state_dict().items())


def test_quantizing_to_q4_1_recovers_a_q4_1_weights_codes_and_moves_any_weight_by_at_most_half_a_step():
    codes, scales, mins = random_q4(40, 96, seed=11)
    starts = torch.arange(0, 48, 16)  # the first byte of each group of 32 codes
    codes[:, starts] &= 0xF0  # code 0 (the group's minimum) and code 15 (its maximum) in every group
    codes[:, starts + 1] |= 0x0F
    weight = gguf_blocks.dequantize(codes, scales, mins)
    got_codes, got_scales, got_mins = gguf_blocks.quantize_q4_1(weight)
    assert torch.equal(got_codes, codes) and torch.equal(got_mins, mins)
    torch.testing.assert_close(got_scales, scales, rtol=1e-6, atol=0)

    weight = torch.randn(40, 96, generator=torch.Generator().manual_seed(12))
    weight[3, :32] = 0.25  # a constant group: no step, the value itself
    got_codes, got_scales, got_mins = gguf_blocks.quantize_q4_1(weight)
    error = (gguf_blocks.dequantize(got_codes, got_scales, got_mins) - weight).abs().reshape(40, 3, 32)
    assert (error <= got_scales.unsqueeze(-1) / 2 * (1 + 1e-5) + 1e-7).all() and error[3, 0].max() == 0
    assert got_scales[3, 0] == 0 and got_codes.dtype == torch.uint8 and got_codes.shape == (40, 48)
    with pytest.raises(ValueError, match="groups of 32"):
        gguf_blocks.quantize_q4_1(torch.zeros(4, 40))


def random_eagle_head(target_config, folder=None):
    from specviz.models.heads import EagleHead

    torch.manual_seed(0)
    head = EagleHead(target_config).eval()
    for parameter in head.parameters():
        parameter.data.normal_(0, 0.3)
    if folder is not None:
        head.save(folder, {"target": "tiny"}, dtype=torch.float32)
    return head


@needs_op
def test_beside_a_4_bit_target_an_eagle_head_runs_4_bit_products_in_the_layer_op(tmp_path, monkeypatch):
    """load_trained gives a 4-bit target's EAGLE head Q4_1 products (its fc and layer), run as one layer-op call
    with the Python loop's bits and transformers' forward's values; SPECVIZ_DRAFT_DTYPE keeps it unquantized."""
    from transformers import DynamicCache

    from specviz.models.device import DRAFT_DTYPE_ENV
    from specviz.models.loading import load_trained

    monkeypatch.delenv(DRAFT_DTYPE_ENV, raising=False)
    _, q4, _ = tiny_pair()
    random_eagle_head(q4.config, tmp_path / "head")
    head = load_trained("eagle", tmp_path / "head", q4)
    assert quant.is_quantized(head) and not any(type(m) is torch.nn.Linear for m in head.modules())
    fast = fastdecoder.for_eagle(head)
    assert fast.stack.layer_op and isinstance(fast.fc, quant.Q4Projection)
    generator = torch.Generator().manual_seed(3)
    features, embeds = torch.randn(5, 64, generator=generator), torch.randn(5, 64, generator=generator)
    positions = torch.arange(5)[None]
    results = {}
    try:
        for layer_op in (True, False):
            fast.stack.layer_op = layer_op
            cache = fast.new_cache()
            results[layer_op] = torch.cat([fast(features[:3], embeds[:3], positions[:, :3], cache),
                                           fast(features[3:], embeds[3:], positions[:, 3:], cache)])
    finally:
        fast.stack.layer_op = True
    assert torch.equal(results[True], results[False])
    with torch.inference_mode():
        expected = head(features[None], embeds[None], positions, DynamicCache())[0]
    torch.testing.assert_close(results[True], expected, rtol=1e-4, atol=1e-5)

    monkeypatch.setenv(DRAFT_DTYPE_ENV, "float32")
    assert not quant.is_quantized(load_trained("eagle", tmp_path / "head", q4))


@needs_op
def test_a_4_bit_eagle_head_beside_a_4_bit_target_keeps_the_greedy_output():
    from specviz.drafters.eagle import EagleDrafter, TreeShape

    _, q4, _ = tiny_pair(scale=3.0)
    head = random_eagle_head(q4.config)
    quant.quantize_linears(head)
    prompt = [5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6]
    settings = decode_settings(max_new_tokens=30)
    alone = list(engine.decode(q4, TinyTokenizer(64), NoDraft(), prompt, settings))[-1].token_ids
    drafter = EagleDrafter(head, q4, TreeShape(depth=3, top_k=3, total_tokens=8))
    events = list(engine.decode(q4, TinyTokenizer(64), drafter, prompt, settings))
    assert events[-1].token_ids == alone and len(alone) == 30
    assert sum(len(e.nodes) for e in events[1:-1]) > 0  # it did draft


def test_unknown_weights_are_a_clear_error():
    with pytest.raises(SpecvizError, match="unknown weights"):
        quantized.apply_weights(tiny_llama(), "int3", None)
    with pytest.raises(SpecvizError, match="needs a preset"):
        quantized.apply_weights(tiny_llama(), "q4", None)
    with pytest.raises(SpecvizError, match="unknown weights"):
        quantized.resolve_weights("int3", None, torch.device("cpu"), torch.float32)


def test_auto_weights_are_the_gguf_blocks_only_where_they_can_run(monkeypatch):
    """"auto" (every entry point's default) is the GGUF's blocks on 8-bit activations for a preset GGUF on the CPU in
    float32 with the C++ ops built, and the fp32 tensors anywhere else; a choice other than auto is kept."""
    preset = models.PRESETS["smollm2-135m"].target
    cpu, fp32 = torch.device("cpu"), torch.float32
    monkeypatch.setattr(quant, "available", lambda: True)
    assert quantized.resolve_weights("auto", preset, cpu, fp32) == quantized.GGUF_DEFAULT == "q4q8"
    assert quantized.resolve_weights("auto", None, cpu, fp32) == "fp32"  # a local folder or hub id: no GGUF
    assert quantized.resolve_weights("auto", preset, torch.device("cuda"), fp32) == "fp32"
    assert quantized.resolve_weights("auto", preset, cpu, torch.bfloat16) == "fp32"
    assert quantized.resolve_weights("auto", dataclasses.replace(preset, gguf_name="model.safetensors"), cpu, fp32) == "fp32"
    for choice in quantized.WEIGHTS:
        assert quantized.resolve_weights(choice, None, cpu, fp32) == choice
    monkeypatch.setattr(quant, "available", lambda: False)  # no compiler where it was installed: the fp32 path
    assert quantized.resolve_weights("auto", preset, cpu, fp32) == "fp32"


def test_every_entry_point_defaults_to_auto_weights():
    import inspect

    from specviz.bench.cli import build_bench_parser
    from specviz.cli.main import build_parser

    parser = build_parser()
    for command in (["generate", "--prompt", "hi"], ["serve"], ["batch-cost"]):
        assert parser.parse_args(command).weights == "auto", command
    assert build_bench_parser().parse_args([]).weights == "auto"
    assert parser.parse_args(["generate", "--prompt", "hi", "--weights", "fp32"]).weights == "fp32"
    assert inspect.signature(models.load).parameters["weights"].default == "auto"
    assert inspect.signature(specviz.stream).parameters["weights"].default == "auto"


@needs_op
def test_a_gguf_without_4_bit_projections_loads_as_fp32(monkeypatch):
    """Asked for blocks a file does not hold (its tensors F32), the load says it runs fp32 rather than q4q8."""
    monkeypatch.setattr(quantized, "quantize_target", lambda *args: 0)  # what such a file gives: nothing replaced
    assert quantized.apply_weights(tiny_llama(), "q4q8", models.PRESETS["smollm2-135m"].target) == "fp32"



fetched = pytest.mark.skipif(not models.is_fetched("smollm2-135m"), reason="smollm2-135m is not fetched (make fetch)")
REAL_PROMPT = "Write a Python function that checks whether a number is prime."


@pytest.fixture(scope="module")
def smol_q4():
    return models.load("smollm2-135m", device="cpu", weights="q4")


@fetched
@needs_op
@pytest.mark.slow
@pytest.mark.parametrize("drafter", [name for name in drafters.REGISTRY if name != drafters.PLAIN])
def test_every_drafter_greedy_equals_none_with_q4_weights(smol_q4, drafter):
    assert smol_q4.weights == "q4" and quant.is_quantized(smol_q4.target)
    assert not any(type(m) is torch.nn.Linear for m in smol_q4.target.model.layers.modules())  # all 210 are 4-bit
    assert quantized.q8_head(smol_q4.target) is not None  # and the LM head 8-bit
    if drafter not in drafters.available(smol_q4):
        pytest.skip(f"no shipped {drafter} weights in assets/")
    alone = specviz.generate(REAL_PROMPT, models=smol_q4, drafter="none", max_new_tokens=48)
    drafted = specviz.generate(REAL_PROMPT, models=smol_q4, drafter=drafter, max_new_tokens=48)
    assert drafted.token_ids == alone.token_ids and len(alone.token_ids) > 0


# ---- statistical losslessness with 4-bit weights --------------------------------------------------------------

SAMPLINGS = [pytest.param(Sampling(1.0), id="T=1"), pytest.param(Sampling(0.7, top_p=0.8), id="T=0.7,top-p=0.8")]


@pytest.fixture(scope="module")
def small_q4():
    """A vocabulary-8 target with 4-bit projections and an 8-bit LM head, and a random EAGLE head with 4-bit
    products for it."""
    _, target, _ = tiny_pair(vocab_size=8, scale=20.0, eos=None)
    head = random_eagle_head(target.config)
    quant.quantize_linears(head)
    return target, head


def sampled_p_value(small_q4, sampling, drafter):
    from specviz.drafters.eagle import EagleDrafter, TreeShape

    target, head = small_q4
    make = {"ngram": lambda: NgramDrafter(2, max_ngram=1),
            "eagle2": lambda: EagleDrafter(head, target, TreeShape(depth=2, top_k=2, total_tokens=4)),
            "top-3 of p": lambda: TopBTree(target, b=3, depth=2)}[drafter]  # siblings the target itself ranks
    counts = sampled_two_tokens(target, TinyTokenizer(8, eos=None), make, [1, 2, 3], sampling, 1500)
    return chi_square_p_value(counts, exact_two_tokens(target, [1, 2, 3], sampling))


@needs_op
@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("drafter", ["ngram", "eagle2", "top-3 of p"])
def test_sampling_with_4_bit_weights_matches_the_4_bit_target(small_q4, sampling, drafter):
    """The first two tokens, 1500 seeded runs, against the exact distribution of the same 4-bit target."""
    assert sampled_p_value(small_q4, sampling, drafter) > 1e-3


@needs_op
@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_the_4_bit_sampling_test_catches_an_unnormalised_residual(small_q4, monkeypatch):
    monkeypatch.setattr(verify_module, "_residual", unnormalised_residual)
    assert sampled_p_value(small_q4, Sampling(1.0), "top-3 of p") < 1e-6
