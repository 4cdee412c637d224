"""The Streamlit app: the shared state and sidebar (state.py), running decodes for the pages (runner.py), the
figures (figures.py) and the pages (pages/). The only code that imports streamlit; specviz/ is the library."""
