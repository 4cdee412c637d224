import time

import streamlit as st

from app import figures, regimes, state, teaching
from specviz.decoding.costs import interpolate
from specviz.decoding.events import CHAIN, TYPICAL

AUTO_SMALL = 4  # a median tree of at most this many nodes under "auto": the page says why
FIXED_BUDGET = 16  # the node budget it offers instead

state.intro(
    "EAGLE tree explorer",
    "Each step the drafter proposes a tree of guesses (a chain is a tree with one branch); the target scores every "
    "node in one forward pass, using the attention mask on the right so each node sees only its own ancestors.  \n"
    "Nodes are tested from the root down, siblings in order; hover a node for q (draft), its path score, p (target), "
    "the rule its test applied, u and the decision. EAGLE-2 and Medusa children are the draft's top-k **picks**, "
    "not samples, so each is a point mass: α = p(x), and after a rejection x is removed from p and p renormalised "
    "before the next sibling is tested. A sampled chain (the draft model at temperature > 0) uses α = min(1, p/q). "
    "Medusa's typical acceptance (lossy, when asked for) replaces both by a threshold on P(x) and keeps the longest "
    "passing path.",
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

def side_by_side() -> None:
    """eagle2 and eagle3 drafting from the same contexts: shown whether or not a run is loaded above."""
    st.header("EAGLE-2 and EAGLE-3 on the same step")
    st.markdown(teaching.EAGLE3_CHANGES)
    both = shared is not None and all(d in shared.drafters() for d in ("eagle2", "eagle3"))
    if not both:
        st.info("This needs a model with both an EAGLE-2 and an EAGLE-3 head (the embedded model ships both).")
    else:
        st.caption("Both drafters decode the prompt above at temperature 0 with the sidebar's tree settings as set "
                   "(`k_policy=fixed`: no step is skipped for this run's timings), so they "
                   "commit the same text (the target's greedy text, up to floating-point near-ties) and meet the same contexts; pick a position where "
                   "both drafted, and compare the two trees grown from it.")
        if st.button("Draft with both", key="tree_both_run"):
            runs = {}
            for name in ("eagle2", "eagle3"):
                with st.spinner(f"decoding with {name}…"):
                    runs[name] = state.run_decode(shared, st.session_state.get("tree_prompt", state.DEFAULT_PROMPT),
                                                  settings, drafter=f"{name}:k_policy=fixed", temperature=0.0)
            if all(runs.values()):
                st.session_state["tree_both"] = runs
        runs = st.session_state.get("tree_both")
        if runs:
            at = {name: {s["position"]: s for s in state.steps_of(events) if s["nodes"]} for name, events in runs.items()}
            common = sorted(set(at["eagle2"]) & set(at["eagle3"]))
            if not common:
                st.info("The two runs never drafted from the same position; decode a longer run.")
            else:
                position = (st.select_slider("Position of the root", options=common, value=common[0], key="tree_both_pos")
                            if len(common) > 1 else common[0])
                for column, name in zip(st.columns(2), ("eagle2", "eagle3")):
                    step = at[name][position]
                    column.subheader(f"`{name}`")
                    column.plotly_chart(figures.step_tree_figure(step, greedy=True), key=f"tree_both_{name}_{position}")
                    best = max(step["nodes"], key=lambda n: n["q"] or 0.0)
                    column.caption(
                        f"{len(step['nodes'])} nodes, {len(step['accepted_path'])} accepted, drafted in "
                        f"{step['timing']['draft_ms']:.1f} ms; its most confident node q = {best['q'] or 0:.3f} "
                        f"({figures.visible(best['text'])!r}).")
                taus = {name: sum(len(s["committed"]) for s in state.steps_of(events)) / max(1, len(state.steps_of(events)))
                        for name, events in runs.items()}
                st.caption("Over the whole run: τ (tokens per target forward, the last token included) "
                           + ", ".join(f"`{n}` {t:.2f}" for n, t in taus.items()) + ".")


if not trace:
    st.info("No run yet: decode one above or on the *Live decoding* page.")
    side_by_side()
    st.stop()

def auto_budget_note(start: dict, steps: list[dict]) -> None:
    """Where the auto budget kept small trees (at most AUTO_SMALL nodes a step, median): why (this machine's
    verify-cost curve), and a rerun at a fixed budget of FIXED_BUDGET nodes with its measured verify cost."""
    nodes = sorted(len(s["nodes"]) for s in steps)
    # the node budget was the measured cost's choice: "auto", or a cap under the cost-aware k_policy
    chosen_by_cost = start["options"].get("total_tokens") == "auto" or start.get("k_policy") == "cost"
    if ("total_tokens" not in start["options"] or not chosen_by_cost or not nodes
            or nodes[len(nodes) // 2] > AUTO_SMALL or shared is None):
        return
    ratio = state.verify_ratio(shared)
    if ratio is None:
        return
    cost = interpolate(shared.models_here().verify_curve)
    st.info(f"`total_tokens {start['options']['total_tokens']}` kept {nodes[0]}–{nodes[-1]} nodes a step (median {nodes[len(nodes) // 2]}): it keeps "
            "a node only where its chance of being accepted pays for verifying it, and on this machine's verify-cost "
            f"curve ({shared.where()}) verifying 8 tokens costs {ratio:.2f}× one "
            f"({1e3 * cost(8):.1f} ms against {1e3 * cost(1):.1f} ms, {regimes.regime(ratio)}). A fixed budget of "
            f"{FIXED_BUDGET} nodes shows a full tree and its price: one verify over {FIXED_BUDGET + 1} tokens costs "
            f"{1e3 * cost(FIXED_BUDGET + 1):.1f} ms here, {cost(FIXED_BUDGET + 1) / cost(1):.2f}× one token's.")
    if st.button(f"Decode again with total_tokens = {FIXED_BUDGET}", key="tree_fixed"):
        fixed = ":k_policy=fixed" if start.get("k_policy") else ""  # an engine that trims by cost: not this run
        events = state.run_decode(shared, start["prompt_text"], settings,
                                  drafter=f"{start['drafter']}:total_tokens={FIXED_BUDGET}{fixed}")
        if events:
            state.set_trace(events, f"run from the tree page at total_tokens = {FIXED_BUDGET}")
            st.rerun()


steps = [s for s in state.steps_of(trace) if s.get("nodes")]
start = trace[0]
if start.get("detail") == "counts":
    st.info(teaching.counts_note(start.get("engine", "this engine")))
    side_by_side()
    st.stop()
st.caption(f"Showing the {source}: drafter `{start['drafter']}`, {len(state.steps_of(trace))} steps, "
           f"{len(steps)} with a draft.")
auto_budget_note(start, state.steps_of(trace))
if not steps:
    st.info("Nothing was drafted in this run (every step was autoregressive), so there is no tree to show. "
            "Pick a drafter other than `none` in the sidebar and run again.")
    side_by_side()
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


greedy = start["sampling"]["temperature"] == 0


def show(step: dict, stage: str, key: str) -> None:
    if stage == "verified tree":
        fig = figures.step_tree_figure(step, greedy)
    else:
        fig = figures.build_stage_figure(step, stage_names.index(stage))
    graph.plotly_chart(fig, key=f"tree_graph_{key}")
    mask.plotly_chart(figures.mask_figure(step), key=f"tree_mask_{key}")
    table.dataframe(
        [{"node": r["node"], "token": figures.visible(r["token"]), "rule": r["rule_name"],
          "p(x)": round(r["p used by the test"], 4), teaching.Q_DRAFT: teaching.q_text(step["nodes"][r["node"]]),
          "α": "—" if r["rule_name"] == TYPICAL else figures.fmt(r["α"], 4),
          "threshold": figures.fmt(r["threshold"], 4), "u": figures.fmt(r["u"], 4), "decision": decision(r, step)}
         for r in teaching.verification_walkthrough(step, greedy)],
        hide_index=True,
    )


def decision(row: dict, step: dict) -> str:
    if row["rule_name"] == TYPICAL:
        if not row["accepted"]:
            return "fail"
        return "pass, kept" if row["node"] in step["accepted_path"] else "pass, off the kept path"
    return "accept" if row["accepted"] else "reject"


if play:
    for n in numbers[numbers.index(chosen):]:
        show(by_number[n], "verified tree", f"play_{n}")
        time.sleep(0.8)
else:
    show(step, stage, f"{chosen}_{stage}")
st.caption("Colours: green = accepted path, red = tested and rejected, light green = passed Medusa's typical "
           "threshold but off the kept (longest) path, grey = never tested (an ancestor was rejected or a sibling "
           "was accepted first), orange = the token that ends the step after a rejection, blue = the one after a "
           "fully accepted path. q(x) is the node's own: the draft's probability of the token, the same here, "
           "in the table below and in the lab; a picked token (a tree's top-k child, a lookup) is tested as a "
           "point mass whatever its q (α = p), and a drafter without a distribution (n-gram lookup) has none.")


# ------------------------------------------------------------------------------ how this step was verified
st.header("How this step was verified")
rows = teaching.verification_walkthrough(step, greedy)
rules = {r["rule_name"] for r in rows}
st.markdown(
    "The tests of the step above, in the order they ran: from the root down, and at each node its children one "
    "after another until one is accepted. Beside the rule that was applied stands the other rule on the same "
    "numbers."
)
st.dataframe(
    [{"order": r["order"], "depth": r["depth"], "parent": figures.visible(r["parent"]),
      "token x": figures.visible(r["token"]), "rule applied": r["rule"],
      "p(x) at the parent": round(r["p (target, at the parent)"], 6), "p used by the test": round(r["p used by the test"], 6),
      "α": "—" if r["rule_name"] == TYPICAL else figures.fmt(r["α"], 6),
      "threshold": figures.fmt(r["threshold"], 6), "u": figures.fmt(r["u"], 4), "decision": decision(r, step),
      "chain rule on the same x: min(1, p/q)": figures.fmt(r["chain_alpha"], 6),
      teaching.Q_DRAFT: teaching.q_text(step["nodes"][r["node"]])}
     for r in rows],
    hide_index=True, key=f"tree_walk_{chosen}",
)
if TYPICAL in rules:
    st.warning(teaching.TYPICAL_NOTE)
    st.markdown(
        f"On this step: {len(rows)} tests (every node whose ancestors all passed), "
        f"{sum(r['accepted'] for r in rows)} passed, {len(step['accepted_path'])} kept; the step's last token "
        f"{figures.md_code(step['final']['text'])} is {figures.final_source(step, greedy)}. The chain-rule column "
        "is min(1, p/q) on the same token, for comparison only: no such test ran here.")
elif greedy:
    st.markdown(
        "At temperature 0 both rules collapse to one: a drafted token is accepted exactly when it is the target's "
        "argmax at its parent, and the step's last token is that argmax. The output is then the target's own greedy "
        "text up to floating-point near-ties (*Why it works* says when the two can part; tested against "
        "transformers' `generate()`). Run at a temperature above 0 to see the two rules differ."
    )
else:
    left, right = st.columns(2)
    left.markdown(
        "**Point masses (what ran for picked tokens).** A tree drafter (EAGLE-2, Medusa) or prompt lookup does "
        "not *sample* its tokens: it picks the top-k of its distribution, so each child is a point mass q = δₓ. "
        "Then:\n"
        "- α = p′(x), where p′ is the target's p at the parent;\n"
        "- after a rejection, x is removed from p′ and p′ renormalised: p′(y) ← p′(y) ÷ (1 − p′(x)); the next sibling "
        "is tested against that;\n"
        "- if every sibling is rejected, the step's token is drawn from what is left.\n\n"
        "*Why it is lossless:* the first child x₁ comes out with probability p(x₁). It is rejected with probability "
        "1 − p(x₁), and the second child then comes out with probability (1 − p(x₁)) · p(x₂) ÷ (1 − p(x₁)) = p(x₂); "
        "and so on. A token y that is no child comes out with (1 − Σ p(xᵢ)) · p(y) ÷ (1 − Σ p(xᵢ)) = p(y). Every "
        f"token has exactly its target probability ({teaching.SPECINFER}, its multi-candidate rule with q = δₓ; "
        f"the rule of {teaching.SAFEAILAB_EAGLE}; EAGLE-1's paper instead samples its children and verifies them "
        f"with the draft's probabilities, {teaching.EAGLE})."
    )
    right.markdown(
        "**The chain rule (a sampled draft, as the draft model at temperature > 0).** When x was *drawn* from q:\n"
        "- α = min(1, p(x) ÷ q(x));\n"
        "- after a rejection the next token is drawn from the residual max(0, p − q), normalised, and the step "
        "ends (a chain has one child per node).\n\n"
        "*Why it is lossless:* x comes out accepted with probability q(x) · min(1, p(x)/q(x)) = min(p(x), q(x)), "
        "and after a rejection (probability 1 − Σ min(p, q)) from the residual with probability "
        "max(0, p(x) − q(x)) ÷ (1 − Σ min(p, q)); the two add up to p(x) "
        f"({teaching.LEVIATHAN}, with its proof in the appendix; {teaching.CHEN}).\n\n"
        "The right-hand column of the table applies this rule to the same x with the draft's q. For a picked "
        "token that would be wrong: x was not drawn from q, and min(1, p/q) would accept it too rarely or too often."
    )
    st.caption(teaching.LETTERS_NOTE)
    checked = [r for r in rows if r["expected_p"] is not None]
    if checked:
        worst = max(abs(r["p used by the test"] - r["expected_p"]) / max(r["expected_p"], 1e-12) for r in checked)
        check = (f"Check on this step: for every point-mass test, p used = p(x) ÷ (1 − Σ p of the siblings rejected "
                 f"before it), recomputed here from the nodes' own p: largest relative difference {worst:.1e}")
        if worst > 1e-4:  # float32 rounding stays far below this
            st.error(check + ". That is more than rounding: the verification did not renormalise as the rule says.")
        else:
            st.caption(check + " (rounding). The *Rejection sampling lab*'s sandbox samples this rule and the "
                       "chain rule many times and compares the outputs with p.")
if rules == {CHAIN}:
    st.caption("Every test of this step used the chain rule: its tokens were sampled from the draft's q.")

side_by_side()
