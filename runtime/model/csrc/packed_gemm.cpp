// Small-batch fp32 matrix multiply for the decode step: y[m][n] = sum_k x[m][k] * w[n][k].
//
// Why this exists: a decode step multiplies a handful of rows (one per running sequence) by every weight of the
// model. libtorch's sgemm is tuned for large M and reaches well under half of this CPU's fp32 throughput at
// M = 16 (measured: ~80 GFLOP/s for the MLP shapes of SmolLM2, ~35 GFLOP/s for its output head), so decoding
// is dominated by kernel inefficiency, not by arithmetic. Here the weights are packed once into panels of 16
// output columns stored k-major ([n / 16][k][16]), so the inner loop streams each weight exactly once per
// 8-row tile and keeps 8 x 3 accumulators in registers (one fused multiply-add per weight element per row).
//
// Threads come from libtorch's own pool (at::parallel_for) so the kernel never competes with libtorch's
// OpenMP workers for the cores.

#include "packed_gemm.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <exception>

namespace {

constexpr int64_t kPanel = 16;   // output columns per packed panel (one zmm register)
constexpr int64_t kGroup = 3;    // panels per work unit: 8 rows x 3 panels = 24 accumulators
constexpr int64_t kRows = 8;     // rows per register tile

template <int MR, int NP>
__attribute__((target("avx512f,fma"))) inline void tile(const float* x, int64_t ldx, const float* panels,
                                                        int64_t k_len, float* y, int64_t ldy) {
  __m512 acc[MR][NP];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_setzero_ps();
  const float* p[NP];
  for (int j = 0; j < NP; ++j) p[j] = panels + j * k_len * kPanel;
  for (int64_t k = 0; k < k_len; ++k) {
    __m512 w[NP];
    for (int j = 0; j < NP; ++j) w[j] = _mm512_loadu_ps(p[j] + k * kPanel);
    for (int i = 0; i < MR; ++i) {
      const __m512 b = _mm512_set1_ps(x[i * ldx + k]);
      for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_fmadd_ps(b, w[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NP; ++j) _mm512_storeu_ps(y + i * ldy + j * kPanel, acc[i][j]);
}

template <int NP>
__attribute__((target("avx512f,fma"))) void all_rows(const float* x, int64_t m, int64_t k_len,
                                                     const float* panels, float* y, int64_t ldy) {
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows) tile<kRows, NP>(x + i * k_len, k_len, panels, k_len, y + i * ldy, ldy);
  const float* xr = x + i * k_len;
  float* yr = y + i * ldy;
  switch (m - i) {
    case 7: tile<7, NP>(xr, k_len, panels, k_len, yr, ldy); break;
    case 6: tile<6, NP>(xr, k_len, panels, k_len, yr, ldy); break;
    case 5: tile<5, NP>(xr, k_len, panels, k_len, yr, ldy); break;
    case 4: tile<4, NP>(xr, k_len, panels, k_len, yr, ldy); break;
    case 3: tile<3, NP>(xr, k_len, panels, k_len, yr, ldy); break;
    case 2: tile<2, NP>(xr, k_len, panels, k_len, yr, ldy); break;
    case 1: tile<1, NP>(xr, k_len, panels, k_len, yr, ldy); break;
    default: break;
  }
}

}  // namespace

namespace trinity {

void packed_gemm(const float* x, int64_t m, int64_t k_len, const float* packed, int64_t n, float* y) {
  if (m <= 0) return;
  const int64_t panels = n / kPanel;
  const int64_t groups = (panels + kGroup - 1) / kGroup;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t first = g * kGroup;
      const int64_t count = std::min(kGroup, panels - first);
      const float* p = packed + first * k_len * kPanel;
      float* out = y + first * kPanel;
      switch (count) {
        case 3: all_rows<3>(x, m, k_len, p, out, n); break;
        case 2: all_rows<2>(x, m, k_len, p, out, n); break;
        default: all_rows<1>(x, m, k_len, p, out, n); break;
      }
    }
  });
}

}  // namespace trinity

// Returns 0, or -1 when libtorch's thread pool reported an error (nothing is thrown across the C boundary).
extern "C" int trinity_packed_gemm(const float* x, int64_t m, int64_t k_len, const float* packed, int64_t n,
                                   float* y) {
  try {
    trinity::packed_gemm(x, m, k_len, packed, n, y);
    return 0;
  } catch (const std::exception&) {
    return -1;
  }
}

// Packs `count` row-major weight matrices stacked along n (sources[i] has rows[i] rows of k_len) into the panel
// layout [n / 16][k][16] that trinity_packed_gemm reads, in one pass and without an intermediate copy: at model
// load that pass is the first touch of ~half a gigabyte for SmolLM2, so a concatenate-then-transpose cost twice
// that in page faults. n (the sum of rows) must be a multiple of 16. Returns 0, or -1 on a thread-pool error.
extern "C" int trinity_pack_panels(const float* const* sources, const int64_t* rows, int64_t count, int64_t k_len,
                                   float* packed) {
  try {
    int64_t n = 0;
    for (int64_t i = 0; i < count; ++i) n += rows[i];
    at::parallel_for(0, n / kPanel, 1, [&](int64_t begin, int64_t end) {
      const float* row[kPanel];
      for (int64_t panel = begin; panel < end; ++panel) {
        for (int64_t c = 0; c < kPanel; ++c) {
          int64_t r = panel * kPanel + c;
          int64_t i = 0;
          while (r >= rows[i]) r -= rows[i++];
          row[c] = sources[i] + r * k_len;
        }
        float* out = packed + panel * k_len * kPanel;
        for (int64_t k = 0; k < k_len; ++k)
          for (int64_t c = 0; c < kPanel; ++c) out[k * kPanel + c] = row[c][k];
      }
    });
    return 0;
  } catch (const std::exception&) {
    return -1;
  }
}
