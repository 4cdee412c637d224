"""Why it works: decoding one token streams every weight through memory once, so a step costs about the
same whether the target scores 1 token or 5. Speculative decoding uses that idle compute."""
import plotly.graph_objects as go
import streamlit as st

from app import regimes, state, teaching
from specviz import analysis
from specviz.bench import probes
from specviz.drafters import PLAIN

state.intro(
    "Why speculative decoding works",
    "Generating one token at batch 1 reads **every weight of the model from memory once**, so the time per "
    "token is set by memory bandwidth, not arithmetic.  \nA cheap **draft** guesses a few tokens ahead and the "
    "big **target** checks them all in one forward pass, which, where decoding is memory-bound, costs about the same "
    "as producing one token (section 2 measures whether it is on this machine).",
)
st.info("**Notation used on every page:** **p** is the target model's probability distribution, **q** the "
        "draft's (both after temperature, top-k and top-p). τ (tau) = tokens committed per target forward.")



def premise_measured(shared) -> None:
    """The premise on this machine: the verify-cost curve, ms for n = 1…16 tokens, of every weight set the model
    runs on here, beside the measured bandwidth, and the regime each set is in, chosen from the measurement."""
    st.subheader("Does one forward over several tokens cost about one over a single token here?")
    st.markdown("The premise of speculative decoding, measured: c(n), one verify forward of the target over n tokens "
                "(as a tree of drafted tokens, after 128 cached ones), on each weight set this model runs on here.")
    if shared is None or not shared.capabilities.bench:
        st.info("Measured where the app runs the engine itself (`make run` on the engine's machine).")
        return
    if st.button("Measure the verify cost on every weight set", key="ov_regimes"):
        found = {}
        with st.spinner("Measuring the verify-cost curve of each weight set (once per loaded model)…"):
            for weights in state.weight_sets(shared):
                backend = state.on_weights(shared, weights)
                if backend is not None and state.verify_ratio(backend) is not None:
                    found[weights] = {n: 1e3 * t for n, t in sorted(backend.models_here().verify_curve.items()) if n <= 16}
            gb_s = probes.BandwidthProbe(shared.models_here().device).measure()
        st.session_state["ov_premise"] = {"curves": found, "gb_s": gb_s, "where": shared.where()}
    measured = st.session_state.get("ov_premise")
    if not measured or not measured["curves"]:
        return
    chart, side = st.columns([3, 1])
    fig = go.Figure([go.Scatter(x=list(curve), y=list(curve.values()), mode="lines+markers",
                                name=f"{weights} ({regimes.weights_words(weights)})")
                     for weights, curve in measured["curves"].items()])
    fig.update_layout(title="verify cost c(n), measured here", height=320, xaxis={"title": "n tokens verified",
                      "dtick": 1}, yaxis={"title": "ms", "rangemode": "tozero"}, legend={"orientation": "h"},
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    chart.plotly_chart(fig, key="ov_premise_chart")
    side.metric("Copy bandwidth (measured)", f"{measured['gb_s']:,.1f} GB/s")
    ratios = {w: regimes.cost_ratio(curve) for w, curve in measured["curves"].items()}
    for weights, ratio in ratios.items():
        side.metric(f"c(8) ÷ c(1), {weights}", f"{ratio:.2f}")
    st.info(regimes.regime_sentence(ratios))
    st.caption(f"Measured {measured['where']}: each c(n) the median of 3 timed forwards (specviz.decoding.costs."
               "verify_curve, the curve the tree drafters' auto budget reads); bandwidth as section 2's. The "
               "*Topology race*'s preset *Where speculation pays and where it does not* races both sets.")


# ---------------------------------------------------------------------------------------- calculator
st.header("1. The memory-bandwidth calculator")
H100 = analysis.GPU_DATASHEET["H100 SXM"]["bandwidth_tb_s"]
H200 = analysis.GPU_DATASHEET["H200"]["bandwidth_tb_s"]
# (parameters in billions, bytes per parameter, TB/s of all the GPUs together, a note on whether it fits)
PRESETS = {
    "70B model, 16-bit, 2× H100 SXM (2 × 3.35 TB/s)": (
        70.0, 2.0, 2 * H100, "140 GB of weights do not fit in one 80 GB H100: two GPUs (tensor parallel) each "
        "hold and stream half of them, so their bandwidths add up."),
    "70B model, 16-bit, 2× H200 (2 × 4.8 TB/s)": (
        70.0, 2.0, 2 * H200, "The weights take 70e9 × 2 bytes = 140e9 bytes = 130 GiB; one H200's 141 GB of HBM3e "
        "(about 141 GiB of device memory) would leave about 10 GiB before the runtime's own overhead, little room "
        "for the KV cache of many sequences: two GPUs split the weights and add their bandwidths."),
    "8B model, 16-bit, H100 SXM (3.35 TB/s)": (8.0, 2.0, H100, "16 GB of weights: fits one GPU with room for the KV cache."),
    "70B model, 4-bit, H100 SXM (3.35 TB/s)": (70.0, 0.5, H100, "35 GB of 4-bit weights fit one 80 GB H100."),
}
preset = st.selectbox("Preset", list(PRESETS), key="ov_preset")
params_b, bpp, bw, fits = PRESETS[preset]
st.caption(fits)
c1, c2, c3 = st.columns(3)
params_b = c1.number_input("Parameters (billions)", 0.01, 2000.0, params_b, key=f"ov_params_{preset}")
bpp = c2.number_input("Bytes per parameter (2 = 16-bit, 1 = 8-bit, 0.5 = 4-bit)", 0.125, 8.0, bpp, 0.125,
                      key=f"ov_bpp_{preset}")
bw = c3.number_input("Memory bandwidth (TB/s)", 0.01, 100.0, bw, 0.05, key=f"ov_bw_{preset}")
ms = analysis.ms_per_token(params_b * 1e9, bpp, bw * 1e12)
m1, m2, m3 = st.columns(3)
m1.metric("Weights to read per token", f"{params_b * bpp:,.1f} GB")
m2.metric("Milliseconds per token (at least)", f"{ms:,.1f} ms")
m3.metric("Tokens per second (at most)", f"{1000 / ms:,.1f}")
st.caption(f"ms/token = parameters × bytes per parameter ÷ bandwidth = {params_b:g}e9 × {bpp:g} B ÷ {bw:g}e12 B/s. "
           "Bandwidths are datasheet figures, not measured here: H100 SXM 3.35 TB/s (NVIDIA H100 datasheet), "
           "H200 4.8 TB/s (NVIDIA H200 datasheet). Real decoding is slower than the bound (KV-cache reads, kernel "
           "overheads): the shipped bench report's plain decoding reaches about half of it on its CPU (*Benchmarks*, "
           "weight-streaming floor).")

# ------------------------------------------------------------------------------------- this machine
st.header("2. This machine, measured")
st.markdown("The loaded target model's per-token latency on this machine, and how much of it streaming its "
            "weights through memory explains (weights in bytes ÷ the copy bandwidth measured here).")
shared, settings = state.current()
if shared is None:
    st.warning("Load a model in the sidebar to measure it.")
elif not shared.capabilities.bandwidth_probe:
    st.info(f"The engine runs {shared.where()}: this measurement reads the weights in this process, so it is "
            "offered where the app runs the engine itself (`make run` on the engine's machine).")
elif st.button("Measure this machine", key="ov_measure"):
    progress = st.progress(0.0, text="measuring memory copy bandwidth (a 256 MB tensor copy)…")
    models = shared.models_here()
    bandwidth = probes.BandwidthProbe(models.device).measure() * 1e9  # bytes/s, as the bench measures it
    progress.progress(0.3, text="timing the target: 8 plain autoregressive steps…")
    events = state.run_decode(shared, state.DEFAULT_PROMPT, settings, drafter=PLAIN, max_new_tokens=8,
                              temperature=0.0, on_event=lambda e, evs: progress.progress(
                                  min(0.3 + 0.08 * len(state.steps_of(evs)), 1.0),
                                  text=f"timing the target: step {len(state.steps_of(evs))} of 8"))
    progress.empty()
    if events:
        steps = state.steps_of(events)[1:] or state.steps_of(events)  # the first step warms caches up
        st.session_state["ov_measured"] = {
            "model": shared.name,
            "bandwidth": bandwidth,
            "weights": probes.streamed_weight_bytes(models.target),  # what one step reads, as in the bench
            "ms_per_token": sum(s["timing"]["verify_ms"] for s in steps) / len(steps),
            "steps": len(steps),
            "device": str(models.device),
        }
measured = st.session_state.get("ov_measured")
if measured:
    streaming_ms = measured["weights"] / measured["bandwidth"] * 1e3
    a, b, c, d = st.columns(4)
    a.metric("Weights read per step", f"{measured['weights'] / 1e6:,.0f} MB")
    b.metric("Copy bandwidth (measured)", f"{measured['bandwidth'] / 1e9:,.1f} GB/s")
    c.metric("Per-token latency (measured)", f"{measured['ms_per_token']:,.1f} ms")
    d.metric("Share explained by weight streaming", f"{min(streaming_ms / measured['ms_per_token'], 9.99):.0%}")
    st.caption(
        f"Measured on this server ({measured['device']}) for {measured['model']}: latency = mean target forward + "
        f"acceptance test over {measured['steps']} plain steps; bandwidth = 2 × 256 MB ÷ median time of 5 "
        f"tensor copies after a warm-up one (a copy reads and writes; the bench measures it the same way). "
        f"Weight streaming alone would take {streaming_ms:,.1f} ms per token. "
        "On a CPU the rest is arithmetic and framework overhead. On a GPU a model this small would be bound by "
        "kernel launches and framework overhead rather than by bandwidth (not measured here: at the datasheet "
        "bandwidths above its weights would stream in a fraction of a millisecond); weight streaming dominates "
        "for models of billions of parameters, as in the calculator. This page measures only the machine it runs on."
    )

premise_measured(shared)

# ------------------------------------------------------------------------------------ the algorithm
st.header("3. Draft → verify → accept")
st.markdown(
    """
1. **Draft.** A cheap drafter proposes K tokens x₁ … xₖ (a chain), or a tree of alternatives. A draft model
   *samples* each token from its distribution **q**; prompt lookup copies tokens from the context, and the tree
   drafters (Medusa, EAGLE-2) *pick* their top-k candidates: those are point masses (see below).
2. **Verify.** The target runs **one** forward pass over the last committed token plus all drafted tokens and
   gets its distribution **p** at every position at once.
3. **Accept, left to right.** Drafted token x is accepted with probability
"""
)
st.latex(r"\alpha = \min\!\left(1,\ \frac{p(x)}{q(x)}\right) \qquad \text{accept when } u \le \alpha,\ u \sim U(0,1)")
st.markdown("At the first rejection the token is replaced by a sample from the **residual** distribution")
st.latex(r"r(x) = \frac{\max\!\left(0,\ p(x) - q(x)\right)}{\sum_{x'} \max\!\left(0,\ p(x') - q(x')\right)}")
st.markdown(
    """
and the step ends. If every drafted token is accepted, one **bonus** token is sampled from p at the end.
So each target forward commits between 1 and K + 1 tokens.

**Point masses.** A token that was picked rather than sampled (prompt lookup, a tree's top-k children) has
q = δₓ, all its mass on x. The same rule then gives **α = p(x)**, and after a rejection the residual is p with x
removed and renormalised. In a tree the siblings under one parent are tested in turn, each against what is left
of p after the siblings rejected before it (SpecInfer's multi-candidate rule with q = δₓ; the rule SafeAILab's
EAGLE-2/3 code runs on its trees); the *EAGLE tree explorer* shows every test of a real step with the rule it used.
The one exception is an option you must ask for: Medusa's *typical acceptance* (`medusa:typical=true`) replaces this
test by a threshold on the target's probability and is not lossless (the *Topologies* page says how it works).

**Why it is lossless:** the token that comes out is x with probability min(q(x), p(x)) (accepted) plus
(1 − Σ min(p, q)) · r(x) (rejected, then replaced), which adds up to exactly p(x). The output has the target's
distribution whatever the draft is; a better draft only makes it faster. The *Rejection sampling lab* page
lets you watch it by sampling, and *Is it really lossless?* tests it on the real model; a test that sees no
difference only bounds how large one could be, the proof is what makes it exact.
"""
)
st.markdown(teaching.GREEDY_IDENTITY)
st.caption(f"Sources: the rule, the residual and the proof that the output follows p: {teaching.LEVIATHAN} "
           f"(section 2.3 and its appendix) and {teaching.CHEN}, which found it independently. Several candidates "
           f"per position: {teaching.SPECINFER}; point-mass children, as {teaching.SAFEAILAB_EAGLE} (EAGLE-1's "
           "paper samples its children and verifies them with the draft's probabilities instead). The bandwidth bound of section 1: each decode step at batch 1 reads every weight "
           "once, so time ≥ bytes ÷ bandwidth (a lower bound, not a measurement).")
st.caption(teaching.LETTERS_NOTE)
