// One Llama-family decoder layer whose projections are Q4_1 blocks, for a few new tokens, in one call: what the
// lean decoder's Python loop (specviz.kernels.fastdecoder) does per layer, from C++, so a decoding step makes 30
// calls instead of some 600 small ones through Python and torch's dispatcher.
//
// q4_layer(x, input_norm, post_norm, eps, qkv, qkv_bias, o, gate_up, down, cos, sin, keys, values, past, mask,
//          scaling, heads, kv_heads) for T new tokens:
//   x (T, H) fp32, the layer's input; input_norm, post_norm (H,) fp32 RMSNorm weights with epsilon eps;
//   qkv, o, gate_up, down: each [nibbles, scales, mins] as q4_linear takes them (qkv the fused q/k/v rows, gate_up
//     the fused gate/up rows); qkv_bias: the fused q/k/v bias (Qwen2) or none;
//   cos, sin, keys, values, past, mask, scaling, heads, kv_heads: as attend takes them;
// returns the layer's output (T, H).
//
// The same ATen ops and the same C++ ops in the same order as the Python loop: rms_norm, q4_linear, attend,
// q4_linear, add, rms_norm, q4_linear, silu, mul, q4_linear, add; so the result has the same bits.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops.h"

namespace {

void check_blocks(const char* what, const at::TensorList& blocks) {
  TORCH_CHECK(blocks.size() == 3, "q4_layer: ", what, " must be [nibbles, scales, mins]");
}

at::Tensor product(const at::Tensor& x, const at::TensorList& blocks, const c10::optional<at::Tensor>& bias) {
  return specviz::q4_linear(x, blocks[0], blocks[1], blocks[2], bias, -1);
}

at::Tensor q4_layer(const at::Tensor& x, const at::Tensor& input_norm, const at::Tensor& post_norm, double eps,
                    at::TensorList qkv, const c10::optional<at::Tensor>& qkv_bias, at::TensorList o,
                    at::TensorList gate_up, at::TensorList down, const at::Tensor& cos, const at::Tensor& sin,
                    at::Tensor keys, at::Tensor values, int64_t past, const c10::optional<at::Tensor>& mask,
                    double scaling, int64_t heads, int64_t kv_heads) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "q4_layer: x (T, H) fp32");
  check_blocks("qkv", qkv);
  check_blocks("o", o);
  check_blocks("gate_up", gate_up);
  check_blocks("down", down);
  const int64_t width = x.size(1), intermediate = gate_up[0].size(0) / 2;
  const c10::optional<at::Tensor> none;
  const at::Tensor fused = product(at::rms_norm(x, {width}, input_norm, eps), qkv, qkv_bias);
  const at::Tensor attended = specviz::attend(fused, cos, sin, keys, values, past, mask, scaling, heads, kv_heads);
  const at::Tensor h = at::add(x, product(attended, o, none));
  const at::Tensor gu = product(at::rms_norm(h, {width}, post_norm, eps), gate_up, none);
  const at::Tensor act = at::mul(at::silu(gu.slice(1, 0, intermediate)), gu.slice(1, intermediate));
  return at::add(h, product(act.contiguous(), down, none));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specviz, m) {
  m.def("q4_layer(Tensor x, Tensor input_norm, Tensor post_norm, float eps, Tensor[] qkv, Tensor? qkv_bias, "
        "Tensor[] o, Tensor[] gate_up, Tensor[] down, Tensor cos, Tensor sin, Tensor(a!) keys, Tensor(b!) values, "
        "int past, Tensor? mask, float scaling, int heads, int kv_heads) -> Tensor");
}

TORCH_LIBRARY_IMPL(specviz, CPU, m) {
  m.impl("q4_layer", q4_layer);
}
