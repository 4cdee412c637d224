"""Benchmarks: run a small bench on the sidebar's model, or show a report saved by `python -m specviz bench`.

Render only: measuring, summarising and the report's schema live in specviz/bench/."""
import json
from pathlib import Path

import plotly.graph_objects as go
import streamlit as st

from app import figures, state, teaching
from specviz import bench
from specviz.bench.llamaserver import PREFIX as LLAMA_PREFIX  # a lane's method in the runs: llama.cpp:<label>
from specviz.bench.vllm import DECODING
from specviz.bench.vllm import PREFIX as VLLM_PREFIX  # a lane's method in the runs: vllm:<label>
from specviz.drafters import PLAIN
from specviz.errors import SpecvizError

state.intro(
    "Benchmarks",
    "How much faster, on this machine, with which drafter, and why: every drafter against plain decoding (`none`) "
    "and against what you would use instead (transformers' `generate()`, llama.cpp, vLLM servers), measured side "
    "by side.  \n"
    "Run a small bench here, or load a report written by `python -m specviz bench --json-out FILE`.",
)

REPORT = "bench_report"  # session key: (report, where it came from)
SOURCES = ("this session's run", "upload a JSON file", "a file on the server")
SAVED = str(bench.REFERENCE_REPORT)  # the shipped T = 0 bench, shown until this browser session runs one
PROJECT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------------ run
def run_section() -> None:
    st.header("1. Run a small bench")
    shared, settings = state.require_model()
    if shared is None:
        return
    names = shared.drafters() + shared.variants()
    c1, c2, c3 = st.columns(3)
    limit = c1.slider("Prompts (from the built-in set)", 1, len(bench.load_prompts()), 2, key="bench_limit")
    max_new = c2.slider("Max new tokens", 4, 256, 32, key="bench_max_new")
    drafters = c3.multiselect("Drafters (`none` always runs)", names, default=names, key="bench_drafters")
    c1, c2, c3 = st.columns(3)
    peers = c1.checkbox("transformers `generate()` peers", True, key="bench_peers")
    llama = c3.checkbox("llama.cpp peers (where installed: `make peers`)", True, key="bench_llama_cpp")
    quick = c2.checkbox(f"Quick verify-cost curve (n = {', '.join(map(str, bench.QUICK_SIZES))})", True, key="bench_quick")
    run_settings = (bench.quick_settings if quick else bench.BenchSettings)(
        drafters=tuple(drafters), max_new_tokens=max_new, temperature=settings.temperature, top_p=settings.top_p,
        top_k=settings.top_k, seed=settings.seed, k=settings.k, peers=peers, llama_cpp=llama)
    command = bench.command_for(shared.name, run_settings, limit, quick)
    st.caption("Temperature, top-p, top-k, K and seed come from the sidebar. The same run from a shell, with more "
               "prompts and tokens for numbers you can rely on:")
    st.code(command, language="bash")
    if not shared.capabilities.bench:
        st.info(f"The engine runs {shared.where()}: a bench times the engine where it runs, so run this command on "
                "that machine and load its report (--json-out) below.")
        return
    if not st.button("Run the bench", key="bench_run", type="primary"):
        return
    bar = st.progress(0.0, text="waiting for the model…")
    waiting = st.empty()
    try:  # the bench holds the engine: no other session's decode runs in between and skews the timings
        report = bench.run_bench(shared, bench.load_prompts(limit=limit), run_settings, command=command,
                                 progress=lambda done, total, label: bar.progress(done / total, text=f"{label} ({done}/{total})"),
                                 on_wait=lambda _: waiting.info("Another session is decoding on this model; the "
                                                                "bench starts when it finishes…"))
        st.session_state[REPORT] = (report, "this session's run")
        st.session_state["bench_source"] = SOURCES[0]
    except SpecvizError as err:
        st.error(str(err))
    except Exception as err:  # an engine bug should read as a message, not a traceback
        st.error(f"The bench failed ({type(err).__name__}): {err}")
    finally:
        waiting.empty()
        bar.empty()


# ------------------------------------------------------------------------------------------- choose
def chosen_report() -> dict | None:
    st.header("2. A report")
    st.session_state.setdefault("bench_source", SOURCES[2])  # a measured report from the start, not an empty page
    source = st.radio("Show", SOURCES, horizontal=True, key="bench_source")
    if source == SOURCES[0]:
        saved = st.session_state.get(REPORT)
        if saved is None:
            st.info("No bench has run in this session yet: run one above, or load a saved report.")
            return None
        return saved[0]
    try:
        if source == SOURCES[1]:
            upload = st.file_uploader("Report (JSON from `--json-out`)", type=["json"], key="bench_upload")
            if upload is None:
                return None
            return bench.parse_report(upload.getvalue(), upload.name)
        path = st.text_input("Path on the server (a .json file; a relative one may also be in the project)", SAVED,
                             key="bench_path").strip()
        if not path.endswith(".json"):
            st.info("Enter the path of a report written by `--json-out` (a .json file).")
            return None
        if not Path(path).exists() and (PROJECT / path).exists():  # the app started from another folder
            path = str(PROJECT / path)
        return bench.load_report(path)
    except SpecvizError as err:
        st.error(str(err))
    return None


def llama_cpp_tables(section: dict | None, weights: str = "fp32") -> None:
    """llama.cpp's plain decoding and prompt lookup on the same GGUF, and ours over each (`weights`: what our target
    ran, the report's machine.weights); or why they did not run."""
    if section is None:
        return
    if not section.get("methods"):
        st.caption(f"llama.cpp peers: not run ({section['reason']}).")
        return
    plain, lookup = section["methods"]["llama_cpp"], section["methods"]["llama_cpp_lookup"]
    st.markdown(f"**llama.cpp** (llama-cpp-python {section['version']}, `{section['gguf']}`, {section['threads']} threads): "
                "the same prompt tokens, sampling settings and token budget, timed in the same interleaved run.")
    table([{"peer": "llama_cpp", "tokens/s": rounded(plain["tokens_per_s"], 1), "ms/token": rounded(plain["ms_per_token"], 1),
                   "output = none (prompts)": plain["outputs_equal_none"]},
                  {"peer": "llama_cpp_lookup", "tokens/s": rounded(lookup["tokens_per_s"], 1),
                   "ms/token": rounded(lookup["ms_per_token"], 1), **spread("speedup vs llama_cpp", lookup["speedup_vs_plain"])}],
                 hide_index=True)
    table([{"ours": name, **{f"over {peer} (median, min–max)": span(over[peer]) for peer in ("llama_cpp", "llama_cpp_lookup")}}
                  for name, over in section["ours_over"].items()], hide_index=True)
    ours = ("quantize them to 8 bits too, by the same rule but summed in another order" if weights == "q4q8"
            else "keep them fp32")
    st.caption(f"llama.cpp's 4-bit products quantize the activations to 8 bits and ours ({weights}) {ours}, so its "
               "greedy output is a near neighbour of `none`'s, not the same tokens; its lookup's output is compared "
               "with its own plain decoding in the Markdown report.")


VLLM_LIMITS = ("vLLM exposes no q, no tree and no u: a lane's τ and acceptance are its own per-step counts (drafted "
               "and accepted per verify step, from `--per-request-spec-decode-metrics detailed`), τ counting the "
               "prefill's forward as ours does, not tests this page can replay. Its output is compared with `none`'s "
               "for information only: vLLM's kernels round otherwise, so the two may part at a near-tie.")
LLAMA_SERVER_LIMITS = ("llama.cpp exposes no q, no tree and no u: a lane's τ and acceptance are counts as llama-server "
                       "reports them (drafted and accepted per verify step, read from its per-token timings), τ "
                       "counting the prefill's forward as ours does, its mean length llama.cpp's own (1 + accepted ÷ "
                       "verify steps that drafted). Its output is compared with `none`'s at T = 0 for information "
                       "only: llama.cpp quantizes the activations to 8 bits and sums in its own order, so the two may "
                       "part at a near-tie.")


def equal_none(lane: dict) -> str | None:
    """"k of n" prompts whose output equalled `none`'s (None at T > 0, where outputs are samples)."""
    same = lane["outputs_equal_none"]
    return None if same is None else f"{same} of {same + len(lane['parted_from_none'])}"


def depth_and_ours_tables(section: dict, engine: str) -> None:
    """An engine's lanes' per-position acceptance, and ours over each lane per prompt."""
    lanes = section["lanes"]
    if any(lane["per_position_acceptance"] for lane in lanes.values()):
        st.markdown(f"{engine}'s per-position acceptance (accepted at depth d ÷ steps that drafted to d):")
        table([{"lane": label, **{f"d={d + 1}": rounded(a) for d, a in enumerate(lane["per_position_acceptance"])}}
                      for label, lane in lanes.items() if lane["per_position_acceptance"]], hide_index=True)
    table([{"ours": name, **{f"over {label} (median, min–max)": span(s) for label, s in over.items()}}
                  for name, over in section["ours_over"].items()], hide_index=True)


def vllm_tables(section: dict | None) -> None:
    """Running vLLM servers as lanes (`specviz bench --vllm URL=label,...`): each beside `none`, its per-position
    acceptance, and ours over each lane per prompt."""
    if not section:
        return
    st.markdown("**vLLM** (running servers, each with the speculative method it was started with): the same prompt "
                "token ids, sampling settings and token budget, timed in the same interleaved run as a client waits "
                "for it, the whole stream over HTTP, prefill included.")
    table([{"lane": label, "server": lane["url"], "decoding": DECODING[lane["speculative"]],
                   "τ": rounded(lane["tau"]), "acceptance": rounded(lane["acceptance_rate"]),
                   "tokens/s": rounded(lane["tokens_per_s"], 1), "ms/token": rounded(lane["ms_per_token"], 1),
                   **spread("speedup vs none", lane["speedup_vs_none"]), "output = none (prompts)": equal_none(lane)}
                  for label, lane in section["lanes"].items()], hide_index=True)
    depth_and_ours_tables(section, "vLLM")
    st.caption(VLLM_LIMITS)


def llama_server_tables(section: dict | None) -> None:
    """llama-server configurations the bench started as lanes (`specviz bench --llama-server plain ngram-mod ...`):
    each beside `none` with llama.cpp's counts, its per-position acceptance, and ours over each lane per prompt."""
    if not section:
        return
    lanes = section["lanes"]
    st.markdown("**llama.cpp's llama-server** (started by the bench, one server per configuration, on the GGUF our "
                "target was converted from): the same prompt token ids, sampling settings and token budget, timed in "
                "the same interleaved run as a client waits for it, the whole stream over HTTP, prefill included.")
    table([{"lane": label, "threads": lane["threads"], "τ": rounded(lane["tau"]),
                   "mean length (llama.cpp's)": rounded(lane["llamacpp_mean_length"]),
                   "acceptance": rounded(lane["acceptance_rate"]), "tokens/s": rounded(lane["tokens_per_s"], 1),
                   **spread("over none", lane["speedup_vs_none"]), "output = none (prompts)": equal_none(lane)}
                  for label, lane in lanes.items()], hide_index=True)
    depth_and_ours_tables(section, "llama.cpp")
    with st.expander("The servers' command lines"):
        st.markdown("\n".join(f"- {figures.md_code(label)}: {figures.md_code(lane['command'])}"
                              for label, lane in lanes.items()))
    st.caption(LLAMA_SERVER_LIMITS)


def numerics_table(report: dict) -> None:
    """Greedy differences from `none` at a floating-point near-tie: numerics events, with the target's two logits."""
    events = [(n, x) for n, d in report["drafters"].items() for x in d.get("numerics_events", [])]
    if not events:
        return
    st.info(f"{len(events)} numerics event(s): a drafter's greedy output parted from `none`'s where the target's two "
            "most likely tokens were within floating-point rounding of each other (the two logits below, recomputed "
            "by the bench with a one-token forward). Not a failed drafter: " + teaching.GREEDY_IDENTITY)
    table([{"drafter": n, "prompt": x["prompt"], "token": x["index"], "none's token": x["expected"],
                   "drafter's token": x["got"], "top-1 (id, logit)": f"{x['top'][0][0]}, {x['top'][0][1]:.6g}",
                   "top-2 (id, logit)": f"{x['top'][1][0]}, {x['top'][1][1]:.6g}", "gap": x["gap"],
                   "tolerance": x["tolerance"]} for n, x in events], hide_index=True)


# ------------------------------------------------------------------------------------------- charts
def served_lanes(report: dict, section: str = "vllm") -> dict[str, dict]:
    """The lanes of a report's section ("vllm" or "llama_server") named as in its runs, vllm:<label> or
    llama.cpp:<label> (a lane's label may be a drafter's name)."""
    prefix = {"vllm": VLLM_PREFIX, "llama_server": LLAMA_PREFIX}[section]
    return {f"{prefix}{label}": lane for label, lane in ((report.get(section) or {}).get("lanes") or {}).items()}


def engine_lanes(report: dict) -> dict[str, dict]:
    """Every lane another engine ran (vLLM's and llama-server's), named as in the runs."""
    return {**served_lanes(report), **served_lanes(report, "llama_server")}


def rates_figure(report: dict) -> go.Figure:
    drafters, peers = report["drafters"], report["peers"]
    fig = go.Figure()
    fig.add_bar(name="our engine", x=list(drafters), y=[d["tokens_per_s"] for d in drafters.values()],
                text=[f"{d['tokens_per_s']:.1f}" for d in drafters.values()], textposition="outside")
    if peers:
        fig.add_bar(name="transformers generate()", x=list(peers), y=[p["tokens_per_s"] for p in peers.values()],
                    text=[f"{p['tokens_per_s']:.1f}" for p in peers.values()], textposition="outside")
    theirs = (report.get("llama_cpp") or {}).get("methods") or {}
    if theirs:
        fig.add_bar(name="llama.cpp (llama-cpp-python)", x=list(theirs), y=[p["tokens_per_s"] for p in theirs.values()],
                    text=[f"{p['tokens_per_s']:.1f}" for p in theirs.values()], textposition="outside")
    served, started = served_lanes(report), served_lanes(report, "llama_server")
    for name, lanes in (("vLLM (served)", served), ("llama.cpp (llama-server)", started)):
        if lanes:
            fig.add_bar(name=name, x=list(lanes), y=[p["tokens_per_s"] for p in lanes.values()],
                        text=[f"{p['tokens_per_s']:.1f}" for p in lanes.values()], textposition="outside")
    floor = report["floor"]["floor_tokens_per_s"]
    title = "Tokens per second (all prompts together)"
    fastest = max([d["tokens_per_s"] for d in drafters.values()]
                  + [p["tokens_per_s"] for p in [*peers.values(), *theirs.values(), *served.values(), *started.values()]])
    if floor <= 3 * fastest:
        # a short label at the left: a long one overflows a narrow chart and is cut off
        fig.add_hline(y=floor, line_dash="dash", annotation_text=f"floor {floor:.1f}", annotation_position="top left")
        title += "<br><sup>dashed: the weight-streaming floor, autoregressive at best</sup>"
    else:  # a line far above the bars would flatten them
        title += f"<br><sup>weight-streaming floor: {floor:,.1f} tokens/s, off this scale</sup>"
    fig.update_layout(title=title, yaxis_title="tokens/s", height=420)
    return figures.level_categories(fig)


def spread_figure(report: dict) -> go.Figure:
    fig = go.Figure()
    ours = bench.per_prompt_speedups(report, PLAIN, [n for n in report["drafters"] if n != PLAIN])
    theirs = bench.per_prompt_speedups(report, "generate", [n for n in report["peers"] if n != "generate"]) if report["peers"] else {}
    for label, values in [*((f"{n} / none", v) for n, v in ours.items()), *((f"{n} / generate", v) for n, v in theirs.items())]:
        fig.add_box(name=label, y=list(values.values()), text=list(values), boxpoints="all", pointpos=0,
                    hovertemplate="%{text}: %{y:.2f}×<extra></extra>")
    fig.add_hline(y=1.0, line_dash="dot")
    fig.update_layout(title="Speedup per prompt (each point is one prompt)", yaxis_title="× over the baseline",
                      showlegend=False, height=420)
    return figures.level_categories(fig)


@figures.clear_of_toolbar
def cost_figure(report: dict) -> go.Figure:
    fig = go.Figure()
    for name, curve in (("chain (causal mask)", report["verify_cost_ms"]), ("tree (4D mask)", report["tree_verify_cost_ms"])):
        if curve:
            fig.add_scatter(name=name, x=[int(n) for n in curve], y=list(curve.values()), mode="lines+markers")
    fig.update_layout(title=f"Verify cost: one target forward over n new tokens ({report['config']['context_len']} cached)",
                      xaxis=dict(title="n (root + drafted tokens)", type="log", dtick=0.30103), yaxis_title="ms",
                      height=400)
    return fig


@figures.clear_of_toolbar
def acceptance_figure(report: dict) -> go.Figure:
    fig = go.Figure()
    for name, d in {**report["drafters"], **engine_lanes(report)}.items():
        if d["per_position_acceptance"]:
            fig.add_scatter(name=name, x=list(range(1, len(d["per_position_acceptance"]) + 1)),
                            y=d["per_position_acceptance"], mode="lines+markers")
    fig.update_layout(title="Per-position acceptance", xaxis=dict(title="depth d", dtick=1),
                      yaxis=dict(title="accepted at d", range=[0, 1.05]),
                      height=400)
    return fig


def predicted_figure(report: dict) -> go.Figure:
    rows = report["predicted_speedup"]
    fig = go.Figure()
    fig.add_bar(name="predicted from τ and the cost curve", x=list(rows), y=[r["predicted"] for r in rows.values()])
    fig.add_bar(name="measured (median over prompts)", x=list(rows), y=[r["measured"] for r in rows.values()])
    fig.add_hline(y=1.0, line_dash="dot")
    fig.update_layout(title="Speedup over none: predicted vs measured", yaxis_title="×", barmode="group", height=400)
    return figures.level_categories(fig)


@figures.clear_of_toolbar
def floor_figure(report: dict, points: list[dict]) -> go.Figure:
    """`none`'s ms per token against the bandwidth measured right before it, with the floor it is held to."""
    weight_bytes = report["floor"]["weight_bytes"]
    fig = go.Figure()
    fig.add_scatter(name="none, one prompt each", x=[p["bandwidth_gb_s"] for p in points],
                    y=[p["none_ms_per_token"] for p in points], text=[p["prompt"] for p in points], mode="markers",
                    hovertemplate="%{text}: %{x:.1f} GB/s, %{y:.1f} ms/token<extra></extra>")
    low, high = min(p["bandwidth_gb_s"] for p in points), max(p["bandwidth_gb_s"] for p in points)
    xs = [low + (high - low) * i / 20 for i in range(21)]
    for share, label in ((1.0, "floor: weights ÷ bandwidth"), (0.5, "half the floor's tokens/s")):
        fig.add_scatter(name=label, x=xs, y=[1e3 * weight_bytes / (x * 1e9) / share for x in xs], mode="lines",
                        line_dash="dash" if share == 1.0 else "dot")
    fig.update_layout(title="Does plain decoding follow the memory? none against the bandwidth measured just before it",
                      xaxis_title="copy bandwidth (GB/s)", yaxis=dict(title="ms per token", rangemode="tozero"), height=420)
    return fig


# ------------------------------------------------------------------------------------------- report
def table(rows: list[dict], **options) -> None:
    """A table whose missing numbers read "—", not None: the data stays numeric (NaN), only its display changes."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    numbers = frame.select_dtypes("number").columns
    st.dataframe(frame.style.format(str, na_rep="—", subset=numbers), **options)


def rounded(value, digits: int = 2):
    return None if value is None else round(value, digits)


def spread(label: str, summary: dict | None) -> dict:
    summary = summary or {}
    return {f"{label} (median)": rounded(summary.get("median")), "min": rounded(summary.get("min")),
            "max": rounded(summary.get("max"))}


def span(summary: dict | None) -> str | None:
    return None if summary is None else f"{summary['median']:.2f}× ({summary['min']:.2f}–{summary['max']:.2f})"


def show(report: dict) -> None:
    m, c = report["machine"], report["config"]
    st.code(c["command"], language="bash")
    st.caption(f"{m['cpu']}, {m['cores']} cores" + (f", {m['gpu']}" if m.get("gpu") else "")
               + f"; {m['device']} {m['dtype']}; torch {m['torch']}, transformers {m['transformers']}; {m['date']}. "
               f"{c['n_prompts']} prompts, {c['max_new_tokens']} new tokens at most, temperature {c['temperature']}, K = {c['k']}.")
    if report["outputs_match_none"] is False:
        st.error("At temperature 0 these prompts gave a drafter output different from `none`'s, and not at a "
                 "floating-point near-tie of the target's two most likely tokens: a failed drafter. "
                 f"{', '.join(report['mismatching_prompts'])}. See the mismatch list below.")
    elif report["outputs_match_none"] is None:
        st.info("Temperature > 0: outputs are samples, so they are not compared token by token (the *Is it really "
                "lossless?* page tests the distributions).")
    table([{"drafter": n, "τ": rounded(d["tau"]), "acceptance": rounded(d["acceptance_rate"]),
                   "tokens/s": rounded(d["tokens_per_s"], 1), "ms/token": rounded(d["ms_per_token"], 1),
                   "draft share": rounded(d["draft_share"]), **spread("speedup vs none", d["speedup_vs_none"]),
                   "output = none": d["outputs_match_none"]} for n, d in report["drafters"].items()],
                 hide_index=True)
    if report["peers"]:
        table([{"peer": n, "tokens/s": rounded(p["tokens_per_s"], 1), "ms/token": rounded(p["ms_per_token"], 1),
                       **spread("speedup vs generate", p["speedup_vs_generate"]),
                       "output = generate": p["outputs_match_generate"]} for n, p in report["peers"].items()],
                     hide_index=True)
    numerics_table(report)
    llama_cpp_tables(report.get("llama_cpp"), report["machine"].get("weights", "fp32"))
    vllm_tables(report.get("vllm"))
    llama_server_tables(report.get("llama_server"))
    c1, c2 = st.columns(2)
    c1.plotly_chart(rates_figure(report), key="bench_rates")
    c2.plotly_chart(spread_figure(report), key="bench_spread")
    served = engine_lanes(report)
    if served:
        names = " and ".join(f"each {engine} lane as {prefix}<label>" for engine, prefix, section in
                             (("vLLM", VLLM_PREFIX, "vllm"), ("llama-server", LLAMA_PREFIX, "llama_server"))
                             if report.get(section))
        st.caption(f"The tokens/s chart shows {names} beside ours, timed in the same run (a lane over HTTP, as a "
                   "client waits); the per-prompt chart shows our drafters only: ours over each lane, per prompt, is "
                   "in the tables above. A speculative lane's own counts join the acceptance charts below.")
    if report["verify_cost_ms"]:
        c1, c2 = st.columns(2)
        c1.plotly_chart(cost_figure(report), key="bench_cost")
        c2.plotly_chart(predicted_figure(report), key="bench_predicted")
    ours = {n: d["acceptance_histogram"] for n, d in report["drafters"].items() if d.get("acceptance_histogram")}
    nothing = {n: report["drafters"][n]["steps"] - sum(h) for n, h in ours.items()}  # steps that drafted nothing
    histograms = {**ours, **{n: d["acceptance_histogram"] for n, d in served.items() if d.get("acceptance_histogram")}}
    if any(d["per_position_acceptance"] for d in [*report["drafters"].values(), *served.values()]):
        c1, c2 = (st.columns(2) if histograms else (st.container(), None))
        c1.plotly_chart(acceptance_figure(report), key="bench_acceptance")
        if histograms:
            c2.plotly_chart(figures.acceptance_histogram_figure(histograms, "Acceptance histogram (all prompts)",
                                                                no_draft=nothing), key="bench_histogram")
        st.caption(teaching.HISTOGRAM_NOTE + (" This report predates the histogram (its drafters carry no "
                                              "`acceptance_histogram`)." if not ours else " Steps that drafted "
                                              "nothing, per method: " + ", ".join(
                                                  f"`{n}` {c:,}" for n, c in nothing.items()) + "."))
    st.markdown("**Weight-streaming floor.** A plain decoding step reads every weight once: " + bench.floor_sentence(report["floor"]))
    points = bench.none_against_bandwidth(report)
    if points:
        st.plotly_chart(floor_figure(report, points), key="bench_floor")
        st.caption("Where the points stay level while the bandwidth moves, something other than the memory (the "
                   "matrix-product kernels, the rest of the forward) sets the speed of plain decoding.")
    with st.expander("The whole report as Markdown (what `--md-out` writes)"):
        st.markdown(bench.to_markdown(report))
    st.download_button("Download the report (JSON)", json.dumps(report, indent=1), "bench.json", "application/json",
                       key="bench_download")


run_section()
report = chosen_report()
if report is not None:
    show(report)
