"""How fast the matrix products of one decoding step read their weights, per weight shape: fp32, 1 row (torch's
F.linear and torch.mv) against oneDNN's packed kernel (specviz.kernels.fastlinear) over 4 rows and over 1 row padded to
4. Many copies of each weight (about 200 MB in all) are multiplied in turn, so none of them sits in a cache:
GB/s = weight bytes read ÷ median time. Shapes: SmolLM2-135M's LM head, gate/up, down and q/o projections.

    .venv/bin/python experiments/product_bandwidth.py
"""
import statistics
import time

import torch
from torch.nn import functional as F

from specviz.kernels import fastlinear

SHAPES = ((49152, 576), (1536, 576), (576, 1536), (576, 576))


def median_s(run, repeats: int = 15) -> float:
    for _ in range(3):
        run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@torch.inference_mode()
def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; GB/s of weights read (median of 15)")
    print("out × in        copies  F.linear 1 row  torch.mv  packed 4 rows  packed 1 row (padded)")
    for out_features, in_features in SHAPES:
        copies = max(1, 200_000_000 // (out_features * in_features * 4))
        weights = [torch.randn(out_features, in_features) for _ in range(copies)]
        packed = [fastlinear.reorder(w) for w in weights]
        one, four, column = torch.randn(1, in_features), torch.randn(4, in_features), torch.randn(in_features)
        read = copies * out_features * in_features * 4 / 1e9
        rates = [read / median_s(run) for run in (
            lambda one=one, weights=weights: [F.linear(one, w) for w in weights],
            lambda column=column, weights=weights: [torch.mv(w, column) for w in weights],
            lambda four=four, packed=packed: [fastlinear.packed_product(four, p, None) for p in packed],
            lambda one=one, packed=packed: [fastlinear.packed_product(one, p, None) for p in packed],
        )]
        print(f"{out_features:5d} × {in_features:<5d}  {copies:6d}  " + "  ".join(f"{r:13.1f}" for r in rates))


if __name__ == "__main__":
    main()
