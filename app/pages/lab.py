import numpy as np
import plotly.graph_objects as go
import streamlit as st

from app import figures, quiz, state, teaching
from specviz import analysis
from specviz.decoding.events import GREEDY, TYPICAL, rule_of

state.intro(
    "Rejection sampling lab",
    "A drafted token x (drawn from the draft's **q**) is kept when u ≤ α = min(1, p(x)/q(x)) with u uniform in "
    "[0, 1]; otherwise a replacement is drawn from the residual max(0, p − q), normalised (**p** = target).  \n"
    "Look at one real test from a run, then build your own p and q and watch the outputs approach p: the proof says "
    "they follow p exactly; sampling can only show how far from p they could still be.",
)

P_VALUE_HELP = ("If the outputs really follow p, the probability of a chi-square at least this large. Below 0.01 is "
                "evidence at the 1 % level that they do not, and happens 1 % of the time when they do; above it, the "
                "test only failed to see a difference (how small a difference it could see depends on the samples). "
                "Outcomes expecting fewer than 5 samples are pooled (the approximation needs it).")

tab_run, tab_quiz, tab_sandbox = st.tabs(["A test from a real run", "Check yourself", "Sandbox: your own p and q"])

# ----------------------------------------------------------------------------------------- real run
with tab_run:
    trace, source = state.get_trace()
    tested = [s for s in state.steps_of(trace or []) if s.get("tests")]
    if not trace:
        st.info("No run yet: decode one on the *Live decoding* page (a drafter other than `none`; temperature "
                "above 0 shows u and the residual).")
    elif not tested:
        st.info("This run has no acceptance tests (nothing was drafted). Pick a drafter other than `none`.")
    else:
        start = trace[0]
        greedy = start["sampling"]["temperature"] == 0
        st.caption(f"From the {source}: drafter `{start['drafter']}`, temperature {start['sampling']['temperature']}.")
        c1, c2 = st.columns(2)
        numbers = [s["step"] for s in tested]
        chosen = c1.selectbox("Step", numbers, key="lab_step", format_func=lambda n: f"step {n}")
        step = next(s for s in tested if s["step"] == chosen)
        index = c2.selectbox(
            "Tested position", range(len(step["tests"])), key=f"lab_test_{chosen}",
            format_func=lambda i: (f"node {step['tests'][i]['node']} (depth "
                                   f"{step['nodes'][step['tests'][i]['node']]['depth']}): "
                                   f"{figures.visible(step['tests'][i]['text'])!r} → "
                                   + ("accepted" if step["tests"][i]["accepted"] else "rejected")))
        test = step["tests"][index]
        rule = rule_of(test, greedy, start.get("lossy", False))
        node = step["nodes"][test["node"]]
        p_row = next((r for r in step["target"] if r["node"] == node["parent"]), None)
        earlier = [t for t in step["tests"][:index] if step["nodes"][t["node"]]["parent"] == node["parent"]]
        after = bool(earlier) and rule not in (GREEDY, TYPICAL)  # only the lossless sampled rules update p
        point_mass = test["q"] is None
        m = st.columns(5)
        m[0].metric(quiz.p_label(greedy, after, rule), f"{test['p']:.4f}")
        if rule == TYPICAL:
            kept = test["node"] in step["accepted_path"]
            m[1].metric(teaching.Q_DRAFT, teaching.q_text(node),
                        help="The typical test does not read q: it compares P(x) with a threshold.")
            m[2].metric("threshold min(ε, δ·e^−H)", "—" if test.get("threshold") is None else f"{test['threshold']:.4f}")
            m[3].metric("u", "— (no draw: a threshold test)")
            m[4].metric("decision", ("passed, kept" if kept else "passed, off the kept path") if test["accepted"]
                        else "failed")
        else:
            m[1].metric(teaching.Q_DRAFT, teaching.q_text(node),
                        help=teaching.POINT_MASS_Q if point_mass else "The test's α = min(1, p(x)/q(x)) reads it.")
            m[2].metric(quiz.alpha_label(greedy, point_mass, after), f"{test['alpha']:.4f}")
            m[3].metric("u", "— (greedy)" if test["u"] is None else f"{test['u']:.4f}")
            m[4].metric("decision", "accept" if test["accepted"] else "reject")
        if after:
            st.caption("An earlier sibling was rejected at this parent, so this test used the residual of that "
                       "rejection as p (the bars below show the target's p before any update).")
        b1, b2 = st.columns(2)
        p_title = "p: target's top tokens at this position"
        if rule == TYPICAL:
            p_title += " (after top-k/top-p; the test read softmax(logits / T))"
        b1.plotly_chart(figures.distribution_bars(p_row["p_top"] if p_row else None, p_title, "#1f77b4",
                                                  highlight=test["token"]), key=f"lab_p_{chosen}_{index}")
        q_bars = node["q_top"] or ([[node["token"], node["text"], node["q"]]] if node["q"] is not None else None)
        if node["q_top"] and point_mass:  # a top-k pick: the draft's distribution ranked it; the test used δx
            q_title = "the draft's top tokens (it picked x from them: the test treats x as a point mass)"
        elif node["q_top"]:
            q_title = "q: the draft distribution x was sampled from"
        elif node["q"] is not None:  # only x's own q was recorded
            q_title = f"the draft's q(x) = {node['q']:.4f}" + (" (it picked x: the test treats x as a point mass)"
                                                             if point_mass else "")
        else:
            q_title = f"q: a point mass ({start['drafter']} has no draft distribution)"
        if rule == TYPICAL:
            q_title = "the head's top tokens (it picked x from them; the typical test does not read q)"
        b2.plotly_chart(figures.distribution_bars(q_bars, q_title, "#ff7f0e", highlight=test["token"],
                                                  point_mass=None if q_bars else (node["token"], node["text"])),
                        key=f"lab_q_{chosen}_{index}")
        if rule == TYPICAL:
            if test.get("threshold") is not None:
                st.plotly_chart(figures.threshold_gauge(test["p"], test["threshold"]), key=f"lab_u_{chosen}_{index}")
            st.warning(teaching.TYPICAL_NOTE)
        else:
            st.plotly_chart(figures.u_gauge(test["alpha"], test["u"], rule), key=f"lab_u_{chosen}_{index}")
        if greedy:
            st.info("Greedy decoding (temperature 0): the draft token is accepted exactly when it is the target's "
                    "argmax (α = 1, else 0), and a rejection is replaced by the argmax. p and q above are the plain "
                    "softmax of the logits, shown for how confident each model was.")
        final = step["final"]
        if rule == TYPICAL:
            st.info(f"This step kept {len(step['accepted_path'])} drafted token(s), the longest passing prefix; "
                    f"its last token, {figures.md_code(final['text'])} (id {final['token']}), is "
                    + figures.final_source(step, greedy) + ".")
        elif not test["accepted"]:
            last_here = all(step["nodes"][t["node"]]["parent"] != node["parent"] for t in step["tests"][index + 1:])
            replacement = final if last_here and final["kind"] == "replacement" else None
            if test["residual_top"]:
                st.plotly_chart(figures.distribution_bars(
                    test["residual_top"], "residual max(0, p − q), normalised", "#9467bd",
                    highlight=replacement["token"] if replacement else None), key=f"lab_r_{chosen}_{index}")
            if replacement:
                source = "the target's argmax (greedy)" if greedy else "the residual"
                st.success(f"Replacement token from {source}: {figures.md_code(replacement['text'])} "
                           f"(id {replacement['token']}). The step ends here.")
            else:
                st.info("The next sibling was tested against this residual.")
        elif test["node"] == step["accepted_path"][-1] and final["kind"] == "bonus":
            source = "the target's argmax (greedy)" if greedy else "p"
            st.success(f"Every drafted token on the path was accepted: a bonus token "
                       f"{figures.md_code(final['text'])} was drawn from {source}.")

# ------------------------------------------------------------------------------------------- self-check
with tab_quiz:
    trace, source = state.get_trace()
    if trace and trace[0].get("detail") == "counts":
        st.info(teaching.counts_note(trace[0].get("engine", "this engine")))
    elif not trace or not any(s.get("tests") for s in state.steps_of(trace)) or state.done_of(trace) is None:
        st.info("The questions are built from the acceptance tests of your own run: decode one on the *Live "
                "decoding* page first (a drafter other than `none`; a temperature above 0 adds α questions).")
    else:
        seed = st.session_state.setdefault("quiz_seed", 0)
        # a new run (another text, drafter or sampling) or new questions start a fresh sheet
        quiz_id = (source, trace[0]["drafter"], str(trace[0]["sampling"]), tuple(trace[-1]["token_ids"]), seed)
        if st.session_state.get("quiz_id") != quiz_id:
            st.session_state["quiz_id"], st.session_state["quiz_answers"] = quiz_id, {}
        answers = st.session_state["quiz_answers"]
        qs = quiz.questions(trace, seed=seed)
        greedy = trace[0]["sampling"]["temperature"] == 0
        st.markdown(f"{len(qs)} questions on real tests of the {source} (drafter `{trace[0]['drafter']}`, "
                    f"temperature {trace[0]['sampling']['temperature']}). Answer, then press **Check**: your answer "
                    "is shown against what the engine did, and why."
                    + (" At temperature 0 α is 1 for the target's argmax and 0 otherwise, so every question asks "
                       "whether the token was accepted; decode at a temperature above 0 for *what is α?* questions."
                       if greedy else ""))
        for i, q in enumerate(qs):
            with st.container(border=True):
                asked = next(s for s in state.steps_of(trace) if s["step"] == q.step)
                node = asked["nodes"][asked["tests"][q.test_index]["node"]]
                st.markdown(f"**{i + 1}.** Step {q.step}, drafted token {figures.md_code(q.token)}")
                facts = st.columns(3)
                facts[0].metric(q.p_label, f"{q.p:.4g}")
                if q.rule == TYPICAL:
                    facts[1].metric("threshold min(ε, δ·e^−H)", "—" if q.threshold is None else f"{q.threshold:.4g}")
                    facts[2].metric("temperature", f"{trace[0]['sampling']['temperature']} (typical, lossy)")
                else:
                    facts[1].metric(teaching.Q_DRAFT, teaching.q_text(node),
                                    help=teaching.POINT_MASS_Q if q.q is None else None)
                if greedy:
                    facts[2].metric("temperature", "0 (greedy: accepted when x is the target's argmax)")
                elif q.kind == "accept" and q.u is not None:
                    facts[2].metric("u (the uniform draw)", f"{q.u:.4f}")
                key = f"quiz_{seed}_{i}"
                if q.kind == "accept":
                    guess = st.radio("Will it pass the threshold?" if q.rule == TYPICAL else "Will it be accepted?",
                                     ["accepted", "rejected"], index=None, horizontal=True, key=f"{key}_guess")
                    value = None if guess is None else guess == "accepted"
                else:
                    value = st.number_input("What is α here?", 0.0, 1.0, value=None, step=0.0001, format="%.4f",
                                            key=f"{key}_guess")
                if st.button("Check", key=f"{key}_check", disabled=value is None):
                    right, truth = quiz.check_answer(q, value)
                    answers[i] = {"guess": guess if q.kind == "accept" else f"{value:.4f}", "right": right,
                                  "truth": truth}
                if i in answers:
                    a = answers[i]
                    say = st.success if a["right"] else st.error
                    say(f"{'Right' if a['right'] else 'Not quite'}: you said **{a['guess']}**, the engine's value "
                        f"is **{a['truth']}**. {q.reason()}")
                    if greedy:  # the answer, so only after it is checked
                        top = next((r["p_top"] for r in asked["target"] if r["node"] == node["parent"]), None)
                        st.caption("The target's most likely tokens here: " + ", ".join(
                            f"{figures.md_code(t[1])} {t[2]:.3f}" for t in (top or [])[:3]))
        if answers:
            st.metric("Score", quiz.score(answers, len(qs)))
        if st.button("New questions", key="quiz_new"):
            st.session_state["quiz_seed"] = seed + 1
            st.rerun()

# ------------------------------------------------------------------------------------------ sandbox
with tab_sandbox:
    st.markdown("Edit p (the target) and q (the draft) over a few tokens; rows are normalised. Choose how the "
                "draft proposes: a **sampled chain** draws x from q and applies α = min(1, p/q) with the residual "
                "max(0, p − q); **picked siblings** (how a tree drafter proposes the children of one node) take the "
                "top-k tokens of q as point masses, tried in turn with α = p′(x) and x removed from p′ after each "
                "rejection. Either way the histogram of outputs converges to **p**, not q.")
    default = {"token": ["the", "a", "cat", "dog", "sat"], "p": [0.40, 0.25, 0.15, 0.15, 0.05],
               "q": [0.10, 0.50, 0.10, 0.10, 0.20]}
    table = st.data_editor(default, num_rows="dynamic", key="lab_table", width="stretch")
    tokens = [str(t) if t not in (None, "") else f"token {i}" for i, t in enumerate(table["token"])]
    mode = st.radio("The draft", ["sampled chain (x drawn from q)", "picked siblings (top-k of q, point masses)"],
                    horizontal=True, key="lab_mode")
    siblings = mode.startswith("picked")
    c1, c2, c3 = st.columns(3)
    n = c1.select_slider("Samples", [10, 100, 1_000, 10_000, 100_000], value=1_000, key="lab_n")
    seed = c2.number_input("Seed", 0, 10**6, 0, key="lab_seed")
    if siblings:
        bug = c3.checkbox("Plant a bug (keep rejected siblings in p′)", key="lab_bug_siblings",
                          help="After a rejection, test the next sibling against p unchanged instead of p with the "
                               "rejected token removed and renormalised.")
    else:
        bug = c3.checkbox("Plant a bug (skip the residual)", key="lab_bug",
                          help="On a rejection, redraw from q instead of from the residual max(0, p − q).")
    try:
        raw_p = [float(x or 0) for x in table["p"]]
        raw_q = [float(x or 0) for x in table["q"]]
        p, q = analysis.normalise(raw_p), analysis.normalise(raw_q)
        if len(p) < 2:
            raise ValueError("give at least two tokens")
        if any(x < 0 for x in raw_p + raw_q):
            raise ValueError("probabilities cannot be negative")
    except (ValueError, TypeError) as err:
        st.error(f"Fix the table: {err}")
        st.stop()
    if siblings:
        k = st.slider("Siblings k (the top-k of q, most likely first)", 1, len(p), min(2, len(p)), key="lab_k")
        candidates = [int(i) for i in np.argsort(-q, kind="stable")[:k]]
        st.caption("Siblings tried in order: " + ", ".join(figures.md_code(tokens[i]) for i in candidates)
                   + f" ({teaching.SPECINFER}).")
        samples = teaching.point_mass_samples(p, candidates, n, seed=int(seed), keep_rejected=bug)
        accepted = int(np.isin(samples, candidates).sum())  # a sibling came out: one was accepted
        theory = float(p[candidates].sum())
        accepted_help = f"theory: Σ p over the siblings = {theory:.1%}"
    else:
        samples, accepted = analysis.speculative_samples(p, q, n, seed=int(seed), skip_residual=bug)
        accepted_help = f"theory: Σ min(p, q) = {np.minimum(p, q).sum():.1%} ({teaching.LEVIATHAN})"
    counts = np.bincount(samples, minlength=len(p))
    fit = analysis.goodness_of_fit(counts, p)
    names = figures.unique_labels(list(enumerate(tokens)))
    m = st.columns(5)
    m[0].metric("samples", f"{n:,}")
    m[1].metric("accepted drafts" if not siblings else "a sibling came out", f"{accepted / n:.1%}", help=accepted_help)
    m[2].metric("total variation to p", f"{fit['tv']:.4f}")
    tested = fit["p_value"] == fit["p_value"]  # NaN: too few samples for the chi-square approximation
    m[3].metric("chi-square vs p", f"{fit['chi2']:.2f}" if tested else "—",
                help=f"{fit['dof']} degrees of freedom over {fit['cells']} cells")
    m[4].metric("p-value", f"{fit['p_value']:.3f}" if tested else "—", help=P_VALUE_HELP)
    if not tested:
        st.info(f"No chi-square test at {n:,} samples: every outcome expects fewer than 5 (n × p), so its "
                "approximation does not hold. Take more samples.")
    elif fit["pooled"]:
        st.caption(f"{fit['pooled']} outcome(s) expecting fewer than 5 samples were pooled into one cell for the test.")
    st.plotly_chart(figures.histogram_pair(names, {"outputs": list(counts / n), "p (target)": list(p),
                                                   "q (draft)": list(q)},
                                           f"{n:,} speculative samples", {"outputs": "#444", "p (target)": "#1f77b4",
                                                                          "q (draft)": "#ff7f0e"}), key="lab_hist")
    sizes = [s for s in (10, 30, 100, 300, 1_000, 3_000, 10_000, 30_000, 100_000) if s <= n]
    tvs = [analysis.total_variation(np.bincount(samples[:s], minlength=len(p)), p) for s in sizes]
    fig = go.Figure(go.Scatter(x=sizes, y=tvs, mode="lines+markers", name="TV(outputs, p)"))
    fig.update_layout(title="distance to p shrinks as samples grow (roughly like 1/√n)", height=260,
                      xaxis={"type": "log", "title": "samples"}, yaxis={"title": "total variation"},
                      margin={"l": 10, "r": 10, "t": 40, "b": 10}, modebar=figures.TOOLBAR)
    st.plotly_chart(fig, key="lab_tv")
    if bug and siblings:
        st.warning("With the bug each sibling is tested against the unchanged p, and a rejected sibling can still "
                   "be drawn at the end: the outputs no longer follow p, and the chi-square p-value drops to ~0 once "
                   "there are enough samples. Removing a rejected sibling from p′ is what keeps the tree rule exact.")
    elif bug:
        st.warning("With the bug the outputs drift toward q: the chi-square p-value drops to ~0 once there are "
                   "enough samples. This is how the losslessness tests catch a wrong implementation.")
