import time

import streamlit as st

from app import figures, state

state.intro(
    "EAGLE tree explorer",
    "Each step the drafter proposes a tree of guesses (a chain is a tree with one branch); the target scores every "
    "node in one forward pass, using the attention mask on the right so each node sees only its own ancestors.  \n"
    "Nodes are tested from the root down, siblings in order; hover a node for q (draft), its path score, p (target), "
    "the rule its test applied, u and the decision. EAGLE-2 and Medusa children are the draft's top-k **picks**, "
    "not samples, so each is a point mass: α = p(x), and after a rejection x is removed from p and p renormalised "
    "before the next sibling is tested. A sampled chain (the draft model at temperature > 0) uses α = min(1, p/q).",
)
shared, settings = state.current()
trace, source = state.get_trace()

with st.expander("Decode a new run for this page", expanded=not trace):
    if shared is None:
        st.warning("No model is loaded: choose one in the sidebar, or upload a trace on the Live decoding page.")
    else:
        st.caption(f"Uses the sidebar settings: drafter **{settings.drafter}**, K {settings.k}, "
                   f"max {settings.max_new_tokens} new tokens. EAGLE-2 and Medusa draw real trees; n-gram and the "
                   "draft model draw chains.")
        prompt = st.text_input("Prompt", state.DEFAULT_PROMPT, key="tree_prompt")
        if st.button("Run", type="primary", key="tree_run"):
            bar = st.progress(0.0, text="decoding…")
            events = state.run_decode(shared, prompt, settings, on_event=lambda e, evs: bar.progress(
                min(sum(len(s["committed"]) for s in state.steps_of(evs)) / settings.max_new_tokens, 1.0),
                text=f"decoding: step {len(state.steps_of(evs))}"))
            bar.empty()
            if events:
                state.set_trace(events, "run from the tree page")
                trace, source = state.get_trace()

if not trace:
    st.info("No run yet: decode one above or on the *Live decoding* page.")
    st.stop()

steps = [s for s in state.steps_of(trace) if s["nodes"]]
start = trace[0]
st.caption(f"Showing the {source}: drafter `{start['drafter']}`, {len(state.steps_of(trace))} steps, "
           f"{len(steps)} with a draft.")
if not steps:
    st.info("Nothing was drafted in this run (every step was autoregressive), so there is no tree to show. "
            "Pick a drafter other than `none` in the sidebar and run again.")
    st.stop()

numbers = [s["step"] for s in steps]
by_number = {s["step"]: s for s in steps}
c1, c2 = st.columns([5, 1])
chosen = c1.select_slider("Step", options=numbers, value=numbers[0], key="tree_step") if len(numbers) > 1 else numbers[0]
play = c2.button("▶ Play", key="tree_play", help="Step through every drafted step from the chosen one.")
step = by_number[chosen]

def stage_name(b: dict) -> str:
    if b["stage"] == "expand":
        return f"expand depth {b['depth']}"
    if b["stage"] == "lookup":
        return "graft prompt lookup"
    if b["stage"] == "rerank":
        return f"rerank to {b['total_tokens']}"
    return str(b["stage"])  # a stage this version does not know (a newer trace) still gets a name


stage_names = [stage_name(b) for b in step["build"]]
stage = "verified tree"
if stage_names:
    stage = st.radio("Construction", stage_names + ["verified tree"], index=len(stage_names), horizontal=True,
                     key=f"tree_stage_{chosen}",
                     help="EAGLE-2 grows the tree depth by depth (expanding the best top_k candidates by path "
                          "score = product of q along the path), then keeps the best total_tokens of all candidates.")

graph_slot, mask_slot = st.columns([3, 2])
graph = graph_slot.empty()
mask = mask_slot.empty()
table = st.empty()


def show(step: dict, stage: str, key: str) -> None:
    if stage == "verified tree":
        fig = figures.step_tree_figure(step)
    else:
        fig = figures.build_stage_figure(step, stage_names.index(stage))
    graph.plotly_chart(fig, key=f"tree_graph_{key}")
    mask.plotly_chart(figures.mask_figure(step), key=f"tree_mask_{key}")
    table.dataframe(
        [{"node": t["node"], "token": figures.visible(t["text"]), "p(x)": round(t["p"], 4),
          "q(x)": None if t["q"] is None else round(t["q"], 4), "α": round(t["alpha"], 4),
          "u": None if t["u"] is None else round(t["u"], 4), "decision": "accept" if t["accepted"] else "reject"}
         for t in step["tests"]],
        hide_index=True,
    )


if play:
    for n in numbers[numbers.index(chosen):]:
        show(by_number[n], "verified tree", f"play_{n}")
        time.sleep(0.8)
else:
    show(step, stage, f"{chosen}_{stage}")
st.caption("Colours: green = accepted path, red = tested and rejected, grey = never tested (an ancestor was "
           "rejected or a sibling was accepted first), orange = replacement from the residual, blue = bonus token. "
           "A node's q is null for drafters without a distribution (n-gram lookup: a point mass, α = p).")
