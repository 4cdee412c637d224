// One Llama-family decoder layer whose projections are Q4_1 blocks, for a few new tokens, in one call: what the
// lean decoder's Python loop (specviz.kernels.fastdecoder) does per layer, from C++, so a decoding step makes 30
// calls instead of some 600 small ones through Python and torch's dispatcher.
//
// q4_layer(x, input_norm, post_norm, eps, qkv, qkv_bias, o, gate_up, down, cos, sin, keys, values, past, mask,
//          scaling, heads, kv_heads) for T new tokens:
//   x (T, H) fp32, the layer's input; input_norm, post_norm (H,) fp32 RMSNorm weights with epsilon eps (input_norm
//     none for a layer without one: an EAGLE head's only layer reads its fused input as it is);
//   qkv, o, gate_up, down: each [nibbles, scales, mins] as q4_linear takes them (qkv the fused q/k/v rows, gate_up
//     the fused gate/up rows); qkv_bias: the fused q/k/v bias (Qwen2) or none;
//   cos, sin, keys, values, past, mask, scaling, heads, kv_heads: as attend takes them;
// returns the layer's output (T, H).
//
// In order: rms_norm, q4_linear, attend, q4_linear, + x, rms_norm, q4_linear, silu(gate) * up, q4_linear, + h.
//
// q4_eagle3_layer(x, embeds, hidden_norm, input_norm, post_norm, eps, norm_before_residual, qkv, qkv_bias, o,
//                 gate_up, down, cos, sin, keys, values, past, mask, scaling, heads, kv_heads): an EAGLE-3 head's
//   one layer (specviz.models.eagle3.Layer), whose q/k/v read [input_norm(embeds) ; hidden_norm(x)] (qkv's rows
//   are 2 H wide) and whose residual is x, or hidden_norm(x) with norm_before_residual; the rest as q4_layer's.
//   embeds (T, H) fp32, the embeddings of the tokens the features are paired with.
// The norm is this file's rms_norm (also an op, which the Python loop calls for 4-bit layers, so that both give the
// same bits), since torch's, with its small elementwise ops, took about 1 ms of a 10 ms one-token step
// (experiments/profile_step.py --weights q4; 61 norms a step).
// The residual sums and silu(gate) * up are written in place: the same IEEE sums and products as torch's add and
// mul, with torch's silu, so those keep torch's bits.
//
// rms_norm(x, weight, eps): each row of x (T, H) fp32 as transformers' LlamaRMSNorm computes it,
// weight * (x / sqrt(mean(x²) + eps)), the mean of squares summed in double in a fixed order (eight partial sums,
// then in order), so a row's result does not depend on T; it differs from torch's fp32 mean by rounding only.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops.h"

#include <cmath>

namespace {

void check_blocks(const char* what, const at::TensorList& blocks) {
  TORCH_CHECK(blocks.size() == 3, "q4_layer: ", what, " must be [nibbles, scales, mins]");
}

at::Tensor product(const at::Tensor& x, const at::TensorList& blocks, const c10::optional<at::Tensor>& bias) {
  return specviz::q4_linear(x, blocks[0], blocks[1], blocks[2], bias, -1);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "rms_norm: x (T, H) fp32");
  const int64_t rows = x.size(0), width = x.size(1);
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.is_contiguous() && weight.numel() == width,
              "rms_norm: weight (H,) fp32");
  at::Tensor y = at::empty_like(x);
  const float* X = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  constexpr int64_t kSums = 8;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = X + r * width;
    double partial[kSums] = {};
    int64_t i = 0;
    for (; i + kSums <= width; i += kSums)
      for (int64_t l = 0; l < kSums; ++l) partial[l] += static_cast<double>(xr[i + l]) * xr[i + l];
    for (; i < width; ++i) partial[0] += static_cast<double>(xr[i]) * xr[i];
    double squares = 0.0;
    for (int64_t l = 0; l < kSums; ++l) squares += partial[l];
    const float inverse = 1.0f / std::sqrt(static_cast<float>(squares / width) + static_cast<float>(eps));
    for (int64_t j = 0; j < width; ++j) Y[r * width + j] = w[j] * (xr[j] * inverse);
  }
  return y;
}

// y += x, in place (both (T, H) contiguous).
void add_into(at::Tensor& y, const at::Tensor& x) {
  float* Y = y.data_ptr<float>();
  const float* X = x.data_ptr<float>();
  for (int64_t i = 0, n = y.numel(); i < n; ++i) Y[i] += X[i];
}

// silu(gate) * up for gate_up (T, 2 I) = [gate | up]: (T, I).
at::Tensor silu_mul(const at::Tensor& gate_up, int64_t intermediate) {
  at::Tensor act = at::silu(gate_up.slice(1, 0, intermediate)).contiguous();
  float* A = act.data_ptr<float>();
  const float* G = gate_up.data_ptr<float>();
  for (int64_t t = 0, rows = act.size(0); t < rows; ++t)
    for (int64_t i = 0; i < intermediate; ++i) A[t * intermediate + i] *= G[t * 2 * intermediate + intermediate + i];
  return act;
}

// The layer from q/k/v's input on: q/k/v, attend, o, + residual, then the MLP and its residual.
at::Tensor from_qkv_input(const at::Tensor& qkv_input, const at::Tensor& residual, const at::Tensor& post_norm,
                          double eps, at::TensorList qkv, const c10::optional<at::Tensor>& qkv_bias, at::TensorList o,
                          at::TensorList gate_up, at::TensorList down, const at::Tensor& cos, const at::Tensor& sin,
                          at::Tensor keys, at::Tensor values, int64_t past, const c10::optional<at::Tensor>& mask,
                          double scaling, int64_t heads, int64_t kv_heads) {
  check_blocks("qkv", qkv);
  check_blocks("o", o);
  check_blocks("gate_up", gate_up);
  check_blocks("down", down);
  const int64_t intermediate = gate_up[0].size(0) / 2;
  const c10::optional<at::Tensor> none;
  const at::Tensor fused = product(qkv_input, qkv, qkv_bias);
  const at::Tensor attended = specviz::attend(fused, cos, sin, keys, values, past, mask, scaling, heads, kv_heads);
  at::Tensor h = product(attended, o, none);
  add_into(h, residual);
  at::Tensor out = product(silu_mul(product(rms_norm(h, post_norm, eps), gate_up, none), intermediate), down, none);
  add_into(out, h);
  return out;
}

at::Tensor q4_layer(const at::Tensor& x, const c10::optional<at::Tensor>& input_norm, const at::Tensor& post_norm, double eps,
                    at::TensorList qkv, const c10::optional<at::Tensor>& qkv_bias, at::TensorList o,
                    at::TensorList gate_up, at::TensorList down, const at::Tensor& cos, const at::Tensor& sin,
                    at::Tensor keys, at::Tensor values, int64_t past, const c10::optional<at::Tensor>& mask,
                    double scaling, int64_t heads, int64_t kv_heads) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "q4_layer: x (T, H) fp32");
  return from_qkv_input(input_norm.has_value() ? rms_norm(x, *input_norm, eps) : x, x, post_norm, eps, qkv, qkv_bias,
                        o, gate_up, down, cos, sin, keys, values, past, mask, scaling, heads, kv_heads);
}

at::Tensor q4_eagle3_layer(const at::Tensor& x, const at::Tensor& embeds, const at::Tensor& hidden_norm,
                           const at::Tensor& input_norm, const at::Tensor& post_norm, double eps,
                           bool norm_before_residual, at::TensorList qkv, const c10::optional<at::Tensor>& qkv_bias,
                           at::TensorList o, at::TensorList gate_up, at::TensorList down, const at::Tensor& cos,
                           const at::Tensor& sin, at::Tensor keys, at::Tensor values, int64_t past,
                           const c10::optional<at::Tensor>& mask, double scaling, int64_t heads, int64_t kv_heads) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "q4_eagle3_layer: x (T, H) fp32");
  TORCH_CHECK(embeds.sizes() == x.sizes() && embeds.scalar_type() == at::kFloat && embeds.is_contiguous(),
              "q4_eagle3_layer: embeds (T, H) fp32, as x");
  const at::Tensor normed = rms_norm(x, hidden_norm, eps);
  const at::Tensor both = at::cat({rms_norm(embeds, input_norm, eps), normed}, 1);
  return from_qkv_input(both, norm_before_residual ? normed : x, post_norm, eps, qkv, qkv_bias, o, gate_up, down, cos,
                        sin, keys, values, past, mask, scaling, heads, kv_heads);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specviz, m) {
  m.def("q4_layer(Tensor x, Tensor? input_norm, Tensor post_norm, float eps, Tensor[] qkv, Tensor? qkv_bias, "
        "Tensor[] o, Tensor[] gate_up, Tensor[] down, Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, "
        "int past, Tensor? mask, float scaling, int heads, int kv_heads) -> Tensor");
  m.def("q4_eagle3_layer(Tensor x, Tensor embeds, Tensor hidden_norm, Tensor input_norm, Tensor post_norm, float eps, "
        "bool norm_before_residual, Tensor[] qkv, Tensor? qkv_bias, Tensor[] o, Tensor[] gate_up, Tensor[] down, "
        "Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, int past, Tensor? mask, float scaling, "
        "int heads, int kv_heads) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(specviz, CPU, m) {
  m.impl("q4_layer", q4_layer);
  m.impl("q4_eagle3_layer", q4_eagle3_layer);
  m.impl("rms_norm", rms_norm);
}
