"""Placeholder until the app issue lands: generate with the engine and show the tokens by how they were made."""
import html

import streamlit as st

import specviz

st.set_page_config(page_title="specviz", layout="wide")
st.title("specviz: speculative decoding you can watch")
prompt = st.text_area("Prompt", "Write a Python function that reverses a string.")
drafter = st.selectbox("Drafter", ["ngram", "none"])
if st.button("Run"):
    colours = {"accepted": "#c8f7c5", "replacement": "#ffd6a5", "bonus": "#a0c4ff", "autoregressive": "#e0e0e0"}
    out = st.empty()
    pieces = []
    try:
        for event in specviz.stream(prompt, drafter=drafter, max_new_tokens=64):
            if event.type == "step":
                pieces += [f'<span style="background:{colours[c.kind]}">{html.escape(c.text)}</span>' for c in event.committed]
                out.markdown("".join(pieces), unsafe_allow_html=True)
            elif event.type == "done":
                st.json(event.stats)
    except specviz.SpecvizError as e:
        st.error(str(e))
