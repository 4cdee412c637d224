// Products of 8-bit activations with 4-bit and 8-bit weights in integers: the kernels of csrc/intdot.cpp, without
// torch, so that a test can also build them against SIMDe's portable intrinsics (SPECVIZ_INTDOT_SIMDE) and run the
// AVX-512 path on a CPU without it.
//
// Activations (quantize_rows): each row of x (rows, in) fp32 in groups of 32, as llama.cpp's Q8_1 does it: per
// group amax = max |x|, d = amax / 127, q = x · (1 / d) rounded to the nearest integer (ties to even) in -127..127,
// and the sums of q over each half of the group; s = d · (sum of q). d and s stay fp32 (the file format rounds them
// to fp16). A group holding a NaN or an infinity gets q = 0 and d = NaN, so its outputs are NaN.
//
// Weights, in tiles of 16 output columns (kTile), laid out so that one 64-byte load gives the same four input
// positions of all 16 columns (llama.cpp's and oneDNN's "VNNI" order):
//   4-bit (Q4_1, and Q4_K widened to it): codes [tiles][groups][4][16][4] bytes: for group g, word k (0..3),
//     column c, byte i: the byte 4k + i of column c's 16 bytes of nibbles in the GGUF order (low nibble: weight
//     4k + i, high nibble: weight 16 + 4k + i); scales and mins [tiles][groups][16] fp32 (w = d q + m);
//   8-bit (Q8_0, Q5_0 and Q6_K as 8-bit codes): codes [tiles][groups][8][16][4] int8: chunk k (0..7), column c,
//     byte i: weight 4k + i of column c's group; scales [tiles][groups · per][16] fp32, per = 1 (a scale per 32
//     weights) or 2 (per 16, Q6_K: the first for weights 0..15).
//
// Every output y[r][o] is computed in one fixed order, the same on every path, for any row count, tile split or
// thread count: per group g, the integer sum i = Σ q_w q_x (exact; 32 products of at most 255 · 127), then in fp32
//   acc = fma(d_w · d_x, (float) i, acc)                    (per = 2: once per half, with its own scale and sum)
//   acc = fma(m_w, s_x, acc)                                (4-bit only: the minimum's term)
// from acc = +0 over g = 0, 1, ...; d_w · d_x is one rounded product, (float) i is exact. The paths differ only in
// how they get i: portable C++ loops; AVX2 `vpmaddubsw` (unsigned 4-bit codes, or |w|, times signed activations,
// pairs summed in int16 without saturation: at most 2 · 128 · 127), then `vpmaddwd`; AVX-512 VNNI `vpdpbusd` on
// 16 columns at once (8-bit weights biased by 128 to make them unsigned, 128 · Σ q_x taken back off).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#if defined(SPECVIZ_INTDOT_SIMDE)  // tests: SIMDe's portable versions of the same intrinsics, any CPU
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#ifndef _MM_FROUND_NO_EXC
#define _MM_FROUND_NO_EXC SIMDE_MM_FROUND_NO_EXC
#endif
#ifndef _mm512_cvtepi32_ps  // missing from SIMDe 0.7: lane by lane (exact for the integers converted here)
inline __m512 specviz_cvtepi32_ps(__m512i v) {
  int32_t i[16];
  float f[16];
  _mm512_storeu_si512(i, v);
  for (int l = 0; l < 16; ++l) f[l] = static_cast<float>(i[l]);
  return _mm512_loadu_ps(f);
}
#define _mm512_cvtepi32_ps specviz_cvtepi32_ps
#endif
#define SPECVIZ_INTDOT_X86 1
#define SPECVIZ_TARGET_AVX2
#define SPECVIZ_TARGET_VNNI
// ... and the AMX tile instructions emulated as the Intel SDM defines them (tests/csrc/amx_emulation.h)
#include "amx_emulation.h"
#define SPECVIZ_INTDOT_AMX 1
#define SPECVIZ_TARGET_AMX
#define SPECVIZ_TILE_CONFIG(config) specviz_amx_config(config)
#define SPECVIZ_TILE_RELEASE() specviz_amx_release()
#define SPECVIZ_TILE_ZERO(t) specviz_amx_zero(t)
#define SPECVIZ_TILE_LOAD(t, base, stride) specviz_amx_load(t, base, stride)
#define SPECVIZ_TILE_STORE(t, base, stride) specviz_amx_store(t, base, stride)
#define SPECVIZ_TILE_DPBSSD(c, a, b) specviz_amx_dp<true, true>(c, a, b)
#define SPECVIZ_TILE_DPBSUD(c, a, b) specviz_amx_dp<true, false>(c, a, b)
#elif defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SPECVIZ_INTDOT_X86 1
#define SPECVIZ_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define SPECVIZ_TARGET_VNNI __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vnni")))
// Compilers from GCC 11 and Clang 12 on ship AMX themselves, so their toolchains' assemblers know the instructions.
#if defined(__x86_64__) && defined(__linux__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
// AMX tiles, written as instructions (any GCC or Clang whose assembler knows them; the compiler needs no -mamx), on
// Linux, which hands out the tile state on request (arch_prctl, csrc/intdot.cpp); AT&T syntax, the compiler's default:
// tile numbers are part of the instruction, so these take them as literals. "memory": a tile load reads and a
// tile store writes memory the compiler does not see in the operands.
#define SPECVIZ_INTDOT_AMX 1
#define SPECVIZ_TARGET_AMX SPECVIZ_TARGET_VNNI
#define SPECVIZ_TILE_CONFIG(config) __asm__ volatile("ldtilecfg %0" ::"m"(*(const uint8_t(*)[64])(config)))
#define SPECVIZ_TILE_RELEASE() __asm__ volatile("tilerelease" ::: "memory")
#define SPECVIZ_TILE_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define SPECVIZ_TILE_LOAD(t, base, stride) \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"(static_cast<int64_t>(stride)) : "memory")
#define SPECVIZ_TILE_STORE(t, base, stride) \
  __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"(static_cast<int64_t>(stride)) : "memory")
#define SPECVIZ_TILE_DPBSSD(c, a, b) __asm__ volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define SPECVIZ_TILE_DPBSUD(c, a, b) __asm__ volatile("tdpbsud %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#endif
#endif

namespace specviz_intdot {

constexpr int64_t kGroup = 32;  // activations and weights per scale
constexpr int64_t kTile = 16;   // output columns per tile
constexpr int64_t kRowBlock = 64;  // rows whose activations stay in cache while all the tiles pass (a prompt's)

enum Path : int64_t { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };

// Quantized activations: q (rows, in) int8; d, s (rows, groups) fp32; sums (rows, groups, 2) int32.
struct Acts {
  const int8_t* q;
  const float* d;
  const float* s;
  const int32_t* sums;
  int64_t in, groups;
  const int8_t* at(int64_t row, int64_t g) const { return q + row * in + g * kGroup; }
  int64_t index(int64_t row, int64_t g) const { return row * groups + g; }
};

// Tiled weights: codes as above; mins only for 4-bit; per: scales per group (8-bit only).
struct Tiles {
  const uint8_t* codes;
  const float* scales;
  const float* mins;
  int64_t groups;
  int per;
  int64_t block(int64_t tile, int64_t g) const { return tile * groups + g; }
};

// ------------------------------------------------------------------------------------------------ activations

// One group's scale for its largest magnitude, and 1 / scale (0 where the group is all zeros, or so small that
// 1 / scale would overflow); false where the group holds a NaN or an infinity.
inline bool group_scale(float amax, bool finite, float* d, float* inverse) {
  if (!finite || !(amax <= FLT_MAX)) {
    *d = NAN;
    *inverse = 0.0f;
    return false;
  }
  *d = amax / 127.0f;
  *inverse = *d >= FLT_MIN ? 1.0f / *d : 0.0f;
  return true;
}

inline void finish_group(float d, int32_t low, int32_t high, float* s, int32_t* sums) {
  sums[0] = low;
  sums[1] = high;
  *s = d * static_cast<float>(low + high);
}

inline void quantize_row_portable(const float* x, int64_t groups, int8_t* q, float* d, float* s, int32_t* sums) {
  for (int64_t g = 0; g < groups; ++g) {
    const float* xg = x + g * kGroup;
    float amax = 0.0f;
    bool finite = true;
    for (int j = 0; j < kGroup; ++j) {
      const float a = std::fabs(xg[j]);
      finite = finite && a <= FLT_MAX;  // false for NaN too
      amax = a > amax ? a : amax;
    }
    float inverse;
    const bool ok = group_scale(amax, finite, d + g, &inverse);
    int32_t half[2] = {0, 0};
    for (int j = 0; j < kGroup; ++j) {
      const int32_t v = ok ? static_cast<int32_t>(std::nearbyint(xg[j] * inverse)) : 0;  // ties to even
      q[g * kGroup + j] = static_cast<int8_t>(std::min(127, std::max(-127, v)));
      half[j / 16] += q[g * kGroup + j];
    }
    finish_group(d[g], half[0], half[1], s + g, sums + 2 * g);
  }
}

#ifdef SPECVIZ_INTDOT_X86
SPECVIZ_TARGET_AVX2 inline int32_t hsum_epi32(__m256i v) {
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
  return _mm_cvtsi128_si32(h);
}

// The same numbers eight at a time: the maximum is exact, and x · (1 / d) and its rounding are the same IEEE
// operations, so quantize_row_portable's bits.
SPECVIZ_TARGET_AVX2 inline void quantize_row_avx2(const float* x, int64_t groups, int8_t* q, float* d, float* s,
                                                  int32_t* sums) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 largest = _mm256_set1_ps(FLT_MAX);
  for (int64_t g = 0; g < groups; ++g) {
    const float* xg = x + g * kGroup;
    __m256 v[4], m = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(xg + 8 * j);
      const __m256 a = _mm256_and_ps(v[j], magnitude);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, largest, _CMP_NLE_UQ));  // NaN or infinite
      m = _mm256_max_ps(m, a);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    float inverse;
    const bool ok = group_scale(_mm_cvtss_f32(h), _mm256_movemask_ps(bad) == 0, d + g, &inverse);
    const __m256 scale = _mm256_set1_ps(ok ? inverse : 0.0f);
    __m256i i[4];
    for (int j = 0; j < 4; ++j) {
      const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[j], scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      i[j] = ok ? _mm256_cvttps_epi32(r) : _mm256_setzero_si256();
    }
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    const __m256i ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + g * kGroup), ordered);
    finish_group(d[g], hsum_epi32(_mm256_add_epi32(i[0], i[1])), hsum_epi32(_mm256_add_epi32(i[2], i[3])),
                 s + g, sums + 2 * g);
  }
}
#endif

// ------------------------------------------------------------------------------------------------ portable C++

// Rows [r0, r0 + rows) times tile t into y (rows of `out`, the tile's columns at 16 t).
template <int Bits>
inline void tile_portable(const Acts& x, int64_t r0, int64_t rows, const Tiles& w, int64_t t, float* y, int64_t out) {
  constexpr int kWords = Bits == 4 ? 4 : 8;  // 4-byte words per column per group
  for (int64_t r = r0; r < r0 + rows; ++r) {
    float acc[kTile] = {};
    for (int64_t g = 0; g < w.groups; ++g) {
      const uint8_t* codes = w.codes + w.block(t, g) * kWords * 64;
      const int8_t* xq = x.at(r, g);
      const float dx = x.d[x.index(r, g)];
      for (int64_t c = 0; c < kTile; ++c) {
        int32_t sum[2] = {0, 0};  // weights 0..15, 16..31
        for (int k = 0; k < kWords; ++k)
          for (int i = 0; i < 4; ++i) {
            const uint8_t byte = codes[k * 64 + c * 4 + i];
            if constexpr (Bits == 4) {
              sum[0] += (byte & 0x0F) * xq[4 * k + i];
              sum[1] += (byte >> 4) * xq[16 + 4 * k + i];
            } else {
              sum[k / 4] += static_cast<int8_t>(byte) * xq[4 * k + i];
            }
          }
        if (Bits == 8 && w.per == 2) {
          for (int h = 0; h < 2; ++h)
            acc[c] = std::fma(w.scales[(w.block(t, g) * 2 + h) * kTile + c] * dx, static_cast<float>(sum[h]), acc[c]);
        } else {
          acc[c] = std::fma(w.scales[w.block(t, g) * kTile + c] * dx, static_cast<float>(sum[0] + sum[1]), acc[c]);
        }
        if constexpr (Bits == 4) acc[c] = std::fma(w.mins[w.block(t, g) * kTile + c], x.s[x.index(r, g)], acc[c]);
      }
    }
    std::memcpy(y + r * out + t * kTile, acc, sizeof(acc));
  }
}

#ifdef SPECVIZ_INTDOT_X86
// ------------------------------------------------------------------------------------------------ AVX2

// The cache lines of the group `block` (the tile's groups, then the next tile's, lie in this order in memory): its
// codes, scale and minimum, fetched ahead of use, since the weights of a decoding step come from the last-level
// cache or memory, and a product over several rows would otherwise wait on each line.
constexpr int64_t kAheadGroups = 8;

template <int Bits>
SPECVIZ_TARGET_AVX2 inline void prefetch_group(const Tiles& w, int64_t block) {
  constexpr int kWords = Bits == 4 ? 4 : 8;
  // Addresses as integers: past the last tile they point beyond the arrays, where a prefetch does nothing.
  auto at = [](const void* base, int64_t bytes) {
    return reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(bytes));
  };
  for (int k = 0; k < kWords; ++k) _mm_prefetch(at(w.codes, (block * kWords + k) * 64), _MM_HINT_T0);
  for (int h = 0; h < w.per; ++h) _mm_prefetch(at(w.scales, (block * w.per + h) * kTile * 4), _MM_HINT_T0);
  if constexpr (Bits == 4) _mm_prefetch(at(w.mins, block * kTile * 4), _MM_HINT_T0);
}

SPECVIZ_TARGET_AVX2 inline __m256i broadcast4_avx2(const int8_t* p) {
  int32_t word;
  std::memcpy(&word, p, 4);
  return _mm256_set1_epi32(word);
}

// R rows times half h (columns 8 h .. 8 h + 7) of tile t: each group's codes are unpacked once for the R rows.
// 4-bit: the eight products of a column's group summed in int16 (at most 8 · 2 · 15 · 127 = 30480) before vpmaddwd.
template <int Bits, int R>
SPECVIZ_TARGET_AVX2 inline void half_tile_avx2(const Acts& x, int64_t r0, const Tiles& w, int64_t t, int h, float* y,
                                               int64_t out, bool ahead) {
  constexpr int kWords = Bits == 4 ? 4 : 8;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < w.groups; ++g) {
    const uint8_t* codes = w.codes + w.block(t, g) * kWords * 64 + h * 32;
    if (ahead) prefetch_group<Bits>(w, w.block(t, g) + kAheadGroups);
    const int8_t* xq[R];
    for (int r = 0; r < R; ++r) xq[r] = x.at(r0 + r, g);
    __m256i sum[R][2];
    for (int r = 0; r < R; ++r) sum[r][0] = sum[r][1] = _mm256_setzero_si256();
    for (int k = 0; k < kWords; ++k) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + k * 64));
      if constexpr (Bits == 4) {
        const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        for (int r = 0; r < R; ++r) {
          sum[r][0] = _mm256_add_epi16(sum[r][0], _mm256_maddubs_epi16(lo, broadcast4_avx2(xq[r] + 4 * k)));
          sum[r][0] = _mm256_add_epi16(sum[r][0], _mm256_maddubs_epi16(hi, broadcast4_avx2(xq[r] + 16 + 4 * k)));
        }
      } else {
        const __m256i magnitude = _mm256_abs_epi8(v);
        for (int r = 0; r < R; ++r) {
          const __m256i signed_x = _mm256_sign_epi8(broadcast4_avx2(xq[r] + 4 * k), v);
          sum[r][k / 4] = _mm256_add_epi32(sum[r][k / 4], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed_x), ones));
        }
      }
    }
    const int64_t block = w.block(t, g);
    for (int r = 0; r < R; ++r) {
      const int64_t at = x.index(r0 + r, g);
      const __m256 dx = _mm256_set1_ps(x.d[at]);
      if constexpr (Bits == 4) {
        const __m256 dw = _mm256_loadu_ps(w.scales + block * kTile + h * 8);
        const __m256i i = _mm256_madd_epi16(sum[r][0], ones);
        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(i), acc[r]);
        acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w.mins + block * kTile + h * 8), _mm256_set1_ps(x.s[at]), acc[r]);
      } else if (w.per == 2) {
        for (int half = 0; half < 2; ++half) {
          const __m256 dw = _mm256_loadu_ps(w.scales + (block * 2 + half) * kTile + h * 8);
          acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(sum[r][half]), acc[r]);
        }
      } else {
        const __m256 dw = _mm256_loadu_ps(w.scales + block * kTile + h * 8);
        const __m256i i = _mm256_add_epi32(sum[r][0], sum[r][1]);
        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(i), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + (r0 + r) * out + t * kTile + h * 8, acc[r]);
}

// Rows [first, last) times half h of tile t, four rows a pass, then the rest; the first pass over the tile fetches
// ahead (both halves share its lines), the others find them in L1.
template <int Bits>
SPECVIZ_TARGET_AVX2 inline void rows_avx2(const Acts& x, int64_t first, int64_t last, const Tiles& w, int64_t t, int h,
                                          float* y, int64_t out) {
  int64_t r = first;
  for (; r + 4 <= last; r += 4) half_tile_avx2<Bits, 4>(x, r, w, t, h, y, out, h == 0 && r == first);
  if (last - r == 3) half_tile_avx2<Bits, 3>(x, r, w, t, h, y, out, h == 0 && r == first);
  if (last - r == 2) half_tile_avx2<Bits, 2>(x, r, w, t, h, y, out, h == 0 && r == first);
  if (last - r == 1) half_tile_avx2<Bits, 1>(x, r, w, t, h, y, out, h == 0 && r == first);
}

// ------------------------------------------------------------------------------------------------ AVX-512 VNNI

SPECVIZ_TARGET_VNNI inline __m512i broadcast4_vnni(const int8_t* p) {
  int32_t word;
  std::memcpy(&word, p, 4);
  return _mm512_set1_epi32(word);
}

// R rows times tile t, all 16 columns in one register: vpdpbusd sums four products of unsigned weights and signed
// activations into each column's int32. 8-bit weights are made unsigned by adding 128 (w ^ 0x80), and 128 times
// the activations' sum over the same weights is taken off again, so the integer is the same. Halves: integer sums
// per row and group, 2 where the group's halves have scales of their own (8-bit weights with per = 2), else 1
// (both halves in one sum: integer sums, so the same i either way).
template <int Bits, int R, int Halves>
SPECVIZ_TARGET_VNNI inline void tile_vnni(const Acts& x, int64_t r0, const Tiles& w, int64_t t, float* y, int64_t out,
                                          bool ahead) {
  constexpr int kWords = Bits == 4 ? 4 : 8;
  static_assert(Halves == 1 || Bits == 8, "4-bit groups have one scale");
  const __m512i low = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < w.groups; ++g) {
    const int64_t block = w.block(t, g);
    const uint8_t* codes = w.codes + block * kWords * 64;
    if (ahead) prefetch_group<Bits>(w, block + kAheadGroups);
    const int8_t* xq[R];
    for (int r = 0; r < R; ++r) xq[r] = x.at(r0 + r, g);
    __m512i sum[R][Halves];
    for (int r = 0; r < R; ++r)
      for (auto& part : sum[r]) part = _mm512_setzero_si512();
    for (int k = 0; k < kWords; ++k) {
      const __m512i v = _mm512_loadu_si512(codes + k * 64);
      if constexpr (Bits == 4) {
        const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        for (int r = 0; r < R; ++r) {
          sum[r][0] = _mm512_dpbusd_epi32(sum[r][0], lo, broadcast4_vnni(xq[r] + 4 * k));
          sum[r][0] = _mm512_dpbusd_epi32(sum[r][0], hi, broadcast4_vnni(xq[r] + 16 + 4 * k));
        }
      } else {
        const __m512i biased = _mm512_xor_si512(v, flip);
        for (int r = 0; r < R; ++r) {
          __m512i& part = sum[r][Halves == 2 ? k / 4 : 0];
          part = _mm512_dpbusd_epi32(part, biased, broadcast4_vnni(xq[r] + 4 * k));
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      const int64_t at = x.index(r0 + r, g);
      const __m512 dx = _mm512_set1_ps(x.d[at]);
      if constexpr (Bits == 4) {
        const __m512 dw = _mm512_loadu_ps(w.scales + block * kTile);
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(sum[r][0]), acc[r]);
        acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(w.mins + block * kTile), _mm512_set1_ps(x.s[at]), acc[r]);
      } else if constexpr (Halves == 2) {
        const int32_t* xs = x.sums + 2 * at;
        for (int h = 0; h < 2; ++h) {
          const __m512i i = _mm512_sub_epi32(sum[r][h], _mm512_set1_epi32(128 * xs[h]));
          const __m512 dw = _mm512_loadu_ps(w.scales + (block * 2 + h) * kTile);
          acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(i), acc[r]);
        }
      } else {
        const int32_t* xs = x.sums + 2 * at;
        const __m512i i = _mm512_sub_epi32(sum[r][0], _mm512_set1_epi32(128 * (xs[0] + xs[1])));
        const __m512 dw = _mm512_loadu_ps(w.scales + block * kTile);
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(i), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + (r0 + r) * out + t * kTile, acc[r]);
}

// Rows [first, last) times tile t, eight rows a pass where their sums fit in registers beside the accumulators, then
// four, then the rest; the first pass over the tile fetches ahead, the others find its lines in L1.
template <int Bits, int Halves>
SPECVIZ_TARGET_VNNI inline void rows_vnni(const Acts& x, int64_t first, int64_t last, const Tiles& w, int64_t t,
                                          float* y, int64_t out) {
  int64_t r = first;
  if constexpr (Halves == 1)
    for (; r + 8 <= last; r += 8) tile_vnni<Bits, 8, Halves>(x, r, w, t, y, out, r == first);
  for (; r + 4 <= last; r += 4) tile_vnni<Bits, 4, Halves>(x, r, w, t, y, out, r == first);
  if (last - r == 3) tile_vnni<Bits, 3, Halves>(x, r, w, t, y, out, r == first);
  if (last - r == 2) tile_vnni<Bits, 2, Halves>(x, r, w, t, y, out, r == first);
  if (last - r == 1) tile_vnni<Bits, 1, Halves>(x, r, w, t, y, out, r == first);
}
#endif

#ifdef SPECVIZ_INTDOT_AMX
// ------------------------------------------------------------------------------------------------ AMX tiles

// One tdpbssd (8-bit weights) or tdpbsud (4-bit codes, unsigned) multiplies a tile A of 16 rows' activations,
// K bytes each, by a tile B of K / 4 rows of 64 bytes, the weights' own tile order (4 consecutive inputs of each of
// 16 columns: the layout above is already the one B takes), into C, 16 rows × 16 columns of int32: the integer sums
// of 16 rows at once, exact as on the other paths. K = 32 / Halves: one sum per row, column, group and half, which
// C hands back through memory to be scaled in fp32 in the fixed order. Two sets of registers (C, A, B in tiles
// 0/2/4 and 1/3/5) alternate between consecutive groups, so one group's products run while the last one's sums
// are scaled. A CPU must have AMX-TILE and AMX-INT8 and the process must have asked Linux for the tile state
// (csrc/intdot.cpp does both before it picks this path).
constexpr int64_t kAmxRows = 16;     // rows of an A tile; a block's last, partial chunk is padded with zero rows
constexpr int64_t kAmxMinRows = 2;   // fewer rows take the VNNI path: a tile's fixed costs buy nothing for one row

struct alignas(64) TileConfig {  // ldtilecfg's 64 bytes, palette 1
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

inline TileConfig amx_config(int halves) {
  const int k = static_cast<int>(kGroup) / halves;
  TileConfig config;
  for (int p = 0; p < 2; ++p) {
    config.rows[p] = kAmxRows, config.colsb[p] = 64;          // C
    config.rows[2 + p] = kAmxRows, config.colsb[2 + p] = k;   // A
    config.rows[4 + p] = k / 4, config.colsb[4 + p] = 64;     // B
  }
  return config;
}

template <int P>
SPECVIZ_TARGET_AMX inline void amx_load_b(const void* b) {
  if constexpr (P == 0) SPECVIZ_TILE_LOAD(4, b, 64);
  else SPECVIZ_TILE_LOAD(5, b, 64);
}

// C = A · B for the 16 rows at `a` (`stride` bytes apart) and the B loaded last into set P; C stored to `c`.
template <int P, bool UnsignedB>
SPECVIZ_TARGET_AMX inline void amx_product(const int8_t* a, int64_t stride, int32_t* c) {
  if constexpr (P == 0) {
    SPECVIZ_TILE_ZERO(0);
    SPECVIZ_TILE_LOAD(2, a, stride);
    if constexpr (UnsignedB) SPECVIZ_TILE_DPBSUD(0, 2, 4);
    else SPECVIZ_TILE_DPBSSD(0, 2, 4);
    SPECVIZ_TILE_STORE(0, c, 64);
  } else {
    SPECVIZ_TILE_ZERO(1);
    SPECVIZ_TILE_LOAD(3, a, stride);
    if constexpr (UnsignedB) SPECVIZ_TILE_DPBSUD(1, 3, 5);
    else SPECVIZ_TILE_DPBSSD(1, 3, 5);
    SPECVIZ_TILE_STORE(1, c, 64);
  }
}

// A block of at most kRowBlock rows in chunks of 16: chunk c's activations at `chunk(c)` (rows `in` bytes apart);
// the last chunk, when partial, is a zero-padded copy of its rows.
struct AmxRows {
  const Acts& x;
  int64_t first, rows;
  const int8_t* padded;  // kAmxRows rows of the last chunk, or nullptr when every chunk is whole
  int64_t chunks() const { return (rows + kAmxRows - 1) / kAmxRows; }
  int64_t count(int64_t c) const { return std::min(kAmxRows, rows - c * kAmxRows); }
  const int8_t* chunk(int64_t c) const {
    return padded != nullptr && c == chunks() - 1 ? padded : x.q + (first + c * kAmxRows) * x.in;
  }
};

// Unit (group g, half h) of tile t for every row of the block, on register set P: its integer sums in tiles, then
// acc[r] (16 fp32 a row) advanced as tile_vnni advances it, in the same order.
template <int Bits, int Halves, int P>
SPECVIZ_TARGET_AMX inline void unit_amx(const AmxRows& b, const Tiles& w, int64_t t, int64_t g, int h, float* acc) {
  constexpr int64_t K = kGroup / Halves;
  const int64_t block = w.block(t, g);
  alignas(64) uint8_t unpacked[8 * 64];
  if constexpr (Bits == 4) {  // B rows 0..3: the low nibbles of words 0..3 (weights 0..15), 4..7: the high ones
    const uint8_t* codes = w.codes + block * 4 * 64;
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int k = 0; k < 4; ++k) {
      const __m512i v = _mm512_loadu_si512(codes + k * 64);
      _mm512_store_si512(unpacked + k * 64, _mm512_and_si512(v, low));
      _mm512_store_si512(unpacked + (4 + k) * 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
    }
    amx_load_b<P>(unpacked);
  } else {  // chunks 4h .. 4h + K / 4 - 1 of the group, as they lie
    amx_load_b<P>(w.codes + block * 8 * 64 + h * (K / 4) * 64);
  }
  const __m512 dw = _mm512_loadu_ps(w.scales + (Halves == 2 ? block * 2 + h : block) * kTile);
  alignas(64) int32_t sums[kAmxRows * kTile];
  for (int64_t c = 0; c < b.chunks(); ++c) {
    amx_product<P, Bits == 4>(b.chunk(c) + g * kGroup + h * K, b.x.in, sums);
    for (int64_t r = 0; r < b.count(c); ++r) {
      const int64_t at = b.x.index(b.first + c * kAmxRows + r, g);
      float* a = acc + (c * kAmxRows + r) * kTile;
      const __m512 i = _mm512_cvtepi32_ps(_mm512_load_si512(sums + r * kTile));
      __m512 v = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(b.x.d[at])), i, _mm512_load_ps(a));
      if constexpr (Bits == 4)
        v = _mm512_fmadd_ps(_mm512_loadu_ps(w.mins + block * kTile), _mm512_set1_ps(b.x.s[at]), v);
      _mm512_store_ps(a, v);
    }
  }
}

// Rows [first, last) (at most kRowBlock, at least kAmxMinRows) times tiles [begin, end) on AMX tiles: one tile
// configuration for the call, released at its end (another library on the same thread, oneDNN, configures the
// tiles its own way between calls).
template <int Bits, int Halves>
SPECVIZ_TARGET_AMX inline void block_amx(const Acts& x, int64_t first, int64_t last, const Tiles& w, float* y,
                                         int64_t out, int64_t begin, int64_t end) {
  const int64_t rows = last - first, whole = rows / kAmxRows * kAmxRows;
  std::vector<int8_t> padded(whole < rows ? kAmxRows * x.in : 0, 0);
  if (whole < rows) std::memcpy(padded.data(), x.q + (first + whole) * x.in, (rows - whole) * x.in);
  const AmxRows b{x, first, rows, whole < rows ? padded.data() : nullptr};
  const TileConfig config = amx_config(Halves);
  SPECVIZ_TILE_CONFIG(&config);
  alignas(64) float acc[kRowBlock * kTile];
  for (int64_t t = begin; t < end; ++t) {
    std::memset(acc, 0, sizeof(float) * rows * kTile);
    int64_t unit = 0;
    for (int64_t g = 0; g < w.groups; ++g)
      for (int h = 0; h < Halves; ++h, ++unit) {
        if (unit % 2 == 0) unit_amx<Bits, Halves, 0>(b, w, t, g, h, acc);
        else unit_amx<Bits, Halves, 1>(b, w, t, g, h, acc);
      }
    for (int64_t r = 0; r < rows; ++r) std::memcpy(y + (first + r) * out + t * kTile, acc + r * kTile, 4 * kTile);
  }
  SPECVIZ_TILE_RELEASE();
}
#endif

// ------------------------------------------------------------------------------------------------ dispatch

// Tiles [begin, end) for every row, on `path`: a few rows at a time over each tile (AVX-512: eight, then four and
// the rest; AVX2: four per half tile), so each tile's codes are read from memory once and from L1 for the other
// row blocks; over many rows (a prompt), kRowBlock rows at a time over all the tiles, so those rows' activations
// stay in cache while the weights pass.
template <int Bits>
inline void tiles(int64_t path, const Acts& x, int64_t rows, const Tiles& w, float* y, int64_t out, int64_t begin,
                  int64_t end) {
  for (int64_t first = 0; first < rows; first += kRowBlock) {
    const int64_t last = std::min(rows, first + kRowBlock);
#ifdef SPECVIZ_INTDOT_AMX
    if (path == kAmx && last - first >= kAmxMinRows) {
      if constexpr (Bits == 8) {
        if (w.per == 2) {
          block_amx<Bits, 2>(x, first, last, w, y, out, begin, end);
          continue;
        }
      }
      block_amx<Bits, 1>(x, first, last, w, y, out, begin, end);
      continue;
    }
#endif
    for (int64_t t = begin; t < end; ++t) {
#ifdef SPECVIZ_INTDOT_X86
      if (path == kAvx512 || path == kAmx) {
        if constexpr (Bits == 8) {
          if (w.per == 2) {
            rows_vnni<Bits, 2>(x, first, last, w, t, y, out);
            continue;
          }
        }
        rows_vnni<Bits, 1>(x, first, last, w, t, y, out);
        continue;
      }
      if (path == kAvx2) {
        for (int h = 0; h < 2; ++h) rows_avx2<Bits>(x, first, last, w, t, h, y, out);
        continue;
      }
#endif
      tile_portable<Bits>(x, first, last - first, w, t, y, out);
    }
  }
}

// Rows [begin, end) of x (in = 32 groups) quantized into q, d, s, sums (their rows' places).
inline void quantize_rows(int64_t path, const float* x, int64_t in, int64_t begin, int64_t end, int8_t* q, float* d,
                          float* s, int32_t* sums) {
  const int64_t groups = in / kGroup;
  for (int64_t r = begin; r < end; ++r) {
#ifdef SPECVIZ_INTDOT_X86
    if (path != kPortable) {
      quantize_row_avx2(x + r * in, groups, q + r * in, d + r * groups, s + r * groups, sums + 2 * r * groups);
      continue;
    }
#endif
    quantize_row_portable(x + r * in, groups, q + r * in, d + r * groups, s + r * groups, sums + 2 * r * groups);
  }
}

#ifdef SPECVIZ_INTDOT_AMX
// Products of 20 rows (a whole chunk of 16 and a padded one) on the tiles and on VNNI, for 4-bit codes, Q8_0 and
// Q6_K's halves, on made-up weights and activations: the same bits, or the tiles are not used. A wrong tile
// product would otherwise change every verify's logits silently.
inline bool amx_agrees_with_vnni() {
  constexpr int64_t rows = 20, in = 64, out = 32, groups = in / kGroup;
  uint32_t state = 20261206u;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;  // a linear congruential generator: the same numbers everywhere
    return state >> 8;
  };
  std::vector<float> x(rows * in), scales(out * groups * 2), mins(out * groups);
  std::vector<uint8_t> codes(out * in);
  for (float& v : x) v = static_cast<float>(static_cast<int>(next() % 2001) - 1000) / 100.0f;
  for (float& v : scales) v = static_cast<float>(next() % 1000 + 1) / 4096.0f;
  for (float& v : mins) v = -static_cast<float>(next() % 1000) / 4096.0f;
  for (uint8_t& c : codes) c = static_cast<uint8_t>(next());
  std::vector<int8_t> q(rows * in);
  std::vector<float> d(rows * groups), s(rows * groups);
  std::vector<int32_t> sums(2 * rows * groups);
  quantize_rows(kPortable, x.data(), in, 0, rows, q.data(), d.data(), s.data(), sums.data());
  const Acts acts{q.data(), d.data(), s.data(), sums.data(), in, groups};
  for (int per : {0, 1, 2}) {  // 0: 4-bit codes, else 8-bit with `per` scales a group
    const Tiles w{codes.data(), scales.data(), per == 0 ? mins.data() : nullptr, groups,
                                  per == 0 ? 1 : per};
    std::vector<float> tiled(rows * out), vnni(rows * out);
    for (auto [path, y] : {std::pair{kAmx, tiled.data()}, std::pair{kAvx512, vnni.data()}}) {
      if (per == 0) tiles<4>(path, acts, rows, w, y, out, 0, out / kTile);
      else tiles<8>(path, acts, rows, w, y, out, 0, out / kTile);
    }
    if (std::memcmp(tiled.data(), vnni.data(), sizeof(float) * tiled.size()) != 0) return false;
  }
  return true;
}
#endif

}  // namespace specviz_intdot
