"""GGUF's block formats as specviz keeps them in memory: Q4_1, Q8_0, Q5_0, Q4_K and Q6_K tensors parsed from a
file's raw bytes into codes and scales (the layouts specviz/kernels/quant.py describes and its ops read), widened
where a format has two levels of scales, and dequantized to fp32 for tests and tools."""

from __future__ import annotations

import numpy as np
import torch

GROUP = 32  # weights per (scale, minimum) pair in Q4_1
BLOCK_BYTES = 20  # one Q4_1 block: fp16 d, fp16 m, 16 bytes of codes
Q8_BLOCK_BYTES = 34  # one Q8_0 block: fp16 d, 32 int8 codes
Q5_0_BYTES = 22  # one Q5_0 block: fp16 d, 4 bytes of fifth bits, 16 bytes of low nibbles
Q4_K_BYTES = 144  # one Q4_K super-block: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and minimums, 128 of codes
Q6_K_BYTES = 210  # one Q6_K super-block: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, fp16 d


def _split_blocks(blocks: np.ndarray | torch.Tensor, size: int, kind: str) -> torch.Tensor:
    """A GGUF tensor's raw bytes (out, blocks * size) uint8 → (out, blocks, size) uint8."""
    raw = blocks if isinstance(blocks, torch.Tensor) else torch.from_numpy(np.array(blocks, dtype=np.uint8))
    out, width = raw.shape
    if width % size:
        raise ValueError(f"a {kind} row is a whole number of {size}-byte blocks, got {width} bytes")
    return raw.reshape(out, width // size, size)


def _fp16_field(grouped: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 at bytes [at, at + 2) of every block, widened: (out, blocks) fp32."""
    return grouped[..., at : at + 2].contiguous().view(torch.float16).reshape(grouped.shape[0], -1).float()


def parse_q4_1(blocks: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A GGUF Q4_1 tensor's raw bytes (out, in / 32 * 20) uint8 → codes (out, in / 2) uint8, scales and mins
    (out, in / 32) fp32."""
    grouped = _split_blocks(blocks, BLOCK_BYTES, "Q4_1")
    return grouped[..., 4:].reshape(grouped.shape[0], -1).contiguous(), _fp16_field(grouped, 0), _fp16_field(grouped, 2)


def parse_q8_0(blocks: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A GGUF Q8_0 tensor's raw bytes (out, in / 32 * 34) uint8 → codes (out, in) int8, scales (out, in / 32) fp32."""
    grouped = _split_blocks(blocks, Q8_BLOCK_BYTES, "Q8_0")
    return grouped[..., 2:].contiguous().view(torch.int8).reshape(grouped.shape[0], -1), _fp16_field(grouped, 0)


def parse_q5_0(blocks: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A GGUF Q5_0 tensor's raw bytes (out, in / 32 * 22) uint8 → codes (out, in) int8 (q − 16) and scales
    (out, in / 32) fp32, Q8_0's layout: w = d code exactly (an fp16 d times a 5-bit integer)."""
    grouped = _split_blocks(blocks, Q5_0_BYTES, "Q5_0")
    out = grouped.shape[0]
    nibbles = grouped[..., 6:].to(torch.int16)  # byte j: weight j low, weight j + 16 high
    low = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1)  # (out, groups, 32)
    fifth = grouped[..., 2:6].to(torch.int64)  # little-endian 32 bits: bit j is weight j's fifth bit
    bits = (fifth[..., 0] | fifth[..., 1] << 8 | fifth[..., 2] << 16 | fifth[..., 3] << 24).unsqueeze(-1)
    high = ((bits >> torch.arange(32)) & 1).to(torch.int16) << 4
    codes = ((low | high) - 16).to(torch.int8).reshape(out, -1)
    return codes.contiguous(), _fp16_field(grouped, 0)


def parse_q4_k_levels(blocks: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A GGUF Q4_K tensor's raw bytes (out, in / 256 * 144) uint8 → its own two-level layout, as q4k_linear reads it:
    codes (out, in / 2) uint8 (parse_q4_1's order), d and −dmin (out, in / 256) fp32, sc and m (out, in / 32) uint8
    (each group's 6-bit scale and minimum), so that w = (d sc) q + (−dmin m) is Q4_K's value."""
    grouped = _split_blocks(blocks, Q4_K_BYTES, "Q4_K")
    out, supers = grouped.shape[:2]
    d, dmin = _fp16_field(grouped, 0), _fp16_field(grouped, 2)
    packed = grouped[..., 4:16]  # 8 six-bit scales and 8 six-bit minimums (llama.cpp's get_scale_min_k4)
    low, high = packed[..., :4], packed[..., 4:8]  # bytes 0-3, 4-7
    rest = packed[..., 8:12]  # bytes 8-11
    sc = torch.cat([low & 63, (rest & 0x0F) | ((low >> 6) << 4)], dim=-1)  # (out, supers, 8)
    mn = torch.cat([high & 63, (rest >> 4) | ((high >> 6) << 4)], dim=-1)
    # codes: 4 runs of 32 bytes per super-block; run j holds group 2j in its low nibbles, group 2j + 1 in its high
    runs = grouped[..., 16:].reshape(out, supers, 4, 32)
    q = torch.stack([runs & 0x0F, runs >> 4], dim=3).reshape(out, supers * 8, 32)  # (out, groups, 32), in order
    codes = q[..., :16] | (q[..., 16:] << 4)  # Q4_1's order: byte j holds weight j low, weight j + 16 high
    return (codes.reshape(out, -1).contiguous(), d.contiguous(), (-dmin).contiguous(),
            sc.reshape(out, -1).contiguous(), mn.reshape(out, -1).contiguous())


def widen_q4_k(codes, d, dmin, sc, m) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K's two levels (parse_q4_k_levels) → Q4_1 groups: codes, scales d sc and mins −dmin m (out, in / 32) fp32
    (an fp16 times a 6-bit integer: exact in fp32)."""
    per = sc.shape[1] // d.shape[1]
    return codes, d.repeat_interleave(per, 1) * sc.float(), dmin.repeat_interleave(per, 1) * m.float()


def parse_q4_k(blocks: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A GGUF Q4_K tensor's raw bytes → Q4_1 groups as parse_q4_1 gives them: codes (out, in / 2) uint8, scales and
    mins (out, in / 32) fp32, with w = scale q + min exactly Q4_K's value."""
    return widen_q4_k(*parse_q4_k_levels(blocks))


def parse_q6_k_levels(blocks: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A GGUF Q6_K tensor's raw bytes (out, in / 256 * 210) uint8 → codes (out, in) int8 (q − 32), d (out, in / 256)
    fp32 and sc (out, in / 16) int8 (each 16 weights' scale), as q6k_linear reads them: w = (d sc) code."""
    grouped = _split_blocks(blocks, Q6_K_BYTES, "Q6_K")
    out, supers = grouped.shape[:2]
    low = grouped[..., :128].reshape(out, supers, 2, 2, 32)  # (half, run of 32 bytes, byte)
    high = grouped[..., 128:192].reshape(out, supers, 2, 1, 32)
    # weight 128 h + 32 k + l (k = 0..3, l < 32): run k % 2's low (k < 2) or high nibble, high bits (k * 2)
    nibbles = torch.cat([low & 0x0F, low >> 4], dim=3)  # (out, supers, 2, 4, 32): k = 0, 1 low; 2, 3 high
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 1, 4, 1)
    q = nibbles.to(torch.int16) | (((high >> shifts) & 3).to(torch.int16) << 4)
    codes = (q - 32).to(torch.int8).reshape(out, -1)
    sub = grouped[..., 192:208].contiguous().view(torch.int8).reshape(out, -1)  # (out, supers * 16)
    return codes.contiguous(), _fp16_field(grouped, 208).contiguous(), sub.contiguous()


def widen_q6_k(codes, d, sc) -> tuple[torch.Tensor, torch.Tensor]:
    """Q6_K's two levels (parse_q6_k_levels) → codes and scales d sc (out, in / 16) fp32 (exact)."""
    return codes, d.repeat_interleave(sc.shape[1] // d.shape[1], 1) * sc.float()


def parse_q6_k(blocks: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A GGUF Q6_K tensor's raw bytes → codes (out, in) int8 (q − 32) and scales (out, in / 16) fp32 (d times each
    sub-block's int8 scale, exact), so that w = scale code is Q6_K's value."""
    return widen_q6_k(*parse_q6_k_levels(blocks))


def dequantize_q8(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(out, in) fp32: w = d q per group of 32, or per 16 where scales is (out, in / 16) (one rounding: exact for
    Q8_0, Q6_K's own rounding for its values)."""
    out = codes.shape[0]
    size = codes.shape[1] // scales.shape[1]
    return (codes.reshape(out, -1, size).float() * scales.unsqueeze(-1)).reshape(out, -1)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """(out, in) fp32: w = d q + m per group (d q is exact in fp32, so this rounds once, as the op does)."""
    out = codes.shape[0]
    grouped = codes.reshape(out, -1, GROUP // 2)
    q = torch.cat([grouped & 0x0F, grouped >> 4], dim=-1).float()  # (out, groups, 32): low nibbles, then high
    return (q * scales.unsqueeze(-1) + mins.unsqueeze(-1)).reshape(out, -1)


def quantize_q4_1(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A float weight (out, in), in a multiple of 32, as Q4_1 groups in the layout the op reads: codes (out, in / 2)
    uint8, scales and mins (out, in / 32) fp32. Per group of 32: m = its minimum, d = (maximum - m) / 15, and
    q = round((w - m) / d) in 0..15 (llama.cpp's Q4_1 rule; d and m kept in fp32, not rounded to fp16), so each
    weight moves by at most d / 2 (plus rounding)."""
    out, inp = weight.shape
    if inp % GROUP:
        raise ValueError(f"Q4_1 needs the input size in whole groups of {GROUP}, got {inp}")
    grouped = weight.detach().float().reshape(out, inp // GROUP, GROUP)
    mins, maxs = grouped.amin(-1), grouped.amax(-1)
    scales = (maxs - mins) / 15
    inverse = torch.where(scales > 0, 1 / scales, torch.zeros_like(scales))
    q = ((grouped - mins.unsqueeze(-1)) * inverse.unsqueeze(-1)).round().clamp(0, 15).to(torch.uint8)
    codes = q[..., : GROUP // 2] | (q[..., GROUP // 2 :] << 4)  # byte j: code j low, code j + 16 high
    return codes.reshape(out, inp // 2).contiguous(), scales.contiguous(), mins.contiguous()
