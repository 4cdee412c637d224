"""Two ways to unpack a Q4_1 group to fp32 in the AVX-512 product (csrc/blocklinear.cpp), per row count: by
conversion (nibbles to int32 to fp32, then d q + m: two conversions and two multiply-adds a group) and by table
lookup (the group's 16 values d j + m in a register, indexed by the nibbles: one multiply-add and three shuffles).
Both give the same weights, bit for bit (checked here). The shipped source uses the lookup for one row and the
conversion for several; this builds it twice more under other op names, once with the conversion everywhere and
once with the lookup everywhere, and times the three on SmolLM2-135M's projection shapes, alternated in one
process (median of 7 rounds), over about 100 MB of codes so that none sits in a cache.

    .venv/bin/python experiments/q4_unpack_ab.py [--rows 1,4,16]
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
ONE_ROW = "      if constexpr (Bits == 4) lookup_avx512(b, o + c, g, w0, w1);\n      else unpack_avx512(b, o + c, g, w0, w1);"
SEVERAL_ROWS = "        unpack_avx512(b, o + c, g, w0, w1);\n        _mm512_store_ps"


def variant(name: str, shipped: str, folder: Path) -> None:
    """Build blocklinear.cpp as `name` with one unpacking everywhere; registers torch.ops.<name>.q4_linear."""
    source = shipped.replace("TORCH_LIBRARY_FRAGMENT(specviz,", f"TORCH_LIBRARY_FRAGMENT({name},")
    source = source.replace("TORCH_LIBRARY_IMPL(specviz,", f"TORCH_LIBRARY_IMPL({name},")
    source = source.replace("namespace specviz {", f"namespace {name} {{").replace("specviz::q4_linear", f"{name}::q4_linear")
    assert ONE_ROW in source and SEVERAL_ROWS in source, "csrc/blocklinear.cpp changed: update this experiment"
    if name.endswith("conversion"):
        source = source.replace(ONE_ROW, "      unpack_avx512(b, o + c, g, w0, w1);")
    else:
        source = source.replace(SEVERAL_ROWS, "        if constexpr (Bits == 4) lookup_avx512(b, o + c, g, w0, w1);\n"
                                              "        else unpack_avx512(b, o + c, g, w0, w1);\n        _mm512_store_ps")
    (folder / name).mkdir()
    (folder / name / "blocklinear.cpp").write_text(source)
    (folder / name / "ops.h").write_text((CSRC / "ops.h").read_text())
    cpp_extension.load(name, [str(folder / name / "blocklinear.cpp")], extra_cflags=extension.FLAGS,
                       extra_ldflags=["-fopenmp"], build_directory=str(folder / name), is_python_module=False)


@torch.inference_mode()
def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,4,16")
    args = ap.parse_args(argv)
    if not quant.available() or torch.ops.specviz.q4_path(-1) != 2:
        print("needs specviz's C++ ops and an AVX-512 CPU")
        return 1
    shipped = (CSRC / "blocklinear.cpp").read_text()
    with tempfile.TemporaryDirectory() as folder:
        for name in ("specviz_conversion", "specviz_lookup"):
            variant(name, shipped, Path(folder))
    ops = {"shipped": torch.ops.specviz.q4_linear, "conversion": torch.ops.specviz_conversion.q4_linear,
           "lookup": torch.ops.specviz_lookup.q4_linear}
    generator = torch.Generator().manual_seed(0)
    print(f"torch threads {torch.get_num_threads()}; ms per product (median of 7), relative to the conversion")
    print("| shape | rows | conversion ms | lookup ms | shipped ms | lookup vs conversion | shipped vs conversion |")
    print("|---|---|---|---|---|---|---|")
    for shape, (out, inp) in SHAPES.items():
        copies = max(1, (100 << 20) // (out * inp // 2))
        weights = [(torch.randint(0, 256, (out, inp // 2), generator=generator, dtype=torch.uint8),
                    (torch.rand(out, inp // 32, generator=generator) * 0.01).half().float(),
                    (-torch.rand(out, inp // 32, generator=generator) * 0.08).half().float()) for _ in range(copies)]
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, inp, generator=generator)
            reference = ops["conversion"](x, *weights[0], None, -1)
            assert all(torch.equal(op(x, *weights[0], None, -1), reference) for op in ops.values()), "bits differ"

            def run(op, x=x, weights=weights, copies=copies):
                started = time.perf_counter()
                for codes, scales, mins in weights:
                    op(x, codes, scales, mins, None, -1)
                return (time.perf_counter() - started) / copies * 1e3

            for op in ops.values():
                run(op)
            times = {name: [] for name in ops}
            for _ in range(7):
                for name, op in ops.items():
                    times[name].append(run(op))
            ms = {name: statistics.median(t) for name, t in times.items()}
            print(f"| {shape} {out}×{inp} | {rows} | {ms['conversion']:.3f} | {ms['lookup']:.3f} | {ms['shipped']:.3f} | "
                  f"{ms['conversion'] / ms['lookup']:.2f}× | {ms['conversion'] / ms['shipped']:.2f}× |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
