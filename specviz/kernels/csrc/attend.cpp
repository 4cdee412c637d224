// One attention block of a Llama-family decoding step, for a few new tokens over an in-place KV cache, in one call
// instead of some thirty small torch ops (slices, rotary, cache writes, scaled_dot_product_attention, reshapes).
//
// attend(qkv, cos, sin, keys, values, past, mask, scaling, heads, kv_heads) for T new tokens:
//   qkv (T, (heads + 2 kv_heads) D) fp32: the fused q/k/v product of the layer's normed input;
//   cos, sin (T, D) fp32: the rotary tables at the new tokens' positions;
//   keys, values (1, kv_heads, capacity, D) fp32 cache buffers: the new tokens' rotated keys and values are
//     written at [past, past + T);
//   mask: none (causal: new token t sees positions [0, past + t]), or (.., T, past + T), bool (true = attend)
//     or additive float;
// returns the attended values (T, heads D), the input of o_proj.
//
// The rotary step is transformers' q * cos + rotate_half(q) * sin, each product and the sum rounded as torch
// rounds them (this file is compiled with -ffp-contract=off), so the cache holds the same bits as through torch.
// The softmax(q k / sqrt(D)) v is computed in fp32 per (token, head) with max subtraction: the same function
// as scaled_dot_product_attention, to rounding. Without a mask each (token, head) is computed the same way
// whatever T is (it sees past + t + 1 keys either way). With a mask whose every entry either lets a key in unchanged
// (true, or 0 added) or shuts it out (false, or an added value of -1e30 or less: a weight that is exactly 0), as a
// draft tree's mask does, a row attends over the keys it may see, gathered in order: the same keys in the same
// order as a one-token forward along the row's path would see them in a cache of its path alone, so it gives the
// same bits whatever else the tree holds (a fixed order of sums needs the same sequence of terms, not only the same
// nonzero ones). A mask with other values makes its row see all past + T keys, each with its value added.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "ops.h"

#include <cmath>
#include <limits>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kLanes = 16;  // partial sums per dot product: one AVX-512 register
constexpr float kShut = -1e30f;  // an added mask value at or below this gives its key a weight of exactly 0

// The cache position of a row's j-th key: index[j] where its keys are gathered, else j.
inline int64_t key_at(const int64_t* index, int64_t j) { return index ? index[j] : j; }

// The cache positions a mask row lets in, in order, into `keys`; false where the row has a value that neither lets
// a key in unchanged nor shuts it out (then the row attends over all its keys with the mask applied).
inline bool gather(const bool* allowed_row, const float* additive_row, int64_t end, std::vector<int64_t>& keys) {
  keys.clear();
  for (int64_t j = 0; j < end; ++j) {
    if (allowed_row) {
      if (allowed_row[j]) keys.push_back(j);
    } else if (additive_row[j] == 0.f) {
      keys.push_back(j);
    } else if (!(additive_row[j] <= kShut)) {
      return false;
    }
  }
  return true;
}

// The generic path's dot product: 16 partial sums (which the compiler vectorizes), then summed in order.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  for (int64_t i = 0; i < n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  float sum = 0.f;
  for (int64_t l = 0; l < kLanes; ++l) sum += acc[l];
  return sum;
}

// scores[j] = scale scores[j], masked (-inf where the bool row forbids, + the additive row), for j < seen;
// returns their maximum (-inf when every key is masked).
inline float mask_and_top(float* scores, int64_t seen, float scale, const bool* allowed_row, const float* additive_row) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < seen; ++j) {
    float s = scores[j] * scale;
    if (allowed_row && !allowed_row[j]) s = -std::numeric_limits<float>::infinity();
    if (additive_row) s += additive_row[j];
    scores[j] = s;
    top = std::max(top, s);
  }
  return top;
}

// scores[j] = exp(scores[j] - top) for j < n; returns their sum.
inline float exp_shifted(float* scores, int64_t n, float top) {
  int64_t j = 0;
  float total = 0.f;
#ifdef __AVX512F__
  // e^x = 2^(x log2 e) = 2^k 2^f, k the nearest integer, |f| <= 1/2, 2^f by its Taylor series to degree 7
  // (relative error below 3e-8); scores below -87 (where fp32 underflows) come out 0.
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f), ln2 = _mm512_set1_ps(0.693147180559945309f);
  const __m512 lowest = _mm512_set1_ps(-87.f), shift = _mm512_set1_ps(top);
  __m512 sum = _mm512_setzero_ps();
  for (; j + kLanes <= n; j += kLanes) {
    const __m512 x = _mm512_sub_ps(_mm512_loadu_ps(scores + j), shift);
    const __mmask16 live = _mm512_cmp_ps_mask(x, lowest, _CMP_GE_OQ);
    const __m512 t = _mm512_mul_ps(_mm512_max_ps(x, lowest), log2e);
    const __m512 k = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 g = _mm512_mul_ps(_mm512_sub_ps(t, k), ln2);  // 2^f = e^g
    __m512 p = _mm512_set1_ps(1.f / 5040.f);
    p = _mm512_fmadd_ps(p, g, _mm512_set1_ps(1.f / 720.f));
    p = _mm512_fmadd_ps(p, g, _mm512_set1_ps(1.f / 120.f));
    p = _mm512_fmadd_ps(p, g, _mm512_set1_ps(1.f / 24.f));
    p = _mm512_fmadd_ps(p, g, _mm512_set1_ps(1.f / 6.f));
    p = _mm512_fmadd_ps(p, g, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, g, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, g, _mm512_set1_ps(1.f));
    const __m512 e = _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, k));
    _mm512_storeu_ps(scores + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  total = _mm512_reduce_add_ps(sum);
#endif
  for (; j < n; ++j) {
    scores[j] = std::exp(scores[j] - top);
    total += scores[j];
  }
  return total;
}

// out = x * cos + rotate_half(x) * sin, rotate_half(x) = (-x[D/2:], x[:D/2]).
inline void rotate(const float* x, const float* cos, const float* sin, float* out, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < D; ++i) {
    const float rotated = i < half ? -x[i + half] : x[i - half];
    const float a = x[i] * cos[i];
    const float b = rotated * sin[i];
    out[i] = a + b;
  }
}

#ifdef __AVX512F__
// The 16 lane sums of v[0..15], as one register (lane i = sum of v[i]'s lanes): three rounds of pairwise adds.
inline __m512 lane_sums(__m512* v) {
  __m512 u[4];
  for (int i = 0; i < 4; ++i) {
    const __m512 a = _mm512_add_ps(_mm512_unpacklo_ps(v[4 * i], v[4 * i + 1]), _mm512_unpackhi_ps(v[4 * i], v[4 * i + 1]));
    const __m512 b = _mm512_add_ps(_mm512_unpacklo_ps(v[4 * i + 2], v[4 * i + 3]), _mm512_unpackhi_ps(v[4 * i + 2], v[4 * i + 3]));
    // per 128-bit block: (a0 + a1, b0 + b1, a2 + a3, b2 + b3) reordered to v[4i], v[4i+1], v[4i+2], v[4i+3]
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
  }
  const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xDD));
}

// scores[j] = scale scores[j] for j < seen (no mask row: the keys are the ones the row sees); returns their maximum.
// Sixteen at a time: the same products, and the maximum is exact, so mask_and_top's numbers.
inline float scale_and_top(float* scores, int64_t seen, float scale) {
  const __m512 factor = _mm512_set1_ps(scale);
  __m512 top16 = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + kLanes <= seen; j += kLanes) {
    const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(scores + j), factor);
    _mm512_storeu_ps(scores + j, s);
    top16 = _mm512_max_ps(s, top16);  // top16 where s is NaN, as std::max(top, s) keeps top
  }
  float top = _mm512_reduce_max_ps(top16);
  for (; j < seen; ++j) {
    scores[j] *= scale;
    top = std::max(top, scores[j]);
  }
  return top;
}

// q · k_j for j < seen, into scores: per key 16 partial sums (D / 16 products each, in order), then lane_sums.
template <int C>
void key_scores(const float* q, const float* keys, const int64_t* index, int64_t seen, float* scores) {
  constexpr int64_t D = C * kLanes;
  __m512 qv[C];
  for (int c = 0; c < C; ++c) qv[c] = _mm512_loadu_ps(q + c * kLanes);
  int64_t j = 0;
  for (; j + kLanes <= seen; j += kLanes) {
    __m512 v[kLanes];
    for (int i = 0; i < kLanes; ++i) {
      const float* k = keys + key_at(index, j + i) * D;
      v[i] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k));
      for (int c = 1; c < C; ++c) v[i] = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + c * kLanes), v[i]);
    }
    _mm512_storeu_ps(scores + j, lane_sums(v));
  }
  for (; j < seen; ++j) {
    const float* k = keys + key_at(index, j) * D;
    __m512 v = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k));
    for (int c = 1; c < C; ++c) v = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + c * kLanes), v);
    scores[j] = _mm512_reduce_add_ps(v);
  }
}

// out[n] = Σ_j p[n][j] v_j / totals[n] for N queries at once over the same keys: each query's sum in the order
// j = 0, 1, ..., as one query alone sums it, with N · C independent chains of fmas instead of C.
template <int C, int N>
void weighted_values(const float* const* p, const float* values, const int64_t* index, int64_t seen,
                     const float* totals, float* const* out) {
  constexpr int64_t D = C * kLanes;
  __m512 acc[N][C];
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) acc[n][c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < seen; ++j) {
    const float* v = values + key_at(index, j) * D;
    __m512 vv[C];
    for (int c = 0; c < C; ++c) vv[c] = _mm512_loadu_ps(v + c * kLanes);
    for (int n = 0; n < N; ++n) {
      const __m512 weight = _mm512_set1_ps(p[n][j]);
      for (int c = 0; c < C; ++c) acc[n][c] = _mm512_fmadd_ps(weight, vv[c], acc[n][c]);
    }
  }
  for (int n = 0; n < N; ++n) {
    const __m512 inverse = _mm512_set1_ps(totals[n] > 0.f ? 1.f / totals[n] : 0.f);
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out[n] + c * kLanes, _mm512_mul_ps(acc[n][c], inverse));
  }
}

// The heads of one kv head for one token, `count` queries (q: count × D, out: the same), which see the same keys:
// each out = softmax(scale q·k_j + mask_j over j < seen) · v, for D = 16 C. scores has room for count × seen
// floats; allowed_row / additive_row: the token's row of a bool / additive mask, or null; index: where the j-th key
// and value sit in the cache (a row's gathered keys), or null for the j-th. Per query the same operations in the
// same order as it alone would take, so the same bits whatever the group holds.
template <int C>
void group_attention(const float* q, int64_t count, const float* keys, const float* values, const int64_t* index,
                     int64_t seen, float scale, const bool* allowed_row, const float* additive_row, float* scores,
                     float* out) {
  constexpr int64_t D = C * kLanes;
  constexpr int kMost = C <= 4 ? 4 : 2;  // queries whose value sums run together (N C accumulators, at most 16)
  const float* live[kMost];
  float* where[kMost];
  float totals[kMost];
  int n = 0;
  auto flush = [&]() {
    if constexpr (kMost == 4) {
      if (n == 4) weighted_values<C, 4>(live, values, index, seen, totals, where);
      if (n == 3) weighted_values<C, 3>(live, values, index, seen, totals, where);
    }
    if (n == 2) weighted_values<C, 2>(live, values, index, seen, totals, where);
    if (n == 1) weighted_values<C, 1>(live, values, index, seen, totals, where);
    n = 0;
  };
  for (int64_t h = 0; h < count; ++h) {
    float* row = scores + h * seen;
    key_scores<C>(q + h * D, keys, index, seen, row);
    const float top = allowed_row || additive_row ? mask_and_top(row, seen, scale, allowed_row, additive_row)
                                                  : scale_and_top(row, seen, scale);
    if (!(top > -std::numeric_limits<float>::infinity())) {  // every key shut out: zeros
      std::fill(out + h * D, out + (h + 1) * D, 0.f);
      continue;
    }
    totals[n] = exp_shifted(row, seen, top);
    live[n] = row;
    where[n] = out + h * D;
    if (++n == kMost) flush();
  }
  flush();
}
#endif

// One (token, head) as group_attention computes each of its heads, for any D (a multiple of 16), in portable C++;
// acc has room for D floats.
inline void head_attention_generic(const float* q, const float* keys, const float* values, const int64_t* index,
                                   int64_t D, int64_t seen, float scale, const bool* allowed_row,
                                   const float* additive_row, float* scores, float* acc, float* out) {
  for (int64_t j = 0; j < seen; ++j) scores[j] = dot(q, keys + key_at(index, j) * D, D);
  const float top = mask_and_top(scores, seen, scale, allowed_row, additive_row);
  std::fill(acc, acc + D, 0.f);
  float total = 0.f;
  if (top > -std::numeric_limits<float>::infinity()) {
    total = exp_shifted(scores, seen, top);
    for (int64_t j = 0; j < seen; ++j) {
      const float* v = values + key_at(index, j) * D;
      for (int64_t d = 0; d < D; ++d) acc[d] += scores[j] * v[d];
    }
  }
  const float inverse = total > 0.f ? 1.f / total : 0.f;
  for (int64_t d = 0; d < D; ++d) out[d] = acc[d] * inverse;
}

}  // namespace

namespace specviz {

at::Tensor attend(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor keys,
                  at::Tensor values, int64_t past, const c10::optional<at::Tensor>& mask, double scaling,
                  int64_t heads, int64_t kv_heads) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kFloat && qkv.is_contiguous(), "attend: qkv (T, width) fp32");
  TORCH_CHECK(keys.dim() == 4 && keys.is_contiguous() && values.is_contiguous() && keys.sizes() == values.sizes() &&
                  keys.scalar_type() == at::kFloat && values.scalar_type() == at::kFloat && keys.size(1) == kv_heads,
              "attend: keys, values (1, kv_heads, capacity, D) fp32");
  TORCH_CHECK(heads % kv_heads == 0, "attend: heads must be a multiple of kv_heads");
  const int64_t T = qkv.size(0), D = keys.size(3), capacity = keys.size(2), end = past + T;
  TORCH_CHECK(D % kLanes == 0 && D % 2 == 0, "attend: head_dim must be a multiple of 16");
  TORCH_CHECK(qkv.size(1) == (heads + 2 * kv_heads) * D, "attend: qkv width does not match the heads");
  TORCH_CHECK(past >= 0 && end <= capacity, "attend: the cache has no room for the new tokens");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat && cos.numel() == T * D && sin.numel() == T * D,
              "attend: cos, sin (T, D) fp32");
  at::Tensor mask2d;
  const bool* allowed = nullptr;
  const float* additive = nullptr;
  if (mask.has_value() && mask->defined()) {
    TORCH_CHECK(mask->numel() == T * end, "attend: the mask must be (T, past + T)");
    mask2d = mask->reshape({T, end}).contiguous();
    if (mask2d.scalar_type() == at::kBool) {
      allowed = mask2d.data_ptr<bool>();
    } else {
      TORCH_CHECK(mask2d.scalar_type() == at::kFloat, "attend: the mask must be bool or fp32");
      additive = mask2d.data_ptr<float>();
    }
  }
  const float* QKV = qkv.data_ptr<float>();
  const float* COS = cos.data_ptr<float>();
  const float* SIN = sin.data_ptr<float>();
  float* K = keys.data_ptr<float>();
  float* V = values.data_ptr<float>();
  const int64_t width = qkv.size(1), group = heads / kv_heads;
  const float scale = static_cast<float>(scaling);

  // The new tokens' keys (rotated) and values, into the cache.
  for (int64_t t = 0; t < T; ++t) {
    const float* row = QKV + t * width;
    for (int64_t g = 0; g < kv_heads; ++g) {
      rotate(row + (heads + g) * D, COS + t * D, SIN + t * D, K + (g * capacity + past + t) * D, D);
      const float* v = row + (heads + kv_heads + g) * D;
      std::copy(v, v + D, V + (g * capacity + past + t) * D);
    }
  }

  at::Tensor out = at::empty({T, heads * D}, qkv.options());
  float* OUT = out.data_ptr<float>();
  // Threads only where there is enough work to share (a single token over a short context runs on one).
  const int64_t grain = std::max<int64_t>(1, (1 << 18) / std::max<int64_t>(1, end * D));
  // With a mask, each row's keys: gathered where its mask only lets keys in or shuts them out (see the top).
  std::vector<std::vector<int64_t>> rows_keys(allowed || additive ? T : 0);
  std::vector<char> gathered(rows_keys.size(), 0);
  for (int64_t t = 0; t < static_cast<int64_t>(rows_keys.size()); ++t)
    gathered[t] = gather(allowed ? allowed + t * end : nullptr, additive ? additive + t * end : nullptr, end, rows_keys[t]);
  // A task: one token's heads of one kv head, `chunk` of them (all, unless a long context makes a head's work worth
  // a thread's share: then as few as the grain asks, so that every thread gets some).
  const int64_t chunk = std::min(group, grain), chunks = (group + chunk - 1) / chunk;
  at::parallel_for(0, T * kv_heads * chunks, std::max<int64_t>(1, grain / chunk), [&](int64_t begin, int64_t stop) {
    std::vector<float> q(chunk * D), scores(chunk * end), acc(D);
    for (int64_t task = begin; task < stop; ++task) {
      const int64_t t = task / (kv_heads * chunks), g = task / chunks % kv_heads, first = task % chunks * chunk;
      const int64_t count = std::min(chunk, group - first);
      for (int64_t i = 0; i < count; ++i)
        rotate(QKV + t * width + (g * group + first + i) * D, COS + t * D, SIN + t * D, q.data() + i * D, D);
      const float* keys_g = K + g * capacity * D;
      const float* values_g = V + g * capacity * D;
      const int64_t* index = nullptr;
      const bool* allowed_row = nullptr;
      const float* additive_row = nullptr;
      int64_t seen = past + t + 1;  // causal: nothing after the token itself
      if (!rows_keys.empty() && gathered[t]) {
        index = rows_keys[t].data();
        seen = static_cast<int64_t>(rows_keys[t].size());
      } else if (!rows_keys.empty()) {
        seen = end;
        allowed_row = allowed ? allowed + t * end : nullptr;
        additive_row = additive ? additive + t * end : nullptr;
      }
      float* o = OUT + t * heads * D + (g * group + first) * D;  // the task's heads, side by side
      switch (D) {  // AVX-512 registers for the common head sizes
#ifdef __AVX512F__
        case 16: group_attention<1>(q.data(), count, keys_g, values_g, index, seen, scale, allowed_row, additive_row, scores.data(), o); break;
        case 32: group_attention<2>(q.data(), count, keys_g, values_g, index, seen, scale, allowed_row, additive_row, scores.data(), o); break;
        case 64: group_attention<4>(q.data(), count, keys_g, values_g, index, seen, scale, allowed_row, additive_row, scores.data(), o); break;
        case 128: group_attention<8>(q.data(), count, keys_g, values_g, index, seen, scale, allowed_row, additive_row, scores.data(), o); break;
#endif
        default:
          for (int64_t i = 0; i < count; ++i)
            head_attention_generic(q.data() + i * D, keys_g, values_g, index, D, seen, scale, allowed_row,
                                   additive_row, scores.data(), acc.data(), o + i * D);
      }
    }
  });
  return out;
}

}  // namespace specviz

TORCH_LIBRARY(specviz, m) {
  m.def("attend(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, int past, Tensor? mask, "
        "float scaling, int heads, int kv_heads) -> Tensor");
}

TORCH_LIBRARY_IMPL(specviz, CPU, m) {
  m.impl("attend", specviz::attend);
}
