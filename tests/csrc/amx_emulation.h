// The AMX tile instructions that specviz/kernels/csrc/intdot.h uses, in plain C++ as the Intel SDM's pseudocode
// defines them (ldtilecfg, tilerelease, tilezero, tileloadd, tilestored, tdpbssd, tdpbsud), so that the AMX path
// runs, and is tested for its bits, on any CPU. Stricter than the hardware where that helps a test: every shape
// rule whose breach raises #UD on a real CPU, and every ldtilecfg byte that raises #GP there, aborts here, and so
// do a tile used before ldtilecfg and a configuration that resumes at a start_row.
//
// SPECVIZ_AMX_EMULATION_MISREAD: B's bytes read in the wrong order within each column's four (a planted layout
// bug, to show the test that runs this emulation catches one).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace specviz_amx_emulation {

struct Tile {
  int rows = 0, colsb = 0;  // as configured
  uint8_t bytes[16][64] = {};
};

inline thread_local Tile tmm[8];
inline thread_local bool configured = false;

[[noreturn]] inline void fault(const char* why) {
  std::fprintf(stderr, "AMX emulation: %s\n", why);
  std::abort();
}

inline Tile& used(int t) {
  if (!configured) fault("tile used before ldtilecfg");
  if (t < 0 || t > 7 || tmm[t].rows == 0) fault("tile not configured");
  return tmm[t];
}

}  // namespace specviz_amx_emulation

inline void specviz_amx_config(const void* config) {
  using namespace specviz_amx_emulation;
  const uint8_t* c = static_cast<const uint8_t*>(config);
  if (c[0] != 1) fault("palette must be 1");
  // #GP on the hardware: reserved bytes 2..15, and tiles 8..15 (colsb at bytes 32..47, rows at 56..63), not zero.
  // A start_row other than 0 is legal there (it resumes an interrupted tile load or store) but would make the next
  // tileloadd begin at that row: refused here.
  if (c[1] != 0) fault("start_row must be 0");
  for (int i = 2; i < 64; ++i)
    if (c[i] != 0 && (i < 16 || (i >= 32 && i < 48) || i >= 56)) fault("reserved byte or tile 8..15 not zero");
  for (int t = 0; t < 8; ++t) {
    const int colsb = c[16 + 2 * t] | (c[17 + 2 * t] << 8), rows = c[48 + t];
    if (rows > 16 || colsb > 64 || (rows == 0) != (colsb == 0)) fault("tile shape out of range");
    tmm[t] = Tile{};
    tmm[t].rows = rows;
    tmm[t].colsb = colsb;
  }
  configured = true;
}

inline void specviz_amx_release() {
  using namespace specviz_amx_emulation;
  for (Tile& t : tmm) t = Tile{};
  configured = false;
}

inline void specviz_amx_zero(int t) { std::memset(specviz_amx_emulation::used(t).bytes, 0, 16 * 64); }

// Rows past `rows` and bytes past `colsb` are zeroed, as tileloadd does.
inline void specviz_amx_load(int t, const void* base, int64_t stride) {
  specviz_amx_emulation::Tile& tile = specviz_amx_emulation::used(t);
  std::memset(tile.bytes, 0, 16 * 64);
  for (int r = 0; r < tile.rows; ++r)
    std::memcpy(tile.bytes[r], static_cast<const uint8_t*>(base) + r * stride, tile.colsb);
}

inline void specviz_amx_store(int t, void* base, int64_t stride) {
  const specviz_amx_emulation::Tile& tile = specviz_amx_emulation::used(t);
  for (int r = 0; r < tile.rows; ++r) std::memcpy(static_cast<uint8_t*>(base) + r * stride, tile.bytes[r], tile.colsb);
}

// C[m][n] += Σ_k Σ_i A[m][4k + i] · B[k][4n + i] in int32, A's bytes signed (tdpbs*d), B's signed (tdpbssd) or
// unsigned (tdpbsud); the shape rules: C and A have the same rows, B has A.colsb / 4 rows, C and B the same colsb.
template <bool SignedA, bool SignedB>
inline void specviz_amx_dp(int c, int a, int b) {
  using namespace specviz_amx_emulation;
  Tile &C = used(c), &A = used(a), &B = used(b);
  if (c == a || c == b || a == b) fault("tdp* operands must be distinct tiles");
  if (C.rows != A.rows || B.rows * 4 != A.colsb || C.colsb != B.colsb || C.colsb % 4 != 0 || A.colsb % 4 != 0)
    fault("tdp* tile shapes do not match");
  for (int m = 0; m < C.rows; ++m)
    for (int n = 0; n < C.colsb / 4; ++n) {
      int32_t sum;
      std::memcpy(&sum, C.bytes[m] + 4 * n, 4);
      for (int k = 0; k < A.colsb / 4; ++k)
        for (int i = 0; i < 4; ++i) {
          const uint8_t x = A.bytes[m][4 * k + i];
#ifdef SPECVIZ_AMX_EMULATION_MISREAD
          const uint8_t y = B.bytes[k][4 * n + (3 - i)];
#else
          const uint8_t y = B.bytes[k][4 * n + i];
#endif
          const int32_t xv = SignedA ? static_cast<int8_t>(x) : x, yv = SignedB ? static_cast<int8_t>(y) : y;
          sum = static_cast<int32_t>(static_cast<uint32_t>(sum) + static_cast<uint32_t>(xv * yv));
        }
      std::memcpy(C.bytes[m] + 4 * n, &sum, 4);
    }
}
