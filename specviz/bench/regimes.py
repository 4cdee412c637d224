"""The bench on several weight sets at once (`specviz bench --weights q4q8,fp32`): the target loaded on each set in
this process, every drafter on each set in one interleaved run, speedups within each weight set (over its own
`none`) and across them (over the first set's `none`), and each set's verify-cost curve with the regime it puts
the set in.

The premise of speculative decoding is that one target forward over a few tokens costs about what a forward over
one costs (memory-bound: decoding streams every weight once per forward). c(8) ÷ c(1), the cost of verifying 8
tokens over the cost of one, says whether that holds on a weight set here.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
from dataclasses import replace

from specviz.bench.probes import BandwidthProbe, cpu_name, machine_info
from specviz.bench.run import ProgressCallback, chosen_drafters, method_order, run_drafter
from specviz.bench.runs import (
    MethodRuns,
    acceptance,
    fmt,
    matched,
    mismatches,
    ratios,
    speed,
    spread,
    summary,
    table,
)
from specviz.decoding.costs import interpolate, verify_costs
from specviz.decoding.prompt import encode_prompt
from specviz.drafters import PLAIN, make_drafter
from specviz.errors import SpecvizError
from specviz.models.quantized import CHOICES, WEIGHT_WORDS

RATIO_N = 8  # c(8) ÷ c(1): the verify cost every lane and page shows
MEMORY_BOUND_BELOW = 1.5  # c(8) ÷ c(1) under this: verifying 8 tokens costs about one forward
SEPARATOR = "@"  # a method on a named weight set: eagle2@fp32


def cost_ratio(curve: dict, n: int = RATIO_N) -> float:
    """c(n) ÷ c(1) of a verify-cost curve ({tokens: cost}; linear between measured sizes)."""
    cost = interpolate({int(k): float(v) for k, v in curve.items()})
    return cost(n) / cost(1)


def regime(ratio: float) -> str:
    return "memory-bound" if ratio < MEMORY_BOUND_BELOW else "compute-bound"


def weight_sets_arg(value: str) -> str:
    """--weights as the bench takes it: one choice, or several comma-separated (q4q8,fp32)."""
    words = [w.strip() for w in value.split(",") if w.strip()]
    if not words or any(w not in CHOICES for w in words) or ("auto" in words and len(words) > 1):
        raise argparse.ArgumentTypeError(f"{value!r}: one of {', '.join(CHOICES)}, or several weight sets "
                                         "comma-separated, e.g. q4q8,fp32")
    return ",".join(words)


def allow_weight_sets(parser: argparse.ArgumentParser) -> None:
    """Let the parser's --weights take several sets (weight_sets_arg)."""
    action = next(a for a in parser._actions if a.dest == "weights")
    action.choices, action.type = None, weight_sets_arg
    action.help = (action.help or "") + "; the bench also takes several, e.g. q4q8,fp32 (every drafter on each)"


def run_regimes(loaded: dict, prompts: list, settings, progress: ProgressCallback | None = None,
                command: str = "") -> dict:
    """Every drafter on every weight set of `loaded` ({weights: specviz.models.LoadedModels}, one model), on every
    prompt, interleaved: per prompt the (weights, drafter) methods in an order rotated per prompt and repeat, after a
    warm-up of each; then each set's verify-cost curve. Returns the report (JSON-ready)."""
    sets = list(loaded)
    first = loaded[sets[0]]
    drafters = chosen_drafters(first, settings.drafters, settings.k_policies)
    for models in loaded.values():
        chosen_drafters(models, settings.drafters)  # every set offers them
        for name in drafters:
            make_drafter(name, models, k=settings.k)  # fail before measuring anything
    methods = [(w, d) for w in sets for d in drafters]
    encoded = [encode_prompt(first.tokenizer, p.text) for p in prompts]  # the sets share one tokenizer
    total = len(methods) * (1 + len(prompts) * settings.repeats) + len(sets)
    counted = itertools.count(1)

    def tick(label: str) -> None:
        n = next(counted)
        if progress is not None:
            progress(n, total, label)

    short = replace(settings, max_new_tokens=min(16, settings.max_new_tokens))
    for w, d in methods:
        run_drafter(loaded[w], d, prompts[0], encoded[0], short)
        tick(f"warm-up {d}{SEPARATOR}{w}")
    probe = BandwidthProbe(first.target.device, settings.bandwidth_mb, settings.bandwidth_repeats)
    bandwidth, runs = [], []
    for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
        for r in range(settings.repeats):
            for w, d in method_order(methods, i * settings.repeats + r):
                if d == PLAIN:
                    bandwidth.append(probe.measure())
                run = run_drafter(loaded[w], d, prompt, ids, settings, r)
                runs.append(replace(run, method=f"{d}{SEPARATOR}{w}"))
                tick(f"{prompt.id} · {d}{SEPARATOR}{w}")
    del probe
    sizes = sorted({1, RATIO_N, *settings.verify_sizes})
    curves = {}
    for w in sets:
        curves[w] = verify_costs(loaded[w].target, sizes, settings.context_len, settings.cost_repeats,
                                 settings.tree_branching)
        tick(f"verify cost {w}")
    return build(loaded, prompts, settings, drafters, runs, curves, bandwidth, command)


def build(loaded: dict, prompts: list, settings, drafters: list[str], runs: list, curves: dict,
          bandwidth: list[float], command: str) -> dict:
    sets = list(loaded)
    grouped = {name: MethodRuns([r for r in runs if r.method == name]) for name in dict.fromkeys(r.method for r in runs)}
    greedy = settings.temperature == 0
    across = f"{PLAIN}{SEPARATOR}{sets[0]}"
    methods = {}
    for name, method in grouped.items():
        drafter, _, weights = name.partition(SEPARATOR)
        own = grouped[f"{PLAIN}{SEPARATOR}{weights}"]
        found = mismatches(method, own) if greedy else []
        methods[name] = {"drafter": drafter, "weights": weights, **speed(method),
                         "tau": acceptance(method)["tau"],
                         "speedup_vs_none_same_weights": summary(ratios(method, own)),
                         "speedup_vs_first_none": summary(ratios(method, grouped[across])),
                         "outputs_match_none": (not found) if greedy else None, "mismatches": found}
    weight_sets = {}
    for w in sets:
        tree = curves[w]["tree"] or curves[w]["chain"]
        ratio = cost_ratio(tree)
        weight_sets[w] = {"words": WEIGHT_WORDS[w], "verify_cost_ms": curves[w], "c8_over_c1": ratio,
                          "regime": regime(ratio)}
    models = loaded[sets[0]]
    return {
        "kind": "specviz-regimes", "command": command, "model": models.name, "weights": sets,
        "first_none": across, "machine": machine_info(models.device, models.dtype,
                                                      statistics.median(bandwidth) if bandwidth else 0.0),
        "settings": {"max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature,
                     "k": settings.k, "repeats": settings.repeats, "prompts": [p.id for p in prompts]},
        "weight_sets": weight_sets, "drafters": drafters, "methods": methods,
        "outputs_match_none": all(m["outputs_match_none"] is not False for m in methods.values()),
    }


def to_markdown(report: dict) -> str:
    machine = report["machine"]
    lines = [f"# specviz bench on {len(report['weights'])} weight sets: {report['model']}", "",
             f"`{report['command']}`", "",
             f"{cpu_name() if not machine.get('cpu') else machine['cpu']}, {machine['cores']} cores, torch threads "
             f"{machine['torch_threads']}, bandwidth {machine['bandwidth_gb_s']:.1f} GB/s (copy, median), "
             f"{machine['date']}. {len(report['settings']['prompts'])} prompts, "
             f"{report['settings']['max_new_tokens']} new tokens, T {report['settings']['temperature']:g}; every "
             "drafter on each weight set in one interleaved run.", "", "## The regime of each weight set", ""]
    lines += table(["weights", "c(1) ms", f"c({RATIO_N}) ms", f"c({RATIO_N})/c(1)", "regime"], [
        [f"{w} ({s['words']})", fmt(_at(s, 1)), fmt(_at(s, RATIO_N)), fmt(s["c8_over_c1"]), s["regime"]]
        for w, s in report["weight_sets"].items()])
    lines += ["", "c(n): one tree-shaped verify forward over n tokens (median ms). Memory-bound (c(8)/c(1) near 1): "
              "verifying several tokens costs about one forward, so almost any acceptance pays for the verify; "
              "compute-bound: it costs several, so a drafter pays only where its steps commit more than c(8)/c(1) "
              "tokens, and shorter drafts cost less to verify.", "", "## Every method", ""]
    lines += table(["method", "weights", "τ", "tokens/s", "speedup vs none (same weights)",
                    f"speedup vs {report['first_none']}", "output = none (same weights)"], [
        [f"`{name}`", m["weights"], fmt(m["tau"]), fmt(m["tokens_per_s"], ".1f"),
         spread(m["speedup_vs_none_same_weights"]), spread(m["speedup_vs_first_none"]), matched(m["outputs_match_none"])]
        for name, m in report["methods"].items()])
    lines += ["", "Speedups: per prompt, median (min–max)."]
    return "\n".join(lines) + "\n"


def _at(weight_set: dict, n: int) -> float | None:
    tree = weight_set["verify_cost_ms"]["tree"] or weight_set["verify_cost_ms"]["chain"]
    return tree.get(str(n))


def main(args, settings, prompts, command: str, progress: ProgressCallback | None) -> dict:
    """The bench's command line on several weight sets (args.weights: q4q8,fp32)."""
    from specviz.models.loading import load_weight_sets

    sets = args.weights.split(",")
    if settings.vllm or settings.llama_server:
        raise SpecvizError("--weights with several sets runs our engine's drafters only: leave out --vllm and "
                           "--llama-server")
    loaded = load_weight_sets(args.model, sets, draft_model=args.draft_model, device=args.device, dtype=args.dtype)
    return run_regimes(loaded, prompts, settings, progress, command)
