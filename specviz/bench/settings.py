"""What a bench run measures: a decode configuration plus the bench's own settings (read by the runner, the
report and the peers alike)."""
from __future__ import annotations

from dataclasses import dataclass

from specviz.decoding.settings import DecodeSettings

FULL_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64)  # dense where the CPU curve is not smooth (see costs.AUTO_SIZES)
QUICK_SIZES = (1, 4, 16)

@dataclass(frozen=True)
class BenchSettings(DecodeSettings):
    """A decode configuration (specviz.decoding.settings.DecodeSettings: k is also num_assistant_tokens and
    prompt_lookup_num_tokens for the peers) plus what the bench measures around it."""

    max_new_tokens: int = 128
    drafters: tuple[str, ...] = ()  # empty: every drafter available for the models; `none` always runs
    repeats: int = 1  # decodes of each (prompt, method); the median time is kept
    peers: bool = True  # transformers' generate() peers
    llama_cpp: bool = True  # llama.cpp's peers, where llama-cpp-python is installed and the model has a GGUF
    warmup: bool = True
    verify_sizes: tuple[int, ...] = FULL_SIZES  # () skips the cost curves and the prediction
    context_len: int = 256  # cached tokens before the timed forward: a prompt plus part of an answer
    cost_repeats: int = 5  # timed forwards per size, median kept (after one untimed)
    tree_branching: int = 4  # the tree curve's shape: a full tree, this many children per node, breadth first
    bandwidth_mb: int = 256  # size of the tensor copied to measure memory bandwidth
    bandwidth_repeats: int = 5
    vllm: tuple[tuple[str, str], ...] = ()  # (label, URL) of running vLLM servers, each a lane (specviz.bench.vllm)
    llama_server: tuple[str, ...] = ()  # llama-server configurations the bench starts, each a lane (bench/llamaserver.py)
    # draft-length policies each drafter runs under, side by side (specviz.decoding.policy): () runs each drafter as
    # named (cost-aware unless it says k_policy=fixed); ("cost", "fixed") runs both lanes of every drafter
    k_policies: tuple[str, ...] = ()


def quick_settings(**overrides) -> BenchSettings:
    """Fewer cost-curve sizes and repeats: a smoke run."""
    return BenchSettings(**{"verify_sizes": QUICK_SIZES, "cost_repeats": 3, "bandwidth_repeats": 3, **overrides})
