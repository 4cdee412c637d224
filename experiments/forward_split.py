"""Where a target forward's time goes on the default weights (`q4q8`), over 1 and over several new tokens.

1. the forward over n = 1 .. 64 new tokens after 256 cached, back to back with one model loaded (as decoding runs
   it), each n's median over 30 calls after 5 warm-up ones, the lower of two rounds; and n tokens over 1; with
   --paths auto,avx512 on each path in turn (on a CPU with AMX tiles: with and without them);
2. the 30 decoder layers as one C++ call each (`q4_layer`), in turn as a forward runs them (their weights come from
   the last-level cache or memory), against one layer's call 30 times (its weights stay in L2), over 1 and 8 rows;
3. one layer's parts over 1 and 8 rows, the layer's weights in L2: its RMSNorm, the fused q/k/v product, the
   attention op, o, gate/up, silu(gate) · up, down; and the LM head (576 → 49,152, Q8_0 tiles).

    .venv/bin/python experiments/forward_split.py [--threads 2] [--context-len 256] [--paths auto,avx512] [--curve-only]
        [--random]

--random times a model of SmolLM2-135M's shape with random weights instead of the fetched one (its projections
rounded to Q4_1, a random Q8_0 head, all on 8-bit activations: the products' speed does not depend on the values),
so the curve can be measured on a machine the model files cannot reach, e.g. a host with AMX and no network access:
    python3 experiments/forward_split.py --random --paths auto,avx512 --curve-only
"""
import argparse
import contextlib
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file from anywhere: find specviz

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from specviz import models  # noqa: E402
from specviz.decoding.target import Target  # noqa: E402
from specviz.kernels import products  # noqa: E402
from specviz.kernels.kvcache import crop_cache  # noqa: E402


def median_ms(call, calls: int = 30, warm: int = 5) -> float:
    times = []
    for i in range(warm + calls):
        started = time.perf_counter()
        call()
        if i >= warm:
            times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 24, 32, 64)


def forward_curve(target: Target, cache, context_len: int, paths: list[str]) -> list[str]:
    """Each n's forward on each path (products.products_on; "auto" as the engine runs it), the paths alternating
    at each n so a slow spell of the host touches them alike."""
    best: dict[tuple[str, int], float] = {}
    for _ in range(2):
        for n in SIZES:
            ids = list(range(500, 500 + n))

            def call(ids=ids):
                target.forward(ids, cache)
                crop_cache(cache, context_len)

            for path in paths:
                with products.products_on(path) if path != "auto" else contextlib.nullcontext():
                    best[path, n] = min(best.get((path, n), float("inf")), median_ms(call))
    head = " | ".join(f"{path}: forward (ms) | {path}: over 1 token" for path in paths)
    lines = [f"| new tokens (after {context_len} cached) | {head} |", "|---" * (1 + 2 * len(paths)) + "|"]
    for n in SIZES:
        cells = " | ".join(f"{best[path, n]:.2f} | {best[path, n] / best[path, 1]:.2f}×" for path in paths)
        lines.append(f"| {n} | {cells} |")
    return lines


def layer_parts(target: Target, cache, context_len: int, T: int) -> dict[str, float]:
    """ms of each part over T rows (see the top)."""
    ops, stack = torch.ops.specviz, target.fast.stack
    layer = stack.layers[0]
    norm, _post, eps, qkv, _bias, o, gate_up, down = layer.blocks
    intermediate = stack.intermediate
    x = torch.randn(T, target.model.config.hidden_size, generator=torch.Generator().manual_seed(T))
    cos, sin, _mask, _attend, _one_op = stack.prepare(x, cache, None, None)
    keys, values = cache.keys[0], cache.values[0]
    normed = ops.rms_norm(x, norm, eps)
    fused = ops.q4_linear(normed, *qkv, None)
    attended = ops.attend(fused, cos, sin, keys, values, context_len, None, layer.scaling, stack.heads, stack.kv_heads)
    both = ops.q4_linear(normed, *gate_up, None)
    act = (F.silu(both[:, :intermediate]) * both[:, intermediate:]).contiguous()

    def one_layer(number):
        spec = stack.layers[number]
        return ops.q4_layer(x, *spec.blocks, cos, sin, cache.keys[number], cache.values[number], context_len, None,
                            spec.scaling, stack.heads, stack.kv_heads)

    parts = {
        "30 layers in turn (weights from the last-level cache)": lambda: [one_layer(n) for n in range(len(stack.layers))],
        "one layer 30 times (weights in L2)": lambda: [one_layer(0) for _ in range(len(stack.layers))],
        "one layer": lambda: one_layer(0),
        "  RMSNorm": lambda: ops.rms_norm(x, norm, eps),
        "  q/k/v product (576 → 960)": lambda: ops.q4_linear(normed, *qkv, None),
        "  attention op": lambda: ops.attend(fused, cos, sin, keys, values, context_len, None, layer.scaling,
                                             stack.heads, stack.kv_heads),
        "  o product (576 → 576)": lambda: ops.q4_linear(attended, *o, None),
        "  gate/up product (576 → 3072)": lambda: ops.q4_linear(normed, *gate_up, None),
        "  silu(gate) · up": lambda: F.silu(both[:, :intermediate]) * both[:, intermediate:],
        "  down product (1536 → 576)": lambda: ops.q4_linear(act, *down, None),
        "LM head (576 → 49,152)": lambda: target.head(x),
    }
    return {name: median_ms(call) for name, call in parts.items()}


def layer_split(target: Target, cache, context_len: int) -> list[str]:
    one, eight = (layer_parts(target, cache, context_len, T) for T in (1, 8))
    lines = ["| part | 1 row (ms) | 8 rows (ms) | 8 over 1 |", "|---|---|---|---|"]
    lines += [f"| {name} | {one[name]:.3f} | {eight[name]:.3f} | {eight[name] / one[name]:.2f}× |" for name in one]
    return lines


def random_target():
    """A Llama of SmolLM2-135M's shape, random weights, on the default path's blocks (see --random above)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specviz.kernels import blocks, fastdecoder, quant
    from specviz.models import quantized

    config = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5,
                         rope_theta=100000.0, tie_word_embeddings=True)
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval().requires_grad_(False)
    quant.quantize_linears(model.model.layers, "q8")
    codes = torch.randint(-128, 128, (config.vocab_size, config.hidden_size), generator=generator, dtype=torch.int8)
    scales = (torch.rand(config.vocab_size, config.hidden_size // 32, generator=generator) * 0.01).half().float()
    with torch.no_grad():
        model.lm_head.weight.copy_(blocks.dequantize_q8(codes, scales))
    assert quantized.attach_q8_head(model, (codes, scales), activations="q8")
    assert fastdecoder.for_model(model) is not None
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context-len", type=int, default=256)
    ap.add_argument("--paths", default="auto", help="the products' paths to compare, e.g. auto,avx512 on a CPU "
                    "with AMX tiles (auto takes them; avx512 holds the products to VNNI)")
    ap.add_argument("--curve-only", action="store_true", help="skip the layer split")
    ap.add_argument("--random", action="store_true", help="a model of the same shape with random weights (no fetch)")
    args = ap.parse_args()
    paths = args.paths.split(",")
    torch.set_num_threads(args.threads)
    target = Target(random_target() if args.random else models.load("smollm2-135m", weights="q4q8").target)
    cache = target.new_cache()
    target.forward(list(range(100, 100 + args.context_len)), cache, logits=False)
    print(f"smollm2-135m{' (its shape, random weights)' if args.random else ''}, weights q4q8, torch {torch.__version__}, {args.threads} threads, "
          f"{platform.processor() or platform.machine()}, AMX tiles {'on' if products.amx_tiles() else 'off'}\n")
    with torch.inference_mode():
        print("\n".join(forward_curve(target, cache, args.context_len, paths)) + "\n")
        if not args.curve_only:
            print("\n".join(layer_split(target, cache, args.context_len)))


if __name__ == "__main__":
    main()
