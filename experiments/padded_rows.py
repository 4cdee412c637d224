"""fastlinear.MIN_ROWS on the machine at hand: one target forward (the engine's, with its LM head) over 1, 2 and 4
new tokens after 256 cached, with products of fewer rows padded to 4 rows or not, interleaved round by round.

.venv/bin/python experiments/padded_rows.py [--rounds 30]
"""
import argparse
import statistics
import time

import torch

from specviz import models
from specviz.kernels import fastdecoder, fastlinear


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    loaded = models.load(args.model)
    decoder, head = fastdecoder.for_model(loaded.target), loaded.target.get_output_embeddings()
    cache = decoder.new_cache()
    decoder(torch.randint(0, 1000, (256,)), cache)

    def forward_ms(tokens: int) -> float:
        length = cache.length
        started = time.perf_counter()
        head(decoder(torch.randint(0, 1000, (tokens,)), cache))
        cache.crop(length)
        return (time.perf_counter() - started) * 1e3

    default, times = fastlinear.MIN_ROWS, {}
    for _ in range(args.rounds + 1):  # round 0 warms up
        for min_rows in (1, default):
            fastlinear.MIN_ROWS = min_rows
            for tokens in (1, 2, 4):
                times.setdefault((min_rows, tokens), []).append(forward_ms(tokens))
    fastlinear.MIN_ROWS = default
    print("median ms of one forward (LM head included), rows padded to at least MIN_ROWS:")
    for (min_rows, tokens), ms in times.items():
        print(f"  MIN_ROWS={min_rows}  {tokens} token(s): {statistics.median(ms[1:]):.2f}")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
