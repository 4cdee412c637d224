from dataclasses import replace

import plotly.graph_objects as go
import streamlit as st

from app import figures, state

state.intro(
    "Topology race",
    "The same prompt, seed and sampling settings through every drafter available for this model, one after "
    "another on the same target.  \nCompare how many tokens each target forward produced (τ), where the time goes "
    "(draft vs verify), and the measured speedup over plain autoregressive decoding (`none`).",
)
shared, settings = state.require_model()
if shared is None:
    st.stop()

drafters = shared.drafters() + shared.variants()
prompt = st.text_input("Prompt", state.DEFAULT_PROMPT, key="race_prompt")
c1, c2 = st.columns([1, 3])
max_new = c1.number_input("Max new tokens", 1, 256, min(settings.max_new_tokens, 32), key="race_max_new",
                          help="Kept small by default: the drafters run one after another.")
chosen = c2.multiselect("Drafters", drafters, default=drafters, key="race_drafters")
cache = st.session_state.setdefault("race_cache", {})  # (run_key(d), d) → events; revisits reuse runs


def run_key(drafter: str) -> tuple:
    """What a run depends on besides its drafter: the prompt and the sidebar's settings; the tree settings only
    for eagle2 (changing them re-runs only the eagle2 runs)."""
    return prompt, replace(settings, drafter="", max_new_tokens=int(max_new), tree=settings.tree_for(drafter))


todo = [d for d in chosen if (run_key(d), d) not in cache]
st.caption(f"temperature {settings.temperature}, top-p {settings.top_p}, top-k {settings.top_k}, K {settings.k}, "
           f"seed {settings.seed} (from the sidebar). "
           + (f"{len(chosen) - len(todo)} of {len(chosen)} runs are cached for these settings." if chosen else ""))

if st.button(f"Run the race ({len(todo)} to run)" if todo else "All runs cached: rerun", type="primary",
             key="race_run", disabled=not chosen):
    todo = todo or chosen
    bar = st.progress(0.0, text="starting…")
    for i, drafter in enumerate(todo):
        def tick(event, evs, i=i, drafter=drafter):
            made = sum(len(s["committed"]) for s in state.steps_of(evs))
            bar.progress(min((i + made / max_new) / len(todo), 1.0),
                         text=f"{drafter} ({i + 1} of {len(todo)}): {made} / {max_new} tokens")
        events = state.run_decode(shared, prompt, settings, on_event=tick, drafter=drafter, max_new_tokens=int(max_new))
        if events is None:
            break
        cache[(run_key(drafter), drafter)] = events
    bar.empty()
    if events is not None:
        st.rerun()  # redraw with the new runs (and the button's label) from the cache

runs = {d: cache[(run_key(d), d)] for d in chosen if (run_key(d), d) in cache}
if not runs:
    st.info("Press **Run the race** to decode with each drafter.")
    st.stop()

base = runs.get("none")
base_tps = state.done_of(base)["stats"]["tokens_per_s"] if base else None
rows = []
for name, events in runs.items():
    stats = state.done_of(events)["stats"]
    rows.append({
        "drafter": name,
        "tokens": stats["new_tokens"],
        "steps": stats["steps"],
        "τ (tokens/step)": round(stats["tau"], 2),
        "acceptance": None if stats["acceptance_rate"] is None else round(stats["acceptance_rate"], 3),
        "tokens/s": round(stats["tokens_per_s"], 2),
        "speedup vs none": round(stats["tokens_per_s"] / base_tps, 2) if base_tps else None,
        "draft s": round(stats["draft_s"], 2),
        "verify s": round(stats["verify_s"], 2),
        "same text as none (greedy)": (state.done_of(events)["token_ids"] == state.done_of(base)["token_ids"])
        if base and settings.temperature == 0 else None,
    })
st.subheader("Results")
st.dataframe(rows, hide_index=True)
st.caption(f"Speedup = tokens/s ÷ tokens/s of `none`, measured in this session with the engine {shared.where()}. "
           "At temperature 0 "
           "every drafter must produce the same text as `none` (greedy decoding is exactly preserved). "
           + ("" if base else "Add `none` to the drafters to get speedups."))

st.subheader("Which tokens each step produced")
cols = st.columns(min(len(runs), 2))
for i, (name, events) in enumerate(runs.items()):
    cols[i % len(cols)].plotly_chart(figures.race_timeline(name, state.steps_of(events)), key=f"race_tl_{name}")
st.html(figures.legend_html())

st.subheader("Where the time goes")
st.plotly_chart(figures.timing_breakdown({n: state.steps_of(e) for n, e in runs.items()}), key="race_timing")

c1, c2 = st.columns(2)
fig = go.Figure(go.Bar(x=list(runs), y=[state.done_of(e)["stats"]["tokens_per_s"] for e in runs.values()],
                       marker_color="#1f77b4"))
fig.update_layout(title="tokens/s (measured)", height=300, margin={"l": 10, "r": 10, "t": 40, "b": 10})
c1.plotly_chart(fig, key="race_tps")
fig = go.Figure()
for name, events in runs.items():
    per_position = state.done_of(events)["stats"]["per_position_acceptance"]
    if per_position:
        fig.add_trace(go.Scatter(x=list(range(1, len(per_position) + 1)), y=per_position, mode="lines+markers", name=name))
fig.update_layout(title="per-position acceptance", height=300, xaxis={"title": "depth d", "dtick": 1},
                  yaxis={"range": [0, 1.05], "title": "steps accepting at d ÷ steps reaching d"},
                  margin={"l": 10, "r": 10, "t": 40, "b": 10})
c2.plotly_chart(fig, key="race_pos")

pick = st.selectbox("Open one run in the tree explorer and the lab", list(runs), key="race_pick")
if st.button("Use this run", key="race_use"):
    state.set_trace(runs[pick], f"race run ({pick})")
    st.success(f"The {pick} run is now the one the *EAGLE tree explorer* and *Rejection sampling lab* show.")
