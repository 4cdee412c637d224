"""The bench's report: runs aggregated per method, ratios against `none` and the peers, the predicted speedup,
the weight-streaming floor, and the report as Markdown tables."""
from __future__ import annotations

import shlex
import statistics
from typing import TYPE_CHECKING

from specviz.analysis import predicted_speedup
from specviz.bench import numerics
from specviz.bench.llamaserver import LlamaServerLanes, llama_server_markdown, llama_server_report
from specviz.bench.probes import (
    draft_dtypes,
    machine_info,
    streamed_weight_bytes,
    target_forward,
)
from specviz.bench.runs import MethodRuns, acceptance, fmt, matched, mismatches, ratios, speed, spread, summary, table
from specviz.bench.vllm import VllmLanes, vllm_markdown, vllm_report
from specviz.decoding.costs import fitting_context, interpolate
from specviz.drafters.base import PLAIN
from specviz.kernels import fastlinear

if TYPE_CHECKING:
    from specviz.bench.settings import BenchSettings

SCHEMA_VERSION = 1
# ours vs theirs: the pairs a user chooses between
HEAD_TO_HEAD = ((PLAIN, "generate"), ("draft", "generate_assisted"), ("ngram", "generate_prompt_lookup"))


def drafter_report(method: MethodRuns, none: MethodRuns, greedy: bool) -> dict:
    firsts = method.firsts()
    all_steps = sum(r.steps for r in method.runs)
    counted = acceptance(method)
    steps, drafted = counted["steps"], counted["drafted"]
    wall = sum(r.wall_s for r in method.runs)
    found = mismatches(method, none) if greedy else []
    return {
        **speed(method),
        **counted,
        "draft_share": sum(r.draft_s for r in method.runs) / wall,
        "verify_share": sum(r.verify_s for r in method.runs) / wall,
        # over every repeat, as the wall time (median over repeats) is: the first repeat alone may be the slow one
        "draft_ms_per_step": 1e3 * sum(r.draft_s for r in method.runs) / all_steps if all_steps else 0.0,
        "verify_ms_per_step": 1e3 * sum(r.verify_s for r in method.runs) / all_steps if all_steps else 0.0,
        "inputs_per_step": 1 + drafted / steps if steps else 1.0,
        "tree": any(r.tree for r in firsts),
        "speedup_vs_none": summary(ratios(method, none)),
        "outputs_match_none": (not found) if greedy else None,
        "mismatches": found,
    }


def peer_report(method: MethodRuns, plain: MethodRuns, greedy: bool) -> dict:
    found = mismatches(method, plain) if greedy else []
    return {**speed(method), "speedup_vs_generate": summary(ratios(method, plain)),
            "outputs_match_generate": (not found) if greedy else None, "mismatches": found}


def prediction(drafter: dict, chain_curve: dict, tree_curve: dict) -> dict | None:
    """Speedup over `none` predicted from measured τ, draft cost and the verify-cost curve (analysis.predicted_speedup):
    τ / ((draft ms per step + c(inputs per step)) / c(1)), c the curve (the tree curve for tree drafters).
    None when the curves cannot say: c(1) not measured, or one size only where a step verifies more tokens."""
    curve = {int(n): ms for n, ms in (tree_curve if drafter["tree"] else chain_curve).items()}
    if "1" not in chain_curve or not curve or (len(curve) == 1 and drafter["inputs_per_step"] > min(curve)):
        return None
    one = chain_curve["1"]
    verify = interpolate(curve)(drafter["inputs_per_step"])
    step_ms = 1e3 * drafter["wall_s"] / drafter["steps"] if drafter["steps"] else 0.0
    measured = drafter["speedup_vs_none"]
    return {
        "tau": drafter["tau"],
        "inputs_per_step": drafter["inputs_per_step"],
        "draft_ms_per_step": drafter["draft_ms_per_step"],
        "verify_ms_per_step_curve": verify,
        "verify_ms_per_step_measured": drafter["verify_ms_per_step"],
        # prefill (spread over the steps), acceptance tests, events, cache surgery: what the model ignores
        "other_ms_per_step": step_ms - drafter["draft_ms_per_step"] - drafter["verify_ms_per_step"],
        "predicted": predicted_speedup(drafter["tau"], (drafter["draft_ms_per_step"] + verify) / one),
        "measured": measured["median"] if measured else None,
    }


def floor_report(weight_bytes: int, bandwidth: dict[str, list[float]], none: MethodRuns) -> dict:
    """The weight-streaming floor (weight bytes ÷ bandwidth) against `none`'s time per token. Each prompt's floor
    uses the bandwidth measured right before its `none` runs (median over repeats), so a tenant who slows the
    machine down for a while moves both sides of that prompt's ratio; the headline share is the median of the
    per-prompt shares, beside the one from the run's totals and the median bandwidth."""
    samples = [gb_s for per_prompt in bandwidth.values() for gb_s in per_prompt]
    median_bandwidth = statistics.median(samples)
    floor_ms = 1e3 * weight_bytes / (median_bandwidth * 1e9)
    none_ms = speed(none)["ms_per_token"]
    # the floor's seconds per token × `none`'s tokens per second = the share of the floor's tokens/s reached
    shares = [weight_bytes / (statistics.median(gb_s) * 1e9) * none.tokens_per_s(prompt) for prompt, gb_s in bandwidth.items()
              if none.first(prompt).token_ids]
    return {
        "weight_bytes": weight_bytes,
        "bandwidth_gb_s": median_bandwidth,
        "bandwidth_gb_s_range": [min(samples), max(samples)],
        "bandwidth_samples": len(samples),
        "bandwidth_by_prompt": bandwidth,
        "floor_ms_per_token": floor_ms,
        "floor_tokens_per_s": 1e3 / floor_ms,
        "none_ms_per_token": none_ms,
        "none_share_of_floor": statistics.median(shares) if shares else None,
        "none_share_of_floor_per_prompt": summary(shares),
        "none_share_of_floor_totals": floor_ms / none_ms if none_ms else None,
    }


def llama_cpp_report(info: dict, grouped: dict[str, MethodRuns], drafters: list[str], greedy: bool) -> dict:
    """llama.cpp's two peers: speeds; its lookup against its plain decoding (at T = 0 they part where llama.cpp's
    batched forward rounds differently from its one-token one); its plain output against our `none` (equal only up to
    the two programs' rounding); and every drafter of ours over each of them, per prompt."""
    plain, lookup = grouped.get("llama_cpp"), grouped.get("llama_cpp_lookup")
    if plain is None or lookup is None:
        return info
    none = grouped[PLAIN]
    apart = mismatches(plain, none) if greedy else []
    return {
        **info,
        "methods": {
            "llama_cpp": {**speed(plain), "outputs_equal_none": len(plain.by_prompt) - len(apart) if greedy else None,
                          "parted_from_none": apart},
            "llama_cpp_lookup": {**speed(lookup), "speedup_vs_plain": summary(ratios(lookup, plain)),
                                 "outputs_match_plain": (not (found := mismatches(lookup, plain))) if greedy else None,
                                 "mismatches": found if greedy else []},
        },
        "ours_over": {name: {peer: summary(ratios(grouped[name], grouped[peer])) for peer in ("llama_cpp", "llama_cpp_lookup")}
                      for name in drafters},
    }


def build_report(models, prompts, encoded, settings, drafters, peers, runs, chain_curve, tree_curve, bandwidth, command,
                 llama_cpp: dict | None = None, vllm_lanes: VllmLanes | None = None,
                 llama_servers: LlamaServerLanes | None = None) -> dict:
    """bandwidth: {prompt id: [GB/s measured before each of its `none` runs]}; llama_cpp: the llama.cpp peers'
    description (specviz.bench.llamacpp), their runs among `runs` when they ran; vllm_lanes: the vLLM servers
    that ran beside ours (specviz.bench.vllm), their runs among `runs`."""
    greedy = settings.sampling.greedy
    grouped = {m: MethodRuns([r for r in runs if r.method == m]) for m in dict.fromkeys([*drafters, *peers, *(r.method for r in runs)])}
    none = grouped[PLAIN]
    drafter_reports = {name: drafter_report(grouped[name], none, greedy) for name in drafters}
    dtype = next(models.target.parameters()).dtype
    if greedy:  # a difference at a floating-point near-tie is a numerics event, not a failed drafter
        ids = {p.id: list(e) for p, e in zip(prompts, encoded)}
        numerics.sort_out(drafter_reports, lambda prompt, index: numerics.logits_after(
            models.target, ids[prompt] + none.first(prompt).token_ids[:index], models.vocab_size), dtype)
    peer_reports = {name: peer_report(grouped[name], grouped["generate"], greedy) for name in peers}
    head_to_head = [{"ours": a, "peer": b, "speedup": summary(ratios(grouped[a], grouped[b]))}
                    for a, b in HEAD_TO_HEAD if a in grouped and b in grouped]
    bad = sorted({m["prompt"] for d in drafter_reports.values() for m in d["mismatches"]})

    floor = floor_report(streamed_weight_bytes(models.target), bandwidth, none)
    return {
        "schema_version": SCHEMA_VERSION,
        "machine": {**machine_info(models.target.device, dtype, floor["bandwidth_gb_s"], fastlinear.is_packed(models.target),
                                   target_forward(models.target)),
                    "weights": getattr(models, "weights", "fp32"),  # the target's projections: fp32, q4 or q4q8
                    "draft_dtypes": draft_dtypes(models)},
        "config": {
            "command": command or "specviz.bench.run_bench (Python API)",
            "model": models.name,
            "draft_model": _model_path(models.draft) if getattr(models, "draft", None) is not None else None,
            "drafters": drafters,
            "peers": peers,
            "n_prompts": len(prompts),
            "max_new_tokens": settings.max_new_tokens,
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "top_k": settings.top_k,
            "seed": settings.seed,
            "repeats": settings.repeats,
            "k": settings.k,
            "warmup": settings.warmup,
            "assistant": {"num_assistant_tokens": settings.k, "schedule": "constant", "confidence_threshold": 0.0},
            "prompt_lookup": {"prompt_lookup_num_tokens": settings.k, "max_matching_ngram_size": 2},
            "verify_sizes": list(settings.verify_sizes),
            "context_len": fitting_context(models.target, settings.verify_sizes or (1,), settings.context_len),
            "cost_repeats": settings.cost_repeats,
            "tree_branching": settings.tree_branching,
        },
        "prompts": [
            {"id": p.id, "prompt_tokens": len(ids), "output_tokens": len(none.first(p.id).token_ids),
             "output_preview": models.tokenizer.decode(none.first(p.id).token_ids, skip_special_tokens=True)[:200]}
            for p, ids in zip(prompts, encoded)
        ],
        "drafters": drafter_reports,
        "peers": peer_reports,
        "head_to_head": head_to_head,
        **({"llama_cpp": llama_cpp_report(llama_cpp, grouped, drafters, greedy)} if llama_cpp is not None else {}),
        **({"vllm": vllm_report(vllm_lanes, grouped, drafters, greedy)} if vllm_lanes is not None else {}),
        **({"llama_server": llama_server_report(llama_servers, grouped, drafters, greedy)}
           if llama_servers is not None else {}),
        "outputs_match_none": (not bad) if greedy else None,
        "mismatching_prompts": bad,
        "verify_cost_ms": chain_curve,
        "tree_verify_cost_ms": tree_curve,
        "predicted_speedup": {name: p for name, d in drafter_reports.items()
                              if (p := prediction(d, chain_curve, tree_curve)) is not None},
        "floor_ms_per_token": floor["floor_ms_per_token"],
        "floor": {**floor, "forward_1_ms": chain_curve.get("1")},
        "runs": [{"prompt": r.prompt, "method": r.method, "repeat": r.repeat, "new_tokens": len(r.token_ids),
                  "wall_s": r.wall_s, "tokens_per_s": r.tokens_per_s} for r in runs],
    }


def _model_path(model) -> str:
    return getattr(model.config, "_name_or_path", "") or "draft"


def per_prompt_rates(report: dict) -> dict[tuple[str, str], float]:
    """{(method, prompt): tokens/s} from a report's runs, as the summaries compute them (tokens of the first
    repeat over the median time of the repeats)."""
    rows: dict[tuple[str, str], list[dict]] = {}
    for run in report["runs"]:
        rows.setdefault((run["method"], run["prompt"]), []).append(run)
    return {key: min(runs, key=lambda r: r["repeat"])["new_tokens"] / statistics.median(r["wall_s"] for r in runs)
            for key, runs in rows.items()}


def none_against_bandwidth(report: dict) -> list[dict]:
    """Per prompt: the bandwidth measured right before its `none` runs (median) and `none`'s ms per token, for a
    chart of whether plain decoding follows the memory; empty for reports made before per-run bandwidth."""
    rate = per_prompt_rates(report)
    return [{"prompt": prompt, "bandwidth_gb_s": statistics.median(gb_s), "none_ms_per_token": 1e3 / rate[PLAIN, prompt]}
            for prompt, gb_s in (report["floor"].get("bandwidth_by_prompt") or {}).items()
            if gb_s and rate.get((PLAIN, prompt))]


def per_prompt_speedups(report: dict, baseline: str, methods) -> dict[str, dict[str, float]]:
    """{method: {prompt: tokens/s over the baseline's}} from a report's runs, for charts of the spread."""
    rate = per_prompt_rates(report)
    return {m: {p: rate[m, p] / rate[baseline, p] for (name, p) in rate if name == m and (baseline, p) in rate}
            for m in methods}


def command_for(model: str, settings: BenchSettings, limit: int | None = None, quick: bool = False) -> str:
    """The `python -m specviz bench` command line that reruns these settings (for reports made by the app)."""
    words = ["python", "-m", "specviz", "bench", "--model", model]
    if settings.drafters:
        words += ["--drafters", ",".join(settings.drafters)]
    if limit is not None:
        words += ["--limit", str(limit)]
    words += ["--max-new-tokens", str(settings.max_new_tokens), "--temperature", str(settings.temperature),
              "--top-p", str(settings.top_p)] + ["--top-k", str(settings.top_k)] * bool(settings.top_k)
    words += ["--seed", str(settings.seed), "--repeats", str(settings.repeats), "--k", str(settings.k)]
    words += ["--no-peers"] * (not settings.peers) + ["--no-llama-cpp"] * (not settings.llama_cpp) + ["--quick"] * quick
    return shlex.join(words)


def floor_sentence(fl: dict) -> str:
    """The floor paragraph of the Markdown report and the Benchmarks page (older reports lack the per-prompt part)."""
    if fl.get("bandwidth_gb_s_range"):
        low, high = fl["bandwidth_gb_s_range"]
        measured = (f"{fl['bandwidth_gb_s']:.1f} GB/s (median of {fl['bandwidth_samples']} copy measurements, one right "
                    f"before each `none` run; {low:.1f}–{high:.1f})")
    else:
        measured = f"{fl['bandwidth_gb_s']:.1f} GB/s (copy, measured once in the run)"
    text = (f"{fl['weight_bytes'] / 1e6:,.1f} MB of target weights read per step ÷ {measured} = "
            f"**{fl['floor_ms_per_token']:.1f} ms per token** ({fl['floor_tokens_per_s']:.1f} tokens/s) at best for "
            f"autoregressive decoding. Measured: `none` {fmt(fl['none_ms_per_token'], '.1f')} ms per token; ")
    per_prompt = fl.get("none_share_of_floor_per_prompt")
    if per_prompt:
        text += (f"per prompt, against the bandwidth measured just before it, `none` reaches **{100 * per_prompt['median']:.0f} %** "
                 f"of the floor's tokens/s (median; {100 * per_prompt['min']:.0f}–{100 * per_prompt['max']:.0f} %), "
                 f"{fmt(None if fl.get('none_share_of_floor_totals') is None else 100 * fl['none_share_of_floor_totals'], '.0f', ' %')} "
                 f"from the totals and the median bandwidth")
    else:
        text += f"{fmt(None if fl['none_share_of_floor'] is None else 100 * fl['none_share_of_floor'], '.0f', ' %')} of the floor's tokens/s"
    return text + f"; one target forward over 1 token: {fmt(fl.get('forward_1_ms'), '.1f')} ms."


def llama_cpp_markdown(section: dict | None, weights: str = "fp32") -> list[str]:
    """The llama.cpp section: why it did not run, or its two peers and ours over each (`weights`: our target's)."""
    if section is None:
        return []
    if not section.get("methods"):
        return ["", f"llama.cpp peers: not run ({section['reason']})."]
    plain, lookup = section["methods"]["llama_cpp"], section["methods"]["llama_cpp_lookup"]
    parted = plain["parted_from_none"]
    lines = ["", f"## llama.cpp (llama-cpp-python {section['version']}, `{section['gguf']}`, {section['threads']} threads, "
             f"prompt lookup of {section['lookup']['num_pred_tokens']} tokens over {section['lookup']['max_ngram_size']}-grams)", ""]
    lines += table(["peer", "tokens/s", "ms/token", "speedup vs llama.cpp plain", "output = llama.cpp plain"],
                    [["`llama_cpp`", fmt(plain["tokens_per_s"], ".1f"), fmt(plain["ms_per_token"], ".1f"), "1.00×", "–"],
                     ["`llama_cpp_lookup`", fmt(lookup["tokens_per_s"], ".1f"), fmt(lookup["ms_per_token"], ".1f"),
                      spread(lookup["speedup_vs_plain"]), matched(lookup["outputs_match_plain"])]])
    if plain["outputs_equal_none"] is not None:
        n = plain["outputs_equal_none"] + len(parted)
        lines += ["", f"llama.cpp's plain output equals our `none`'s on {plain['outputs_equal_none']} of {n} prompts"
                  + (f"; the others part at token {', '.join(str(x['index']) for x in parted[:12])}"
                     + (" …" if len(parted) > 12 else "") if parted else "")
                  + (" (both quantize the activations to 8 bits, by the same rule, and sum in other orders)."
                     if weights == "q4q8" else " (its 4-bit products quantize the activations to 8 bits; ours keep them fp32).")]
    lines += ["", "Ours over llama.cpp, per prompt (median, min–max):", ""]
    lines += table(["ours", "over `llama_cpp`", "over `llama_cpp_lookup`"],
                    [[f"`{n}`", spread(o["llama_cpp"]), spread(o["llama_cpp_lookup"])] for n, o in section["ours_over"].items()])
    return lines


def to_markdown(report: dict) -> str:
    m, c = report["machine"], report["config"]
    lines = [
        "# specviz bench",
        "",
        f"`{c['command']}`",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores ({m.get('torch_threads', '?')} torch threads)"
        + (f", GPU {m['gpu']}" if m.get("gpu") else "")
        + f"; {m['device']} {m['dtype']}, linear layers: {m.get('linear', 'torch default')}, "
        f"our engine's forward: {m.get('forward', 'transformers')}; "
        + (f"drafters in {', '.join(f'{k} {v}' for k, v in m['draft_dtypes'].items())}; " if m.get("draft_dtypes") else "")
        + f"torch {m['torch']}, transformers {m['transformers']}; "
        f"memory bandwidth {m['bandwidth_gb_s']:.1f} GB/s (copy, read + write); {m['date']}.",
        "",
        f"Model `{c['model']}`" + (f", draft `{c['draft_model']}`" if c.get("draft_model") else "")
        + f"; {c['n_prompts']} prompts, {c['max_new_tokens']} new tokens at most, temperature {c['temperature']}, "
        f"top-p {c['top_p']}, top-k {c.get('top_k', 0)}, seed {c['seed']}, K = {c['k']}, {c['repeats']} repeat(s), warm-up {'on' if c.get('warmup') else 'off'}.",
        "",
    ]
    if report["outputs_match_none"] is False:
        lines += [f"**MISMATCH: at temperature 0 some drafters' outputs differ from `none` on: "
                  f"{', '.join(report['mismatching_prompts'])}. See the mismatch list below.**", ""]
    lines += ["## Drafters (our engine)", "",
              "τ counts the replacement/bonus token; speedup is per prompt over `none`, median (min–max).", ""]
    lines += table(
        ["drafter", "τ", "drafted/step", "acceptance", "tokens/s", "ms/token", "draft share", "speedup vs none",
         "output = none"],
        [[f"`{n}`", fmt(d["tau"]), fmt(d["inputs_per_step"] - 1), fmt(d["acceptance_rate"]), fmt(d["tokens_per_s"], ".1f"),
          fmt(d["ms_per_token"], ".1f"),
          fmt(100 * d["draft_share"], ".0f", " %"), spread(d["speedup_vs_none"]), matched(d["outputs_match_none"])]
         for n, d in report["drafters"].items()],
    )
    depth = max((len(d["per_position_acceptance"]) for d in report["drafters"].values()), default=0)
    if depth:
        lines += ["", "Per-position acceptance (of the steps whose draft reached depth d, the share accepting there):", ""]
        lines += table(["drafter"] + [f"d={d + 1}" for d in range(depth)],
                        [[f"`{n}`"] + [fmt(a) for a in d["per_position_acceptance"]] + ["–"] * (depth - len(d["per_position_acceptance"]))
                         for n, d in report["drafters"].items() if d["per_position_acceptance"]])
    if any(d.get("acceptance_histogram") for d in report["drafters"].values()):
        lines += ["", "Acceptance histogram (verify steps that drafted something, by drafted tokens accepted: 0, 1, 2, …):", ""]
        lines += table(["drafter", "steps accepting 0, 1, 2, …"], [[f"`{n}`", ", ".join(map(str, d["acceptance_histogram"]))]
                                                                    for n, d in report["drafters"].items() if d.get("acceptance_histogram")])
    if report["peers"]:
        lines += ["", "## Peers (transformers `generate()`, same model objects)", ""]
        lines += table(["peer", "tokens/s", "ms/token", "speedup vs generate", "output = generate"],
                        [[f"`{n}`", fmt(p["tokens_per_s"], ".1f"), fmt(p["ms_per_token"], ".1f"), spread(p["speedup_vs_generate"]),
                          matched(p["outputs_match_generate"])] for n, p in report["peers"].items()])
    if report["head_to_head"]:
        lines += ["", "## Head to head (ours over theirs, per prompt)", ""]
        lines += table(["ours", "peer", "speedup"], [[f"`{h['ours']}`", f"`{h['peer']}`", spread(h["speedup"])]
                                                      for h in report["head_to_head"]])
    lines += llama_cpp_markdown(report.get("llama_cpp"), m.get("weights", "fp32"))
    lines += vllm_markdown(report.get("vllm"))
    lines += llama_server_markdown(report.get("llama_server"))
    if report["verify_cost_ms"]:
        sizes = list(report["verify_cost_ms"])
        lines += ["", f"## Verify cost (ms of one target forward over n new tokens, {c['context_len']} tokens cached; median)", ""]
        rows = [["chain"] + [fmt(report["verify_cost_ms"][n], ".1f") for n in sizes]]
        if report["tree_verify_cost_ms"]:
            rows.append([f"tree (branching {c.get('tree_branching')})"] + [fmt(report["tree_verify_cost_ms"].get(n), ".1f") for n in sizes])
        rows.append([f"chain, relative to n={sizes[0]}"]
                    + [fmt(report["verify_cost_ms"][n] / report["verify_cost_ms"][sizes[0]]) for n in sizes])
        lines += table(["n"] + sizes, rows)
    if report["predicted_speedup"]:
        lines += ["", "## Predicted vs measured speedup over `none`", "",
                  "predicted = τ · c(1) / (draft ms + c(inputs per step)), c the verify-cost curve; "
                  "other ms = step time not spent drafting or verifying (prefill spread over steps, acceptance, events).", ""]
        lines += table(["drafter", "τ", "inputs/step", "draft ms/step", "verify ms/step (curve)", "verify ms/step (measured)",
                         "other ms/step", "predicted", "measured"],
                        [[f"`{n}`", fmt(p["tau"]), fmt(p["inputs_per_step"]), fmt(p["draft_ms_per_step"], ".1f"),
                          fmt(p["verify_ms_per_step_curve"], ".1f"), fmt(p["verify_ms_per_step_measured"], ".1f"),
                          fmt(p["other_ms_per_step"], ".1f"), fmt(p["predicted"], ".2f", "×"), fmt(p["measured"], ".2f", "×")]
                         for n, p in report["predicted_speedup"].items()])
    lines += ["", "## Weight-streaming floor", "", floor_sentence(report["floor"])]
    lines += numerics.markdown(report)
    bad = [(n, x) for n, d in report["drafters"].items() for x in d["mismatches"]]
    bad += [(n, x) for n, p in report["peers"].items() for x in p["mismatches"]]
    if bad:
        lines += ["", "## Mismatches", "", "Drafters are compared with `none`, peers with `generate`.", ""]
        lines += table(["method", "prompt", "first differing token", "expected", "got", "lengths"],
                        [[f"`{n}`", x["prompt"], str(x["index"]), str(x["expected"]), str(x["got"]),
                          f"{x['expected_tokens']} / {x['got_tokens']}"] for n, x in bad])
    lines += ["", "## Prompts", ""]
    lines += table(["prompt", "prompt tokens", "output tokens (`none`)", "output (`none`, start)"],
                    [[p["id"], str(p["prompt_tokens"]), str(p["output_tokens"]),
                      p["output_preview"][:80].replace("\n", " ").replace("|", "\\|")] for p in report["prompts"]])
    return "\n".join(lines) + "\n"
