"""How long loading a preset on its default weights takes with specviz's own GGUF tensor table
(specviz.models.gguf_tensors) against gguf's GGUFReader, which builds every metadata value first: loads alternating
in one process, after one warm-up load, medians printed.

    .venv/bin/python experiments/gguf_load_ab.py [--model smollm2-135m] [--rounds 3]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file from anywhere: find specviz

import gguf  # noqa: E402

from specviz import models  # noqa: E402
from specviz.models import gguf_tensors  # noqa: E402


def main(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    readers = {"gguf_tensors": gguf_tensors.tensors, "GGUFReader": lambda path: gguf.GGUFReader(path).tensors}
    models.load(args.model, weights="auto")  # warm-up: the files in the page cache, the C++ ops built
    seconds: dict[str, list[float]] = {name: [] for name in readers}
    for _ in range(args.rounds):
        for name, read in readers.items():
            gguf_tensors.tensors = read  # what specviz.models.quantized reads the table with
            started = time.perf_counter()
            models.load(args.model, weights="auto")
            seconds[name].append(time.perf_counter() - started)
    for name, values in seconds.items():
        print(f"{args.model} loaded with {name:12s} median {statistics.median(values):.2f} s  "
              f"({', '.join(f'{v:.2f}' for v in values)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
