"""How the AVX-512 4-bit product (csrc/blocklinear.cpp) unpacks a Q4_1 group, per row count, three builds side by
side: as shipped (one to 64 rows unpacked in registers by table lookup: the group's 16 values d j + m in a
register, indexed by the nibbles, one multiply-add and three shuffles, each weight feeding up to four rows), with
conversion instead of the lookup (nibbles to int32 to fp32, then d q + m: two conversions and two multiply-adds a
group), and with several rows unpacked into L1 first, as the product did before (four columns at a time, then each
row's products with them; one row still by lookup). All three give the same bits (checked here). The two other
builds are the shipped source with one line changed, loaded under other op names; the three are timed on
SmolLM2-135M's projection shapes over about 100 MB of codes (so none sits in a cache), in a rotated order each
round (median of 9 rounds). Then the 8-bit LM head over 1–8 rows, as shipped (registers up to 4 rows) and
through L1.

    .venv/bin/python experiments/q4_unpack_ab.py [--rows 1,2,4,8,16,64]
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils import cpp_extension

from specviz.kernels import extension, quant

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
CSRC = Path(extension.__file__).with_name("csrc")
LOOKUP = "      if constexpr (Bits == 4) lookup_avx512(b, o + c, g, w0, w1);\n      else unpack_avx512(b, o + c, g, w0, w1);"
FUSED_ROWS = "constexpr int64_t kFusedRows = 64;  // AVX-512, 4-bit: up to this many rows unpack in registers, four at a time\nconstexpr int64_t kFusedRows8 = 4;"
CHANGES = {"specviz_conversion": (LOOKUP, "      unpack_avx512(b, o + c, g, w0, w1);"),
           "specviz_l1": (FUSED_ROWS, "constexpr int64_t kFusedRows = 1;\nconstexpr int64_t kFusedRows8 = 1;")}


def variant(name: str, shipped: str, folder: Path) -> None:
    """Build blocklinear.cpp with CHANGES[name] as `name`; registers torch.ops.<name>.q4_linear."""
    old, new = CHANGES[name]
    assert old in shipped, "csrc/blocklinear.cpp changed: update this experiment"
    source = shipped.replace(old, new)
    source = source.replace("TORCH_LIBRARY_FRAGMENT(specviz,", f"TORCH_LIBRARY_FRAGMENT({name},")
    source = source.replace("TORCH_LIBRARY_IMPL(specviz,", f"TORCH_LIBRARY_IMPL({name},")
    source = source.replace("namespace specviz {", f"namespace {name} {{").replace("specviz::q4_linear", f"{name}::q4_linear")
    (folder / name).mkdir()
    (folder / name / "blocklinear.cpp").write_text(source)
    (folder / name / "ops.h").write_text((CSRC / "ops.h").read_text())
    cpp_extension.load(name, [str(folder / name / "blocklinear.cpp")], extra_cflags=extension.FLAGS,
                       extra_ldflags=["-fopenmp"], build_directory=str(folder / name), is_python_module=False)


@torch.inference_mode()
def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,4,8,16,64")
    args = ap.parse_args(argv)
    if not quant.available() or torch.ops.specviz.q4_path(-1) != 2:
        print("needs specviz's C++ ops and an AVX-512 CPU")
        return 1
    shipped = (CSRC / "blocklinear.cpp").read_text()
    with tempfile.TemporaryDirectory() as folder:
        for name in CHANGES:
            variant(name, shipped, Path(folder))
    ops = {"shipped": torch.ops.specviz.q4_linear, "conversion": torch.ops.specviz_conversion.q4_linear,
           "rows via L1": torch.ops.specviz_l1.q4_linear}
    generator = torch.Generator().manual_seed(0)
    print(f"torch threads {torch.get_num_threads()}; ms per product (median of 9); shipped's speed relative to each")
    print("| shape | rows | shipped ms | conversion ms | rows via L1 ms | shipped vs conversion | shipped vs rows via L1 |")
    print("|---|---|---|---|---|---|---|")
    for shape, (out, inp) in SHAPES.items():
        copies = max(1, (100 << 20) // (out * inp // 2))
        weights = [(torch.randint(0, 256, (out, inp // 2), generator=generator, dtype=torch.uint8),
                    (torch.rand(out, inp // 32, generator=generator) * 0.01).half().float(),
                    (-torch.rand(out, inp // 32, generator=generator) * 0.08).half().float()) for _ in range(copies)]
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, inp, generator=generator)
            reference = ops["shipped"](x, *weights[0], None, -1)
            assert all(torch.equal(op(x, *weights[0], None, -1), reference) for op in ops.values()), "bits differ"

            def run(op, x=x, weights=weights, copies=copies):
                started = time.perf_counter()
                for codes, scales, mins in weights:
                    op(x, codes, scales, mins, None, -1)
                return (time.perf_counter() - started) / copies * 1e3

            for op in ops.values():
                run(op)
            times = {name: [] for name in ops}
            names = list(ops)
            for round_ in range(9):
                for name in names[round_ % 3:] + names[: round_ % 3]:  # each build first in a third of the rounds
                    times[name].append(run(ops[name]))
            ms = {name: statistics.median(t) for name, t in times.items()}
            print(f"| {shape} {out}×{inp} | {rows} | {ms['shipped']:.3f} | {ms['conversion']:.3f} | {ms['rows via L1']:.3f} | "
                  f"{ms['conversion'] / ms['shipped']:.2f}× | {ms['rows via L1'] / ms['shipped']:.2f}× |", flush=True)
    # the 8-bit LM head (SmolLM2's tied Q8_0 embedding): registers for up to 4 rows, L1 beyond, against L1 always
    q8 = {"shipped": torch.ops.specviz.q8_linear, "rows via L1": torch.ops.specviz_l1.q8_linear}
    out, inp = 49152, 576
    heads = [(torch.randint(-127, 128, (out, inp), generator=generator, dtype=torch.int8),
              (torch.rand(out, inp // 32, generator=generator) * 0.01).half().float()) for _ in range(3)]
    print("\n| 8-bit LM head | rows | shipped ms | rows via L1 ms | shipped vs rows via L1 |")
    print("|---|---|---|---|---|")
    for rows in (1, 2, 3, 4, 8):
        x = torch.randn(rows, inp, generator=generator)
        assert torch.equal(q8["shipped"](x, *heads[0], None, -1), q8["rows via L1"](x, *heads[0], None, -1)), "bits differ"

        def run8(op, x=x):
            started = time.perf_counter()
            for codes, scales in heads:
                op(x, codes, scales, None, -1)
            return (time.perf_counter() - started) / len(heads) * 1e3

        times = {name: [] for name in q8}
        for round_ in range(10):
            for name in (list(q8) if round_ % 2 else list(q8)[::-1]):
                times[name].append(run8(q8[name]))
        ms = {name: statistics.median(t) for name, t in times.items()}
        print(f"| {out}×{inp} | {rows} | {ms['shipped']:.2f} | {ms['rows via L1']:.2f} | "
              f"{ms['rows via L1'] / ms['shipped']:.2f}× |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
