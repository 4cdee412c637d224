"""Server observatory: a running vLLM or llama-server's speculation, live, from its Prometheus /metrics.

Render only: scraping, windows and the cost model live in specviz/observatory.py."""
from datetime import datetime

import plotly.graph_objects as go
import streamlit as st

from app import figures, state
from specviz import observatory as obs
from specviz.bench import batch as batch_surface
from specviz.errors import SpecvizError

state.intro(
    "Server observatory",
    "Point this page at a running vLLM or llama.cpp server (llama-server, started with `--metrics`) and watch it "
    "speculate: acceptance, mean acceptance length, acceptance at each draft position and throughput, read from its "
    "Prometheus `/metrics` every second or two.  \nNothing here decodes: every number is a difference of the "
    "server's own counters between two reads.",
)

WATCHERS = "obs_watchers"  # session key: {url: Watcher}, the history of each server watched in this session
BASELINE = "obs_baseline"  # session key: a plain tokens/s kept from a window: {"tokens_per_s", "kind", "source"}
COSTS = ("flat: c(n) = 1", "entered: c(K + 1) = r", "measured: the shipped CPU batch surface")
FORMULA = (r"\text{predicted speedup} = \frac{f + (1 - f)\,\hat L}{f + (1 - f)\,\big(c(K{+}1) + d\,K\big)}, "
           r"\qquad \hat L = 1 + \sum_i a_i")
CHART_MARGIN = {"l": 10, "r": 10, "t": 40, "b": 10}

c = st.columns([3, 1, 1, 2])
address = c[0].text_input("Server address", key="obs_url", placeholder="http://127.0.0.1:8080",
                          help="http://host:port of a vLLM server or a llama-server; vllm+http://... and "
                               "llama+http://... (the app's engine addresses) work too.")
every = c[1].select_slider("Refresh every (s)", [0.5, 1.0, 1.5, 2.0], 1.0, key="obs_every")
span = c[2].number_input("Window (s)", 2, 600, 30, key="obs_span",
                         help="The numbers at the top are the differences of the counters over the last this many "
                              "seconds.")
token = c[3].text_input("Bearer token (optional)", type="password", key="obs_token",
                        help="llama-server started with --api-key asks for it on /metrics too; vLLM's /metrics asks "
                             "for none.")

with st.expander("Speedup: the cost model and the plain baseline"):
    c = st.columns(3)
    cost_name = c[0].selectbox("Verify cost c(n), relative to one token", COSTS, key="obs_cost",
                               help="flat: verifying K + 1 tokens costs one plain forward (a forward bound by reading "
                                    "the weights); entered: your r; measured: the CPU batch surface shipped with "
                                    "specviz (`specviz batch-cost`), a small model on a CPU, not the server's.")
    ratio = c[0].number_input("r = c(K + 1)", 1.0, 100.0, 1.1, 0.05, key="obs_ratio",
                              disabled=cost_name != COSTS[1])
    draft_cost = c[1].number_input("d: draft cost per drafted token (in target forwards)", 0.0, 5.0, 0.0, 0.01,
                                   key="obs_d", help="0 for n-gram lookup; for a draft model or a head, its forward "
                                                     "time ÷ the target's.")
    baseline_from = c[2].radio("Plain tokens/s from", ("entered", "kept from a window"), horizontal=True,
                               key="obs_baseline_from",
                               help="Keep one with the button under the speedup while the page watches the server "
                                    "without speculation (the same server restarted plain, or a plain one beside it).")
    entered = c[2].number_input("Plain tokens/s (entered; 0: none)", 0.0, 1e7, 0.0, key="obs_plain",
                                disabled=baseline_from != "entered")


def fmt(value: float | None, spec: str) -> str:
    """A number in a format spec, a trailing × kept after it ("2.15×"); "–" for none."""
    times = spec.endswith("×")
    return "–" if value is None else format(value, spec.removesuffix("×")) + "×" * times


def baseline() -> tuple[float | None, str]:
    """The plain tokens/s a measured speedup divides by, and where it came from."""
    if baseline_from == "entered":
        return (entered, "entered") if entered > 0 else (None, "none entered yet")
    kept = st.session_state.get(BASELINE)
    if kept is None:
        return None, "none kept yet: watch the server without speculation and press the button below"
    return kept["tokens_per_s"], f"kept from {kept['source']}, {kept['kind']}"


@st.cache_data(show_spinner=False)
def shipped_surface() -> dict:
    return batch_surface.load_surface()


def verify_cost(w: obs.Window):
    """c(n) relative to one token, as chosen above, and a note on where it comes from."""
    if cost_name == COSTS[0]:
        return obs.flat_cost, "c(n) = 1 (flat)"
    if cost_name == COSTS[1]:
        return (lambda n: ratio), f"c(K + 1) = {ratio:g} (entered)"
    try:
        surface = shipped_surface()
    except SpecvizError as err:
        st.error(f"The shipped batch surface could not be read ({err}); the prediction uses c(n) = 1.")
        return obs.flat_cost, "c(n) = 1 (flat: the surface could not be read)"
    b = min(surface["ms"], key=lambda row: abs(int(row) - max(1.0, w.running)))
    m = surface["machine"]
    return obs.relative_cost(surface["ms"][b]), (
        f"c(B, n) ÷ c(B, 1) of {surface['model']} on {m.get('gpu') or m['cpu']} at B = {b}, the row nearest the "
        f"requests running, measured {m['date'][:10]} by `specviz batch-cost`: a small model on a CPU, not the server's")


def watcher_for(url: str) -> obs.Watcher:
    watchers = st.session_state.setdefault(WATCHERS, {})
    if url not in watchers:
        watchers[url] = obs.Watcher(url)
    watchers[url].token = token or None
    return watchers[url]


def headline(w: obs.Window, latest: obs.Snapshot, watcher: obs.Watcher) -> None:
    m = st.columns(7)
    m[0].metric("engine", obs.ENGINES[w.engine])
    m[1].metric("acceptance rate", fmt(w.acceptance_rate, ".3f"), help="accepted ÷ drafted tokens")
    m[2].metric("mean acceptance length", fmt(w.mean_acceptance_length, ".2f"),
                help="1 + accepted ÷ drafts, the bonus token counted: tokens per draft verified, over the steps that "
                     "drafted, as vLLM and llama.cpp name and define it. Not τ: the other pages' τ divides by every "
                     "target forward, steps that drafted nothing included, and is smaller wherever some steps do not "
                     "draft (prompt lookup that finds no match).")
    m[3].metric("drafted tokens/s", f"{w.drafted_per_s:.1f}")
    m[4].metric("accepted tokens/s", f"{w.accepted_per_s:.1f}")
    m[5].metric("generated tokens/s", f"{w.generated_per_s:.1f}", help="wall clock, every request together")
    m[6].metric("requests running", f"{w.running:g}")
    if not w.speculative:
        st.info(obs.no_speculation(latest))
    names = obs.METRICS[w.engine]
    lag = (" llama-server adds a request's counts when the request finishes, so a window holds the requests that "
           "finished in it." if w.engine == "llamacpp" else "")
    st.caption(f"Over the last {w.seconds:.1f} s of reads of {watcher.url}/metrics, every {every:g} s: the "
               f"differences of `{names['draft_tokens']}_total` (drafted), `{names['accepted']}_total` (accepted), "
               f"`{names['drafts']}_total` (drafts: one per request per verify step that checked a draft, so a batched step over B requests adds B) and `{names['generated']}_total` (generated), "
               f"summed over their label sets, each ÷ the seconds between the reads; requests running: the gauge "
               f"`{names['running']}` at the latest read.{lag}")


def charts(windows: list[obs.Window], w: obs.Window) -> None:
    left, right = st.columns(2)
    with left:
        per = w.per_position
        fig = go.Figure(go.Bar(x=[str(i + 1) for i in range(len(per))], y=list(per),
                               text=[f"{a:.2f}" for a in per], textposition="outside"))
        fig.update_layout(title="Acceptance at each draft position (this window)", height=320, margin=CHART_MARGIN, modebar=figures.TOOLBAR,
                          xaxis={"title": "draft position i (1: the first drafted token)", "type": "category"},
                          yaxis={"title": "share of all drafts accepting it", "range": [0, 1.1]})
        st.plotly_chart(fig, key="obs_positions")
        st.caption(f"aᵢ = `{obs.METRICS[w.engine]['accepted_per_pos']}_total{{position=\"i − 1\"}}` ÷ drafts, over the "
                   "window: over every draft, as vLLM and llama.cpp divide, so a draft that stopped short of position "
                   "i counts as not accepting it. (The *Topologies* page's per-position acceptance divides by the "
                   "drafts that reached depth d instead; the two differ wherever the draft length varies.) A chain "
                   "accepts position i only when it accepted every position before it, so the bars can only fall.")
    with right:
        rates = [v.acceptance_rate for v in windows if v.acceptance_rate is not None]
        fig = go.Figure(go.Histogram(x=rates, xbins={"start": 0.0, "end": 1.0001, "size": 0.05}))
        fig.update_layout(title=f"Acceptance rate of each {every:g} s window ({len(rates)} with speculation)",
                          height=320, margin=CHART_MARGIN, modebar=figures.TOOLBAR, xaxis={"title": "accepted ÷ drafted", "range": [0, 1]},
                          yaxis={"title": "windows"})
        st.plotly_chart(fig, key="obs_histogram")
        st.caption("A histogram over requests needs each request's own counts, which /metrics, a running total, does "
                   "not carry: this one is over the windows between two reads.")
    x = [datetime.fromtimestamp(v.end_wall) for v in windows]
    fig = go.Figure([go.Scatter(x=x, y=[v.drafted_per_s for v in windows], name="drafted tokens/s", mode="lines"),
                     go.Scatter(x=x, y=[v.accepted_per_s for v in windows], name="accepted tokens/s", mode="lines"),
                     go.Scatter(x=x, y=[v.generated_per_s for v in windows], name="generated tokens/s", mode="lines",
                                line={"dash": "dot"})])
    fig.update_layout(title="Tokens per second, between each two reads", height=320, margin=CHART_MARGIN, modebar=figures.TOOLBAR,
                      yaxis={"title": "tokens/s", "rangemode": "tozero"}, legend={"orientation": "h", "y": -0.2})
    st.plotly_chart(fig, key="obs_rates")


def speedup(w: obs.Window, url: str) -> None:
    st.subheader("Predicted and measured speedup")
    cost, cost_note = verify_cost(w)
    prediction = obs.predict_window(w, cost, draft_cost)
    rate, kind = w.speed()
    plain, plain_note = baseline()
    measured = obs.measured_speedup(rate, plain)
    m = st.columns(6)
    m[0].metric("predicted speedup", fmt(prediction and prediction.speedup, ".2f×"))
    m[1].metric("measured speedup", fmt(measured, ".2f×"))
    m[2].metric("L̂ = 1 + Σ aᵢ", fmt(prediction and prediction.mean_length, ".2f"),
                help="The predicted mean acceptance length (tokens per draft verified), not τ.")
    m[3].metric("K (drafted tokens per draft)", fmt(prediction and prediction.k, ".2f"))
    m[4].metric("c(K + 1) + d·K", fmt(prediction and prediction.verify_cost + prediction.draft_cost * prediction.k, ".2f"))
    m[5].metric("f (steps without a draft)", fmt(prediction and prediction.plain_share, ".2f"))
    st.latex(FORMULA)
    st.caption(f"Predicted: aᵢ, K = drafted ÷ drafts and f = (generated − drafts − accepted) ÷ (that + drafts) from "
               f"this window's counters, c from {cost_note}, d = {draft_cost:g} as entered. L̂ equals the measured "
               "mean acceptance length (Σ aᵢ = accepted ÷ drafts), so the prediction tests the cost model. Measured: "
               f"this window's {kind}, {rate:.1f}, ÷ the plain tokens/s, "
               + (f"{plain:.1f} ({plain_note})" if plain else plain_note) + "; compare them under the same load.")
    if st.button("Keep this window's tokens/s as the plain baseline", key="obs_keep"):
        when = datetime.fromtimestamp(w.end_wall).strftime("%H:%M:%S")
        st.session_state[BASELINE] = {"tokens_per_s": rate, "kind": kind, "source": f"{url} at {when}"}
        st.success(f"Kept {rate:.1f} tokens/s ({kind}) from {url} at {when}; pick “kept from a window” above to use it.")


def live(watcher: obs.Watcher) -> None:
    """One read of the server and everything drawn from its history."""
    try:
        watcher.poll()
    except SpecvizError as err:
        st.error(str(err))
        if len(watcher.history) < 2:
            return
        st.caption("Below: the reads that succeeded before.")
    latest = watcher.history[-1]
    if watcher.restarts:
        when = datetime.fromtimestamp(watcher.restarts[-1]).strftime("%H:%M:%S")
        st.warning(f"The server restarted (its counters went back) by {when}: the history starts again there.")
    w = watcher.recent(span)
    if w is None:
        st.info(f"{obs.ENGINES[latest.engine]} at {watcher.url}: one read so far; the numbers need a second one "
                "(at the next refresh).")
        return
    headline(w, latest, watcher)
    charts(watcher.windows(), w)
    speedup(w, watcher.url)


if not address.strip():
    st.info("Enter the address of a running vLLM server or llama-server (started with `--metrics`); "
            "docs/observatory.md says how to start one.")
else:
    try:
        watcher = watcher_for(obs.server_url(address))
    except SpecvizError as err:
        st.error(str(err))
    else:
        st.fragment(run_every=every)(live)(watcher)
