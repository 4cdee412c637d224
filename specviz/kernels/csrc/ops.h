// The C++ ops that other ops of this library call directly (without the dispatcher): csrc/attend.cpp's attention
// block and csrc/blocklinear.cpp's 4-bit product, as the layer op (csrc/q4layer.cpp) composes them, and
// csrc/intdot.cpp's products on 8-bit activations, which the block products run for weights in tiles.
#pragma once

#include <ATen/ATen.h>

namespace specviz {

at::Tensor attend(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor keys,
                  at::Tensor values, int64_t past, const c10::optional<at::Tensor>& mask, double scaling,
                  int64_t heads, int64_t kv_heads);

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& nibbles, const at::Tensor& scales, const at::Tensor& mins,
                     const c10::optional<at::Tensor>& bias, int64_t path);

at::Tensor q4_linear_tiled(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                           const at::Tensor& mins, const c10::optional<at::Tensor>& bias, int64_t path);

at::Tensor q8_linear_tiled(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                           const c10::optional<at::Tensor>& bias, int64_t path);

}  // namespace specviz
