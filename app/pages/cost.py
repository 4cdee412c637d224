from pathlib import Path

import plotly.graph_objects as go
import streamlit as st

from app import regimes, state
from specviz import analysis
from specviz.bench import batch as batch_surface
from specviz.bench import loadtable
from specviz.drafters import PLAIN, REGISTRY, drafter_name
from specviz.errors import SpecvizError

state.intro(
    "Cost and scale",
    "What a faster decode is worth: dollars per million output tokens follow directly from tokens/s and the GPU "
    "price.  \nThen: the speedup predicted from the measured acceptance rate α and measured step costs, next to "
    "the measured one, why the gain shrinks as the batch grows, and what many clients at once get from a server "
    "that batches.",
)


PROJECT = Path(__file__).resolve().parents[2]
H100_TB_S = analysis.GPU_DATASHEET["H100 SXM"]["bandwidth_tb_s"]  # NVIDIA H100 datasheet, not measured here


def is_chain(drafter: str) -> bool:
    """Does this run's drafter propose one chain (its spec says so), so that the chain speedup formula fits it?"""
    spec = REGISTRY.get(drafter_name(drafter))
    return spec is not None and spec.chain


def best_run(names: list[str], runs: dict[str, list[dict]]) -> int:
    """The index in `names` of the run of the highest α (accepted ÷ tested): a page's default pick is the best
    run measured, not the last."""
    alphas = [analysis.summarise(runs[name]).alpha or 0.0 for name in names]
    return alphas.index(max(alphas)) if alphas else 0


def measured_runs() -> dict[str, list[dict]]:
    """Finished runs of this session: the race's (for the current settings or any) and the last live run."""
    runs = {}
    for (key, drafter), events in st.session_state.get("race_cache", {}).items():
        prompt, s = key.prompt, key.settings  # app/pages/race.py's key: an app.regimes.RunKey
        label = f"race: {drafter} on “{prompt[:24]}…”, T {s.temperature}, K {s.k}, {s.max_new_tokens} tokens, seed {s.seed}"
        runs[label if label not in runs else f"{label} ({len(runs)})"] = events  # top-p, top-k or tree differ
    trace, source = state.get_trace()
    if trace and state.done_of(trace):
        runs[f"{source}: {trace[0]['drafter']}"] = trace
    return runs


def show_speedup(base: analysis.RunSummary, spec: analysis.RunSummary) -> None:
    cmp = analysis.speedup_comparison(base, spec)
    m = st.columns(5)
    m[0].metric("α (accepted ÷ tested)", f"{cmp['alpha']:.3f}",
                help=f"{spec.accepted_tested} of the {spec.tested} drafted tokens the test ran on were accepted. "
                     f"The run's acceptance rate, accepted ÷ drafted, is {cmp['acceptance_rate']:.3f}: it also "
                     "counts tokens after a chain's first rejection, which are never tested.")
    m[1].metric("expected tokens/step", f"{cmp['expected_tokens_per_step']:.2f}",
                help=f"E(α, n) over the drafted lengths n of the run's steps (mean {cmp['mean_drafted']:.2f} drafted "
                     f"tokens a step); measured τ: {cmp['measured_tau']:.2f}")
    m[2].metric("step cost (target forwards)", f"{cmp['step_cost']:.2f}",
                help=f"{spec.ms_per_step:.1f} ms per speculative step ÷ {base.ms_per_step:.1f} ms per plain step")
    m[3].metric("predicted speedup", f"{cmp['predicted_speedup']:.2f}×")
    m[4].metric("measured speedup", f"{cmp['measured_speedup']:.2f}×")
    st.caption(f"Drafted tokens per step, measured: {cmp['mean_drafted']:.2f} (K = {spec.k} at most: the "
               "cost-aware draft length drafts fewer, or none, where they would not pay). The prediction averages "
               "E(α, n) over each step's drafted length n, not E(α, K). "
               f"Measured τ = {cmp['measured_tau']:.2f}. α is accepted ÷ "
               "tested, the probability that a tested token is accepted, as the formula means it (accepted ÷ drafted "
               f"= {cmp['acceptance_rate']:.3f} is smaller: for a K-token chain it is α(1 − α^K) / (K(1 − α)), and put "
               "into the formula it predicts too few tokens per step). The formula assumes "
               "each drafted token is accepted independently with the same α, and trees accept differently, so "
               "prediction and measurement can differ. Measured tokens/s also include the prefill.")


# ------------------------------------------------------------------------------------- $ per million
st.header("1. Dollars per million output tokens")
st.latex(r"\$/\text{M tokens} = \frac{\$/\text{GPU-hour} \times \#\text{GPUs}}{\text{tokens/s} \times 3600} \times 10^6")
runs = measured_runs()
c1, c2, c3 = st.columns(3)
price = c1.number_input("$ per GPU-hour", 0.0, 1000.0, 2.50, 0.1, key="cost_price",
                        help="Enter your own price; the default is an example, not a quote.")
gpus = c2.number_input("Number of GPUs", 1, 1024, 8, key="cost_gpus")
source = c3.selectbox("tokens/s from", ["entered"] + list(runs), key="cost_source")
if source == "entered":
    tps = st.number_input("tokens/s", 0.001, 1e6, 50.0, key="cost_tps",
                          help="An example; or pick a run measured in this session above.")
else:
    tps = state.done_of(runs[source])["stats"]["tokens_per_s"]
    st.caption(f"tokens/s = {tps:.2f}, measured in this session ({source}).")
st.metric("Cost per million output tokens", f"${analysis.usd_per_million(price, gpus, tps):,.2f}")

# ------------------------------------------------------------------------------------ a worked example
st.header("2. A worked example: one 8×H100 node, 70B at 16-bit")
node_ms = analysis.ms_per_token(70e9, 2, 8 * H100_TB_S * 1e12)
node_tps = 1000 / node_ms
st.markdown(
    f"The 140 GB of 16-bit weights do not fit in one 80 GB H100, so 8 GPUs each stream an eighth of them per token: "
    f"70e9 × 2 bytes ÷ (8 × {H100_TB_S} TB/s) = **{node_ms:.1f} ms per token** at least, so at most "
    f"**{node_tps:.0f} tokens/s** for one stream (the bound of *Why it works*; datasheet bandwidth, perfect scaling, "
    "no KV-cache reads). At the price above that is at least "
    f"**\\${analysis.usd_per_million(price, 8, node_tps):,.2f} per million tokens** when the node serves that one "
    "stream alone. A serving node, though, is paid for by its **total** throughput over every stream it batches, which "
    "divides the cost per token; section 4 shows the speedup of speculative decoding shrinking as the batch grows, so "
    "at a busy node it saves less per token."
)
st.warning(
    "Reading a quoted speedup: speedup = τ ÷ the step's cost in plain steps (section 3). A speedup equal to τ, the "
    "tokens per target forward, would mean a speculative step costs exactly one plain step: drafting free, and "
    "verifying K + 1 tokens no dearer than 1. Neither holds (section 3 and the *Benchmarks* page measure both), so "
    "at batch 1 τ is an upper bound on the speedup, not the speedup."
)

# ---------------------------------------------------------------------------------- predicted speedup
st.header("3. Predicted vs measured speedup")
st.markdown("With K drafted tokens each accepted with probability α (independently, and only while every token "
            "before it was accepted), a step commits on average")
st.latex(r"E[\text{tokens per step}] = \frac{1 - \alpha^{K+1}}{1 - \alpha}")
st.markdown("tokens, the replacement or bonus token included (Leviathan et al., 2023, *Fast Inference from "
            "Transformers via Speculative Decoding*, section 3), and costs (draft time + verify time) ÷ (time of one "
            "plain target step). Predicted speedup = expected tokens per step ÷ step cost. α here is **accepted ÷ "
            "tested**, measured in the run, as are the costs.")
baselines = [n for n, e in runs.items() if e[0]["drafter"] == PLAIN]
# the formula is a chain's: a tree's acceptance (accepted ÷ every node drafted) and depth do not fit it
specs = [n for n, e in runs.items() if is_chain(e[0]["drafter"])]
if not baselines or not specs:
    chains = " or ".join(f"`{name}`" for name, s in REGISTRY.items() if s.chain)
    trees = ", ".join(f"`{name}`" for name, s in REGISTRY.items() if not s.chain and name != PLAIN)
    st.info(f"Needs a `{PLAIN}` run and a chain run ({chains}): run the *Topology race* (it runs every "
            f"drafter, `{PLAIN}` included), then come back. Tree drafters ({trees}) do not fit this "
            "formula; the Benchmarks page predicts their speedup from the measured verify-cost curve.")
else:
    c1, c2 = st.columns(2)
    spec_name = c2.selectbox("Speculative run", specs, index=best_run(specs, runs), key="cost_spec",
                             help="It starts at the run of the highest α (accepted ÷ tested), not the last one.")
    weights = regimes.split_lane(spec_name.split()[1])[1]  # "race: eagle2@fp32 on …": the lane's weights
    same = [i for i, n in enumerate(baselines) if n.split()[1] == regimes.lane_name(PLAIN, weights)] or [0]
    base_name = c1.selectbox("Baseline (none)", baselines, index=same[0], key="cost_base")
    base, spec = analysis.summarise(runs[base_name]), analysis.summarise(runs[spec_name])
    if spec.acceptance_rate is None:
        st.warning("That run drafted nothing (every step was autoregressive), so it has no α. Try another prompt "
                   "(n-gram lookup needs repeated text) or another drafter.")
    else:
        show_speedup(base, spec)

with st.expander("Explore the formula"):
    k_max = st.slider("K", 1, 10, 4, key="cost_k")
    alphas = [i / 50 for i in range(51)]
    fig = go.Figure()
    for k in sorted({1, 2, k_max}):
        fig.add_trace(go.Scatter(x=alphas, y=[analysis.expected_tokens_per_step(a, k) for a in alphas], name=f"K = {k}"))
    fig.update_layout(title="expected tokens per target forward", xaxis={"title": "α"}, height=300,
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    st.plotly_chart(fig, key="cost_formula")

# ------------------------------------------------------------------------------------------ batching
st.header("4. Why the gain falls as the batch grows (measured, and modelled)")
st.markdown(
    "At batch 1 a forward pass is **memory-bound**: reading the weights takes longer than the arithmetic, so "
    "scoring K + 1 tokens costs about as much as scoring 1. With B sequences in the batch the target already does "
    "B tokens of work per weight read; once 2 × params × tokens exceeds what the hardware computes in the time it "
    "reads the weights, the forward becomes **compute-bound**, and verifying K extra tokens per sequence costs real "
    "time. Below, first what that costs as **measured**: one target forward over B sequences × n new tokens each, "
    "c(B, n); then the gain it predicts beside a **roofline model** for a GPU node."
)


def uploaded_or_shipped(what: str, command: str, key: str, parse, load, shipped: Path) -> dict | None:
    """An uploaded file when parse(data, name) takes it (a clear error otherwise), else the one shipped with
    specviz, load() (None when none is shipped)."""
    upload = st.file_uploader(f"Your own {what} (JSON from `{command}`); without one, the {what} shipped with "
                              "specviz", type=["json"], key=key)
    if upload is not None:
        try:
            found = parse(upload.getvalue(), upload.name)
            st.caption(f"Showing the uploaded {what} {upload.name}.")
            return found
        except SpecvizError as err:
            st.error(f"{err}." + (f" Showing the shipped {what} instead." if shipped.exists() else ""))
    try:
        found = load()
    except SpecvizError as err:
        st.error(str(err))
        return None
    if found is not None:
        st.caption(f"Showing the shipped {what}, "
                   f"{shipped.relative_to(PROJECT) if shipped.is_relative_to(PROJECT) else shipped}.")
    return found


def chosen_surface() -> dict | None:
    return uploaded_or_shipped("surface", "python -m specviz batch-cost --out FILE.json", "cost_b_upload",
                               batch_surface.parse_surface, batch_surface.load_surface, batch_surface.SHIPPED)


def machine_label(surface: dict) -> str:
    m = surface["machine"]
    where = m.get("gpu") or f"{m['cpu']} CPU, {m['torch_threads']} threads"
    return f"{surface['model']} ({m['dtype']}) on {where}"


def surface_heatmap(grid: dict, title: str, fmt: str, key: str) -> None:
    bs, ns = list(grid), list(next(iter(grid.values())))
    fig = go.Figure(go.Heatmap(z=[[grid[b][n] for n in ns] for b in bs], x=[str(n) for n in ns], y=[str(b) for b in bs],
                               texttemplate=f"%{{z:{fmt}}}", colorscale="Viridis"))
    fig.update_layout(title=title, height=340, xaxis={"title": "n new tokens per sequence", "type": "category"},
                      yaxis={"title": "B sequences", "type": "category"}, margin={"l": 10, "r": 10, "t": 40, "b": 10})
    st.plotly_chart(fig, key=key)


def batching_note(rows: list[dict]) -> str:
    """What batching and speculation each do to the plain cost per token, from the table's own rows."""
    if len(rows) < 2:
        return ""
    first, last = rows[0], rows[-1]  # cost per token ∝ 1 / node tokens/s, whatever the price
    return (f"Here batching alone, B = {first['batch']} → {last['batch']}, divides the plain cost per token by "
            f"{last['plain_tokens_per_s'] / first['plain_tokens_per_s']:.1f}; speculation divides it by "
            f"{first['spec_tokens_per_s'] / first['plain_tokens_per_s']:.2f} at B = {first['batch']} and by "
            f"{last['spec_tokens_per_s'] / last['plain_tokens_per_s']:.2f} at B = {last['batch']}.")


def verify_cost_curve(surface: dict) -> None:
    """The engine's verify-cost curve (B = 1, the lean forward) over n, and where the products ran on AMX tiles,
    the same forwards held to the VNNI path in the same rounds."""
    lean, vnni = surface["lean_b1_ms"], surface.get("lean_b1_ms_vnni")
    ns = sorted(lean, key=int)
    fig = go.Figure(go.Scatter(x=[int(n) for n in ns], y=[lean[n] / lean[ns[0]] for n in ns], mode="lines+markers",
                               name="AMX tiles" if surface.get("amx_tiles") else "as the engine runs it"))
    if vnni:
        fig.add_trace(go.Scatter(x=[int(n) for n in ns if n in vnni], y=[vnni[n] / vnni[ns[0]] for n in ns if n in vnni],
                                 mode="lines+markers", name="AVX-512 VNNI (tiles off)"))
    fig.update_layout(title=f"The verify-cost curve: c(1, n) ÷ c(1, {ns[0]}), {surface['lean_b1_forward']}",
                      height=320, xaxis={"title": "n new tokens verified in one forward"},
                      yaxis={"title": "cost over one token"}, margin={"l": 10, "r": 10, "t": 40, "b": 10})
    st.plotly_chart(fig, key="cost_verify_curve")
    if vnni:
        n = max((k for k in ns if k in vnni), key=int)
        st.caption(f"This CPU ran the products of two rows or more on AMX tiles; in the same rounds, held to the VNNI "
                   f"path: {n} tokens cost {lean[n] / lean[ns[0]]:.2f}× one token with tiles, "
                   f"{vnni[n] / vnni[ns[0]]:.2f}× without (one token: {lean[ns[0]]:.1f} against {vnni[ns[0]]:.1f} ms).")
    else:
        st.caption("The CPU that measured this curve ran no AMX tiles (none there, the model not on 8-bit "
                   "activations, or Linux did not grant the tile state), so there is no tiles-off curve beside it; "
                   "`specviz batch-cost` measures both on a CPU with AMX-INT8 (Intel Xeon from Sapphire Rapids on).")


CELL_STATISTICS = {"median of the rounds": "ms", "fastest round (the least disturbed)": "ms_min"}
cell_ms = {}  # {"B": {"n": ms}}: the cell statistic chosen below, which every figure of this section uses
with st.expander("The measured forward costs c(B, n) behind the gain, and the verify-cost curve", expanded=False):
    surface = chosen_surface()
    cell_ms = {}  # {"B": {"n": ms}}: the cell statistic chosen below, which every figure of this section uses
    if surface is not None:
        m, config, noise = surface["machine"], surface["config"], surface["noise"]
        st.markdown(f"**Measured:** {machine_label(surface)}, {config['context_len']} tokens already cached per sequence, "
                    f"logits for every new token (as the engine verifies), {surface['forward']}.")
        statistic = st.radio("Each cell is the", [s for s, field in CELL_STATISTICS.items() if field in surface],
                             horizontal=True, key="cost_b_stat")
        cell_ms = surface[CELL_STATISTICS[statistic]]
        c1, c2 = st.columns(2)
        with c1:
            surface_heatmap(analysis.surface_grid(cell_ms), "c(B, n): ms per forward (measured)", ".0f", "cost_b_ms")
        with c2:
            surface_heatmap(analysis.surface_ratios(cell_ms), "c(B, n) ÷ c(B, 1) (measured)", ".2f", "cost_b_ratio")
        st.caption(f"Measured {m['date']} by `{surface['command']}`: {config['rounds']} rounds, every round over all cells "
                   "in a new shuffled order after an untimed warm-up round; each cell the median of its rounds or its "
                   "fastest. Spread of a cell (interquartile range ÷ median): median "
                   f"{noise['median_relative_iqr']:.1%}, largest {noise['max_relative_iqr']:.1%}; memory bandwidth "
                   f"{m['bandwidth_gb_s']:.1f} GB/s.")
        if noise["median_relative_iqr"] > 0.25:
            st.warning(f"This surface was measured on a busy machine: in half its cells the middle half of the rounds "
                       f"spans more than {noise['median_relative_iqr']:.0%} of the median. Single cells are uncertain; "
                       "read the trend across B and n, and compare the median with the fastest round.")
        lean = surface.get("lean_b1_ms")
        if lean:
            ms1 = surface["ms"].get("1", {})
            pairs = ", ".join(f"n = {n}: {lean[n]:.0f} vs {ms1[n]:.0f} ms" for n in lean if n in ms1)
            st.caption(f"B = 1 both ways, in the same rounds (medians): {surface['lean_b1_forward']} (what the engine runs at "
                       f"batch 1, one sequence only) vs the batched transformers forward: {pairs}. The surface uses the "
                       "batched forward throughout, so its B = 1 row is that path's, not the engine's.")
            verify_cost_curve(surface)

st.subheader("The predicted gain at each batch size")
st.latex(r"\text{gain}(B) = \frac{E(\alpha, K)}{c(B, K{+}1) / c(B, 1) + K \cdot d}, \qquad "
         r"E(\alpha, K) = \frac{1 - \alpha^{K+1}}{1 - \alpha}")
st.caption("E(α, K): Leviathan et al., 2023, *Fast Inference from Transformers via Speculative Decoding*. c(B, n): "
           "the measured surface above. d: the draft's cost per drafted token in plain forwards c(B, 1), charged as "
           "the roofline model charges it. The model's forward time is max(weights ÷ bandwidth, 2 × params × tokens "
           "÷ FLOP/s), KV-cache reads ignored.")
chain_runs = {name: analysis.summarise(e) for name, e in runs.items() if is_chain(e[0]["drafter"])}
chain_runs = {name: s for name, s in chain_runs.items() if s.alpha is not None}
c = st.columns(3)
alpha_source = c[0].selectbox("α from", [*chain_runs, "slider"], index=best_run(list(chain_runs), runs),
                              key="cost_b_alpha_source") if chain_runs else "slider"
if alpha_source == "slider":
    alpha = c[0].slider("α", 0.0, 0.99, 0.7, key="cost_b_alpha")
else:
    alpha = min(chain_runs[alpha_source].alpha, 0.99)
    c[0].caption(f"α = {alpha:.3f}: accepted ÷ tested ({chain_runs[alpha_source].accepted_tested} of "
                 f"{chain_runs[alpha_source].tested}), measured in this session.")
k = c[1].slider("K", 1, 10, 4, key="cost_b_k")
draft_cost = c[2].slider("draft cost per token (in target forwards)", 0.0, 0.5, 0.05, 0.01, key="cost_b_draft")
c = st.columns(4)
params_b = c[0].number_input("Parameters (billions)", 0.1, 2000.0, 70.0, key="cost_b_params")
bw = c[1].number_input("Bandwidth (TB/s)", 0.1, 50.0, analysis.GPU_DATASHEET["H100 SXM"]["bandwidth_tb_s"], key="cost_b_bw")
tflops = c[2].number_input("Dense 16-bit TFLOP/s", 1.0, 10000.0, analysis.GPU_DATASHEET["H100 SXM"]["bf16_tflops"],
                           key="cost_b_flops")
gpus_b = c[3].number_input("GPUs (tensor parallel)", 1, 64, 8, key="cost_b_gpus")
batches = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
speedups = analysis.batch_speedup_model(batches, params_b * 1e9, 2.0, bw * 1e12 * gpus_b, tflops * 1e12 * gpus_b,
                                        alpha, k, draft_cost)
fig = go.Figure(go.Scatter(x=batches, y=speedups, mode="lines+markers", line={"dash": "dash"},
                           name=f"MODELLED: {params_b:g}B, 16-bit, {gpus_b} GPUs of {bw:g} TB/s and {tflops:g} TFLOP/s (roofline)"))
gains = {}
if surface is not None and all(str(k + 1) in row for row in cell_ms.values()):
    gains = analysis.measured_batch_gain(cell_ms, alpha, k, draft_cost)
    fig.add_trace(go.Scatter(x=list(gains), y=list(gains.values()), mode="lines+markers",
                             name=f"MEASURED surface: {machine_label(surface)}"))
elif surface is not None:
    st.info(f"The surface measures n = {', '.join(map(str, surface['config']['new_tokens']))} new "
            f"tokens per sequence; the measured curve needs n = K + 1 = {k + 1}, so the chart shows the model only.")
fig.add_hline(y=1.0, line_dash="dot", annotation_text="no gain")
fig.update_layout(title=f"Speedup vs batch size, α = {alpha:.2f}, K = {k}, d = {draft_cost:.2f}", height=380,
                  xaxis={"type": "log", "title": "batch size B (sequences)"}, yaxis={"title": "speedup"},
                  legend={"orientation": "h", "y": -0.25}, margin={"l": 10, "r": 10, "t": 40, "b": 10})
st.plotly_chart(fig, key="cost_batch")
crossover = tflops * 1e12 * 2.0 / (2 * bw * 1e12)  # tokens per forward where weights/bandwidth = 2·P·n/FLOPS
st.caption(f"The model's defaults: H100 SXM datasheet figures (3.35 TB/s, 989 dense BF16 TFLOP/s per GPU; NVIDIA H100 "
           f"datasheet), 16-bit weights, {gpus_b} GPUs with perfect scaling. The modelled forward turns compute-bound "
           f"at about {crossover:.0f} tokens (batch × (K + 1) for the speculative step, batch for the plain one). Real "
           "servers also pay for KV-cache reads and scheduling, so treat the model as the shape of the effect. The "
           "measured curve is a prediction from measured forward costs (same α, K and d), not a measured batched "
           "decode, and it holds for the machine and model that measured the surface.")

with st.expander("What the gain does to the cost per token at that machine", expanded=False):
    if not gains:
        st.info("Needs the measured curve above (a surface that measured n = K + 1).")
    else:
        usd_hour = st.number_input("$ per hour of the machine that measured the surface", 0.0, 1000.0, 0.10, 0.01,
                                   key="cost_b_price", help="Enter your own price; the default is an example, not a quote.")
        rows = analysis.batch_node_rows(cell_ms, alpha, k, draft_cost, usd_hour)
        st.dataframe([{"B": r["batch"], "plain tokens/s (all B)": round(r["plain_tokens_per_s"], 1),
                       "speculative tokens/s (all B, predicted)": round(r["spec_tokens_per_s"], 1),
                       "$/M plain": round(r["plain_usd_per_million"], 4), "$/M speculative": round(r["spec_usd_per_million"], 4),
                       "gain": round(gains[r["batch"]], 2)} for r in rows], hide_index=True)
        st.caption("A node is paid for by its total throughput: $/M tokens = price ÷ (tokens/s of the whole node over all "
                   "B sequences × 3600) × 10⁶ (section 1's formula). Plain: B tokens per c(B, 1). Speculative: B · E(α, K) "
                   "tokens per step of c(B, K + 1) + K · d · c(B, 1), from the measured surface. "
                   f"{batching_note(rows)}")

# ------------------------------------------------------------------------------------------ many clients
st.header("5. Many clients: throughput under concurrency")
st.markdown(
    "Sections 3 and 4 ask what speculation does for one stream or inside one batch. A server is asked something "
    "else: with N clients streaming at once, how many tokens per second come out in total, and how long does each "
    "wait for its first token? **Our engine decodes one run at a time**: `specviz serve` queues the other clients' "
    "runs, so its aggregate stays at one stream's speed however many clients there are, and their first tokens "
    "wait behind the runs ahead of them. **vLLM batches**: each of its forwards advances every running request, "
    "and while a forward is memory-bound a few more tokens in it cost little (section 4), so its aggregate grows "
    "with the clients. Throughput under concurrency comes from vLLM's batching, and that is what this table "
    "measures: specviz's engine shows what speculation does to one stream, step by step; to serve many clients, "
    "run vLLM, with our EAGLE-3 head as its drafter (docs/vllm.md)."
)


def load_figure(table: dict) -> go.Figure:
    """Aggregate tokens/s against clients, a line a lane: the median over rounds, its bar the rounds' min–max."""
    fig = go.Figure()
    for lane in table["lanes"]:
        rows = [lane["by_clients"][str(n)] for n in table["clients"]]
        middle = [r["aggregate_tokens_per_s"] for r in rows]
        fig.add_scatter(name=lane["label"], x=table["clients"], y=middle, mode="lines+markers",
                        line={"dash": "solid" if lane["engine"] == "vLLM" else "dot"},
                        error_y={"type": "data", "symmetric": False,
                                 "array": [r["aggregate_range"][1] - m for r, m in zip(rows, middle)],
                                 "arrayminus": [m - r["aggregate_range"][0] for r, m in zip(rows, middle)]})
    fig.update_layout(title="Aggregate tokens/s against clients streaming at once", height=380,
                      xaxis={"title": "clients at once", "type": "log", "tickvals": table["clients"]},
                      yaxis={"title": "tokens/s, all clients together", "rangemode": "tozero"},
                      legend={"orientation": "h", "y": -0.25}, margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig


def growth_note(table: dict) -> str:
    """How much each lane's aggregate grows from the fewest clients to the most, from the table's own numbers."""
    first, last = str(table["clients"][0]), str(table["clients"][-1])
    grown = [f"{lane['label']} {lane['by_clients'][last]['aggregate_tokens_per_s'] / start:.1f}×"
             for lane in table["lanes"] if (start := lane["by_clients"][first]["aggregate_tokens_per_s"]) > 0]
    return f"From {first} to {last} clients the aggregate grows: {', '.join(grown)}." if first != last and grown else ""


def load_rows(table: dict) -> list[dict]:
    """The table's rows: every lane at each number of clients, its aggregate and its first-token times."""
    rows = []
    for n in table["clients"]:
        for lane in table["lanes"]:
            s = lane["by_clients"][str(n)]
            rows.append({"clients": n, "lane": lane["label"], "engine": lane["engine"],
                         "aggregate tokens/s (median)": round(s["aggregate_tokens_per_s"], 1),
                         "min": round(s["aggregate_range"][0], 1), "max": round(s["aggregate_range"][1], 1),
                         "first token, median (s)": seconds(s["ttft_median_s"]),
                         "first token, p90 (s)": seconds(s["ttft_p90_s"]), "runs": s["runs"], "errors": s["errors"]})
    return rows


def seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


with st.expander("The measured load table: tokens/s and first-token times against clients", expanded=False):
    table = uploaded_or_shipped("load table", "python scripts/load_table.py --json-out FILE.json", "cost_load_upload",
                                loadtable.parse_load_table, loadtable.load_load_table, loadtable.SHIPPED)
    if table is None:
        st.info("No load table to show yet. Make one on a machine with vLLM installed (docs/vllm.md): the script starts "
                "vLLM plain, vLLM with our EAGLE-3 head and `specviz serve`, measures 1, 4 and 16 clients in interleaved "
                "rounds, and writes the JSON this section reads; then load it above.")
        st.code(loadtable.COMMAND, language="bash")
    else:
        st.plotly_chart(load_figure(table), key="cost_load")
        st.dataframe(load_rows(table), hide_index=True)
        failed = [f"{lane['label']} at {n} clients: {s.get('first_error')}" for lane in table["lanes"]
                  for n, s in lane["by_clients"].items() if s["errors"]]
        if failed:
            st.warning("Some runs failed (their tokens are not counted); the first error of each lane and number of "
                       "clients that had one: " + "; ".join(failed))
        versions = ", ".join(f"{k} {v}" for k, v in table.get("versions", {}).items())
        st.caption(f"Measured {table['date']} by `{table['command']}` on {table['cpu']}, {table['cores']} cores; "
                   f"{table['setup']}" + (f"; {versions}" if versions else "") + f". {table['rounds']} rounds, at most "
                   f"{table['max_new_tokens']} new tokens a run, T = 0. A point is the median over rounds of a phase's "
                   "tokens ÷ its wall time, its bar the rounds' min–max; the first token is timed from a run's request "
                   f"to its first committed token, over every run. {growth_note(table)}")
