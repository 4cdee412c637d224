"""EAGLE-3 draft heads (Li et al., 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
Training-Time Test"), in the layout the published heads use.
"""
from __future__ import annotations


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """The target layers whose inputs an EAGLE-3 head fuses when its config names none: 2, N // 2 and N - 3, as
    SafeAILab/EAGLE's EAGLE-3 targets and vLLM choose them (low, middle and high features)."""
    return (2, num_layers // 2, num_layers - 3)
