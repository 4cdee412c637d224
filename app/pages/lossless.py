import time
from collections import Counter

import streamlit as st

from app import figures, state, tokens
from specviz import analysis
from specviz.drafters import PLAIN

state.intro(
    "Is it really lossless?",
    "Speculative sampling promises outputs distributed exactly as the target's (p), whatever the draft (q). Test "
    "it: sample N continuations of one prompt with a drafter and N with the target alone (`none`), at "
    "temperature > 0,  \nthen compare the first generated tokens with a chi-square test and the total variation "
    "distance. Equal distributions give a p-value below 0.01 only 1 % of the time; a larger one shows no difference "
    "was seen, and *How sure are we* below says how large a difference could have gone unseen.",
)
shared, settings = state.require_model()
if shared is None:
    st.stop()

spec_drafters = [d for d in shared.drafters() if d != PLAIN]
if not spec_drafters:
    st.warning("No speculative drafter is available for this model.")
    st.stop()
prompt = st.text_input("Prompt (fixed)", "Once upon a time", key="ll_prompt")
c = st.columns(4)
drafter = c[0].selectbox("Drafter", spec_drafters,
                         index=spec_drafters.index(settings.drafter) if settings.drafter in spec_drafters else 0,
                         key="ll_drafter")
n = c[1].number_input("N runs per side", 10, 5000, 100, 10, key="ll_n",
                      help="Each run is one short decode; 100 + 100 takes a few minutes on a busy CPU.")
temperature = c[2].slider("Temperature", 0.1, 2.0, 1.0, 0.1, key="ll_temperature")
new_tokens = c[3].selectbox("Tokens per run", [2, 1], key="ll_tokens",
                            help="With 2, the first token passes through a drafted acceptance test (the step may "
                                 "draft 1 token, then add a replacement or a bonus). With 1 nothing can be drafted.")
what = st.radio("Compare", ["first generated token", "first two tokens (as a pair)"], horizontal=True, key="ll_what",
                disabled=new_tokens == 1)
key = (shared.name, prompt, drafter, int(n), temperature, new_tokens, settings.top_p, settings.top_k, settings.k,
       settings.tree_for(drafter))
results = st.session_state.setdefault("ll_cache", {})

if st.button(f"Sample {2 * int(n)} runs", type="primary", key="ll_run"):
    bar = st.progress(0.0, text="sampling…")
    samples = {drafter: [], PLAIN: []}
    texts = {}  # token id -> its text, from the runs' own events (the engine may run on a service)
    tested = 0
    failed = False
    started = time.perf_counter()
    for side, name in enumerate((drafter, PLAIN)):
        for i in range(int(n)):
            # disjoint seeds: the two samples are independent of each other and across runs
            events = state.run_decode(shared, prompt, settings, drafter=name, temperature=temperature,
                                      max_new_tokens=new_tokens, seed=side * int(n) + i)
            if events is None:
                failed = True
                break
            samples[name].append(state.done_of(events)["token_ids"])
            texts.update((c["token"], c["text"]) for s in state.steps_of(events) for c in s["committed"])
            first = state.steps_of(events)[0]
            tested += bool(first["tests"]) and name != PLAIN
            done = side * int(n) + i + 1
            left = (time.perf_counter() - started) / done * (2 * int(n) - done)
            bar.progress(done / (2 * int(n)), text=f"{name}: run {i + 1} of {int(n)} ({done} of {2 * int(n)}, "
                                                   f"about {left / 60:.0f} min {left % 60:.0f} s left)")
        if failed:
            break
    bar.empty()
    if not failed:
        results[key] = {"samples": samples, "tested": tested, "texts": texts}

result = results.get(key)
if not result:
    st.info("Press the button to sample (the results stay cached for these settings).")
    st.stop()

width = 2 if what.startswith("first two") and new_tokens == 2 else 1
side_a = [tuple(ids[:width]) for ids in result["samples"][drafter]]
side_b = [tuple(ids[:width]) for ids in result["samples"][PLAIN]]
test = analysis.two_sample_test(side_a, side_b)
m = st.columns(5)
m[0].metric("N per side", f"{test['n_a']} / {test['n_b']}")
m[4].metric(f"{drafter} runs whose first token was tested", f"{result['tested']} / {test['n_a']}",
            help="Runs where the first step drafted a token, so the first output went through accept/reject.")
needed = analysis.samples_for_a_test(test["shares"], test["n_a"])
if test["dof"] < 1:  # one column: nothing to compare, so no distance, statistic or p-value is shown
    m[1].metric("total variation (test's columns)", "no test")
    m[2].metric("chi-square", "no test")
    m[3].metric("p-value", "no test")
    if needed is None:
        st.info(f"Every run of both sides gave the same {what}: there is nothing to compare. A chi-square test "
                "needs at least two different outcomes; raise the temperature or change the prompt.")
    else:
        st.info(f"No test at N = {test['n_a']}: all {len(test['shares'])} outcomes are too rare for a column of "
                f"their own (each needs an expected count of 5 a side), so they would all fall into one pooled "
                f"column, and one column has nothing to compare. From the shares of this sample the most frequent "
                f"outcome gets a column at about **N = {needed:,} per side**; sample at least that many.")
else:
    m[1].metric("total variation (test's columns)", f"{test['tv']:.3f}",
                help=f"½ Σ |share in A − share in B| over the test's {test['columns']} columns: the common outcomes "
                     f"and one for the {test['pooled']} rare ones pooled. Over the outcomes themselves it is "
                     f"{test['tv_outcomes']:.3f}, which on a long tail is large from sampling noise alone.")
    m[2].metric("chi-square", f"{test['chi2']:.2f}", help=f"{test['dof']} degrees of freedom")
    m[3].metric("p-value", f"{test['p_value']:.3f}")
    verdict = test["p_value"]
    (st.success if verdict >= 0.01 else st.warning)(
        f"p-value {verdict:.3f}: " + ("no evidence at the 1 % level that the two distributions differ (not proof "
                                      "that they are equal: see below)." if verdict >= 0.01 else
                                      "the samples differ more than chance usually allows (or this is the 1% case)."))
    st.caption(f"Pearson's chi-square test of homogeneity on a 2 × {test['columns']} table (a standard two-sample "
               "test; the p-value is the probability of a chi-square at least this large when both samples come "
               "from one distribution, so below 0.01 happens 1 % of the time by chance); "
               f"{test['pooled']} rare outcomes (expected count below 5) pooled into one column. Total variation = "
               "½ Σ |share in sample A − share in sample B| over those columns; with "
               f"N = {test['n_a']} and {test['n_b']}, two samples of one distribution (these two pooled) differ by a "
               f"TV of about {test['noise_tv']:.2f} from sampling noise alone (normal approximation; it shrinks as "
               "1/√N).")

st.subheader("How sure are we?")
if test["dof"] >= 1:
    sure = analysis.detectable_tv(test["n_a"], test["n_b"], test["dof"])
    st.metric("smallest difference this N is sure to see (total variation)",
              f"{sure:.3f}" if sure < 1 else "none: too few samples",
              help="Detected with probability at least 80 % by this test at the 1 % level, whatever the shape of "
                   "the difference over the test's columns (the common outcomes and the pooled rest). A difference "
                   "that only moves mass among the pooled rare outcomes is not seen at all, at any size.")
else:
    st.metric("smallest difference this N is sure to see (total variation)", "none: no test at this N",
              help="With one column the test sees no difference of any size.")
sizes = [100, 300, 1_000, 3_000, 10_000, 30_000]
rows = []
for size in sizes:  # more samples pool fewer outcomes: more columns, more degrees of freedom
    dof = max(1, analysis.columns_at(test["shares"], size) - 1)
    rows.append({"N per side": f"{size:,}", "degrees of freedom (outcomes as in this sample)": dof,
                 "smallest TV seen with probability ≥ 80 %": round(analysis.detectable_tv(size, size, dof), 3)})
st.dataframe(rows, hide_index=True)
st.caption(
    "What is bounded: the total variation over the test's columns, not over tokens; mass moved among outcomes "
    "rare enough to be pooled stays unseen. The table's degrees of freedom are the columns each N would make "
    "from the outcome shares of this sample (outcomes expecting 5 a side get their own column). "
    "Method: with d degrees of freedom the test rejects at the 1 % level above the chi-square quantile; under a "
    "difference the statistic is about noncentral chi-square with noncentrality "
    "λ = N_eff · Σ (a − b)² ÷ m (N_eff = N_a·N_b ÷ (N_a + N_b), m the pooled shares), and Σ (a − b)² ÷ m ≥ "
    "(Σ |a − b|)² = 4·TV² (Cauchy–Schwarz), so every difference of that TV has λ ≥ 4·N_eff·TV². The table "
    "solves for the TV whose λ gives 80 % power (`specviz.analysis.detectable_tv`, tested by simulation in "
    "`tests/test_power.py`). The bound is a statement about the test's power, not about this sample: a difference "
    "of at least that TV would have given a p-value below 0.01 with probability at least 80 %. A p-value above "
    "0.01 is therefore no probability that the difference is small; that it is zero comes from the proof on "
    "*Why it works*, not from sampling.")

counts_a, counts_b = Counter(side_a), Counter(side_b)
top = sorted(set(counts_a) | set(counts_b), key=lambda o: -(counts_a[o] + counts_b[o]))[:25]
tokenizer = shared.models_here().tokenizer if shared.capabilities.bench else None  # joins a character's bytes
names = figures.unique_labels([(hash(o), tokens.readable(o, result["texts"], tokenizer)) for o in top])
st.plotly_chart(figures.histogram_pair(
    names, {f"{drafter} (speculative)": [counts_a[o] / test["n_a"] for o in top],
            "none (target alone)": [counts_b[o] / test["n_b"] for o in top]},
    f"{what}: the 25 most frequent outcomes", {f"{drafter} (speculative)": "#ff7f0e", "none (target alone)": "#1f77b4"}),
    key="ll_hist")
