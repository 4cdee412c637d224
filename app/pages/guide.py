"""Start here: a guided path through the pages for an engineer new to speculative decoding, about 20 minutes,
one thing to try on each page."""
import streamlit as st

from app import state

# (page file, title as in the navigation, minutes, what the page teaches, the one thing to try)
PATH = [
    ("app/pages/overview.py", "Why it works", 3,
     "Why a decoding step at batch 1 costs about the same for 1 token as for 5, and the draft → verify → accept "
     "rule with its proof of losslessness.",
     "Switch the preset from *70B model, 16-bit, 2× H100* to *70B model, 4-bit, H100*: how do the milliseconds "
     "per token change, and why? Then press **Measure this machine**."),
    ("app/pages/live.py", "Live decoding", 3,
     "A real run, token by token, coloured by origin: accepted draft tokens, replacements, bonus tokens.",
     "Run the default prompt with `eagle2` at temperature 0, then at 0.8. Which colour dominates, and how many "
     "tokens does one step add at most?"),
    ("app/pages/tree.py", "EAGLE tree explorer", 4,
     "How EAGLE-2 grows its tree depth by depth, how the target scores every node in one pass (the attention mask), "
     "and how the tree is verified.",
     "Step through the construction stages of one step. Then, on a run at temperature > 0, read *How this step was "
     "verified*: compare the rule applied (point mass, α = p′(x)) with the chain rule beside it."),
    ("app/pages/lab.py", "Rejection sampling lab", 4,
     "One real acceptance test up close, and a sandbox that samples the rule thousands of times.",
     "Answer the questions in **Check yourself** (built from your own run). Then in the sandbox plant the bug, for "
     "the chain and for picked siblings, and watch the chi-square p-value collapse."),
    ("app/pages/topologies.py", "Topologies compared", 2,
     "What each drafter reads, needs and gives; what accepted ÷ drafted, accepted ÷ tested and τ each mean.",
     "Find why `eagle2` has a lower acceptance rate than `draft:adaptive=true` in the shipped report and yet a "
     "higher τ."),
    ("app/pages/race.py", "Topology race", 2,
     "Every drafter on the same prompt and settings: who finishes first, and whether the texts agree.",
     "Race `none`, `ngram` and `eagle2` over 24 tokens at temperature 0: do all lanes produce the same text?"),
    ("app/pages/cost.py", "Cost and scale", 1,
     "Speedup predicted from α and the measured step costs against the speedup measured; cost per million tokens; "
     "what batching does to the gain.",
     "After the race, compare the predicted and the measured speedup of the `ngram` run."),
    ("app/pages/lossless.py", "Is it really lossless?", 1,
     "The statistical check that speculative sampling leaves the target's distribution unchanged.",
     "Run the check and read the p-value: what would a value below 0.01 mean? Then read *How sure are we*: how "
     "large a difference could your N have missed?"),
]
# the sidebar's other pages: measured results and a server's own metrics, for after the path
LATER = [
    ("app/pages/benchmarks.py", "Benchmarks",
     "The measured comparison of every drafter with transformers' own generation on this machine, with the command "
     "that produced it; a report of your own can be loaded."),
    ("app/pages/observatory.py", "Server observatory",
     "A running vLLM or llama.cpp server speculating under its real load, read from its Prometheus /metrics."),
]

state.intro(
    "Start here",
    f"A path through specviz for an engineer new to speculative decoding: {len(PATH)} pages, about "
    f"{sum(p[2] for p in PATH)} minutes, one thing to try on each, then {len(LATER)} pages for later. With this one "
    f"they are the {1 + len(PATH) + len(LATER)} pages of the sidebar. Every page explains its own terms; the "
    "notation is the same everywhere.",
)
st.info("**Notation:** **p** is the target model's distribution and **q** the draft's (after temperature, top-k and "
        "top-p); α = min(1, p(x)/q(x)) is the probability of accepting a drafted token x (α = p(x) for a token that "
        "was picked rather than sampled); u is the uniform draw it is compared with; τ is the number of tokens one "
        "target forward pass commits.")
shared, _ = state.current()
if shared is None:
    st.warning("Load a model in the sidebar first: the embedded SmolLM2-135M runs on any CPU.")

for number, (page, title, minutes, what, try_this) in enumerate(PATH, 1):
    with st.container(border=True):
        left, right = st.columns([3, 1])
        left.markdown(f"**{number}. {title}** · about {minutes} min  \n{what}")
        left.markdown(f"*Try this:* {try_this}")
        right.page_link(page, label=f"Open {title}", icon=":material/arrow_forward:")
st.subheader("For later")
for number, (page, title, what) in enumerate(LATER, len(PATH) + 1):
    with st.container(border=True):
        left, right = st.columns([3, 1])
        left.markdown(f"**{number}. {title}**  \n{what}")
        right.page_link(page, label=f"Open {title}", icon=":material/arrow_forward:")
