// y = x · Wᵀ (+ bias) for a few fp32 rows x and a weight W kept 4-bit: the product of a linear layer whose weights
// come from a Q4_1 GGUF, without ever holding W in fp32.
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
//
// Each output column's weights are unpacked once per call into fp32 (in L1) and each row's dot product with them
// is summed in a fixed order (32 partial sums, one per position in a group, each a chain of fused multiply-adds
// over the groups, then a fixed tree), so a row's result does not depend on how many rows come with it or on the
// thread count. The three paths do the same operations in the same order, so they give the same bits.
// Threads split the output columns (at::parallel_for).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

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

constexpr int64_t kGroup = 32;  // weights per (d, m) pair, along the input dimension
constexpr int64_t kLanes = 32;  // partial sums of every dot product: one per position in a group

enum Path : int64_t { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

// ------------------------------------------------------------------------------------------------ portable C++

// w[0..32) of one group: low nibbles first, then high nibbles.
inline void unpack_group(const uint8_t* q, float d, float m, float* w) {
  for (int j = 0; j < 16; ++j) {
    w[j] = std::fma(d, static_cast<float>(q[j] & 0x0F), m);
    w[j + 16] = std::fma(d, static_cast<float>(q[j] >> 4), m);
  }
}

// The fixed summation tree of the 32 partial sums: pairs (l, l + 16), then (l, l + 8), (l, l + 4), (l, l + 2),
// (l, l + 1), which is what the vector paths' register reductions do.
inline float tree_sum(float* acc) {
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
  return acc[0];
}

void columns_portable(const float* x, int64_t rows, int64_t in, int64_t out, const uint8_t* nibbles,
                      const float* scales, const float* mins, float* y, int64_t begin, int64_t end) {
  const int64_t groups = in / kGroup;
  std::vector<float> w(in);
  for (int64_t o = begin; o < end; ++o) {
    for (int64_t g = 0; g < groups; ++g)
      unpack_group(nibbles + (o * groups + g) * 16, scales[o * groups + g], mins[o * groups + g], w.data() + g * kGroup);
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

// R rows' dot products with one unpacked column w: each row keeps its own four accumulators (lanes 0–7, 8–15,
// 16–23, 24–31 of a group), so every row is summed in the one fixed order whatever R is; the weights are read
// from L1 once for the R rows. R = 3: 12 accumulators and 4 weight registers, the 16 AVX2 registers.
template <int R>
__attribute__((target("avx2,fma"))) inline void dots_avx2(const float* w, const float* x, int64_t in, float* y,
                                                          int64_t out) {
  __m256 a[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) a[r][j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < in; i += kLanes) {
    const __m256 w0 = _mm256_load_ps(w + i), w1 = _mm256_load_ps(w + i + 8), w2 = _mm256_load_ps(w + i + 16),
                 w3 = _mm256_load_ps(w + i + 24);
    for (int r = 0; r < R; ++r) {
      const float* xr = x + r * in + i;
      a[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr), a[r][0]);
      a[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + 8), a[r][1]);
      a[r][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xr + 16), a[r][2]);
      a[r][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xr + 24), a[r][3]);
    }
  }
  // the portable tree: (l, l + 16), (l, l + 8), then within 8 lanes
  for (int r = 0; r < R; ++r)
    y[r * out] = sum8(_mm256_add_ps(_mm256_add_ps(a[r][0], a[r][2]), _mm256_add_ps(a[r][1], a[r][3])));
}

__attribute__((target("avx2,fma"))) void columns_avx2(const float* x, int64_t rows, int64_t in, int64_t out,
                                                      const uint8_t* nibbles, const float* scales, const float* mins,
                                                      float* y, int64_t begin, int64_t end) {
  const int64_t groups = in / kGroup;
  std::vector<float> buffer(in + 8);
  float* w = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buffer.data()) + 31) & ~uintptr_t(31));
  const __m128i low = _mm_set1_epi8(0x0F);
  for (int64_t o = begin; o < end; ++o) {
    const uint8_t* q = nibbles + o * groups * 16;
    for (int64_t g = 0; g < groups; ++g) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + g * 16));
      const __m128i lo = _mm_and_si128(bytes, low), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low);
      const __m256 d = _mm256_set1_ps(scales[o * groups + g]), m = _mm256_set1_ps(mins[o * groups + g]);
      float* wg = w + g * kGroup;
      _mm256_store_ps(wg, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), m));
      _mm256_store_ps(wg + 8, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), m));
      _mm256_store_ps(wg + 16, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), m));
      _mm256_store_ps(wg + 24, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), m));
    }
    int64_t r = 0;  // rows three at a time: the unpacked weights are loaded once for the three
    for (; r + 3 <= rows; r += 3) dots_avx2<3>(w, x + r * in, in, y + r * out + o, out);
    if (rows - r == 2) dots_avx2<2>(w, x + r * in, in, y + r * out + o, out);
    if (rows - r == 1) dots_avx2<1>(w, x + r * in, in, y + r * out + o, out);
  }
}

// ------------------------------------------------------------------------------------------------ AVX-512

__attribute__((target("avx512f"))) void columns_avx512(const float* x, int64_t rows, int64_t in, int64_t out,
                                                       const uint8_t* nibbles, const float* scales, const float* mins,
                                                       float* y, int64_t begin, int64_t end) {
  const int64_t groups = in / kGroup;
  std::vector<float> buffer(in + 16);
  float* w = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t(63));
  const __m128i low = _mm_set1_epi8(0x0F);
  for (int64_t o = begin; o < end; ++o) {
    const uint8_t* q = nibbles + o * groups * 16;
    for (int64_t g = 0; g < groups; ++g) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + g * 16));
      const __m128i lo = _mm_and_si128(bytes, low), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low);
      const __m512 d = _mm512_set1_ps(scales[o * groups + g]), m = _mm512_set1_ps(mins[o * groups + g]);
      _mm512_store_ps(w + g * kGroup, _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), m));
      _mm512_store_ps(w + g * kGroup + 16, _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), m));
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * in;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0;  // lanes 0–15 and 16–31 of a group
      for (int64_t i = 0; i < in; i += kLanes) {
        a0 = _mm512_fmadd_ps(_mm512_load_ps(w + i), _mm512_loadu_ps(xr + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_load_ps(w + i + 16), _mm512_loadu_ps(xr + i + 16), a1);
      }
      // the portable tree: (l, l + 16), then within 16 lanes the same halvings
      const __m512 s = _mm512_add_ps(a0, a1);
      const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
      __m128 v = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
      v = _mm_add_ps(v, _mm_movehl_ps(v, v));
      v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
      y[r * out + o] = _mm_cvtss_f32(v);
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
      else TORCH_CHECK(false, "SPECVIZ_Q4_PATH must be portable, avx2 or avx512, not ", forced);
    } else {
      return cpu_has(kAvx512) ? kAvx512 : cpu_has(kAvx2) ? kAvx2 : kPortable;
    }
  }
  TORCH_CHECK(path <= kAvx512, "q4_linear: path must be -1 (auto), 0 (portable), 1 (avx2) or 2 (avx512)");
  TORCH_CHECK(cpu_has(path), "q4_linear: this CPU cannot run path ", path);
  return path;
}

int64_t q4_path(int64_t path) { return resolve(path); }

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& nibbles, const at::Tensor& scales, const at::Tensor& mins,
                     const c10::optional<at::Tensor>& bias, int64_t path) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "q4_linear: x (rows, in) fp32");
  const int64_t rows = x.size(0), in = x.size(1), out = nibbles.size(0), groups = in / kGroup;
  TORCH_CHECK(in % kGroup == 0, "q4_linear: the input size must be a multiple of 32");
  TORCH_CHECK(nibbles.dim() == 2 && nibbles.scalar_type() == at::kByte && nibbles.is_contiguous() &&
                  nibbles.size(1) * 2 == in,
              "q4_linear: nibbles (out, in / 2) uint8");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && mins.scalar_type() == at::kFloat && scales.is_contiguous() &&
                  mins.is_contiguous() && scales.numel() == out * groups && mins.numel() == out * groups,
              "q4_linear: scales, mins (out, in / 32) fp32");
  const int64_t chosen = resolve(path);
  at::Tensor y = at::empty({rows, out}, x.options());
  const float* X = x.data_ptr<float>();
  const uint8_t* N = nibbles.data_ptr<uint8_t>();
  const float* S = scales.data_ptr<float>();
  const float* M = mins.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  auto run = columns_portable;
#ifdef SPECVIZ_X86
  if (chosen == kAvx2) run = columns_avx2;
  if (chosen == kAvx512) run = columns_avx512;
#endif
  // Threads only where each gets enough weights to read (about 32 K).
  const int64_t grain = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, in));
  if (rows > 0)
    at::parallel_for(0, out, grain, [&](int64_t begin, int64_t end) { run(X, rows, in, out, N, S, M, Y, begin, end); });
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == out && bias->scalar_type() == at::kFloat, "q4_linear: bias (out,) fp32");
    y.add_(bias->reshape({1, out}));
  }
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specviz, m) {
  m.def("q4_linear(Tensor x, Tensor nibbles, Tensor scales, Tensor mins, Tensor? bias, int path=-1) -> Tensor");
  m.def("q4_path(int path=-1) -> int", q4_path);
}

TORCH_LIBRARY_IMPL(specviz, CPU, m) {
  m.impl("q4_linear", q4_linear);
}
