"""The benchmark: every drafter against `none`, and against what a user would run instead (transformers'
`generate()`), measured side by side in one run.

    specviz bench --limit 4 --max-new-tokens 64 --json-out bench.json --md-out bench.md

  - Decoding: every method runs on every prompt, interleaved (prompt by prompt, methods in turn, the order
    rotated per prompt so that machine drift cancels), after a warm-up. At temperature 0 every drafter's output
    must equal `none`'s token for token, up to floating-point near-ties (reported as numerics events,
    specviz/bench/numerics.py); any other mismatch is reported loudly and fails the run.
  - Peers: generate(), generate(assistant_model=draft) with the same K and a constant schedule, and
    generate(prompt_lookup_num_tokens=K), on the same model objects, prompts and token budget; llama.cpp where
    it is installed; running vLLM servers (`--vllm URL=label,...`), each with its own speculative method.
  - The verify-cost curve: one target forward over n new tokens after a KV cache of a realistic context, as a
    chain (causal) and as a tree (4D mask); with it, the speedup predicted from measured τ and costs.
  - The weight-streaming floor: bytes of target weights / memory bandwidth measured in the same run.

    prompts.py  the prompt sets            run.py     run_bench, BenchSettings     peers.py  transformers' generate()
    probes.py   bandwidth, machine info    report.py  aggregation, Markdown        schema.py the report's JSON schema
    runs.py     one decode, per-prompt     llamacpp.py  llama.cpp's peers          vllm.py   vLLM servers as lanes
                ratios, table cells        servers.py   start a vllm/specviz serve

`run_bench(models, prompts, settings)` returns one JSON-ready dict that validates against `BENCH_SCHEMA`;
`specviz bench` (specviz/cli.py) is its command line. docs/performance.md explains every field.
"""
from pathlib import Path

from specviz.bench.prompts import Prompt, load_prompts
from specviz.bench.report import (
           command_for,
           floor_sentence,
           none_against_bandwidth,
           per_prompt_speedups,
           to_markdown,
)
from specviz.bench.run import run_bench
from specviz.bench.schema import BENCH_SCHEMA, load_report, parse_report, validate
from specviz.bench.settings import QUICK_SIZES, BenchSettings, quick_settings

REFERENCE_REPORT = Path(__file__).parent / "data" / "reference-t0.json"  # the Benchmarks page's default report

__all__ = ["BENCH_SCHEMA", "QUICK_SIZES", "REFERENCE_REPORT", "BenchSettings", "Prompt", "command_for", "floor_sentence",
           "load_prompts", "load_report", "none_against_bandwidth", "parse_report", "per_prompt_speedups",
           "quick_settings", "run_bench", "to_markdown", "validate"]
