"""How the 4-bit product's cost grows with the rows it multiplies: torch.ops.specviz.q4_linear over 1–64 rows for
SmolLM2-135M's projection shapes (fused q/k/v, o, fused gate/up, down), beside oneDNN's packed fp32 product
(specviz.kernels.fastlinear) on the same weights dequantized. Many copies of each weight (about 100 MB of 4-bit
codes) are multiplied in turn, so none sits in a cache. Prints ms per product (median), the multiply-adds per
second, and each row count's cost relative to one row.

    .venv/bin/python experiments/q4_rows.py [--rows 1,2,4,8,16,64] [--path auto]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling experiment's timer
from product_bandwidth import median_s  # noqa: E402

from specviz.kernels import fastlinear, quant  # noqa: E402

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}


@torch.inference_mode()
def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,4,8,16,64")
    ap.add_argument("--path", default="auto", choices=tuple(quant.PATHS))
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    if not quant.available():
        print("specviz's C++ ops are not built here")
        return 1
    rows_list = [int(r) for r in args.rows.split(",")]
    generator = torch.Generator().manual_seed(0)
    print(f"torch threads {torch.get_num_threads()}, path {args.path} "
          f"(runs {torch.ops.specviz.q4_path(quant.PATHS[args.path])})")
    print("| shape | rows | q4 ms | q4 GFMA/s | q4 vs 1 row | fp32 packed ms | fp32 vs 1 row |")
    print("|---|---|---|---|---|---|---|")
    for name, (out, inp) in SHAPES.items():
        copies = max(1, (100 << 20) // (out * inp // 2))
        weights = []
        for _ in range(copies):
            codes = torch.randint(0, 256, (out, inp // 2), generator=generator, dtype=torch.uint8)
            scales = (torch.rand(out, inp // 32, generator=generator) * 0.01).half().float()
            mins = (-torch.rand(out, inp // 32, generator=generator) * 0.08).half().float()
            weights.append((codes, scales, mins))
        packed = [fastlinear.PackedLinear(torch.nn.Linear(inp, out, bias=False)) for _ in range(max(1, copies // 8))]
        base_q4 = base_fp32 = None
        for rows in rows_list:
            x = torch.randn(rows, inp, generator=generator)

            def q4(x=x, weights=weights):
                for codes, scales, mins in weights:
                    quant.q4_product(x, codes, scales, mins, path=args.path)

            def fp32(x=x, packed=packed):
                for layer in packed:
                    layer(x)

            q4_ms = median_s(q4, args.repeats) / copies * 1e3
            fp32_ms = median_s(fp32, args.repeats) / len(packed) * 1e3
            base_q4, base_fp32 = base_q4 or q4_ms, base_fp32 or fp32_ms
            gfma = rows * out * inp / (q4_ms * 1e-3) / 1e9
            print(f"| {name} {out}×{inp} | {rows} | {q4_ms:.3f} | {gfma:.1f} | {q4_ms / base_q4:.2f} | "
                  f"{fp32_ms:.3f} | {fp32_ms / base_fp32:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
