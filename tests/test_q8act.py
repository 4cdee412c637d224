"""Products on 8-bit activations (specviz/kernels/csrc/intdot.h, `load(..., weights="q4q8")`): the activations
quantized as llama.cpp's Q8_1 does it, each product equal to the 8-bit activations times the weight to rounding,
and the same bits for any row count, thread count and instruction-set path (the AVX-512 VNNI one natively where
the CPU has it, and through SIMDe's portable intrinsics on any CPU where SIMDe's headers are installed), so a
forward over n tokens gives, row by row, the bits of n one-token forwards and every drafter's greedy output is
the target's."""
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch
from test_q4 import REAL_PROMPT, k_quant_qwen2, random_eagle_head, random_q4, random_q4_k_levels, random_q6, random_q6_k_levels, random_q8, tiny_pair

import specviz
from specviz import drafters, models
from specviz.decoding import engine
from specviz.decoding.target import Target
from specviz.drafters import NoDraft
from specviz.drafters.ngram import NgramDrafter
from specviz.kernels import blocks as gguf_blocks
from specviz.kernels import fastdecoder, quant
from specviz.models import quantized

from tiny import TinyTokenizer, decode_settings

needs_op = pytest.mark.skipif(not quant.available(), reason="specviz's C++ ops are not built here")
PATHS = [pytest.param(path, marks=pytest.mark.skipif(
    not quant.path_runs(path, "q8"), reason=f"this CPU cannot run the {path} path on 8-bit activations"
    + (" (it needs AMX-INT8 and Linux's grant of the tile state; its emulation is tested on any CPU)"
       if path == "amx" else "")))
    for path in ("portable", "avx2", "avx512", "amx")]
ROWS = (1, 2, 3, 4, 5, 7, 8, 11, 16)
SHAPES = [(576, 576), (1536, 576), (576, 1536), (4096, 576), (16, 64), (48, 96)]  # (out, in); out whole tiles of 16


def tiled(kind: str, out: int, inp: int, seed: int) -> tuple[quant._BlockLinear, quant._BlockLinear]:
    """(the block linear in rows, the same in tiles) for random blocks of `kind`."""
    make = {"Q4_1": lambda: quant.Q4Linear(*random_q4(out, inp, seed)),
            "Q8_0": lambda: quant.Q8Linear(*random_q8(out, inp, seed)),
            "Q6_K widened": lambda: quant.Q8Linear(*random_q6(out, inp, seed)),
            "Q4_K": lambda: quant.Q4KLinear(*random_q4_k_levels(out, inp, seed)),
            "Q6_K": lambda: quant.Q6KLinear(*random_q6_k_levels(out, inp, seed))}[kind]
    linear = make()
    return linear, quant.with_8_bit_activations(linear)


def eight_bit(x: torch.Tensor, path: str = "auto") -> torch.Tensor:
    """x̂ = d q, the activations the products multiply (the op's own quantization)."""
    q, d, _ = torch.ops.specviz.q8_activations(x, quant.PATHS[path])
    return (q.float().reshape(x.shape[0], -1, 32) * d.unsqueeze(-1)).reshape(x.shape)


def agrees(got: torch.Tensor, weight: torch.Tensor, x_hat: torch.Tensor) -> bool:
    """got equals x̂ · Wᵀ up to fp32 rounding of the sum (float64 reference)."""
    exact = x_hat.double() @ weight.double().T
    scale = x_hat.double().abs() @ weight.double().abs().T
    return bool(((got.double() - exact).abs() <= 1e-5 * scale + 1e-6).all())


def reference_q8_1(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's quantize_row_q8_1 with d kept fp32: per 32, d = amax / 127, q = round-half-even(x / d)."""
    groups = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    d = np.abs(groups).max(-1) / np.float32(127)
    inverse = np.where(d >= np.finfo(np.float32).tiny, np.float32(1) / np.maximum(d, np.float32(1e-30)), np.float32(0))
    q = np.clip(np.rint(groups * inverse[..., None].astype(np.float32)), -127, 127).astype(np.int8)
    return q.reshape(x.shape), d.astype(np.float32)


@needs_op
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q6_K widened", "Q4_K", "Q6_K"])
def test_tiles_hold_the_same_weight(kind):
    linear, tiles = tiled(kind, 48, 512, seed=3)
    assert tiles.activations == "q8" and linear.activations == "fp32"
    assert torch.equal(tiles.weight, linear.weight)
    assert isinstance(tiles, quant.Q4Linear if kind in ("Q4_1", "Q4_K") else quant.Q8Linear)
    assert quant.with_8_bit_activations(tiles) is tiles
    odd = quant.Q4Linear(*random_q4(40, 64, seed=1))  # 40 outputs: not whole tiles, kept as it is
    assert quant.with_8_bit_activations(odd) is odd


@needs_op
@pytest.mark.parametrize("path", PATHS)
def test_activations_are_quantized_as_llama_cpps_q8_1(path):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6, 256, generator=generator) * torch.logspace(-3, 2, 6).unsqueeze(1)
    x[1, :32] = 0  # a group of zeros: d = 0, q = 0
    x[2, 40] = 1e-39  # a subnormal beside normal values
    x[3, 64:96] = 1e-40  # a group of subnormals only: too small to invert, so q = 0
    q, d, s = torch.ops.specviz.q8_activations(x, quant.PATHS[path])
    expected_q, expected_d = reference_q8_1(x.numpy())
    assert np.array_equal(q.numpy(), expected_q) and np.array_equal(d.numpy(), expected_d)
    assert int(q.abs().max()) == 127 and (q[3, 64:96] == 0).all()
    assert torch.equal(s, d * q.reshape(6, -1, 32).sum(-1).float())
    x[4, 100] = float("nan")
    q, d, _ = torch.ops.specviz.q8_activations(x, quant.PATHS[path])
    assert torch.isnan(d[4, 3]) and (q[4, 96:128] == 0).all() and not torch.isnan(d[4, [0, 1, 2, 4]]).any()


@needs_op
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("out,inp", SHAPES)
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q6_K widened"])
def test_the_product_is_the_8_bit_activations_times_the_weight(path, out, inp, kind):
    linear, tiles = tiled(kind, out, inp, seed=out + inp)
    weight = linear.weight
    x = torch.randn(max(ROWS), inp, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(out)
    for rows in ROWS:
        got = type(tiles).PROJECTION.PRODUCT(x[:rows], *tiles.blocks(), bias, path=path)
        assert got.shape == (rows, out) and agrees(got - bias, weight, eight_bit(x[:rows])), rows


@needs_op
@pytest.mark.parametrize("mutation", ["fp32 activations", "scale of the next group", "minimum dropped",
                                      "nibbles swapped", "tile columns shifted"])
def test_a_planted_bug_is_caught(mutation):
    """The comparison above rejects a product that skipped the activations' quantization, or read the weight
    slightly wrong, so it would catch those bugs in the op."""
    codes, scales, mins = random_q4(64, 576, seed=7)
    tiles = quant.with_8_bit_activations(quant.Q4Linear(codes, scales, mins))
    x = torch.randn(4, 576, generator=torch.Generator().manual_seed(4))
    got, x_hat = quant.q4_product(x, *tiles.blocks()), eight_bit(x)
    weight = gguf_blocks.dequantize(codes, scales, mins)
    assert agrees(got, weight, x_hat)
    if mutation == "fp32 activations":
        assert not agrees(got, weight, x)
        return
    wrong = {"scale of the next group": lambda: gguf_blocks.dequantize(codes, scales.roll(-1, dims=1), mins),
             "minimum dropped": lambda: gguf_blocks.dequantize(codes, scales, torch.zeros_like(mins)),
             "nibbles swapped": lambda: gguf_blocks.dequantize((codes << 4) | (codes >> 4), scales, mins),
             "tile columns shifted": lambda: weight.reshape(4, 16, 576).roll(1, dims=1).reshape(64, 576)}[mutation]()
    assert not agrees(got, wrong, x_hat)


@needs_op
def test_every_path_gives_the_same_bits_whatever_the_rows_and_threads():
    """The fixed order: each of 100 rows alone, among 16 or among all 100 (more than one block of rows, passes of 8,
    4 and fewer rows), in uneven splits, on 1 or 2 threads, on every path this CPU runs: the same fp32 bits."""
    layers = {kind: tiled(kind, 1536, 576, seed=5)[1] for kind in ("Q4_1", "Q8_0", "Q6_K widened")}
    x = torch.randn(100, 576, generator=torch.Generator().manual_seed(2))
    paths = [path for path in ("portable", "avx2", "avx512", "amx") if quant.path_runs(path, "q8")]
    threads = torch.get_num_threads()
    for kind, layer in layers.items():
        def product(rows, path, layer=layer):
            return type(layer).PROJECTION.PRODUCT(rows, *layer.blocks(), None, path=path)
        try:
            results = []
            for count in (1, 2):
                torch.set_num_threads(count)
                for path in paths:
                    results.append(product(x, path))
                    results.append(torch.cat([product(x[r : r + 1], path) for r in range(len(x))]))
                    results.append(torch.cat([product(x[a:b], path) for a, b in ((0, 5), (5, 7), (7, 16), (16, 100))]))
                    results.append(torch.cat([product(x[:16], path), product(x[16:83], path), product(x[83:], path)]))
        finally:
            torch.set_num_threads(threads)
        assert all(torch.equal(result, results[0]) for result in results), kind


@needs_op
@pytest.mark.skipif(not quant.path_runs("amx", "q8"), reason="this CPU cannot run the amx path (it needs AMX-INT8 and "
                    "Linux's grant of the tile state; its emulation is tested on any CPU)")
def test_amx_tiles_give_the_one_row_bits_for_every_row_count_and_thread_count():
    """On the CPU's own tiles: every row count 1-64 (and past a block), on 1 and 2 threads, each row the bits of
    that row alone on the VNNI path, for 4-bit codes, Q8_0 and Q6_K's halves."""
    layers = {kind: tiled(kind, 1536, 576, seed=7)[1] for kind in ("Q4_1", "Q8_0", "Q6_K widened")}
    x = torch.randn(80, 576, generator=torch.Generator().manual_seed(3))
    threads = torch.get_num_threads()
    try:
        for kind, layer in layers.items():
            alone = torch.cat([type(layer).PROJECTION.PRODUCT(x[r : r + 1], *layer.blocks(), None, path="avx512")
                               for r in range(len(x))])
            for count in (1, 2):
                torch.set_num_threads(count)
                for rows in (*range(1, 65), 80):
                    got = type(layer).PROJECTION.PRODUCT(x[:rows], *layer.blocks(), None, path="amx")
                    assert torch.equal(got, alone[:rows]), (kind, rows, count)
    finally:
        torch.set_num_threads(threads)


HARNESS = r"""
#include "intdot.h"
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
using namespace specviz_intdot;
template <class T> std::vector<T> read(const std::string& path, size_t n) {
  std::vector<T> v(n);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr || std::fread(v.data(), sizeof(T), n, f) != n) std::exit(2);
  std::fclose(f);
  return v;
}
int main(int argc, char** argv) {  // bits per rows in out path folder, or "check"
  if (std::string(argv[1]) == "check") return amx_agrees_with_vnni() ? 0 : 1;  // the op's check before first use
  if (std::string(argv[1]) == "config") {  // config HALVES [BYTE]: amx_config's 64 bytes in hex, then ldtilecfg
    TileConfig config = amx_config(std::atoi(argv[2]));  // of them, with BYTE set to 1 first where given
    uint8_t* bytes = reinterpret_cast<uint8_t*>(&config);
    static_assert(sizeof(TileConfig) == 64);
    for (int i = 0; i < 64; ++i) std::printf("%02x", bytes[i]);
    std::fflush(stdout);
    if (argc > 3) bytes[std::atoi(argv[3])] = 1;
    specviz_amx_config(bytes);  // aborts where the hardware raises #GP
    return 0;
  }
  const int bits = std::atoi(argv[1]), per = std::atoi(argv[2]);
  const int64_t rows = std::atoll(argv[3]), in = std::atoll(argv[4]), out = std::atoll(argv[5]), path = std::atoll(argv[6]);
  const std::string dir = argv[7];
  const int64_t groups = in / kGroup;
  const auto x = read<float>(dir + "/x", rows * in);
  const auto codes = read<uint8_t>(dir + "/codes", out * in / (bits == 4 ? 2 : 1));
  const auto scales = read<float>(dir + "/scales", out * groups * per);
  const auto mins = bits == 4 ? read<float>(dir + "/mins", out * groups) : std::vector<float>();
  std::vector<int8_t> q(rows * in);
  std::vector<float> d(rows * groups), s(rows * groups), y(rows * out);
  std::vector<int32_t> sums(2 * rows * groups);
  quantize_rows(path, x.data(), in, 0, rows, q.data(), d.data(), s.data(), sums.data());
  const Acts a{q.data(), d.data(), s.data(), sums.data(), in, groups};
  const Tiles w{codes.data(), scales.data(), bits == 4 ? mins.data() : nullptr, groups, per};
  if (bits == 4) tiles<4>(path, a, rows, w, y.data(), out, 0, out / kTile);
  else tiles<8>(path, a, rows, w, y.data(), out, 0, out / kTile);
  FILE* f = std::fopen((dir + "/y").c_str(), "wb");
  std::fwrite(y.data(), 4, y.size(), f);
  std::fclose(f);
}
"""


EMULATION = os.path.join(os.path.dirname(__file__), "csrc")  # amx_emulation.h: the AMX tile instructions in C++


def simde_harness(folder, *defines: str) -> tuple[str | None, str | None]:
    """The kernels built against SIMDe's intrinsics and the AMX emulation (every path runs on any CPU), or why
    they cannot be."""
    compiler = shutil.which("g++")
    if compiler is None or not os.path.isfile("/usr/include/simde/x86/avx512.h"):
        return None, "needs g++ and SIMDe's headers (Debian: apt-get install libsimde-dev)"
    if not quant.path_runs("avx2", "q8"):
        return None, "needs AVX2 and FMA here: SIMDe's fused multiply-add is only fused where the CPU has one"
    source, binary = folder / "harness.cpp", folder / "harness"
    source.write_text(HARNESS)
    csrc = os.path.join(os.path.dirname(quant.__file__), "csrc")
    subprocess.run([compiler, "-O1", "-std=c++17", "-mavx2", "-mfma", "-ffp-contract=off", "-DSPECVIZ_INTDOT_SIMDE",
                    *defines, f"-I{csrc}", f"-I{EMULATION}", str(source), "-o", str(binary)],
                   check=True, capture_output=True)
    return str(binary), None


def emulated_products(binary, folder, paths, row_counts) -> list[tuple]:
    """The cases (bits, per, rows, path) where the harness's product differs from the portable op's bits."""
    generator = torch.Generator().manual_seed(11)
    cases = [(4, 1, tiled("Q4_1", 48, 96, seed=1)[1]), (8, 1, tiled("Q8_0", 32, 128, seed=2)[1]),
             (8, 2, tiled("Q6_K widened", 32, 96, seed=3)[1])]
    differ = []
    for bits, per, layer in cases:
        out, inp = layer.out_features, layer.in_features
        x = torch.randn(max(row_counts), inp, generator=generator)
        x[0, :32] = 0
        for name, tensor in zip(("codes", "scales", "mins"), layer.blocks()):
            tensor.numpy().tofile(folder / name)
        x.numpy().tofile(folder / "x")
        for rows in row_counts:
            expected = type(layer).PROJECTION.PRODUCT(x[:rows], *layer.blocks(), None, path="portable")
            for path in paths:
                subprocess.run([binary, str(bits), str(per), str(rows), str(inp), str(out), str(path), str(folder)],
                               check=True)
                got = torch.from_numpy(np.fromfile(folder / "y", dtype=np.float32).reshape(rows, out))
                if not torch.equal(got, expected):
                    differ.append((bits, per, rows, path))
    return differ


@needs_op
def test_the_avx512_path_gives_the_portable_bits_through_simde(tmp_path):
    """The AVX-512 VNNI path (and the AVX2 one) compiled against SIMDe's portable intrinsics, run on this CPU:
    the portable op's bits, for 4-bit and 8-bit tiles, every row count up to 9 and 12, 17 and 65 (passes of 8, 4
    and fewer rows; past one block of 64)."""
    binary, why = simde_harness(tmp_path)
    if binary is None:
        pytest.skip(why)
    assert emulated_products(binary, tmp_path, (1, 2), (*range(1, 10), 12, 17, 65)) == []


AMX_ROWS = (*range(1, 18), 31, 32, 33, 48, 63, 64, 65, 100, 128)  # one chunk of 16, padded ones, blocks of 64


@needs_op
def test_the_amx_path_gives_the_portable_bits_through_its_emulation(tmp_path):
    """The AMX path (tiles of 16 rows, zero-padded last chunks, two register sets taking turns, 4-bit codes
    unpacked into B, 8-bit ones read as they lie, halves with scales of their own) with the tile instructions
    emulated as the SDM defines them: the portable op's bits for every row count 1-17 and across chunks and
    blocks of rows, on any CPU. The same source runs natively where the CPU has AMX (the next test)."""
    binary, why = simde_harness(tmp_path)
    if binary is None:
        pytest.skip(why)
    assert emulated_products(binary, tmp_path, (3,), AMX_ROWS) == []


@needs_op
def test_a_planted_layout_bug_in_the_amx_path_is_caught(tmp_path):
    """With B's four bytes of each column read in the wrong order, the comparison above fails on every case with
    more than one row (one row takes the VNNI path)."""
    binary, why = simde_harness(tmp_path, "-DSPECVIZ_AMX_EMULATION_MISREAD")
    if binary is None:
        pytest.skip(why)
    differ = emulated_products(binary, tmp_path, (3,), (1, 2, 16, 17))
    assert {rows for _, _, rows, _ in differ} == {2, 16, 17} and len(differ) == 9
    # the op's own check before it first takes the tiles (amx_agrees_with_vnni) refuses them too
    assert subprocess.run([binary, "check"]).returncode == 1


@needs_op
def test_the_tile_configuration_has_the_sdm_layout(tmp_path):
    """amx_config's 64 bytes as ldtilecfg reads them (Intel SDM): palette 1 at byte 0, start_row 0, bytes 2..15
    zero, colsb of tiles 0..15 as little-endian 16-bit words at 16..47, rows of tiles 0..15 at 48..63; C in tiles
    0/1 (16 rows of 64 bytes), A in 2/3 (16 rows of 32 / halves bytes), B in 4/5 (32 / halves / 4 rows of 64 bytes),
    every other tile zero. The emulated ldtilecfg takes it, and refuses a start_row, a reserved byte or a tile past
    7 that is not zero (the hardware raises #GP on the last two)."""
    binary, why = simde_harness(tmp_path)
    if binary is None:
        pytest.skip(why)
    for halves in (1, 2):
        k = 32 // halves
        colsb, rows = [64, 64, k, k, 64, 64] + [0] * 10, [16, 16, 16, 16, k // 4, k // 4] + [0] * 10
        expected = bytes([1, 0] + [0] * 14) + b"".join(c.to_bytes(2, "little") for c in colsb) + bytes(rows)
        run = subprocess.run([binary, "config", str(halves)], capture_output=True, text=True)
        assert run.returncode == 0 and bytes.fromhex(run.stdout) == expected
        for byte in (1, 2, 15, 32, 47, 56, 63):
            run = subprocess.run([binary, "config", str(halves), str(byte)], capture_output=True, text=True)
            assert run.returncode != 0 and "AMX emulation" in run.stderr, byte


@needs_op
def test_the_check_before_first_use_passes_on_correct_tiles(tmp_path):
    """amx_agrees_with_vnni, which the op runs once before it takes the tiles (and keeps VNNI if it fails), passes
    on the emulated instructions; the test above shows it fails on a wrong B order."""
    binary, why = simde_harness(tmp_path)
    if binary is None:
        pytest.skip(why)
    assert subprocess.run([binary, "check"]).returncode == 0


@needs_op
def test_the_amx_status_says_why_the_tiles_run_or_not():
    """On a CPU that reports AMX-INT8 the tiles run, or Linux refused them; never "differs" (the check before first
    use found their products unlike VNNI's: a bug). Elsewhere "absent"; the amx path runs exactly when "runs"."""
    from specviz.kernels import products
    status = products.amx_status()
    with open("/proc/cpuinfo") as f:
        flags = next((line.split() for line in f if line.startswith("flags")), [])
    if "amx_int8" in flags and "amx_tile" in flags and "avx512_vnni" in flags:
        assert status in ("runs", "refused"), f"AMX tiles here, but their status is {status!r}"
    else:
        assert status == "absent"
    assert quant.path_runs("amx", "q8") == (status == "runs") == products.amx_tiles()


def q4q8_pair(**options):
    """(fp32 twin, the tiny target with 4-bit projections and an 8-bit head, all on 8-bit activations)."""
    fp32, q4, tensors = tiny_pair(**options)
    q8 = type(q4)(q4.config).eval().requires_grad_(False)
    q8.load_state_dict(fp32.state_dict())
    assert quantized.replace_projections(q8, tensors, activations="q8") == 14  # before the lean decoder is built
    assert quantized.attach_q8_head(q8, quant.q8_head(q4).linear.blocks(), activations="q8")
    assert quant.q8_head(q8).linear.activations == "q8" and quant.activations(q8) == "q8"
    return fp32, q8


@needs_op
def test_the_layer_op_and_the_python_loop_give_the_same_bits_on_8_bit_activations():
    _, q8 = q4q8_pair()
    fast = fastdecoder.for_model(q8)
    assert fast.stack.layer_op and fast.stack.layers[0].qkv.scales.dim() == 3  # tiled, in the one-call layer op
    context, step = torch.tensor([3, 17, 9, 40, 2, 11, 5, 8]), torch.tensor([7, 1, 30])
    results = {}
    try:
        for layer_op in (True, False):
            fast.stack.layer_op = layer_op
            cache = fast.new_cache()
            results[layer_op] = (fast(context, cache), fast(step, cache))
    finally:
        fast.stack.layer_op = True
    assert all(torch.equal(a, b) for a, b in zip(results[True], results[False]))


@needs_op
def test_a_forward_over_n_tokens_gives_the_bits_of_n_one_token_forwards():
    """What greedy losslessness rests on: each row of a verify forward is what a one-token forward gives."""
    fp32, q8 = q4q8_pair()
    target = Target(q8)
    prompt, new = [3, 17, 9, 40, 2, 11], [7, 1, 30, 4, 4, 9, 12, 60]
    cache = target.new_cache()
    target.forward(prompt, cache, logits=False)
    _, together = target.forward(new, cache)
    cache = target.new_cache()
    target.forward(prompt, cache, logits=False)
    alone = torch.cat([target.forward([token], cache)[1] for token in new])
    assert torch.equal(together, alone)
    with torch.inference_mode():  # and near the fp32 twin: 8-bit activations round more than fp32 ones
        expected = fp32(torch.tensor([prompt + new])).logits[0, len(prompt):]
    assert (together - expected).abs().max() < 0.05 * expected.abs().max()


@needs_op
def test_a_tree_forward_gives_each_node_the_bits_of_one_token_forwards_along_its_path():
    """A tree verify on 8-bit activations: each node's logits are those of one-token forwards along its path alone.
    A tree of 24 nodes, so that its rows' keys cross a 16-key block (where a differently grouped sum once moved a
    bit, and 8-bit roundings turned that into different greedy tokens)."""
    from test_tree import random_tree

    _, q8 = q4q8_pair()
    target = Target(q8)
    prompt, tree = [3, 17, 9, 40, 2, 11, 5, 8, 13, 21, 34], random_tree(n=24, seed=7)
    past = len(prompt) - 1
    cache = target.new_cache()
    target.forward(prompt[:-1], cache, logits=False)
    _, together = target.forward([prompt[-1]] + tree.tokens, cache, tree.position_ids(past),
                                 tree.attention_mask(past))
    for node in range(len(tree)):
        cache = target.new_cache()
        target.forward(prompt[:-1], cache, logits=False)
        _, alone = target.forward([prompt[-1]] + [tree.tokens[i] for i in tree.path_to(node)], cache)
        assert torch.equal(alone[-1], together[node + 1]), f"node {node} differs from its path alone"


@needs_op
def test_drafters_keep_the_greedy_output_on_8_bit_activations():
    from specviz.drafters.eagle import EagleDrafter, TreeShape

    _, q8 = q4q8_pair(scale=3.0)
    head = random_eagle_head(q8.config)
    quant.quantize_linears(head, "q8")
    assert quant.activations(head) == "q8" and fastdecoder.for_eagle(head).stack.layer_op
    prompt = [5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6]
    settings = decode_settings(max_new_tokens=30)
    alone = list(engine.decode(q8, TinyTokenizer(64), NoDraft(), prompt, settings))[-1].token_ids
    for drafter in (NgramDrafter(3), EagleDrafter(head, q8, TreeShape(depth=3, top_k=3, total_tokens=8))):
        events = list(engine.decode(q8, TinyTokenizer(64), drafter, prompt, settings))
        assert events[-1].token_ids == alone and len(alone) == 30
        assert sum(len(e.nodes) for e in events[1:-1]) > 0  # it did draft


@needs_op
def test_a_k_quant_target_on_8_bit_activations_decodes_losslessly():
    """Q4_K widened to Q4_1 tiles, Q6_K and Q5_0 as 8-bit tiles, a Q6_K head: near the fp32 twin, and a drafter's
    greedy output equal to the target's alone."""
    fp32, blocked, tensors = k_quant_qwen2()
    q8 = type(blocked)(blocked.config).eval().requires_grad_(False)
    q8.load_state_dict(fp32.state_dict())
    quantized.replace_projections(q8, tensors, activations="q8")
    assert quantized.attach_q8_head(q8, quant.q8_head(blocked).linear.blocks(), activations="q8")
    assert all(m.activations == "q8" for m in q8.modules() if isinstance(m, quant.BLOCK_LINEARS))
    ids = [3, 17, 9, 40, 2, 11]
    with torch.inference_mode():
        expected = fp32(torch.tensor([ids])).logits[0]
        target = Target(q8)
        _, logits = target.forward(ids, target.new_cache())
    assert (logits - expected).abs().max() < 0.05 * expected.abs().max()
    prompt, settings = [5, 9, 5, 9, 5, 9, 12], decode_settings(max_new_tokens=24)
    alone = list(engine.decode(q8, TinyTokenizer(64), NoDraft(), prompt, settings))[-1].token_ids
    drafted = list(engine.decode(q8, TinyTokenizer(64), NgramDrafter(3), prompt, settings))[-1].token_ids
    assert drafted == alone and len(alone) >= 8


fetched = pytest.mark.skipif(not models.is_fetched("smollm2-135m"), reason="smollm2-135m is not fetched (make fetch)")


@pytest.fixture(scope="module")
def smol_q4q8():
    return models.load("smollm2-135m", device="cpu", weights="q4q8")


@fetched
@needs_op
@pytest.mark.slow
@pytest.mark.parametrize("drafter", [name for name in drafters.REGISTRY if name != drafters.PLAIN])
def test_every_drafter_greedy_equals_none_on_8_bit_activations(smol_q4q8, drafter):
    assert smol_q4q8.weights == "q4q8" and quant.activations(smol_q4q8.target) == "q8"
    linears = [m for m in smol_q4q8.target.model.layers.modules() if isinstance(m, quant.BLOCK_LINEARS)]
    assert len(linears) == 210 and all(m.activations == "q8" for m in linears)
    assert quant.q8_head(smol_q4q8.target).linear.activations == "q8"
    if drafter not in drafters.available(smol_q4q8):
        pytest.skip(f"no shipped {drafter} weights in assets/")
    alone = specviz.generate(REAL_PROMPT, models=smol_q4q8, drafter="none", max_new_tokens=48)
    drafted = specviz.generate(REAL_PROMPT, models=smol_q4q8, drafter=drafter, max_new_tokens=48)
    assert drafted.token_ids == alone.token_ids and len(alone.token_ids) > 0


def random_eagle3_head(target, folder=None, own_lm_head=False):
    """A random EAGLE-3 head over the tiny target's two layers (every size whole Q4_1 groups and tiles of 16), over
    the full vocabulary; saved to `folder` when given."""
    from specviz.models.eagle3 import Eagle3Head

    torch.manual_seed(4)
    hidden = target.config.hidden_size
    layer = dict(hidden_size=hidden, num_attention_heads=4, num_key_value_heads=2, intermediate_size=2 * hidden,
                 vocab_size=target.config.vocab_size, rms_norm_eps=1e-6, max_position_embeddings=256)
    head = Eagle3Head(layer, hidden, target.config.vocab_size, (0, 1), own_lm_head=own_lm_head)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.normal_(0, 0.3)
        head.t2d.fill_(True)
    if folder is not None:
        head.save(folder, {"target": "tiny"}, dtype=torch.float32)
    return head.eval().requires_grad_(False)


@needs_op
@pytest.mark.parametrize("activations, own_lm_head", [("fp32", False), ("q8", False), ("q8", True)])
def test_beside_a_4_bit_target_an_eagle3_head_drafts_on_4_bit_products_and_keeps_the_greedy_output(
        activations, own_lm_head, tmp_path, monkeypatch):
    """load_trained gives a 4-bit target's EAGLE-3 head Q4_1 products (fc, the layer's projections), on the
    target's activations; its projection onto the draft vocabulary (its own LM head, where it has one, or the
    target's rows: the 8-bit head's beside a target on 8-bit activations) has projection_dtype draft_dtype; drafting
    with it leaves the greedy output the target's alone.
    SPECVIZ_DRAFT_DTYPE keeps it unquantized."""
    from specviz.drafters.eagle import TreeShape
    from specviz.drafters.eagle3 import Eagle3Drafter
    from specviz.models import loading
    from specviz.models.device import DRAFT_DTYPE_ENV
    from specviz.models.loading import load_trained

    monkeypatch.delenv(DRAFT_DTYPE_ENV, raising=False)
    monkeypatch.setattr(loading, "draft_dtype", lambda dtype, device: torch.bfloat16)  # as on a CPU with bf16
    target = tiny_pair(scale=3.0)[1] if activations == "fp32" else q4q8_pair(scale=3.0)[1]
    random_eagle3_head(target, tmp_path / "head", own_lm_head=own_lm_head)
    head = load_trained("eagle3", tmp_path / "head", target)
    linears = [name for name, m in head.named_modules() if type(m) is torch.nn.Linear]
    assert quant.is_quantized(head) and linears == (["lm_head"] if own_lm_head else [])
    assert quant.activations(head) == activations and head.projection_dtype == torch.bfloat16
    prompt = [5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6]
    settings = decode_settings(max_new_tokens=30)
    alone = list(engine.decode(target, TinyTokenizer(64), NoDraft(), prompt, settings))[-1].token_ids
    drafter = Eagle3Drafter(head, target, TreeShape(depth=3, top_k=3, total_tokens=8))
    assert drafter.dtype == torch.float32 and drafter.project_dtype == torch.bfloat16
    events = list(engine.decode(target, TinyTokenizer(64), drafter, prompt, settings))
    assert events[-1].token_ids == alone and len(alone) == 30
    assert sum(len(e.nodes) for e in events[1:-1]) > 0  # it did draft

    monkeypatch.setenv(DRAFT_DTYPE_ENV, "float32")
    assert not quant.is_quantized(load_trained("eagle3", tmp_path / "head", target))
