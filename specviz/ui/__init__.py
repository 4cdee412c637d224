"""Streamlit helpers for the app's pages. `runner` and `figures` do not import streamlit; `state` and `views` do."""
