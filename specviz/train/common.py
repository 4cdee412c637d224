"""Paths, target loading and small helpers shared by the data job and the trainers."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from specviz.paths import cache_root  # one cache root for fetched models and training data

TARGET_NAME = "smollm2-135m"


def default_model_path() -> Path:
    return cache_root() / TARGET_NAME


def default_data_dir() -> Path:
    return cache_root() / "train" / TARGET_NAME


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_target(model_path: str | Path):
    """The frozen fp32 target and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    model.eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    return model, tokenizer
