// The 4-bit and 8-bit products on 8-bit activations (the kernels and their layouts: csrc/intdot.h). q4_linear and
// q8_linear (csrc/blocklinear.cpp) run them where their scales come in tiles, (tiles, groups, 16) fp32; so does
// the layer op, whose products call q4_linear.
//
// q8act_path(path): the path the products run (as q4_path; AVX-512 here needs its VNNI and BW extensions, and
//   `auto` takes AVX2 where they are missing; 3, amx, takes AMX tiles for two rows or more where the CPU has
//   AMX-INT8 and Linux grants the tile state, and `auto` takes it there).
// q8act_amx_status(): why the amx path runs here or not (0 runs, 1 no AMX, 2 refused by Linux, 3 its products
//   differ from VNNI's in the check made before first use).
// q8_activations(x, path): x (rows, in) fp32 quantized as the products quantize it: q (rows, in) int8, d and s
//   (rows, in / 32) fp32 (for tests and tools: x̂ = d q is the activation the products multiply).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "intdot.h"
#include "ops.h"

#include <cstdlib>
#include <cstring>
#ifdef SPECVIZ_INTDOT_AMX
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

using specviz_intdot::kAmx;
using specviz_intdot::kAvx2;
using specviz_intdot::kAvx512;
using specviz_intdot::kGroup;
using specviz_intdot::kPortable;
using specviz_intdot::kTile;

// Whether the AMX path runs here (q8act_amx_status): 0 it does; 1 the CPU lacks AMX-TILE, AMX-INT8 or VNNI (or this
// build has no tile instructions); 2 Linux refused the tile state; 3 the tiles' products differ from VNNI's.
enum AmxStatus : int64_t { kAmxRuns = 0, kAmxAbsent = 1, kAmxRefused = 2, kAmxDiffers = 3 };

// AMX-TILE and AMX-INT8 (CPUID leaf 7: EDX bits 24 and 25), and the tile state granted to this process: Linux
// hands it out only on request (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA), once per process and for
// all its threads, and a tile instruction without it faults as an illegal instruction. Asked once; a kernel too
// old to know the request, or one that refuses it (a hypervisor that hides the state), leaves the VNNI path, and
// so do tile products that differ from VNNI's (with a warning: that would be a bug to report).
// AVX-512 F, BW and VNNI (and AVX2 with FMA, which the same path's quantization uses).
bool has_vnni() {
#ifdef SPECVIZ_INTDOT_X86
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

int64_t amx_status() {
#ifdef SPECVIZ_INTDOT_AMX
  static const int64_t status = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!has_vnni() || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return kAmxAbsent;
    if (!((edx >> 24) & 1) || !((edx >> 25) & 1)) return kAmxAbsent;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) != 0) return kAmxRefused;
    if (!specviz_intdot::amx_agrees_with_vnni()) {
      TORCH_WARN("specviz: the AMX tile products differ from the VNNI ones on this CPU; they run on VNNI instead");
      return kAmxDiffers;
    }
    return kAmxRuns;
  }();
  return status;
#else
  return kAmxAbsent;
#endif
}

bool cpu_has(int64_t path) {
#ifdef SPECVIZ_INTDOT_X86
  if (path == kAvx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (path == kAvx512 || path == kAmx) {
    if (path == kAmx) return has_vnni() && amx_status() == kAmxRuns;  // its sums are scaled, single rows run, as on VNNI
    return has_vnni();
  }
#endif
  return path == kPortable;
}

// As blocklinear.cpp's: the path asked for (an error where this CPU lacks it), else SPECVIZ_Q4_PATH, else the
// fastest this CPU has.
int64_t resolve(int64_t path) {
  if (path < 0) {
    const char* forced = std::getenv("SPECVIZ_Q4_PATH");
    if (forced != nullptr && *forced != '\0') {
      if (std::strcmp(forced, "portable") == 0) path = kPortable;
      else if (std::strcmp(forced, "avx2") == 0) path = kAvx2;
      else if (std::strcmp(forced, "avx512") == 0) path = kAvx512;
      else if (std::strcmp(forced, "amx") == 0) path = kAmx;
      else TORCH_CHECK(false, "SPECVIZ_Q4_PATH must be portable, avx2, avx512 or amx, not ", forced);
    } else {
      return cpu_has(kAmx) ? kAmx : cpu_has(kAvx512) ? kAvx512 : cpu_has(kAvx2) ? kAvx2 : kPortable;
    }
  }
  TORCH_CHECK(path <= kAmx,
              "8-bit activations: path must be -1 (auto), 0 (portable), 1 (avx2), 2 (avx512) or 3 (amx)");
  TORCH_CHECK(cpu_has(path), "8-bit activations: this CPU cannot run path ", path,
              path == kAvx512 ? " (it needs AVX-512 F, BW and VNNI)"
              : path == kAmx  ? " (it needs AVX-512 VNNI, AMX-TILE and AMX-INT8, and Linux's grant of the tile state)"
                              : "");
  return path;
}

int64_t q8act_path(int64_t path) { return resolve(path); }

int64_t q8act_amx_status() { return amx_status(); }

// x's rows quantized (intdot.h's quantize_rows), rows split between threads.
struct Quantized {
  at::Tensor q, d, s, sums;
  specviz_intdot::Acts acts() const {
    return {q.data_ptr<int8_t>(), d.data_ptr<float>(), s.data_ptr<float>(), sums.data_ptr<int32_t>(), q.size(1),
            d.size(1)};
  }
};

Quantized quantize(const at::Tensor& x, int64_t path) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "8-bit activations: x (rows, in) fp32");
  const int64_t rows = x.size(0), in = x.size(1), groups = in / kGroup;
  TORCH_CHECK(in % kGroup == 0, "8-bit activations: the input size must be a multiple of 32");
  Quantized out{at::empty({rows, in}, x.options().dtype(at::kChar)), at::empty({rows, groups}, x.options()),
                at::empty({rows, groups}, x.options()), at::empty({rows, groups, 2}, x.options().dtype(at::kInt))};
  const float* X = x.data_ptr<float>();
  int8_t* q = out.q.data_ptr<int8_t>();
  float* d = out.d.data_ptr<float>();
  float* s = out.s.data_ptr<float>();
  int32_t* sums = out.sums.data_ptr<int32_t>();
  const int64_t grain = std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, in));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    specviz_intdot::quantize_rows(path, X, in, begin, end, q, d, s, sums);
  });
  return out;
}

// y (rows, out) = x̂ · Wᵀ (+ bias) for tiled weights: tiles split between threads, each about 32 K weights or more.
template <int Bits>
at::Tensor tiled_product(const char* name, const at::Tensor& x, const specviz_intdot::Tiles& w, int64_t out,
                         const c10::optional<at::Tensor>& bias, int64_t path) {
  const int64_t chosen = resolve(path);
  const Quantized quantized = quantize(x, chosen);
  const specviz_intdot::Acts acts = quantized.acts();
  const int64_t rows = x.size(0), in = x.size(1);
  at::Tensor y = at::empty({rows, out}, x.options());
  float* Y = y.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, (1 << 15) / (kTile * in));
  if (rows > 0)
    at::parallel_for(0, out / kTile, grain, [&](int64_t begin, int64_t end) {
      specviz_intdot::tiles<Bits>(chosen, acts, rows, w, Y, out, begin, end);
    });
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == out && bias->scalar_type() == at::kFloat, name, ": bias (out,) fp32");
    y.add_(bias->reshape({1, out}));
  }
  return y;
}

void check_tiled_scales(const char* name, const at::Tensor& t, int64_t tiles, int64_t rows_per_tile) {
  TORCH_CHECK(t.dim() == 3 && t.scalar_type() == at::kFloat && t.is_contiguous() && t.size(0) == tiles &&
                  t.size(1) == rows_per_tile && t.size(2) == kTile,
              name, ": tiled scales (out / 16, in / 32, 16) fp32 (8-bit weights: or (out / 16, in / 16, 16))");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> q8_activations(const at::Tensor& x, int64_t path) {
  const Quantized quantized = quantize(x, resolve(path));
  return {quantized.q, quantized.d, quantized.s};
}

}  // namespace

namespace specviz {

at::Tensor q4_linear_tiled(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                           const at::Tensor& mins, const c10::optional<at::Tensor>& bias, int64_t path) {
  const int64_t out = codes.size(0), in = x.size(1), groups = in / kGroup;
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.size(1) * 2 == in &&
                  out % kTile == 0,
              "q4_linear: tiled codes (out, in / 2) uint8, out a multiple of 16");
  check_tiled_scales("q4_linear", scales, out / kTile, groups);
  check_tiled_scales("q4_linear", mins, out / kTile, groups);
  const specviz_intdot::Tiles w{codes.data_ptr<uint8_t>(), scales.data_ptr<float>(), mins.data_ptr<float>(), groups, 1};
  return tiled_product<4>("q4_linear", x, w, out, bias, path);
}

at::Tensor q8_linear_tiled(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                           const c10::optional<at::Tensor>& bias, int64_t path) {
  const int64_t out = codes.size(0), in = x.size(1), groups = in / kGroup;
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kChar && codes.is_contiguous() && codes.size(1) == in &&
                  out % kTile == 0,
              "q8_linear: tiled codes (out, in) int8, out a multiple of 16");
  const int per = scales.dim() == 3 && scales.size(1) == 2 * groups ? 2 : 1;
  check_tiled_scales("q8_linear", scales, out / kTile, per * groups);
  const specviz_intdot::Tiles w{reinterpret_cast<const uint8_t*>(codes.data_ptr<int8_t>()), scales.data_ptr<float>(),
                                nullptr, groups, per};
  return tiled_product<8>("q8_linear", x, w, out, bias, path);
}

}  // namespace specviz

TORCH_LIBRARY_FRAGMENT(specviz, m) {
  m.def("q8act_path(int path=-1) -> int", q8act_path);
  m.def("q8act_amx_status() -> int", q8act_amx_status);
  m.def("q8_activations(Tensor x, int path=-1) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(specviz, CPU, m) { m.impl("q8_activations", q8_activations); }
