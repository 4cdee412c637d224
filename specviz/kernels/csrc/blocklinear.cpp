// y = x · Wᵀ (+ bias) for a few fp32 rows x and a weight W kept as GGUF blocks: the product of a linear layer whose
// weights come from a Q4_1 or Q8_0 GGUF tensor, without ever holding W in fp32.
//
// q4_linear(x, nibbles, scales, mins, bias, path):
//   x (rows, in) fp32;
//   nibbles (out, in / 2) uint8: W's row o in groups of 32 weights along the input dimension, 16 bytes a group,
//     byte j holding weight j in its low nibble and weight j + 16 in its high nibble (Q4_1's own order);
//   scales, mins (out, in / 32) fp32: each group's d and m, so that w = d q + m for q in 0..15, exactly Q4_1's
//     value (d and m are fp16 in the file, so d q is exact in fp32 and the fused d q + m rounds once, like d q + m);
//   bias (out,) fp32 or none; path: -1 picks the fastest this CPU runs (or SPECVIZ_Q4_PATH), 0 the portable C++,
//     1 AVX2 + FMA, 2 AVX-512;
// returns y (rows, out) fp32.
// q8_linear(x, codes, scales, bias, path): the same for Q8_0: codes (out, in) int8, scales (out, in / 32) fp32,
//   w = d q (exact in fp32: an fp16 d times an 8-bit q); or, with scales (out, in / 16), one scale per 16 weights:
//   Q6_K's values (codes q - 32 in -32..31, scales its fp16 d times each 16-weight sub-block's int8 scale, exact in
//   fp32; w = scale q rounds once, as the dequantized file does).
// q4k_linear(x, nibbles, d, dmin, sc, m, bias, path): Q4_K with the file's own two-level scales: nibbles as
//   q4_linear's; d, dmin (out, in / 256) fp32, one per super-block of 256 weights (dmin negated); sc, m
//   (out, in / 32) uint8, each group's 6-bit integers: w = (d sc) q + (dmin m), the same values as q4_linear's
//   scales d sc and minimums dmin m, so the same bits, for 0.58 bytes a weight instead of 0.75.
// q6k_linear(x, codes, d, sc, bias, path): Q6_K so: codes as q8_linear's (q - 32); d (out, in / 256) fp32; sc
//   (out, in / 16) int8: w = (d sc) code, q8_linear's values with (out, in / 16) scales, for 1.03 bytes a weight
//   instead of 1.25.
//
// Every dot product is summed in one fixed order (32 partial sums, one per position in a group, each a chain of
// fused multiply-adds over the groups, then a fixed tree), so a row's result does not depend on how many rows come
// with it or on the thread count, and the three paths, which do the same operations in the same order, give the
// same bits. With one row (a decoding step) the vector paths unpack each weight in registers as they use it (AVX-512:
// 4-bit weights by a 16-entry table lookup) and work on 2 (AVX2) or 4 (AVX-512) columns at once, so that several
// accumulator chains overlap. AVX-512 does the same for 4-bit weights over up to 64 rows (8-bit: 4), four rows at a
// time (each unpacked weight feeds four rows from registers); otherwise several rows share four columns unpacked
// once into fp32 in L1.
// Threads split the output columns (at::parallel_for).
// Weights whose scales come in tiles, (out / 16, in / 32, 16), are multiplied with 8-bit activations in integers
// instead (csrc/intdot.cpp).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#define SPECVIZ_X86 1
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kGroup = 32;  // weights per scale (and minimum), along the input dimension
constexpr int64_t kLanes = 32;  // partial sums of every dot product: one per position in a group
constexpr int64_t kCols = 4;    // columns unpacked together where several rows share them
constexpr int64_t kAhead = 32;  // one-row products prefetch the codes of the column this many ahead
constexpr int64_t kFusedRows = 64;  // AVX-512, 4-bit: up to this many rows unpack in registers, four at a time
constexpr int64_t kFusedRows8 = 4;  // the same for 8-bit weights, whose unpacking costs more than the lookup

enum Path : int64_t { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

// A weight in GGUF blocks: Q4_1 (Bits 4: 16 bytes of nibbles, a scale and a minimum per group), Q8_0 (Bits 8:
// 32 int8 codes and a scale per group) or Q6_K as 8-bit codes (Bits 6: 32 int8 codes and a scale per 16 of them,
// Q6_K's sub-blocks). `mins` is null but for Q4_1.
template <int Bits>
struct Blocks {
  static constexpr int64_t kBytes = Bits == 4 ? 16 : 32;  // code bytes per group
  static constexpr int64_t kScales = Bits == 6 ? 2 : 1;   // scales per group
  const uint8_t* codes;
  const float* scales;
  const float* mins;
  int64_t groups;  // per column
  const uint8_t* at(int64_t column, int64_t g) const { return codes + (column * groups + g) * kBytes; }
  int64_t index(int64_t column, int64_t g) const { return column * groups + g; }
  // the scale of lanes [16 half, 16 half + 16) of a group
  float scale(int64_t column, int64_t g, int half) const { return scales[index(column, g) * kScales + (kScales == 2 ? half : 0)]; }
};

// ------------------------------------------------------------------------------------------------ portable C++

// w[0..32) of one group, in the order of the 32 lanes.
template <int Bits>
inline void unpack_group(const Blocks<Bits>& b, int64_t column, int64_t g, float* w) {
  const uint8_t* q = b.at(column, g);
  if constexpr (Bits == 4) {
    const float d = b.scales[b.index(column, g)], m = b.mins[b.index(column, g)];
    for (int j = 0; j < 16; ++j) {
      w[j] = std::fma(d, static_cast<float>(q[j] & 0x0F), m);
      w[j + 16] = std::fma(d, static_cast<float>(q[j] >> 4), m);
    }
  } else {
    for (int j = 0; j < 32; ++j) w[j] = b.scale(column, g, j / 16) * static_cast<float>(static_cast<int8_t>(q[j]));
  }
}

// The fixed summation tree of the 32 partial sums: pairs (l, l + 16), then (l, l + 8), (l, l + 4), (l, l + 2),
// (l, l + 1), which is what the vector paths' register reductions do.
inline float tree_sum(float* acc) {
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
  return acc[0];
}

template <int Bits>
void columns_portable(const float* x, int64_t rows, int64_t in, int64_t out, const Blocks<Bits>& b, float* y,
                      int64_t begin, int64_t end) {
  std::vector<float> w(in);
  for (int64_t o = begin; o < end; ++o) {
    for (int64_t g = 0; g < b.groups; ++g) unpack_group(b, o, g, w.data() + g * kGroup);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * in;
      float acc[kLanes] = {};
      for (int64_t i = 0; i < in; i += kLanes)
        for (int64_t l = 0; l < kLanes; ++l) acc[l] = std::fma(w[i + l], xr[i + l], acc[l]);
      y[r * out + o] = tree_sum(acc);
    }
  }
}

#ifdef SPECVIZ_X86
// ------------------------------------------------------------------------------------------------ AVX2 + FMA

__attribute__((target("avx2,fma"))) inline float sum8(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // (l, l + 4)
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));                                       // (l, l + 2)
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));                                   // (l, l + 1)
  return _mm_cvtss_f32(h);
}

// The portable tree over 32 lanes held as four registers of 8: (l, l + 16), (l, l + 8), then within 8 lanes.
__attribute__((target("avx2,fma"))) inline float sum32(const __m256* a) {
  return sum8(_mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3])));
}

// One group's 32 weights in four registers (lanes 0–7, 8–15, 16–23, 24–31).
template <int Bits>
__attribute__((target("avx2,fma"))) inline void unpack_avx2(const Blocks<Bits>& b, int64_t column, int64_t g, __m256* w) {
  const uint8_t* q = b.at(column, g);
  if constexpr (Bits == 4) {
    const __m256 d = _mm256_set1_ps(b.scales[b.index(column, g)]);
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    const __m128i lo = _mm_and_si128(bytes, low), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low);
    const __m256 m = _mm256_set1_ps(b.mins[b.index(column, g)]);
    w[0] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), m);
    w[1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), m);
    w[2] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), m);
    w[3] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), m);
  } else {
    const __m256 d[2] = {_mm256_set1_ps(b.scale(column, g, 0)), _mm256_set1_ps(b.scale(column, g, 1))};
    for (int j = 0; j < 4; ++j) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * j));
      w[j] = _mm256_mul_ps(d[j / 2], _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)));
    }
  }
}

// One row's dot products with C adjacent columns, each weight unpacked in registers as it is used (the decoding
// step's case, where a column is read once): 4 C independent accumulator chains, x's group loaded once for all C.
template <int Bits, int C>
__attribute__((target("avx2,fma"))) inline void fused_avx2(const float* x, const Blocks<Bits>& b, int64_t o, float* y) {
  __m256 a[C][4];
  for (int c = 0; c < C; ++c)
    for (int j = 0; j < 4; ++j) a[c][j] = _mm256_setzero_ps();
  for (int64_t g = 0; g < b.groups; ++g) {
    const float* xg = x + g * kGroup;
    const __m256 xs[4] = {_mm256_loadu_ps(xg), _mm256_loadu_ps(xg + 8), _mm256_loadu_ps(xg + 16), _mm256_loadu_ps(xg + 24)};
    if ((g * Blocks<Bits>::kBytes) % 64 == 0)  // a cache line of codes a few columns ahead, once per line
      for (int c = 0; c < C; ++c) _mm_prefetch(reinterpret_cast<const char*>(b.at(o + c + kAhead, g)), _MM_HINT_T0);
    for (int c = 0; c < C; ++c) {
      __m256 w[4];
      unpack_avx2(b, o + c, g, w);
      for (int j = 0; j < 4; ++j) a[c][j] = _mm256_fmadd_ps(w[j], xs[j], a[c][j]);
    }
  }
  for (int c = 0; c < C; ++c) y[c] = sum32(a[c]);
}

// R rows' dot products with one unpacked column w: each row keeps its own four accumulators, so every row is
// summed in the one fixed order whatever R is; the weights are read from L1 once for the R rows. R = 3: 12
// accumulators and 4 weight registers, the 16 AVX2 registers.
template <int R>
__attribute__((target("avx2,fma"))) inline void dots_avx2(const float* w, const float* x, int64_t in, float* y, int64_t out) {
  __m256 a[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) a[r][j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < in; i += kLanes) {
    const __m256 ws[4] = {_mm256_load_ps(w + i), _mm256_load_ps(w + i + 8), _mm256_load_ps(w + i + 16), _mm256_load_ps(w + i + 24)};
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 4; ++j) a[r][j] = _mm256_fmadd_ps(ws[j], _mm256_loadu_ps(x + r * in + i + 8 * j), a[r][j]);
  }
  for (int r = 0; r < R; ++r) y[r * out] = sum32(a[r]);
}

template <int Bits>
__attribute__((target("avx2,fma"))) void columns_avx2(const float* x, int64_t rows, int64_t in, int64_t out,
                                                      const Blocks<Bits>& b, float* y, int64_t begin, int64_t end) {
  if (rows == 1) {  // columns two at a time: 8 accumulators, 4 x registers, the rest for unpacking
    int64_t o = begin;
    for (; o + 2 <= end; o += 2) fused_avx2<Bits, 2>(x, b, o, y + o);
    if (o < end) fused_avx2<Bits, 1>(x, b, o, y + o);
    return;
  }
  std::vector<float> buffer(in + 8);
  float* w = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buffer.data()) + 31) & ~uintptr_t(31));
  for (int64_t o = begin; o < end; ++o) {
    for (int64_t g = 0; g < b.groups; ++g) {
      __m256 v[4];
      unpack_avx2(b, o, g, v);
      for (int j = 0; j < 4; ++j) _mm256_store_ps(w + g * kGroup + 8 * j, v[j]);
    }
    int64_t r = 0;  // rows three at a time: the unpacked weights are loaded once for the three
    for (; r + 3 <= rows; r += 3) dots_avx2<3>(w, x + r * in, in, y + r * out + o, out);
    if (rows - r == 2) dots_avx2<2>(w, x + r * in, in, y + r * out + o, out);
    if (rows - r == 1) dots_avx2<1>(w, x + r * in, in, y + r * out + o, out);
  }
}

// ------------------------------------------------------------------------------------------------ AVX-512

// The portable tree over the 32 lanes of a (lanes 0–15) and b (lanes 16–31): (l, l + 16), then the halvings.
__attribute__((target("avx512f"))) inline float sum32(__m512 a, __m512 b) {
  const __m512 s = _mm512_add_ps(a, b);
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
  __m128 v = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
  return _mm_cvtss_f32(v);
}

// One group's 32 weights in two registers (lanes 0–15, 16–31).
template <int Bits>
__attribute__((target("avx512f"))) inline void unpack_avx512(const Blocks<Bits>& b, int64_t column, int64_t g, __m512& w0, __m512& w1) {
  const uint8_t* q = b.at(column, g);
  if constexpr (Bits == 4) {
    const __m512 d = _mm512_set1_ps(b.scales[b.index(column, g)]);
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    const __m128i lo = _mm_and_si128(bytes, low), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low);
    const __m512 m = _mm512_set1_ps(b.mins[b.index(column, g)]);
    w0 = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), m);
    w1 = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), m);
  } else {
    const __m512 d0 = _mm512_set1_ps(b.scale(column, g, 0)), d1 = _mm512_set1_ps(b.scale(column, g, 1));
    w0 = _mm512_mul_ps(d0, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)))));
    w1 = _mm512_mul_ps(d1, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)))));
  }
}

// The same 32 weights of a Q4_1 group by table lookup: the group's 16 possible values d j + m (j = 0..15, one
// multiply-add, the same rounding as unpack_avx512's d q + m) in one register, indexed by the nibbles (vpermps reads
// the low 4 bits of each index, so the low nibbles need no mask). One multiply-add and three shuffles where
// unpack_avx512 spends two conversions and two multiply-adds (measured against it in fused_avx512:
// experiments/q4_unpack_ab.py). The L1 path for many rows keeps the conversion.
__attribute__((target("avx512f"))) inline void lookup_avx512(const Blocks<4>& b, int64_t column, int64_t g, __m512& w0, __m512& w1) {
  const __m512 j = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 table = _mm512_fmadd_ps(_mm512_set1_ps(b.scales[b.index(column, g)]), j,
                                       _mm512_set1_ps(b.mins[b.index(column, g)]));
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.at(column, g))));
  w0 = _mm512_permutexvar_ps(bytes, table);
  w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
}

// R rows' dot products with C adjacent columns, each weight unpacked in registers as it is read and used for the R
// rows at once (a decoding step, or a short verify): 2 R C independent accumulator chains, each row's group of x
// loaded once for the C columns. Each row's sums run in the same order as dots_avx512's, so the bits do not depend
// on which of the two runs.
template <int Bits, int R, int C>
__attribute__((target("avx512f"))) inline void fused_avx512(const float* x, int64_t in, const Blocks<Bits>& b, int64_t o,
                                                            float* y, int64_t out) {
  __m512 a[R][C][2];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) a[r][c][0] = a[r][c][1] = _mm512_setzero_ps();
  for (int64_t g = 0; g < b.groups; ++g) {
    __m512 x0[R], x1[R];
    for (int r = 0; r < R; ++r) {
      x0[r] = _mm512_loadu_ps(x + r * in + g * kGroup);
      x1[r] = _mm512_loadu_ps(x + r * in + g * kGroup + 16);
    }
    if ((g * Blocks<Bits>::kBytes) % 64 == 0)  // a cache line of codes a few columns ahead, once per line
      for (int c = 0; c < C; ++c) _mm_prefetch(reinterpret_cast<const char*>(b.at(o + c + kAhead, g)), _MM_HINT_T0);
    for (int c = 0; c < C; ++c) {
      __m512 w0, w1;
      if constexpr (Bits == 4) lookup_avx512(b, o + c, g, w0, w1);
      else unpack_avx512(b, o + c, g, w0, w1);
      for (int r = 0; r < R; ++r) {
        a[r][c][0] = _mm512_fmadd_ps(w0, x0[r], a[r][c][0]);
        a[r][c][1] = _mm512_fmadd_ps(w1, x1[r], a[r][c][1]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * out + c] = sum32(a[r][c][0], a[r][c][1]);
}

// The columns [begin, end) of R rows by fused_avx512, C columns at a time.
template <int Bits, int R, int C>
__attribute__((target("avx512f"))) void fused_columns_avx512(const float* x, int64_t in, int64_t out, const Blocks<Bits>& b,
                                                             float* y, int64_t begin, int64_t end) {
  int64_t o = begin;
  for (; o + C <= end; o += C) fused_avx512<Bits, R, C>(x, in, b, o, y + o, out);
  for (; o < end; ++o) fused_avx512<Bits, R, 1>(x, in, b, o, y + o, out);
}

// One row's dot products with C columns already unpacked (w: C × in, 64-byte aligned).
template <int C>
__attribute__((target("avx512f"))) inline void dots_avx512(const float* w, const float* x, int64_t in, float* y) {
  __m512 a[C][2];
  for (int c = 0; c < C; ++c) a[c][0] = a[c][1] = _mm512_setzero_ps();
  for (int64_t i = 0; i < in; i += kLanes) {
    const __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);
    for (int c = 0; c < C; ++c) {
      a[c][0] = _mm512_fmadd_ps(_mm512_load_ps(w + c * in + i), x0, a[c][0]);
      a[c][1] = _mm512_fmadd_ps(_mm512_load_ps(w + c * in + i + 16), x1, a[c][1]);
    }
  }
  for (int c = 0; c < C; ++c) y[c] = sum32(a[c][0], a[c][1]);
}

template <int Bits>
__attribute__((target("avx512f"))) void columns_avx512(const float* x, int64_t rows, int64_t in, int64_t out,
                                                       const Blocks<Bits>& b, float* y, int64_t begin, int64_t end) {
  // One row, or up to kFusedRows rows of 4-bit weights (kFusedRows8 of 8-bit ones): unpacked in registers, four
  // rows at a time (2 R C accumulators and 2 R rows of x in the 32 registers); more rows: unpacked into L1 once for
  // all of them.
  if (rows <= (Bits == 4 ? kFusedRows : kFusedRows8)) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) fused_columns_avx512<Bits, 4, 2>(x + r * in, in, out, b, y + r * out, begin, end);
    if (rows - r == 3) fused_columns_avx512<Bits, 3, 2>(x + r * in, in, out, b, y + r * out, begin, end);
    if (rows - r == 2) fused_columns_avx512<Bits, 2, 4>(x + r * in, in, out, b, y + r * out, begin, end);
    if (rows - r == 1) fused_columns_avx512<Bits, 1, 4>(x + r * in, in, out, b, y + r * out, begin, end);
    return;
  }
  // several rows: four columns unpacked once into L1, then each row's products with the four
  std::vector<float> buffer(kCols * in + 16);
  float* w = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t(63));
  for (int64_t o = begin; o < end; o += kCols) {
    const int64_t cols = std::min(kCols, end - o);
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t g = 0; g < b.groups; ++g) {
        __m512 w0, w1;
        unpack_avx512(b, o + c, g, w0, w1);
        _mm512_store_ps(w + c * in + g * kGroup, w0);
        _mm512_store_ps(w + c * in + g * kGroup + 16, w1);
      }
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * in;
      float* yr = y + r * out + o;
      if (cols == 4) dots_avx512<4>(w, xr, in, yr);
      else if (cols == 3) dots_avx512<3>(w, xr, in, yr);
      else if (cols == 2) dots_avx512<2>(w, xr, in, yr);
      else dots_avx512<1>(w, xr, in, yr);
    }
  }
}
#endif

bool cpu_has(int64_t path) {
#ifdef SPECVIZ_X86
  if (path == kAvx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (path == kAvx512) return __builtin_cpu_supports("avx512f");
#endif
  return path == kPortable;
}

// The path a call runs: the one asked for (an error where this CPU lacks it), else SPECVIZ_Q4_PATH
// ("portable", "avx2", "avx512"), else the fastest this CPU has.
int64_t resolve(int64_t path) {
  if (path < 0) {
    const char* forced = std::getenv("SPECVIZ_Q4_PATH");
    if (forced != nullptr && *forced != '\0') {
      if (std::strcmp(forced, "portable") == 0) path = kPortable;
      else if (std::strcmp(forced, "avx2") == 0) path = kAvx2;
      else if (std::strcmp(forced, "avx512") == 0) path = kAvx512;
      else if (std::strcmp(forced, "amx") == 0) path = kAvx512;  // AMX tiles are for 8-bit activations (intdot.h)
      else TORCH_CHECK(false, "SPECVIZ_Q4_PATH must be portable, avx2, avx512 or amx, not ", forced);
    } else {
      return cpu_has(kAvx512) ? kAvx512 : cpu_has(kAvx2) ? kAvx2 : kPortable;
    }
  }
  TORCH_CHECK(path <= kAvx512, "q4_linear: path must be -1 (auto), 0 (portable), 1 (avx2) or 2 (avx512)");
  TORCH_CHECK(cpu_has(path), "q4_linear: this CPU cannot run path ", path);
  return path;
}

int64_t q4_path(int64_t path) { return resolve(path); }

// The columns of one product: `columns(X, Y, rows, in, begin, end)` computes outputs [begin, end) of every row.
template <class Columns>
at::Tensor launch(const char* name, const at::Tensor& x, int64_t out, const c10::optional<at::Tensor>& bias,
                  const Columns& columns) {
  const int64_t rows = x.size(0), in = x.size(1);
  at::Tensor y = at::empty({rows, out}, x.options());
  const float* X = x.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  // Threads only where each gets enough weights to read (about 32 K).
  const int64_t grain = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, in));
  if (rows > 0) at::parallel_for(0, out, grain, [&](int64_t begin, int64_t end) { columns(X, Y, rows, in, begin, end); });
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == out && bias->scalar_type() == at::kFloat, name, ": bias (out,) fp32");
    y.add_(bias->reshape({1, out}));
  }
  return y;
}

template <int Bits>
auto columns_for(int64_t path) {
  const int64_t chosen = resolve(path);
  auto run = columns_portable<Bits>;
#ifdef SPECVIZ_X86
  if (chosen == kAvx2) run = columns_avx2<Bits>;
  if (chosen == kAvx512) run = columns_avx512<Bits>;
#endif
  return run;
}

template <int Bits>
at::Tensor product(const char* name, const at::Tensor& x, const Blocks<Bits>& b, int64_t out,
                   const c10::optional<at::Tensor>& bias, int64_t path) {
  const auto run = columns_for<Bits>(path);
  return launch(name, x, out, bias, [&](const float* X, float* Y, int64_t rows, int64_t in, int64_t begin, int64_t end) {
    run(X, rows, in, out, b, Y, begin, end);
  });
}

// A K-quant weight with its scales in the file's two levels: one fp32 per super-block of 256 weights (Q4_K's d and
// dmin, Q6_K's d) times a small integer per scale (Q4_K's 6-bit sc and m per 32 weights, Q6_K's int8 per 16).
struct TwoLevel {
  const uint8_t* codes;
  const float* d;
  const float* dmin;     // Q4_K: negated, so that a minimum is dmin m; null for Q6_K
  const uint8_t* sc;     // uint8 (Q4_K) or int8 (Q6_K)
  const uint8_t* m;      // Q4_K only
  int64_t groups;        // of 32 weights, per column
};

constexpr int64_t kSuperGroups = 8;  // groups of 32 per super-block of 256 weights
constexpr int64_t kTileScales = 4096;  // scales widened together: a tile of columns' 16 KB (and as much of minimums)

// The scales of super-blocks [first, first + count) of a TwoLevel weight, widened: 8 (Q4_K) or 16 (Q6_K) fp32
// scales per super-block into `scales`, and for Q4_K 8 minimums into `mins`. `vector`: eight at a time in AVX2
// registers (the same products), where the portable loop would cost about as much as the product it serves.
#ifdef SPECVIZ_X86
template <int Bits>
__attribute__((target("avx2"))) void widen_avx2(const TwoLevel& t, int64_t first, int64_t count, float* scales, float* mins) {
  for (int64_t s = 0; s < count; ++s) {
    const int64_t at = first + s;
    const __m256 d = _mm256_set1_ps(t.d[at]);
    if constexpr (Bits == 4) {
      const __m128i sc = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(t.sc + at * kSuperGroups));
      const __m128i m = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(t.m + at * kSuperGroups));
      _mm256_storeu_ps(scales + s * kSuperGroups, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc))));
      _mm256_storeu_ps(mins + s * kSuperGroups,
                       _mm256_mul_ps(_mm256_set1_ps(t.dmin[at]), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m))));
    } else {
      const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t.sc + at * 2 * kSuperGroups));
      _mm256_storeu_ps(scales + s * 16, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
      _mm256_storeu_ps(scales + s * 16 + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
    }
  }
}
#endif

template <int Bits>
void widen(const TwoLevel& t, int64_t first, int64_t count, float* scales, float* mins, bool vector) {
#ifdef SPECVIZ_X86
  if (vector) return widen_avx2<Bits>(t, first, count, scales, mins);
#endif
  constexpr int64_t kScales = Blocks<Bits>::kScales;
  for (int64_t s = 0; s < count; ++s) {
    const int64_t at = first + s;
    for (int64_t j = 0; j < kSuperGroups * kScales; ++j) {
      const uint8_t code = t.sc[at * kSuperGroups * kScales + j];
      scales[s * kSuperGroups * kScales + j] = t.d[at] * static_cast<float>(Bits == 4 ? code : static_cast<int8_t>(code));
    }
    if constexpr (Bits == 4)
      for (int64_t j = 0; j < kSuperGroups; ++j) mins[s * kSuperGroups + j] = t.dmin[at] * static_cast<float>(t.m[at * kSuperGroups + j]);
  }
}

// The product of a TwoLevel weight: each thread widens the scales of a tile of columns at a time into Blocks' layout
// (an fp32 per scale; the product of an fp16 and an integer of 7 bits at most, exact in fp32, so the same values as
// parse_q4_k's and parse_q6_k's) and runs the widened product on those columns, whose inner loops stay as they
// are; a tile's widened scales (about 4096, or those of 4 columns) are written and read back in L1 or L2.
template <int Bits>
at::Tensor two_level_product(const char* name, const at::Tensor& x, const TwoLevel& t, int64_t out,
                             const c10::optional<at::Tensor>& bias, int64_t path) {
  const auto run = columns_for<Bits>(path);
  const bool vector = resolve(path) != kPortable;
  constexpr int64_t kScales = Blocks<Bits>::kScales, kBytes = Blocks<Bits>::kBytes;
  const int64_t groups = t.groups, supers = groups / kSuperGroups, per_column = groups * kScales;
  const int64_t tile = std::max<int64_t>(4, kTileScales / per_column / 4 * 4);  // columns a tile, whole blocks of 4
  return launch(name, x, out, bias, [&](const float* X, float* Y, int64_t rows, int64_t in, int64_t begin, int64_t end) {
    std::vector<float> scales(tile * per_column), mins(Bits == 4 ? tile * groups : 0);
    for (int64_t first = begin; first < end; first += tile) {
      const int64_t n = std::min(tile, end - first);
      widen<Bits>(t, first * supers, n * supers, scales.data(), mins.data(), vector);
      const Blocks<Bits> b{t.codes + first * groups * kBytes, scales.data(), Bits == 4 ? mins.data() : nullptr, groups};
      run(X, rows, in, out, b, Y + first, 0, n);
    }
  });
}

void check_input(const char* name, const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), name, ": x (rows, in) fp32");
  TORCH_CHECK(x.size(1) % kGroup == 0, name, ": the input size must be a multiple of 32");
}

void check_scales(const char* name, const char* what, const at::Tensor& t, int64_t count, const char* shape = "(out, in / 32)") {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == count, name, ": ", what, " ",
              shape, " fp32");
}

}  // namespace

namespace specviz {

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& nibbles, const at::Tensor& scales, const at::Tensor& mins,
                     const c10::optional<at::Tensor>& bias, int64_t path) {
  check_input("q4_linear", x);
  if (scales.dim() == 3) return q4_linear_tiled(x, nibbles, scales, mins, bias, path);  // 8-bit activations
  const int64_t in = x.size(1), out = nibbles.size(0), groups = in / kGroup;
  TORCH_CHECK(nibbles.dim() == 2 && nibbles.scalar_type() == at::kByte && nibbles.is_contiguous() &&
                  nibbles.size(1) * 2 == in,
              "q4_linear: nibbles (out, in / 2) uint8");
  check_scales("q4_linear", "scales, mins", scales, out * groups);
  check_scales("q4_linear", "scales, mins", mins, out * groups);
  const Blocks<4> b{nibbles.data_ptr<uint8_t>(), scales.data_ptr<float>(), mins.data_ptr<float>(), groups};
  return product("q4_linear", x, b, out, bias, path);
}

}  // namespace specviz

namespace {

at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                     const c10::optional<at::Tensor>& bias, int64_t path) {
  check_input("q8_linear", x);
  if (scales.dim() == 3) return specviz::q8_linear_tiled(x, codes, scales, bias, path);  // 8-bit activations
  const int64_t in = x.size(1), out = codes.size(0), groups = in / kGroup;
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kChar && codes.is_contiguous() && codes.size(1) == in,
              "q8_linear: codes (out, in) int8");
  const uint8_t* q = reinterpret_cast<const uint8_t*>(codes.data_ptr<int8_t>());
  if (scales.numel() == 2 * out * groups) {  // a scale per 16 weights (Q6_K)
    check_scales("q8_linear", "scales", scales, 2 * out * groups, "(out, in / 16)");
    return product("q8_linear", x, Blocks<6>{q, scales.data_ptr<float>(), nullptr, groups}, out, bias, path);
  }
  check_scales("q8_linear", "scales", scales, out * groups, "(out, in / 32) or (out, in / 16)");
  return product("q8_linear", x, Blocks<8>{q, scales.data_ptr<float>(), nullptr, groups}, out, bias, path);
}

}  // namespace

namespace {

constexpr int64_t kSuper = 256;  // weights per K-quant super-block

void check_tensor(const char* name, const char* what, const at::Tensor& t, at::ScalarType type, int64_t count,
                  const char* shape) {
  TORCH_CHECK(t.scalar_type() == type && t.is_contiguous() && t.numel() == count, name, ": ", what, " ", shape);
}

at::Tensor q4k_linear(const at::Tensor& x, const at::Tensor& nibbles, const at::Tensor& d, const at::Tensor& dmin,
                      const at::Tensor& sc, const at::Tensor& m, const c10::optional<at::Tensor>& bias, int64_t path) {
  check_input("q4k_linear", x);
  const int64_t in = x.size(1), out = nibbles.size(0), groups = in / kGroup;
  TORCH_CHECK(in % kSuper == 0, "q4k_linear: the input size must be a multiple of 256");
  TORCH_CHECK(nibbles.dim() == 2 && nibbles.scalar_type() == at::kByte && nibbles.is_contiguous() &&
                  nibbles.size(1) * 2 == in,
              "q4k_linear: nibbles (out, in / 2) uint8");
  check_tensor("q4k_linear", "d, dmin", d, at::kFloat, out * in / kSuper, "(out, in / 256) fp32");
  check_tensor("q4k_linear", "d, dmin", dmin, at::kFloat, out * in / kSuper, "(out, in / 256) fp32");
  check_tensor("q4k_linear", "sc, m", sc, at::kByte, out * groups, "(out, in / 32) uint8");
  check_tensor("q4k_linear", "sc, m", m, at::kByte, out * groups, "(out, in / 32) uint8");
  const TwoLevel t{nibbles.data_ptr<uint8_t>(), d.data_ptr<float>(), dmin.data_ptr<float>(), sc.data_ptr<uint8_t>(),
                   m.data_ptr<uint8_t>(), groups};
  return two_level_product<4>("q4k_linear", x, t, out, bias, path);
}

at::Tensor q6k_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& d, const at::Tensor& sc,
                      const c10::optional<at::Tensor>& bias, int64_t path) {
  check_input("q6k_linear", x);
  const int64_t in = x.size(1), out = codes.size(0), groups = in / kGroup;
  TORCH_CHECK(in % kSuper == 0, "q6k_linear: the input size must be a multiple of 256");
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kChar && codes.is_contiguous() && codes.size(1) == in,
              "q6k_linear: codes (out, in) int8");
  check_tensor("q6k_linear", "d", d, at::kFloat, out * in / kSuper, "(out, in / 256) fp32");
  check_tensor("q6k_linear", "sc", sc, at::kChar, 2 * out * groups, "(out, in / 16) int8");
  const TwoLevel t{reinterpret_cast<const uint8_t*>(codes.data_ptr<int8_t>()), d.data_ptr<float>(), nullptr,
                   reinterpret_cast<const uint8_t*>(sc.data_ptr<int8_t>()), nullptr, groups};
  return two_level_product<6>("q6k_linear", x, t, out, bias, path);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specviz, m) {
  m.def("q4_linear(Tensor x, Tensor nibbles, Tensor scales, Tensor mins, Tensor? bias, int path=-1) -> Tensor");
  m.def("q8_linear(Tensor x, Tensor codes, Tensor scales, Tensor? bias, int path=-1) -> Tensor");
  m.def("q4k_linear(Tensor x, Tensor nibbles, Tensor d, Tensor dmin, Tensor sc, Tensor m, Tensor? bias, int path=-1) -> Tensor");
  m.def("q6k_linear(Tensor x, Tensor codes, Tensor d, Tensor sc, Tensor? bias, int path=-1) -> Tensor");
  m.def("q4_path(int path=-1) -> int", q4_path);
}

TORCH_LIBRARY_IMPL(specviz, CPU, m) {
  m.impl("q4_linear", specviz::q4_linear);
  m.impl("q8_linear", q8_linear);
  m.impl("q4k_linear", q4k_linear);
  m.impl("q6k_linear", q6k_linear);
}
