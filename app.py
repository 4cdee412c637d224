"""specviz: speculative decoding you can watch. Entry point: page config, the shared sidebar, the pages.

Run with `make run` (streamlit run app.py). SPECVIZ_DEFAULT_MODEL=<preset or folder> picks the model the
sidebar starts with."""
from pathlib import Path

import streamlit as st

from specviz.ui import state

st.set_page_config(page_title="specviz", page_icon=":material/fast_forward:", layout="wide")

HERE = Path(__file__).parent
PAGES = [
    st.Page("pages/overview.py", title="Why it works", icon=":material/lightbulb:", default=True),
    st.Page("pages/live.py", title="Live decoding", icon=":material/play_arrow:"),
    st.Page("pages/tree.py", title="EAGLE tree explorer", icon=":material/account_tree:"),
    st.Page("pages/lab.py", title="Rejection sampling lab", icon=":material/casino:"),
    st.Page("pages/race.py", title="Topology race", icon=":material/sports_score:"),
    st.Page("pages/cost.py", title="Cost and scale", icon=":material/payments:"),
    st.Page("pages/lossless.py", title="Is it really lossless?", icon=":material/balance:"),
]
if (HERE / "pages" / "benchmarks.py").is_file():  # written separately; listed once it exists
    PAGES.append(st.Page("pages/benchmarks.py", title="Benchmarks", icon=":material/bar_chart:"))

st.session_state[state.IN_APP] = True  # pages check it: see state.intro
try:
    state.sidebar()
    st.navigation(PAGES).run()
finally:
    st.session_state[state.IN_APP] = False
