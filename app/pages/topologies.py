"""The drafting topologies side by side (what each reads, its training, memory, losslessness, the published
speedups and what was measured here), and what each acceptance number means."""
import streamlit as st

from app import regimes, state, teaching
from specviz.drafters import PLAIN

state.intro(
    "Topologies compared",
    "Five ways to draft: a separate small model, Medusa heads, two feature-level heads (EAGLE-2's and EAGLE-3's) "
    "and prompt lookup. "
    "They differ in what they read, what they cost to train and hold, and how well they guess.  \n"
    "Below them: what the acceptance numbers on every page mean, computed on your own run.",
)
report = teaching.reference_report()
measured = teaching.measured_rows(report)
here_runs = regimes.measured_in_process(st.session_state.get("race_cache", {}))  # this process's own runs
elsewhere = "" if not report else (  # where the shipped report's figures were measured: not here
    f"shipped report, {report['machine'].get('weights', 'fp32')} weights, {report['machine']['cores']}-core "
    f"{report['machine']['cpu']}, {report['machine']['date'][:10]}")

# ------------------------------------------------------------------------------------------- the table
st.header("1. What each drafter reads, needs and gives")
topologies = teaching.cards()
for card, t in zip(st.columns(len(topologies)), topologies):
    here = [row for row in here_runs.values() if row["drafter"] == t.drafter]  # a row for each weight set raced on
    shipped = measured.get(t.drafter, {})
    size = teaching.shipped_weights_mb(t.weights)
    with card.container(border=True):
        st.markdown(f"#### `{t.drafter}`\n**{t.name}**")
        st.markdown(f"**Reads:** {t.reads}  \n**Training:** {t.training}  \n**Memory besides the target:** "
                    f"{t.overhead}" + (f"; shipped here: {size:.1f} MB of fp16 weights" if size else ""))
        st.markdown(f"**Lossless?** {t.lossless}")
        if t.published:
            st.markdown(f"**Published:** {t.published}  \n*Source:* {t.source}")
        for row in here:
            label = f"measured here on {row['weights']}: τ" if row["weights"] else "measured here: τ"
            st.metric(label, f"{row['tau']:.2f}", None if row["speedup"] is None else
                      f"{row['speedup']:.2f}× over none", delta_color="off",
                      help=f"This process's race run `{row['lane']}` beside `none` on the same settings and weights.")
        if shipped:
            st.metric(f"{elsewhere}: τ", f"{shipped['tau']:.2f}", f"{shipped['speedup']:.2f}× over none",
                      delta_color="off", help="Measured on that machine and weights, not here: the *Topology race* "
                      "measures here.")
if report:
    machine = report["machine"]
    st.caption(
        "“measured here” figures come from this process's race runs only. The others come from "
        f"the shipped bench report of {report['config']['model']} (135M parameters, "
        f"{report['machine'].get('weights', 'fp32')} weights) on "
        f"{report['config']['n_prompts']} MT-bench questions, {report['config']['max_new_tokens']} new tokens, "
        f"temperature {report['config']['temperature']}, on a {machine['cores']}-core {machine['cpu']} CPU "
        f"({machine['date'][:10]}); speedup = median over prompts of tokens/s ÷ tokens/s of `none`. Command: "
        f"`{report['config']['command']}`. The *Benchmarks* page shows the whole report. The published figures are "
        "for far larger targets (T5-XXL 11B and Chinchilla 70B on TPUs, 7B–70B models on GPUs), whose forward passes "
        "are far more memory-bound than a 135M model's on a CPU, with drafters trained on much more data: they are not "
        "comparable one to one."
    )
st.markdown(teaching.EAGLE3_NOTE)
st.markdown(
    "**What the names mean.** *Independent draft model*: any small model with the target's tokenizer "
    f"({teaching.LEVIATHAN}; {teaching.CHEN}). *Medusa*: extra heads on the target's last hidden state, each "
    f"guessing one position further ahead, verified as a fixed tree ({teaching.MEDUSA}). *EAGLE* stands for "
    "Extrapolation Algorithm for Greater Language-model Efficiency: a one-layer head that extrapolates the target's "
    "top-layer feature (the last hidden state; the paper's \"second-to-top layer\" counts the LM head), reading the token one step ahead to remove the uncertainty of which token was "
    f"sampled ({teaching.EAGLE}); *EAGLE-2* grows its tree dynamically, expanding the nodes whose path confidence "
    f"(product of q along the path) is highest ({teaching.EAGLE2}). *Prompt lookup* copies from the context "
    f"({teaching.PROMPT_LOOKUP})."
)

# ------------------------------------------------------------------------------------ the glossary
st.header("2. What the acceptance numbers mean")
st.markdown(
    """
One run, seven numbers, all correct, and easily confused (the two per-position ones agree when every step drafts
to the same depth, and differ wherever the draft length varies: prompt lookup, a draft cut by a probability floor):

| name | definition | where you see it |
|---|---|---|
| **acceptance rate** | accepted drafted tokens ÷ **drafted** tokens (every node of a tree counts) | specviz's `acceptance`, the race table |
| **α, per tested token** | accepted ÷ **tested** tokens (a chain stops testing at its first rejection) | the α of E = (1 − α^(K+1)) ÷ (1 − α) on *Cost and scale* |
| **τ, acceptance length** | tokens committed per target forward, **the replacement or bonus token included** (`none` has τ = 1): 1 + accepted ÷ **every** step | the EAGLE papers' τ; specviz's `tau` |
| **mean acceptance length** | 1 + accepted ÷ the steps that **drafted** something (the bonus token included) | vLLM's *mean acceptance length*; llama.cpp's "mean len" |
| **per-position acceptance** (÷ drafts reaching d) | of the steps whose draft reached depth d, the share that accepted a token at depth d | the race's per-position chart, the runs table here |
| **per-position acceptance** (÷ every draft) | of all the steps that drafted, the share that accepted a token at depth d: a draft that stopped short of d counts as a miss | vLLM's and llama.cpp's `num_accepted_tokens_per_pos` ÷ `num_drafts`; the *Server observatory*'s aᵢ |
| **acceptance histogram** | of the steps that drafted, how many accepted 0, 1, 2, … drafted tokens | *Live decoding*, the race, *Benchmarks*; vLLM's per-request `acceptance_histogram` |

A tree drafter drafts many tokens per step but can accept at most one path of them, so its acceptance rate is
low by construction even when it is doing well. A percentage in a paper is a rate, never τ (τ is a count of
tokens, such as 3.5): EAGLE's "about 0.8" is its draft's accuracy, the share of its predictions that are the
target's token; vLLM's `draft_acceptance_rate` is accepted ÷ drafted. Read which rate it is before comparing, and
compare τ with τ. τ and the mean acceptance length are equal only when every step drafts: prompt lookup drafts
nothing where it finds no match, and in the default-settings bench at T = 0 (`docs/results/bench-default-t0.json`)
`ngram` has a mean acceptance length of 1.82 against τ 1.46 (3,604 of its 6,405 steps drafted).
"""
)
tree_run = (report or {}).get("drafters", {}).get("eagle2")
if tree_run and tree_run["steps"]:
    st.markdown(
        f"In the shipped bench report `eagle2` drafted {tree_run['drafted'] / tree_run['steps']:.1f} tokens per step "
        f"and accepted {tree_run['accepted'] / tree_run['steps']:.2f} of them: an acceptance rate of "
        f"{tree_run['acceptance_rate']:.0%}, and yet τ = {tree_run['tau']:.2f} tokens per target forward "
        "(the accepted ones plus the one token every step adds).")
st.caption(f"Sources: τ as the EAGLE papers define it ({teaching.EAGLE}), and its draft accuracy of about 0.8 "
           f"(the same paper); {teaching.VLLM_METRICS}: vLLM counts the bonus token in its mean acceptance length "
           "and divides by the steps that drafted; llama.cpp's server logs its \"mean len\" the same way; "
           f"{teaching.VLLM_PER_REQUEST}. The counts below come from the run's own events "
           "(see docs/events.md: `stats.drafted`, `stats.accepted`, the steps' `tests`).")

trace, source = state.get_trace()
if trace and state.done_of(trace) and trace[0]["drafter"] != PLAIN:
    numbers = teaching.acceptance_numbers(trace)
    st.subheader(f"Your run: the {source}, drafter `{trace[0]['drafter']}`")
    c = st.columns(6)
    c[0].metric("acceptance rate (÷ drafted)", "—" if numbers.per_drafted is None else f"{numbers.per_drafted:.1%}",
                help=f"{numbers.accepted} accepted ÷ {numbers.drafted} drafted")
    c[1].metric("α (÷ tested)", "—" if numbers.per_tested is None else f"{numbers.per_tested:.1%}",
                help=f"{numbers.accepted} accepted ÷ {numbers.tested} tested")
    c[2].metric("τ (tokens per target forward)", f"{numbers.tau:.2f}",
                help=f"{numbers.new_tokens} tokens ÷ {numbers.steps} target forwards")
    mal = numbers.mean_acceptance_length
    c[5].metric("mean acceptance length (vLLM's)", "—" if mal is None else f"{mal:.2f}",
                help=f"1 + {numbers.accepted} accepted ÷ {numbers.drafting_steps} steps that drafted (τ divides by "
                     f"all {numbers.steps})")
    c[3].metric("accepted per step", f"{numbers.accepted_per_step:.2f}",
                help="τ minus the one token every step adds itself (less at an end-of-sequence cut)")
    c[4].metric("drafted per step", f"{numbers.drafted / max(numbers.steps, 1):.1f}")
    if numbers.per_position:
        st.dataframe([{"depth d": d + 1, "steps reaching d": numbers.reached[d] if d < len(numbers.reached) else None,
                       "accepting at d ÷ reaching d": round(rate, 3)} for d, rate in enumerate(numbers.per_position)],
                     hide_index=True)
else:
    st.info("Decode a run with a drafter on the *Live decoding* page (or pick one in the *Topology race*) to see "
            "these numbers for it.")

if measured:
    st.subheader("The shipped bench report, the same way")
    st.dataframe(
        [{"drafter": name, "acceptance rate (÷ drafted)": None if m["acceptance"] is None else round(m["acceptance"], 3),
          "τ": round(m["tau"], 2),
          "mean acceptance length (÷ steps that drafted)": None if m["mean_acceptance_length"] is None
          else round(m["mean_acceptance_length"], 2),
          "per-position (depth 1, 2, …)": ", ".join(f"{r:.2f}" for r in m["per_position"]) or "—",
          "speedup": f"{m['speedup']:.2f}×"} for name, m in measured.items()],
        hide_index=True,
    )
    tree, chain = measured.get("eagle2"), measured.get("draft:adaptive=true")
    if tree and chain and tree["acceptance"] < chain["acceptance"] and tree["tau"] > chain["tau"]:
        st.caption(f"Read `eagle2` against `draft:adaptive=true`: a lower acceptance rate ({tree['acceptance']:.0%} "
                   f"against {chain['acceptance']:.0%}) and yet a larger τ ({tree['tau']:.2f} against "
                   f"{chain['tau']:.2f}), because it drafts a whole tree per step and one path of it is enough. Same "
                   "report and command as above.")
