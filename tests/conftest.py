"""Shared fixtures: a tiny random model with the real SmolLM2 tokenizer, saved as a local model folder."""
from pathlib import Path

import pytest

from specviz import models


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A random LlamaForCausalLM (hidden 32, 2 layers, SmolLM2's 49,152-token vocabulary) and the real tokenizer
    in a folder that `specviz.models.load` and the app's sidebar accept. Skips without the cached SmolLM2."""
    source = models.model_dir("smollm2-135m")
    if not (source / "tokenizer.json").is_file():
        pytest.skip(f"needs the SmolLM2 tokenizer in {source} (run `make fetch`)")
    import torch
    from transformers import (
        AutoTokenizer,
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )

    tokenizer = AutoTokenizer.from_pretrained(source)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id)
    folder = tmp_path_factory.mktemp("tiny-smollm")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_models(tiny_model_dir):
    """The tiny model loaded once on the CPU (a specviz.models.LoadedModels)."""
    return models.load(str(tiny_model_dir), device="cpu")


def synthetic_tree_trace() -> list[dict]:
    """A hand-built trace with one EAGLE-2-style tree step (build stages included), for the tree pages before a
    tree drafter exists. Tokens carry markup to check escaping. The tree:

        root ─ A (accepted) ─ C (rejected)
             │              └ D (accepted) → bonus E
             └ B (never tested) ─ F (never tested)
    """
    def top(*pairs):
        return [[token, text, prob] for token, text, prob in pairs]

    cand = lambda cid, parent, token, text, q, score: {  # noqa: E731
        "cid": cid, "parent_cid": parent, "token": token, "text": text, "q": q, "score": score}
    build = [
        {"stage": "expand", "depth": 1, "kept": [0, 1], "candidates": [
            cand(0, -1, 101, " A", 0.5, 0.5), cand(1, -1, 102, "<b>B</b>", 0.3, 0.3), cand(2, -1, 103, " G", 0.1, 0.1)]},
        {"stage": "expand", "depth": 2, "kept": [3, 4], "candidates": [
            cand(3, 0, 104, " C", 0.6, 0.3), cand(4, 0, 105, " D", 0.3, 0.15), cand(5, 1, 106, "\n", 0.5, 0.15),
            cand(6, 1, 107, " H", 0.2, 0.06)]},
        {"stage": "rerank", "total_tokens": 5, "kept": [0, 1, 3, 4, 5], "node_ids": [[0, 0], [1, 1], [3, 2], [4, 3], [5, 4]]},
    ]
    node = lambda i, token, text, parent, depth, q, score, p: {  # noqa: E731
        "id": i, "token": token, "text": text, "parent": parent, "depth": depth, "q": q, "score": score,
        "q_top": top((token, text, q), (999, " z", 0.05)), "p": p}
    nodes = [node(0, 101, " A", -1, 1, 0.5, 0.5, 0.7), node(1, 102, "<b>B</b>", -1, 1, 0.3, 0.3, 0.1),
             node(2, 104, " C", 0, 2, 0.6, 0.3, 0.2), node(3, 105, " D", 0, 2, 0.3, 0.15, 0.5),
             node(4, 106, "\n", 1, 2, 0.5, 0.15, 0.3)]
    test = lambda n, token, text, p, q, u, ok, residual=None: {  # noqa: E731
        "node": n, "token": token, "text": text, "p": p, "q": q, "alpha": min(1.0, p / q), "u": u, "accepted": ok,
        "residual_top": residual}
    step = {
        "type": "step", "step": 1, "position": 7, "nodes": nodes, "build": build,
        "target": [{"node": -1, "p_top": top((101, " A", 0.7), (102, "<b>B</b>", 0.1))},
                   {"node": 0, "p_top": top((105, " D", 0.5), (104, " C", 0.2))},
                   {"node": 3, "p_top": top((108, " E", 0.9))}],
        "tests": [test(0, 101, " A", 0.7, 0.5, 0.4, True),
                  test(2, 104, " C", 0.2, 0.6, 0.8, False, top((105, " D", 0.75), (108, " E", 0.25))),
                  test(3, 105, " D", 0.75, 0.3, 0.5, True)],
        "accepted_path": [0, 3],
        "final": {"token": 108, "text": " E", "kind": "bonus", "dist_top": top((108, " E", 0.9))},
        "committed": [{"token": 101, "text": " A", "kind": "accepted"}, {"token": 105, "text": " D", "kind": "accepted"},
                      {"token": 108, "text": " E", "kind": "bonus"}],
        "text_delta": " A D E",
        "timing": {"draft_ms": 3.0, "verify_ms": 20.0, "step_ms": 24.0, "elapsed_s": 0.05, "tokens_per_s": 60.0},
        "lossy": False,
    }
    start = {"type": "start", "schema_version": 1, "model": "synthetic", "drafter": "eagle2",
             "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0},
             "options": {"k": 4, "depth": 2, "top_k": 2, "total_tokens": 5}, "seed": 0, "max_new_tokens": 3,
             "prompt_text": "<i>hello</i>", "prompt_token_ids": [1, 2, 3], "device": "cpu", "dtype": "float32",
             "lossy": False}
    done = {"type": "done", "text": " A D E", "token_ids": [101, 105, 108], "stop_reason": "max_new_tokens",
            "text_delta": "", "stats": {"steps": 1, "new_tokens": 3, "tau": 3.0, "acceptance_rate": 0.4, "drafted": 5,
                                        "accepted": 2, "per_position_acceptance": [1.0, 1.0], "wall_s": 0.05,
                                        "tokens_per_s": 60.0, "draft_s": 0.003, "verify_s": 0.02}}
    return [start, step, done]


@pytest.fixture
def tree_trace() -> list[dict]:
    return synthetic_tree_trace()


@pytest.fixture
def one_thread():
    """Tiny models: thread start-up dominates, so one torch thread is several times faster."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
