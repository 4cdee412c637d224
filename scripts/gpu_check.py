"""The benchmark's GPU check: one GPU, no network, well under 10 minutes; writes one JSON document.

    python scripts/gpu_check.py --out gpu_check.json          # on the GPU machine (cuda, bf16)
    python scripts/gpu_check.py --device cpu --quick          # anywhere: the same steps, made small

1. The embedded model (smollm2-135m): the verify-cost curve (chain and tree) and a short `bench` (every available
   drafter, the transformers peers). A machine without network may lack the fetched weights: then both run on a
   randomly initialised model of the same shape with a byte-level tokenizer, and the JSON says so (speeds per step
   hold; acceptance and τ of random weights mean nothing).
   Then its batch surface (specviz.bench.batch): one forward over B sequences × n new tokens each, B 1-32,
   n 1-8, 256 cached tokens per sequence (with --quick: B 1-2, n 1-2, 32 cached tokens).
2. A randomly initialised model of SmolLM2-1.7B's shape, built directly on the device in the run's dtype: its
   verify-cost curve and weight-streaming floor (a forward pass's speed does not depend on the weight values).
   With --quick it keeps that per-layer shape but has 2 layers, so that a CPU can run it.

3. With --vllm: vLLM on the same GPU (`make vllm` installs vllm==0.32.0 where nvidia-smi is found, into
   .venv-vllm; the GPU machine has no network, so that venv must already be there): the exported target
   (specviz.train.export_vllm) served plain and with our EAGLE-3 head as a chain of depth 3, each given a greedy run
   through specviz's vLLM backend and compared token for token with specviz's `none` (fp32 in both), then the
   load table (scripts/load_table.py: 1, 4, 16 clients, both vLLM servers beside a `specviz serve`). Without the
   venv or the fetched model this part says why in the JSON and the rest still runs.

When CUDA is asked for and absent, it says so, writes {"skipped": reason} and exits 0.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file from anywhere: find specviz

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from specviz import bench, models  # noqa: E402
from specviz.atomic import write_atomically  # noqa: E402
from specviz.bench import batch, probes, servers  # noqa: E402
from specviz.bench.cli import report_mismatches  # noqa: E402
from specviz.decoding import costs  # noqa: E402
from specviz.errors import SpecvizError  # noqa: E402

EMBEDDED = "smollm2-135m"
# config.json of the fetched SmolLM2-135M-Instruct, for the random stand-in
SMOLLM2_135M_SHAPE = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                          intermediate_size=1536, vocab_size=49152, max_position_embeddings=8192,
                          tie_word_embeddings=True, rope_theta=100000.0, bos_token_id=1, eos_token_id=2, pad_token_id=2)
# SmolLM2-1.7B's published shape
SMOLLM2_1_7B_SHAPE = dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=32,
                          intermediate_size=8192, vocab_size=49152, max_position_embeddings=8192,
                          tie_word_embeddings=True, rope_theta=130000.0, bos_token_id=1, eos_token_id=2, pad_token_id=2)
QUICK_LAYERS = 2


class ByteTokenizer:
    """UTF-8 bytes as token ids 3..258 (0-2 are unk, bos, eos as in SmolLM2): enough to drive a random model."""

    chat_template = None
    eos_token_id = 2
    pad_token_id = 2

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [b + 3 for b in text.encode("utf-8")]}

    def decode(self, ids, skip_special_tokens=False):
        return bytes(i - 3 for i in ids if 3 <= i < 259).decode("utf-8", errors="replace")

    def get_vocab(self):
        return {f"<{i}>": i for i in range(259)}


def random_model(shape: dict, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    """A LlamaForCausalLM of this shape, initialised directly on the device in dtype (never on the CPU first)."""
    config = LlamaConfig(**shape)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval().requires_grad_(False)
    return model


def embedded_models(device: torch.device, dtype: torch.dtype, quick: bool) -> tuple[models.LoadedModels, str]:
    """The fetched embedded model, or a random stand-in of its shape where the cache lacks it."""
    if models.is_fetched(EMBEDDED):
        return models.load(EMBEDDED, device=device, dtype=dtype), "fetched weights"
    shape = dict(SMOLLM2_135M_SHAPE, num_hidden_layers=QUICK_LAYERS) if quick else SMOLLM2_135M_SHAPE
    note = (f"{EMBEDDED} is not in the cache ({models.model_dir(EMBEDDED)}) and there is no network: a randomly "
            "initialised model of its shape stands in, with a byte-level tokenizer; speeds hold, acceptance does not")
    print(f"gpu_check: {note}", file=sys.stderr)
    model = random_model(shape, device, dtype)
    return models.LoadedModels(EMBEDDED + " (random stand-in)", model, None, ByteTokenizer(), device, dtype), note


def large_model_check(shape: dict, device: torch.device, dtype: torch.dtype, sizes, context_len: int, repeats: int,
                      bandwidth: float) -> dict:
    """Verify-cost curves and the weight-streaming floor of a random model of `shape`."""
    started = time.perf_counter()
    model = random_model(shape, device, dtype)
    built_s = time.perf_counter() - started
    curves = costs.verify_costs(model, sizes, context_len, repeats, branching=4)
    context_len = costs.fitting_context(model, sizes, context_len)
    weight_bytes = probes.streamed_weight_bytes(model)
    parameters = sum(p.numel() for p in model.parameters())
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    floor_ms = 1e3 * weight_bytes / (bandwidth * 1e9)
    return {
        "shape": shape,
        "parameters": parameters,
        "build_s": built_s,
        "context_len": context_len,
        "verify_cost_ms": curves["chain"],
        "tree_verify_cost_ms": curves["tree"],
        "weight_bytes": weight_bytes,
        "floor_ms_per_token": floor_ms,
        "forward_1_ms": curves["chain"].get("1"),
    }


def run_checks(embedded: models.LoadedModels, large_shape: dict, settings: bench.BenchSettings, limit: int,
               note: str = "fetched weights", surface: batch.SurfaceSettings | None = None) -> dict:
    """Both parts on already-built models (the tests pass tiny ones); returns the JSON document. `surface`: the
    embedded model's batch surface is measured with these settings (None: not measured)."""
    device = embedded.target.device
    dtype = next(embedded.target.parameters()).dtype
    timings = {}
    started = time.perf_counter()
    prompts = bench.load_prompts(limit=limit)
    report = bench.run_bench(embedded, prompts, settings, command=f"scripts/gpu_check.py (bench, {limit} prompts)",
                             progress=lambda done, total, label: print(f"[{done}/{total}] {label}", file=sys.stderr, flush=True))
    timings["embedded_bench_s"] = time.perf_counter() - started  # its verify-cost curves included
    report_mismatches(report)
    batch_surface = None
    if surface is not None:
        started = time.perf_counter()
        batch_surface = batch.measure_surface(embedded.target, surface, embedded.name, "scripts/gpu_check.py (batch surface)")
        timings["batch_surface_s"] = time.perf_counter() - started
        print("gpu_check: batch surface done", file=sys.stderr, flush=True)

    started = time.perf_counter()
    bandwidth = report["machine"]["bandwidth_gb_s"]
    large = large_model_check(large_shape, device, dtype, settings.verify_sizes, settings.context_len, settings.cost_repeats,
                              bandwidth)
    timings["large_model_s"] = time.perf_counter() - started
    print("gpu_check: large model's verify-cost curve done", file=sys.stderr, flush=True)
    return {
        "machine": report["machine"],
        "embedded": {"model": embedded.name, "weights": note, "verify_cost_ms": report["verify_cost_ms"],
                     "tree_verify_cost_ms": report["tree_verify_cost_ms"], "bench": report,
                     "batch_surface": batch_surface},
        "large": large,
        "timings_s": timings,
    }


def vllm_checks(device: torch.device, work: Path, rounds: int, max_new_tokens: int) -> dict:
    """Part 3: vLLM plain and with our EAGLE-3 head on this device, against specviz's greedy `none` and in the
    load table; {"skipped": why} where vLLM's venv or the fetched embedded model is missing."""
    from specviz import api
    from specviz.backends import Run, open_backend
    from specviz.decoding.prompt import encode_prompt
    from specviz.train.export_vllm import export_all

    if not servers.VLLM_PYTHON.exists():
        return {"skipped": f"vLLM is not installed at {servers.VLLM_PYTHON.parent.parent} (`make vllm`, with network)"}
    if not models.is_fetched(EMBEDDED):
        return {"skipped": f"{EMBEDDED} is not in the cache: there is no target to export to vLLM"}
    folders = export_all(work / "export")
    # both servers on one GPU beside specviz serve: each takes a share of its memory, not vLLM's default 0.9
    extra = ("--gpu-memory-utilization", "0.3") if device.type == "cuda" else ()
    eagle3 = {"method": "eagle3", "model": str(folders["eagle3"]), "num_speculative_tokens": 3}
    fp32 = models.load(EMBEDDED, device=device, dtype=torch.float32, weights="fp32")  # as vLLM is given it
    prompt = bench.load_prompts(limit=1)[0].text
    ours = api.generate(prompt, models=fp32, drafter="none", max_new_tokens=max_new_tokens, temperature=0.0)
    result = {"prompt": prompt, "max_new_tokens": max_new_tokens, "none_token_ids": list(ours.token_ids)}
    with servers.start_vllm(folders["target"], log=work / "vllm-plain.log", extra=extra) as plain, \
            servers.start_vllm(folders["target"], eagle3, log=work / "vllm-eagle3.log", extra=extra) as head:
        for name, server in (("plain", plain), ("eagle3", head)):
            backend = open_backend(f"vllm+{server.url}")
            events = list(backend.stream(Run.of(prompt, max_new_tokens=max_new_tokens, temperature=0.0)))
            done = events[-1]
            result[name] = {"startup_s": server.startup_s, "same_prompt": events[0].prompt_token_ids
                            == encode_prompt(fp32.tokenizer, prompt),
                            "same_as_none": list(done.token_ids) == list(ours.token_ids), "stats": done.stats}
            print(f"gpu_check: vLLM {name}: output = specviz none: {result[name]['same_as_none']}, "
                  f"{done.stats['tokens_per_s']:.1f} tokens/s", file=sys.stderr, flush=True)
        del fp32
        table = load_table_module()
        out = work / "load-table.json"
        code = table.main(["--rounds", str(rounds), "--max-new-tokens", str(max_new_tokens), "--vllm-plain", plain.url,
                           "--vllm-eagle3", head.url, "--logs", str(work), "--json-out", str(out)])
        result["load_table"] = json.loads(out.read_text()) if code == 0 else {"failed": f"exit status {code}"}
    return result


def load_table_module():
    spec = importlib.util.spec_from_file_location("load_table", Path(__file__).resolve().parent / "load_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Verify-cost curves and a short bench on one GPU; writes JSON.")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--quick", action="store_true", help="few sizes and prompts, a 2-layer large model: a CPU smoke run")
    p.add_argument("--limit", type=int, default=None, help="prompts in the short bench (default 6, quick 2)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 64, quick 16")
    p.add_argument("--vllm", action="store_true", help="also vLLM plain and with our EAGLE-3 head, and the load table "
                   "(needs .venv-vllm from `make vllm`)")
    p.add_argument("--work", default="runs/gpu-check", help="the vLLM export, server logs and load table go here")
    p.add_argument("--out", default="gpu_check.json")
    return p


def skip(out: str, reason: str) -> int:
    print(f"gpu_check: skipped: {reason}", file=sys.stderr)
    write_atomically(out, json.dumps({"skipped": reason}, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return skip(args.out, f"no CUDA GPU is visible to this torch ({torch.__version__}); "
                              "run with --device cpu --quick to exercise the script on a CPU")
    try:
        device = models.resolve_device(args.device)
        dtype = models.as_dtype(args.dtype) if args.dtype else models.default_dtype(device)
        quick = args.quick
        settings = replace(
            bench.quick_settings() if quick else bench.BenchSettings(),
            max_new_tokens=args.max_new_tokens or (16 if quick else 64),
            bandwidth_mb=1024 if device.type == "cuda" else 256,  # a GPU copies 256 MB in well under a millisecond
            bandwidth_repeats=10 if device.type == "cuda" else 3,
        )
        started = time.perf_counter()
        embedded, note = embedded_models(device, dtype, quick)
        large_shape = dict(SMOLLM2_1_7B_SHAPE, num_hidden_layers=QUICK_LAYERS) if quick else SMOLLM2_1_7B_SHAPE
        surface = replace(batch.quick_surface_settings() if quick else batch.SurfaceSettings(),
                          bandwidth_mb=settings.bandwidth_mb, bandwidth_repeats=settings.bandwidth_repeats)
        result = run_checks(embedded, large_shape, settings, args.limit or (2 if quick else 6), note, surface)
        if args.vllm:
            vllm_started = time.perf_counter()
            try:
                result["vllm"] = vllm_checks(device, Path(args.work), 1 if quick else 2, settings.max_new_tokens)
            except SpecvizError as err:  # a vLLM that fails to start or dies: said in the JSON, the rest kept
                result["vllm"] = {"failed": str(err)}
            result["timings_s"]["vllm_s"] = time.perf_counter() - vllm_started
        result["timings_s"]["total_s"] = time.perf_counter() - started
        result["quick"] = quick
    except SpecvizError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    write_atomically(args.out, json.dumps(result, indent=1) + "\n")
    print(f"gpu_check: wrote {args.out} in {result['timings_s']['total_s']:.0f} s", file=sys.stderr)
    print(bench.to_markdown(result["embedded"]["bench"]))
    print(batch.to_markdown(result["embedded"]["batch_surface"]))
    large = result["large"]
    print(f"Random SmolLM2-1.7B shape ({large['parameters'] / 1e9:.2f} B parameters, {large['shape']['num_hidden_layers']} layers): "
          f"verify cost ms {large['verify_cost_ms']}, tree {large['tree_verify_cost_ms']}; "
          f"floor {large['floor_ms_per_token']:.2f} ms per token")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
