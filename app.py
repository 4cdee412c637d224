"""specviz: speculative decoding you can watch. Entry point: page config, the shared sidebar, the pages.

Run with `make run` (streamlit run app.py). SPECVIZ_DEFAULT_MODEL=<preset or folder> picks the model the
sidebar starts with."""
# Streamlit imports pandas and pyarrow lazily, inside st.dataframe; sessions that draw their first table at the
# same moment (a room pressing Run together on a fresh server) each import them in their own thread, and some get
# a partially initialised module ("module 'pandas' has no attribute 'Series'"). Importing them here, where every
# session's first script run passes before it can draw anything, finishes that import once.
import pandas  # noqa: F401
import pyarrow  # noqa: F401
import streamlit as st

from app import state

st.set_page_config(page_title="specviz", page_icon=":material/fast_forward:", layout="wide")

PAGES = [
    st.Page("app/pages/guide.py", title="Start here", icon=":material/school:", default=True),
    st.Page("app/pages/overview.py", title="Why it works", icon=":material/lightbulb:"),
    st.Page("app/pages/live.py", title="Live decoding", icon=":material/play_arrow:"),
    st.Page("app/pages/tree.py", title="EAGLE tree explorer", icon=":material/account_tree:"),
    st.Page("app/pages/lab.py", title="Rejection sampling lab", icon=":material/casino:"),
    st.Page("app/pages/topologies.py", title="Topologies compared", icon=":material/compare:"),
    st.Page("app/pages/race.py", title="Topology race", icon=":material/sports_score:"),
    st.Page("app/pages/cost.py", title="Cost and scale", icon=":material/payments:"),
    st.Page("app/pages/lossless.py", title="Is it really lossless?", icon=":material/balance:"),
    st.Page("app/pages/benchmarks.py", title="Benchmarks", icon=":material/bar_chart:"),
    st.Page("app/pages/observatory.py", title="Server observatory", icon=":material/monitoring:"),
]
# The pages live in app/pages/, not in a pages/ folder beside this script: Streamlit would also run the files of
# such a folder as pages of their own (without this script's sidebar) and, on a fresh server, drop the first
# browser session's first click.
state.sidebar()
st.navigation(PAGES).run()
