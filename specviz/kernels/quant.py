"""Linear layers whose weights stay 4-bit in memory: Q4_1 groups multiplied by fp32 activations in specviz's C++ op
(csrc/blocklinear.cpp, `torch.ops.specviz.q4_linear`); and the LM head kept 8-bit, as the GGUF's Q8_0 embedding it
is tied to (`torch.ops.specviz.q8_linear`).

Why: at batch 1 a decoding step of a small model on a CPU is bound by the bytes of weights it reads. SmolLM2-135M
comes as a Q4_1 GGUF; dequantized to fp32 its projections are 425 MB a forward, kept 4-bit they are 0.75 bytes a
weight (half a byte of codes, an fp32 scale and minimum per 32 weights): 80 MB.

The numbers are Q4_1's own: each group of 32 weights along the input dimension has a scale d and a minimum m and
w = d q + m for its 4-bit codes q, exactly the fp32 values the dequantized checkpoint holds; the op unpacks each output's
row into a small fp32 buffer (in L1) and sums every output's dot product in one fixed order, so results differ from `F.linear` on the
dequantized weight by rounding only, and a row's result does not depend on how many rows are multiplied with it.

The layout the op reads (repacked once from the GGUF blocks): codes (out, in / 2) uint8, 16 bytes per group, byte j
holding code j in its low nibble and code j + 16 in its high one (the GGUF order); scales and mins (out, in / 32)
fp32 (the file's fp16, widened). Where the op is not built, `available()` is False and loading keeps fp32 weights.

Q8_0 (32 int8 codes q and an fp16 scale d per group, w = d q, exact in fp32) is read as codes (out, in) int8 and
scales (out, in / 32) fp32: 1.125 bytes a weight against fp32's 4. For SmolLM2-135M's tied LM head (49152 × 576)
that is 32 MB a step instead of 113 MB. The same op file computes it, with the same fixed summation order.

The K-quant files (Qwen2.5's Q4_K_M) keep their own two-level scales (Q4KLinear, Q6KLinear; the ops q4k_linear and
q6k_linear): a Q4_K super-block of 256 weights is 8 groups of 32 with a 6-bit scale and minimum each,
w = (d sc) q − (dmin m), held as the codes, d and −dmin (one fp32 per 256 weights) and sc and m (a byte per group):
0.59 bytes a weight; a Q6_K super-block is 16 sub-blocks of 16 weights with an int8 scale each,
w = (d sc) (q − 32), held as 8-bit codes q − 32, d per 256 and sc per 16: 1.08 bytes a weight. The ops widen each
tile of columns' scales into the layouts above (a Q4_1 group with scale d sc and minimum −dmin m; 8-bit codes with
a scale per 16), exact in fp32, so the products are the very bits of the widened ones (parse_q4_k, parse_q6_k give
those, for tests and tools). Q5_0 (the Qwen2.5-Coder-0.5B file's: 32 weights, an fp16 d, w = d (q − 16) for 5-bit
q) is read as Q8_0 is, codes q − 16 and one scale per 32 weights.

With 8-bit activations (`with_8_bit_activations`, `load(..., weights="q4q8")`) the same values are held in tiles of
16 output columns (tile_codes, tile_scales: one 64-byte load reads the same four input positions of 16 columns),
the ops quantize each activation row to 8 bits per group of 32 as llama.cpp's Q8_1 does and multiply in integers
(csrc/intdot.h: AVX-512 VNNI, AVX2 or portable C++), in one fixed order, so rows, threads and paths still give
the same bits. Q4_K is widened to Q4_1 groups and Q6_K to 8-bit codes with a scale per 16 for it (0.75 and 1.25
bytes a weight). A block linear whose output size is not whole tiles keeps fp32 activations.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from specviz.kernels import extension, fastlinear
from specviz.kernels.blocks import (
    GROUP,
    dequantize,
    dequantize_q8,
    quantize_q4_1,
    widen_q4_k,
    widen_q6_k,
)

# the op's `path` argument (SPECVIZ_Q4_PATH for auto); amx: AMX tiles for products of two rows or more on 8-bit
# activations (their other products, and fp32 activations, on AVX-512)
PATHS = {"auto": -1, "portable": 0, "avx2": 1, "avx512": 2, "amx": 3}
TILE = 16  # output columns per tile of the 8-bit-activation layout (csrc/intdot.h)


def available() -> bool:
    """Whether torch.ops.specviz.q4_linear can be used (specviz's C++ ops built and loaded)."""
    return extension.available() and hasattr(torch.ops.specviz, "q4_linear")


def path_runs(path: str, activations: str = "fp32") -> bool:
    """Whether this CPU (and build) can run the op's `path` ("portable", "avx2", "avx512", "amx") with fp32 or
    8-bit ("q8") activations (whose AVX-512 path needs VNNI; amx is for 8-bit activations only)."""
    if not available():
        return False
    try:
        (torch.ops.specviz.q8act_path if activations == "q8" else torch.ops.specviz.q4_path)(PATHS[path])
    except RuntimeError:
        return False
    return True


def tile_codes(codes: torch.Tensor) -> torch.Tensor:
    """Codes (out, bytes) of 4-bit (16 bytes a group) or 8-bit (32) blocks → the same shape in tile order:
    [out / 16][groups][word][16 columns][4 bytes] (csrc/intdot.h); out a multiple of 16."""
    out, width = codes.shape
    words = 4 if codes.dtype == torch.uint8 else 8
    tiled = codes.reshape(out // TILE, TILE, width // (4 * words), words, 4).permute(0, 2, 3, 1, 4)
    return tiled.contiguous().reshape(out, width)


def untile_codes(codes: torch.Tensor) -> torch.Tensor:
    out, width = codes.shape
    words = 4 if codes.dtype == torch.uint8 else 8
    rows = codes.reshape(out // TILE, width // (4 * words), words, TILE, 4).permute(0, 3, 1, 2, 4)
    return rows.contiguous().reshape(out, width)


def tile_scales(scales: torch.Tensor) -> torch.Tensor:
    """(out, n) fp32 → (out / 16, n, 16): each group's scales (or minimums) of 16 columns side by side."""
    return scales.reshape(-1, TILE, scales.shape[1]).transpose(1, 2).contiguous()


def untile_scales(scales: torch.Tensor) -> torch.Tensor:
    return scales.transpose(1, 2).reshape(-1, scales.shape[1]).contiguous()


def q4_product(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
               bias: torch.Tensor | None = None, path: str = "auto") -> torch.Tensor:
    """x (..., in) fp32 → (..., out) = x · Wᵀ (+ bias) with W given by codes, scales and mins (call `available()`
    once first: it loads the op)."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.ops.specviz.q4_linear(flat, codes, scales, mins, bias, PATHS[path])
    return y.reshape(*x.shape[:-1], codes.shape[0])


def q8_product(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
               path: str = "auto") -> torch.Tensor:
    """x (..., in) fp32 → (..., out) = x · Wᵀ (+ bias) with W given by Q8_0 codes and scales."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.ops.specviz.q8_linear(flat, codes, scales, bias, PATHS[path])
    return y.reshape(*x.shape[:-1], codes.shape[0])


def q4k_product(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor, sc: torch.Tensor,
                m: torch.Tensor, bias: torch.Tensor | None = None, path: str = "auto") -> torch.Tensor:
    """x (..., in) fp32 → x · Wᵀ (+ bias) with W in Q4_K's two levels (parse_q4_k_levels)."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.ops.specviz.q4k_linear(flat, codes, d, dmin, sc, m, bias, PATHS[path])
    return y.reshape(*x.shape[:-1], codes.shape[0])


def q6k_product(x: torch.Tensor, codes: torch.Tensor, d: torch.Tensor, sc: torch.Tensor,
                bias: torch.Tensor | None = None, path: str = "auto") -> torch.Tensor:
    """x (..., in) fp32 → x · Wᵀ (+ bias) with W in Q6_K's two levels (parse_q6_k_levels)."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.ops.specviz.q6k_linear(flat, codes, d, sc, bias, PATHS[path])
    return y.reshape(*x.shape[:-1], codes.shape[0])


def check_q8(name: str, codes: torch.Tensor, scales: torch.Tensor) -> None:
    if (codes.dtype != torch.int8 or codes.dim() != 2 or codes.shape[1] not in (scales.shape[1] * GROUP, scales.shape[1] * 16)
            or (scales.dim() == 3 and scales.shape[0] * TILE != codes.shape[0])):
        raise ValueError(f"{name}: codes (out, in) int8, scales (out, in / 32) or (out, in / 16), or in tiles")


class _Projection:
    """x ↦ x · Wᵀ (+ bias) for a weight held as block tensors (one row per output, `FIELDS`, in the order `PRODUCT`
    takes them); `stacked` makes one product of several that read the same input (q, k, v; gate, up), their output
    rows in order."""

    FIELDS: tuple[str, ...] = ()
    PRODUCT = None

    def __init__(self, *blocks: torch.Tensor, bias: torch.Tensor | None = None):
        for name, tensor in zip(self.FIELDS, blocks, strict=True):
            setattr(self, name, tensor)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return type(self).PRODUCT(x, *(getattr(self, name) for name in self.FIELDS), self.bias)

    @classmethod
    def stacked(cls, *parts):
        like = next(t for t in (getattr(parts[0], name) for name in cls.FIELDS) if t.is_floating_point())  # fp32
        bias = fastlinear.stacked_bias([p.bias for p in parts], [p.codes.shape[0] for p in parts], like)
        return cls(*(torch.cat([getattr(p, name) for p in parts]) for name in cls.FIELDS), bias=bias)


class Q4Projection(_Projection):
    """A Q4_1 weight held as (codes, scales, mins)."""

    FIELDS = ("codes", "scales", "mins")
    PRODUCT = staticmethod(q4_product)


class Q8Projection(_Projection):
    """An 8-bit weight held as (codes, scales), one scale layout."""

    FIELDS = ("codes", "scales")
    PRODUCT = staticmethod(q8_product)


class Q4KProjection(_Projection):
    """A Q4_K weight held in its two levels (codes, d, dmin, sc, m)."""

    FIELDS = ("codes", "d", "dmin", "sc", "m")
    PRODUCT = staticmethod(q4k_product)


class Q6KProjection(_Projection):
    """A Q6_K weight held in its two levels (codes, d, sc)."""

    FIELDS = ("codes", "d", "sc")
    PRODUCT = staticmethod(q6k_product)


class _BlockLinear(nn.Module):
    """A stand-in for a frozen `nn.Linear` (fp32, CPU) whose weight is kept as GGUF blocks (`PROJECTION.FIELDS`,
    buffers). `weight` is not stored: reading it dequantizes a fresh fp32 copy (for code that concatenates or
    inspects weights, and for other dtypes and devices; the CPU fp32 products never do)."""

    PROJECTION: type[_Projection] = _Projection
    FORMAT = ""

    def __init__(self, *blocks: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = blocks[0].shape[0], self.input_size(blocks[0])
        for name, tensor in zip(self.PROJECTION.FIELDS, blocks, strict=True):
            self.register_buffer(name, tensor.float().contiguous() if tensor.is_floating_point() else tensor.contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)

    @staticmethod
    def input_size(codes: torch.Tensor) -> int:
        return codes.shape[1]

    def blocks(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, name) for name in self.PROJECTION.FIELDS)

    @property
    def weight(self) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def stacked(cls, *modules: "_BlockLinear") -> _Projection:
        """One product for several modules of one layout reading the same input (stacked_blocks)."""
        return cls.PROJECTION.stacked(*(m.projection() for m in modules))

    def projection(self) -> _Projection:
        return self.PROJECTION(*self.blocks(), bias=None if self.bias is None else self.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu":
            return F.linear(x, self.weight.to(x), None if self.bias is None else self.bias.to(x))
        return self.PROJECTION.PRODUCT(x, *self.blocks(), None if self.bias is None else self.bias.detach())

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"weights={self.format}")

    @property
    def format(self) -> str:
        return self.FORMAT + (" tiles, 8-bit activations" if self.activations == "q8" else "")

    @property
    def activations(self) -> str:
        """"q8" where the blocks are in tiles (the ops quantize the activations to 8 bits), else "fp32"."""
        return "q8" if self.blocks()[1].dim() == 3 else "fp32"


class Q4Linear(_BlockLinear):
    """A frozen linear whose weight is Q4_1 codes, scales and minimums (quantize_q4_1's or parse_q4_1's layout)."""

    PROJECTION = Q4Projection
    FORMAT = "Q4_1"

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, bias: torch.Tensor | None = None):
        if (codes.dtype != torch.uint8 or codes.shape[1] * 2 != scales.shape[1] * GROUP or scales.shape != mins.shape
                or (scales.dim() == 3 and scales.shape[0] * TILE != codes.shape[0])):
            raise ValueError("Q4Linear: codes (out, in / 2) uint8, scales and mins (out, in / 32), or in tiles")
        super().__init__(codes, scales, mins, bias=bias)

    @staticmethod
    def input_size(codes: torch.Tensor) -> int:
        return codes.shape[1] * 2

    @property
    def weight(self) -> torch.Tensor:
        return dequantize(*self.untiled())

    def untiled(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """codes, scales, mins in the row layout (parse_q4_1's), whatever layout the module holds."""
        if self.activations == "fp32":
            return self.blocks()
        return untile_codes(self.codes), untile_scales(self.scales), untile_scales(self.mins)

    @classmethod
    def quantized(cls, linear: nn.Module) -> "Q4Linear":
        """A linear layer's weight rounded to Q4_1 groups (quantize_q4_1), its bias kept."""
        return cls(*quantize_q4_1(linear.weight), None if linear.bias is None else linear.bias.detach())


class Q8Linear(_BlockLinear):
    """A frozen linear whose weight is 8-bit codes and scales: Q8_0's (a scale per 32 weights; Q5_0's values as
    parse_q5_0 reads them) or Q6_K's widened (parse_q6_k: a scale per 16)."""

    PROJECTION = Q8Projection

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None):
        check_q8("Q8Linear", codes, scales)
        super().__init__(codes, scales, bias=bias)

    @property
    def weight(self) -> torch.Tensor:
        return dequantize_q8(*self.untiled())

    def untiled(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.activations == "fp32":
            return self.blocks()
        return untile_codes(self.codes), untile_scales(self.scales)

    @property
    def format(self) -> str:
        own = "Q8_0" if self.scales.shape[1] * GROUP == self.in_features else "Q6_K as 8-bit codes"
        return own + (" tiles, 8-bit activations" if self.activations == "q8" else "")


class Q4KLinear(_BlockLinear):
    """A frozen linear whose weight is Q4_K in its own two levels (parse_q4_k_levels): the values of Q4Linear's
    widened Q4_1 groups for 0.59 bytes a weight instead of 0.75."""

    PROJECTION = Q4KProjection
    FORMAT = "Q4_K"

    def __init__(self, codes, d, dmin, sc, m, bias: torch.Tensor | None = None):
        supers = codes.shape[1] * 2 // 256
        if (codes.dtype != torch.uint8 or sc.dtype != torch.uint8 or m.dtype != torch.uint8 or codes.shape[1] % 128
                or d.shape != dmin.shape or d.shape[1] != supers or sc.shape != m.shape or sc.shape[1] != supers * 8):
            raise ValueError("Q4KLinear: codes (out, in / 2) uint8, d and dmin (out, in / 256), sc and m (out, in / 32) uint8")
        super().__init__(codes, d, dmin, sc, m, bias=bias)

    @staticmethod
    def input_size(codes: torch.Tensor) -> int:
        return codes.shape[1] * 2

    @property
    def weight(self) -> torch.Tensor:
        return dequantize(*widen_q4_k(*self.blocks()))


class Q6KLinear(_BlockLinear):
    """A frozen linear whose weight is Q6_K as 8-bit codes with its own two-level scales (parse_q6_k_levels): the
    values of Q8Linear's widened Q6_K for 1.08 bytes a weight instead of 1.25."""

    PROJECTION = Q6KProjection
    FORMAT = "Q6_K"

    def __init__(self, codes, d, sc, bias: torch.Tensor | None = None):
        if (codes.dtype != torch.int8 or sc.dtype != torch.int8 or codes.shape[1] % 256
                or d.shape[1] * 256 != codes.shape[1] or sc.shape[1] * 16 != codes.shape[1]):
            raise ValueError("Q6KLinear: codes (out, in) int8, d (out, in / 256), sc (out, in / 16) int8")
        super().__init__(codes, d, sc, bias=bias)

    @property
    def weight(self) -> torch.Tensor:
        return dequantize_q8(*widen_q6_k(*self.blocks()))


FOUR_BIT = (Q4Linear, Q4KLinear)
EIGHT_BIT = (Q8Linear, Q6KLinear)
BLOCK_LINEARS = FOUR_BIT + EIGHT_BIT


def block_linear(blocks: tuple[torch.Tensor, ...], bias: torch.Tensor | None = None) -> _BlockLinear:
    """The block linear of a parser's tensors: Q4_1 groups (codes, scales, mins: parse_q4_1, parse_q4_k), 8-bit codes
    and fp32 scales (parse_q8_0, parse_q5_0, parse_q6_k), Q4_K's two levels (five tensors: parse_q4_k_levels) or
    Q6_K's (codes, d, int8 sc: parse_q6_k_levels)."""
    if len(blocks) == 5:
        return Q4KLinear(*blocks, bias=bias)
    if len(blocks) == 3 and blocks[2].dtype == torch.int8:
        return Q6KLinear(*blocks, bias=bias)
    if len(blocks) == 3:
        return Q4Linear(*blocks, bias=bias)
    return Q8Linear(*blocks, bias=bias)


def dequantize_blocks(blocks: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """(out, in) fp32 of a parser's tensors (see block_linear)."""
    return block_linear(blocks).weight


class Q8Head:
    """x ↦ x · Wᵀ for an LM head held as 8-bit blocks: Q8_0 (codes, scales) or Q6_K's two levels (codes, d, sc); a
    plain object, not a module: it sits beside the model's own fp32 head, which the embedding shares, and is what
    the engine's target forward calls."""

    def __init__(self, *blocks: torch.Tensor):
        self.linear = blocks[0] if isinstance(blocks[0], _BlockLinear) else block_linear(blocks)
        if not isinstance(self.linear, EIGHT_BIT):
            raise ValueError("Q8Head: 8-bit codes and scales (Q8_0) or Q6_K's (codes, d, sc)")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.linear.blocks())

    def with_8_bit_activations(self) -> "Q8Head":
        return Q8Head(with_8_bit_activations(self.linear))

    def on_8_bit_activations(self, rows: torch.Tensor | None = None) -> bool:
        """Whether the head runs on 8-bit activations, and `rows(rows)` can too (whole tiles of 16 rows)."""
        return (isinstance(self.linear, Q8Linear) and self.linear.activations == "q8"
                and (rows is None or len(rows) % TILE == 0))

    def rows(self, rows: torch.Tensor) -> _BlockLinear:
        """The head over its rows `rows` (a draft vocabulary) on 8-bit activations, where on_8_bit_activations(rows):
        each row's logit has the bits of that row of the whole head."""
        assert isinstance(self.linear, Q8Linear) and self.on_8_bit_activations(rows)
        codes, scales = self.linear.codes, self.linear.scales
        rows = rows.to(codes.device)
        tiles, tile_of_row = torch.unique(rows // TILE, return_inverse=True)  # only the tiles that hold `rows`
        width = codes.shape[1]
        picked = untile_codes(codes.reshape(-1, TILE * width)[tiles].reshape(-1, width))
        at = tile_of_row * TILE + rows % TILE
        return with_8_bit_activations(Q8Linear(picked[at], untile_scales(scales[tiles])[at]))


HEAD_ATTRIBUTE = "specviz_q8_head"  # where a model keeps its Q8Head (specviz.models.quantized.attach_q8_head)


def q8_head(model) -> Q8Head | None:
    """The model's LM head as 8-bit blocks, where loading with 4-bit weights attached one."""
    return getattr(model, HEAD_ATTRIBUTE, None)


class Concatenated:
    """Several block products of the same input, outputs side by side (q and k in 4 bits beside v in 8, as a Q4_K_M
    file mixes them): what one stacked product gives where the formats agree."""

    def __init__(self, *parts):
        self.parts = parts

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)



def stacked_blocks(*modules: nn.Module):
    """One product for block linears reading the same input (the lean decoder's q/k/v, gate/up): stacked where they
    share a format, else each run of neighbours that do stacked and the runs side by side; None where any is not a
    block linear."""
    if not all(isinstance(m, BLOCK_LINEARS) for m in modules):
        return None
    runs = [[modules[0]]]
    for module in modules[1:]:
        if _layout(module) == _layout(runs[-1][-1]):
            runs[-1].append(module)
        else:
            runs.append([module])
    if len(runs) == 1:
        return type(modules[0]).stacked(*modules)
    return Concatenated(*(type(run[0]).stacked(*run) for run in runs))


def _layout(module: nn.Module) -> tuple:
    return type(module), tuple(b.shape[1:] for b in module.blocks())


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(m, BLOCK_LINEARS) for m in model.modules())


def quantize_linears(module: nn.Module, activations: str = "fp32", keep: tuple[str, ...] = ()) -> int:
    """Swap every `nn.Linear` under `module` whose input size is whole Q4_1 groups for a Q4Linear of its weight
    rounded to 4 bits (Q4Linear.quantized), in tiles for 8-bit activations where `activations` is "q8", in place,
    except children named in `keep`; returns how many were swapped."""
    swaps = [(parent, name, child) for parent in module.modules() for name, child in parent.named_children()
             if type(child) is nn.Linear and child.in_features % GROUP == 0 and name not in keep]
    for parent, name, child in swaps:
        linear = Q4Linear.quantized(child)
        setattr(parent, name, with_8_bit_activations(linear) if activations == "q8" else linear)
    return len(swaps)


def with_8_bit_activations(linear: _BlockLinear) -> _BlockLinear:
    """The same weight's values in tiles, so that its products run on 8-bit activations: Q4_1 as it is, Q4_K
    widened to Q4_1 groups, Q8_0 (and Q5_0) as it is, Q6_K widened to a scale per 16; `linear` itself where its
    output size is not whole tiles of 16 or it is tiled already."""
    if linear.out_features % TILE or linear.activations == "q8":
        return linear
    bias = None if linear.bias is None else linear.bias.detach()
    if isinstance(linear, FOUR_BIT):
        codes, scales, mins = linear.blocks() if isinstance(linear, Q4Linear) else widen_q4_k(*linear.blocks())
        return Q4Linear(tile_codes(codes), tile_scales(scales), tile_scales(mins), bias)
    codes, scales = linear.blocks() if isinstance(linear, Q8Linear) else widen_q6_k(*linear.blocks())
    return Q8Linear(tile_codes(codes), tile_scales(scales), bias)


def use_8_bit_activations(module: nn.Module) -> int:
    """Swap every block linear under `module` for with_8_bit_activations' (in place), before its first forward
    (the lean decoder keeps the products it was built with); returns how many now run on 8-bit activations."""
    swaps = [(parent, name, with_8_bit_activations(child)) for parent in module.modules()
             for name, child in parent.named_children() if isinstance(child, BLOCK_LINEARS)]
    for parent, name, child in swaps:
        setattr(parent, name, child)
    return sum(child.activations == "q8" for _, _, child in swaps)


def activations(model: nn.Module) -> str:
    """"q8" where any of the model's block linears runs on 8-bit activations, else "fp32"."""
    return "q8" if any(isinstance(m, BLOCK_LINEARS) and m.activations == "q8" for m in model.modules()) else "fp32"
