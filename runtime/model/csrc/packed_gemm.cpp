// Small-batch fp32 matrix multiply for the decode step: y[m][n] = sum_k x[m][k] * w[n][k].
//
// Why this exists: a decode step multiplies a handful of rows (one per running sequence) by every weight of the
// model. libtorch's sgemm is tuned for large M and reaches well under half of this CPU's fp32 throughput at
// M = 16 (measured: ~80 GFLOP/s for the MLP shapes of SmolLM2, ~35 GFLOP/s for its output head), so decoding
// is dominated by kernel inefficiency, not by arithmetic. Here the weights are packed once into panels of 16
// output columns stored k-major, so the inner loop streams each weight exactly once per 8-row tile and keeps
// 8 x 3 accumulators in registers (one fused multiply-add per weight element per row).
//
// A work unit is a group of kGroup = 3 panels, and the packed layout interleaves a group's panels k step by k
// step ([groups][k][3][16], see pack_panels), so the unit reads its weights front to back as one stream. Stored
// panel after panel, each unit read three streams tens of kilobytes apart that restart at every unit; at batch 1
// the matmuls are bound by memory, and on a Zen 4 EPYC (2 threads, SmolLM2-135M bf16, the layers' four matmuls
// alternated step by step in one process) the layers took 1-9% less time grouped (medians over 300 steps of
// each: 9.54 -> 8.76, 7.92 -> 7.81, 7.06 -> 6.80 ms in three runs), and 15-20% less in a matmul-only loop.
//
// bf16 weights (a model loaded in bf16 on a CPU with AVX512-BF16) are packed the same way with k in pairs,
// [groups][k / 2][3][16][2] (k padded to even with a zero); a pair step of one panel is the operand of vdpbf16ps:
// one instruction multiplies 16 output columns by two k at once and accumulates in fp32. The input rows are rounded
// to bf16 once per call (the precision a bf16 matmul computes at); outputs and accumulation stay fp32. Half the
// bytes per weight makes the memory-bound decode matmul about twice as fast as fp32.
//
// On CPUs without AVX-512 (AVX2 + FMA, e.g. AMD Zen 1-3, Intel before Ice Lake) the same layouts are read with
// 256-bit registers: a 16-column panel is two ymm, the register tile is 4 rows x 1 panel = 8 accumulators (16
// ymm registers in all, and 8 independent FMA chains cover Zen 3's 2 ports x 4 cycles of latency), and one to
// three rows take the whole 3-panel group at once so a batch-1 step still has 6 independent chains. There is no
// bf16 dot product there: a pair word [k + 1 | k] of a bf16 panel becomes two fp32 vectors by a 16-bit left
// shift (k) and a mask of the high half (k + 1), so bf16 weights still stream half the bytes of fp32. The input
// rows are rounded to bf16 as on AVX-512, so both paths compute the same products.
//
// AVX-512 CPUs without AVX512-BF16 (Intel Skylake-SP, Cascade Lake, Ice Lake: much of the cloud) widen bf16
// weights the same way with 512-bit registers, a panel step being one zmm of 16 pair words, instead of running
// the AVX2 kernel at half the width. Measured with decode_profile --isa (SmolLM2-135M bf16, 2 threads of a
// Cascade Lake Xeon), decode step tok/s against the AVX2 kernel: batch 1 65-69 / 55-59 (85% of the memory
// floor), 4 214-222 / 154-168, 16 382-388 / 216-222, 64 453-456 / 263-270.
//
// On CPUs with AMX (Intel Sapphire Rapids and later) bf16 weights run on the tile unit instead. The bf16 panel
// layout is already AMX's operand layout for B: rows of k pairs, 64 bytes each (16 columns x 2 bf16), so a B tile
// is 16 consecutive pair rows of one panel, read in place with the group's stride (3 x 64 bytes); an A tile is up
// to 16 input rows x 16 pairs, read in place from the rounded input. One tdpbf16ps does rows x 16 x 32
// multiply-adds where vdpbf16ps does 16 x 2, so a decode step stops being bound by the vector units and comes down
// to streaming the weights. Measured with decode_profile (SmolLM2-135M bf16, 2 threads of a Xeon with AMX),
// decode step tok/s, tiles against vdpbf16ps (panel after panel, before the grouped layout): batch 1 98-103 /
// 92-98, 2 182 / 142, 4 344 / 262, 8 589 / 341, 16 845 / 462, 64 1083 / 501. Even one row gains, so every bf16
// matmul whose k fills whole tile rows takes the tiles.
//
// Threads come from libtorch's own pool (at::parallel_for) so the kernel never competes with libtorch's
// OpenMP workers for the cores.

#include "packed_gemm.h"

#include <ATen/Parallel.h>
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <vector>

namespace {

using trinity::Isa;

constexpr int64_t kPanel = 16;  // output columns per packed panel (one zmm register, two ymm)
constexpr int64_t kGroup = 3;   // panels per work unit: on AVX-512, 8 rows x 3 panels = 24 accumulators

// fp32: y[i][j-th panel] = sum_k x[i][k] * panel[k][:].
struct Fp32 {
  using X = float;
  using W = float;
  static constexpr int64_t kStep = 1;   // weights per panel column per inner iteration
  static constexpr int64_t kXStep = 1;  // X elements per inner iteration of a row
  static constexpr int kRows = 8;       // rows per register tile

  template <int MR, int NP>
  __attribute__((target("avx512f,fma"))) static void tile(const X* x, int64_t ldx, const W* panels,
                                                                 int64_t stride, int64_t steps, float* y,
                                                                 int64_t ldy) {
    __m512 acc[MR][NP];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_setzero_ps();
    const W* p[NP];
    for (int j = 0; j < NP; ++j) p[j] = panels + j * kPanel;
    for (int64_t k = 0; k < steps; ++k) {
      __m512 w[NP];
      for (int j = 0; j < NP; ++j) w[j] = _mm512_loadu_ps(p[j] + k * stride);
      for (int i = 0; i < MR; ++i) {
        const __m512 b = _mm512_set1_ps(x[i * ldx + k]);
        for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_fmadd_ps(b, w[j], acc[i][j]);
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NP; ++j) _mm512_storeu_ps(y + i * ldy + j * kPanel, acc[i][j]);
  }
};

// bf16: x holds bf16 pairs (k, k + 1) as one 32-bit word, a panel step holds 16 columns x 2 k.
struct Bf16 {
  using X = uint32_t;
  using W = uint16_t;
  static constexpr int64_t kStep = 2;
  static constexpr int64_t kXStep = 1;
  static constexpr int kRows = 8;

  template <int MR, int NP>
  __attribute__((target("avx512f,avx512bf16"))) static void tile(const X* x, int64_t ldx, const W* panels,
                                                                        int64_t stride, int64_t steps, float* y,
                                                                        int64_t ldy) {
    __m512 acc[MR][NP];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_setzero_ps();
    const W* p[NP];
    for (int j = 0; j < NP; ++j) p[j] = panels + j * 2 * kPanel;
    for (int64_t k = 0; k < steps; ++k) {
      __m512bh w[NP];
      for (int j = 0; j < NP; ++j) w[j] = (__m512bh)_mm512_loadu_si512(p[j] + k * stride);
      for (int i = 0; i < MR; ++i) {
        const __m512bh b = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[i * ldx + k]));
        for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], b, w[j]);
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NP; ++j) _mm512_storeu_ps(y + i * ldy + j * kPanel, acc[i][j]);
  }
};

// fp32 on AVX2: each panel step is two ymm of 8 columns. Up to 2 rows take all NP panels of a group at once
// (up to 12 accumulators); 3 or 4 rows take one panel at a time (up to 8), so no tile needs more than the 16
// ymm registers.
struct Fp32Avx2 {
  using X = float;
  using W = float;
  static constexpr int64_t kStep = 1;
  static constexpr int64_t kXStep = 1;
  static constexpr int kRows = 4;

  template <int MR, int NP>
  __attribute__((target("avx2,fma"))) static void tile(const X* x, int64_t ldx, const W* panels, int64_t stride,
                                                        int64_t steps, float* y, int64_t ldy) {
    if constexpr (MR > 2 && NP > 1) {
      for (int j = 0; j < NP; ++j) tile<MR, 1>(x, ldx, panels + j * kPanel, stride, steps, y + j * kPanel, ldy);
    } else {
      __m256 acc[MR][NP][2];
      for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NP; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
      const W* p[NP];
      for (int j = 0; j < NP; ++j) p[j] = panels + j * kPanel;
      for (int64_t k = 0; k < steps; ++k) {
        for (int j = 0; j < NP; ++j) {
          const __m256 w0 = _mm256_loadu_ps(p[j] + k * stride);
          const __m256 w1 = _mm256_loadu_ps(p[j] + k * stride + 8);
          for (int i = 0; i < MR; ++i) {
            const __m256 b = _mm256_broadcast_ss(x + i * ldx + k);
            acc[i][j][0] = _mm256_fmadd_ps(b, w0, acc[i][j][0]);
            acc[i][j][1] = _mm256_fmadd_ps(b, w1, acc[i][j][1]);
          }
        }
      }
      for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NP; ++j) {
          _mm256_storeu_ps(y + i * ldy + j * kPanel, acc[i][j][0]);
          _mm256_storeu_ps(y + i * ldy + j * kPanel + 8, acc[i][j][1]);
        }
    }
  }
};

// bf16 weights on AVX2: x is already rounded to bf16 and held as fp32 ([rows][2 * steps], k padded to even with a
// zero); a panel step is 16 pair words [k + 1 | k], two ymm, each widened to an even-k and an odd-k fp32 vector.
struct Bf16Avx2 {
  using X = float;
  using W = uint16_t;
  static constexpr int64_t kStep = 2;
  static constexpr int64_t kXStep = 2;
  static constexpr int kRows = 4;

  template <int MR, int NP>
  __attribute__((target("avx2,fma"))) static void tile(const X* x, int64_t ldx, const W* panels, int64_t stride,
                                                        int64_t steps, float* y, int64_t ldy) {
    if constexpr (MR > 2 && NP > 1) {
      for (int j = 0; j < NP; ++j)
        tile<MR, 1>(x, ldx, panels + j * 2 * kPanel, stride, steps, y + j * kPanel, ldy);
    } else {
      __m256 acc[MR][NP][2];
      for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NP; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
      const W* p[NP];
      for (int j = 0; j < NP; ++j) p[j] = panels + j * 2 * kPanel;
      const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
      for (int64_t k = 0; k < steps; ++k) {
        for (int j = 0; j < NP; ++j) {
          __m256 even[2], odd[2];
          for (int h = 0; h < 2; ++h) {
            const __m256i pairs =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[j] + k * stride + 16 * h));
            even[h] = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
            odd[h] = _mm256_castsi256_ps(_mm256_and_si256(pairs, high));
          }
          for (int i = 0; i < MR; ++i) {
            const __m256 b0 = _mm256_broadcast_ss(x + i * ldx + 2 * k);
            const __m256 b1 = _mm256_broadcast_ss(x + i * ldx + 2 * k + 1);
            for (int h = 0; h < 2; ++h)
              acc[i][j][h] = _mm256_fmadd_ps(b1, odd[h], _mm256_fmadd_ps(b0, even[h], acc[i][j][h]));
          }
        }
      }
      for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NP; ++j) {
          _mm256_storeu_ps(y + i * ldy + j * kPanel, acc[i][j][0]);
          _mm256_storeu_ps(y + i * ldy + j * kPanel + 8, acc[i][j][1]);
        }
    }
  }
};

// bf16 weights on AVX-512F without AVX512-BF16: Bf16Avx2's widening of the pair words with zmm registers, so a
// panel step is one load, a shift and a mask, then two fused multiply-adds per row; 8 rows x 3 panels keep 24
// accumulators in the 32 registers (the inputs are broadcast from memory as FMA operands). The input and the
// order of the two products per pair are Bf16Avx2's, so both compute the same sums.
struct Bf16Avx512Core {
  using X = float;
  using W = uint16_t;
  static constexpr int64_t kStep = 2;
  static constexpr int64_t kXStep = 2;
  static constexpr int kRows = 8;

  template <int MR, int NP>
  __attribute__((target("avx512f,fma"))) static void tile(const X* x, int64_t ldx, const W* panels,
                                                                 int64_t stride, int64_t steps, float* y,
                                                                 int64_t ldy) {
    __m512 acc[MR][NP];
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_setzero_ps();
    const W* p[NP];
    for (int j = 0; j < NP; ++j) p[j] = panels + j * 2 * kPanel;
    const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    for (int64_t k = 0; k < steps; ++k) {
      for (int j = 0; j < NP; ++j) {
        const __m512i pairs = _mm512_loadu_si512(p[j] + k * stride);
        const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
        const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(pairs, high));
        for (int i = 0; i < MR; ++i) {
          const __m512 b0 = _mm512_set1_ps(x[i * ldx + 2 * k]);
          const __m512 b1 = _mm512_set1_ps(x[i * ldx + 2 * k + 1]);
          acc[i][j] = _mm512_fmadd_ps(b1, odd, _mm512_fmadd_ps(b0, even, acc[i][j]));
        }
      }
    }
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NP; ++j) _mm512_storeu_ps(y + i * ldy + j * kPanel, acc[i][j]);
  }
};

// The last rows < K::kRows of x, as one tile of that many rows.
template <typename K, int NP, int MR = K::kRows - 1>
void tail_rows(int64_t rows, const typename K::X* x, int64_t ldx, const typename K::W* panels, int64_t stride,
               int64_t steps, float* y, int64_t ldy) {
  if constexpr (MR >= 1) {
    if (rows == MR)
      K::template tile<MR, NP>(x, ldx, panels, stride, steps, y, ldy);
    else
      tail_rows<K, NP, MR - 1>(rows, x, ldx, panels, stride, steps, y, ldy);
  }
}

// Every row of x against one group of NP panels: full K::kRows-row tiles, then one tile for the remaining rows.
template <typename K, int NP>
void all_rows(const typename K::X* x, int64_t m, int64_t steps, const typename K::W* group, float* y,
              int64_t ldy) {
  const int64_t ldx = steps * K::kXStep;
  const int64_t stride = NP * K::kStep * kPanel;  // the group's weights per k step (see pack_panels)
  int64_t i = 0;
  for (; i + K::kRows <= m; i += K::kRows)
    K::template tile<K::kRows, NP>(x + i * ldx, ldx, group, stride, steps, y + i * ldy, ldy);
  tail_rows<K, NP>(m - i, x + i * ldx, ldx, group, stride, steps, y + i * ldy, ldy);
}

// x [m][steps] (in K's units) times the packed panels, spread over libtorch's pool by groups of kGroup panels.
template <typename K>
void gemm(const typename K::X* x, int64_t m, int64_t steps, const typename K::W* packed, int64_t n, float* y) {
  const int64_t panels = n / kPanel;
  const int64_t groups = (panels + kGroup - 1) / kGroup;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      const int64_t first = g * kGroup;
      const int64_t count = std::min(kGroup, panels - first);
      const typename K::W* p = packed + first * steps * K::kStep * kPanel;
      float* out = y + first * kPanel;
      switch (count) {
        case 3: all_rows<K, 3>(x, m, steps, p, out, n); break;
        case 2: all_rows<K, 2>(x, m, steps, p, out, n); break;
        default: all_rows<K, 1>(x, m, steps, p, out, n); break;
      }
    }
  });
}

constexpr int64_t kAmxPairs = 16;  // k pairs per tile step: one 64-byte tile row

// The tile shapes of one row block: tiles 0-2 accumulate rows x 16 fp32 (one per panel of a group), tile 3 holds
// rows x 16 pairs of x, tiles 4-6 the 16 pairs x 16 columns of each panel. Palette 1; unused tiles stay empty.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

__attribute__((target("amx-tile"))) void amx_configure(int64_t rows) {
  TileConfig config;
  for (int t = 0; t < 7; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = static_cast<uint8_t>(t < 4 ? rows : kAmxPairs);
  }
  // Not _tile_loadconfig: GCC 12's declares that it reads only 8 bytes of the config, and the optimizer then
  // drops the stores of the row and column sizes (ldtilecfg faults on the half-written config). This operand is
  // the whole struct.
  asm volatile("ldtilecfg %0" ::"m"(config));
}

// Hands the tile state back, so a context switch of the calling pool thread saves no 8 KiB of tile registers.
__attribute__((target("amx-tile"))) void amx_release() { _tile_release(); }

// The configured rows of x (pairs words, row stride ldx words) times one group of NP panels of `steps` pairs each
// (a multiple of kAmxPairs), into y (row stride ldy floats). A B tile is 16 pair rows of one panel, which the
// group layout holds NP * 64 bytes apart (see pack_panels).
template <int NP>
__attribute__((target("amx-tile,amx-bf16"))) void amx_tile(const uint32_t* x, int64_t ldx, const uint16_t* group,
                                                          int64_t steps, float* y, int64_t ldy) {
  const int64_t stride = NP * 2 * kPanel;  // bf16 elements per pair row of the group
  _tile_zero(0);
  if constexpr (NP > 1) _tile_zero(1);
  if constexpr (NP > 2) _tile_zero(2);
  for (int64_t k = 0; k < steps; k += kAmxPairs) {
    const uint16_t* rows = group + k * stride;
    _tile_loadd(3, x + k, ldx * 4);
    _tile_loadd(4, rows, stride * 2);
    _tile_dpbf16ps(0, 3, 4);
    if constexpr (NP > 1) {
      _tile_loadd(5, rows + 2 * kPanel, stride * 2);
      _tile_dpbf16ps(1, 3, 5);
    }
    if constexpr (NP > 2) {
      _tile_loadd(6, rows + 4 * kPanel, stride * 2);
      _tile_dpbf16ps(2, 3, 6);
    }
  }
  _tile_stored(0, y, ldy * 4);
  if constexpr (NP > 1) _tile_stored(1, y + kPanel, ldy * 4);
  if constexpr (NP > 2) _tile_stored(2, y + 2 * kPanel, ldy * 4);
}

// gemm<Bf16> on the tiles: each worker takes its groups of panels through every block of up to 16 rows, so a
// group's weights are read from memory once and from cache for the next blocks. Needs steps % kAmxPairs == 0.
void gemm_amx(const uint32_t* x, int64_t m, int64_t steps, const uint16_t* packed, int64_t n, float* y) {
  const int64_t panels = n / kPanel;
  const int64_t groups = (panels + kGroup - 1) / kGroup;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    int64_t configured = 0;
    for (int64_t i = 0; i < m; i += kAmxPairs) {
      const int64_t rows = std::min(kAmxPairs, m - i);
      if (rows != configured) {
        amx_configure(rows);
        configured = rows;
      }
      for (int64_t g = begin; g < end; ++g) {
        const int64_t first = g * kGroup;
        const uint16_t* p = packed + first * steps * 2 * kPanel;
        float* out = y + i * n + first * kPanel;
        switch (std::min(kGroup, panels - first)) {
          case 3: amx_tile<3>(x + i * steps, steps, p, steps, out, n); break;
          case 2: amx_tile<2>(x + i * steps, steps, p, steps, out, n); break;
          default: amx_tile<1>(x + i * steps, steps, p, steps, out, n); break;
        }
      }
    }
    amx_release();
  });
}

// Rounds rows of x [m][k] to bf16 (nearest even) as [m][pairs] words, a zero in the padding of an odd k.
__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl"))) void to_bf16_pairs(const float* x, int64_t m,
                                                                                  int64_t k, uint32_t* out) {
  const int64_t pairs = (k + 1) / 2;
  for (int64_t r = 0; r < m; ++r) {
    auto* row = reinterpret_cast<uint16_t*>(out + r * pairs);
    for (int64_t i = 0; i < k; i += 16) {
      const __mmask16 mask = k - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (k - i)) - 1);
      const __m256bh b = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x + r * k + i));
      _mm256_mask_storeu_epi16(row + i, mask, (__m256i)b);
    }
    if (k % 2 != 0) row[k] = 0;
  }
}

// Rounds rows of x [m][k] to bf16 (nearest even, NaN kept NaN) but keeps them as fp32, [m][2 * pairs] with a zero
// in the padding of an odd k: the AVX2 kernel's input, the same values to_bf16_pairs gives the AVX-512 one.
void to_bf16_floats(const float* x, int64_t m, int64_t k, float* out) {
  const int64_t ld = (k + 1) / 2 * 2;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      uint32_t bits;
      std::memcpy(&bits, x + r * k + i, 4);
      if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
        bits |= 0x00400000u;  // a quiet NaN stays NaN once truncated
      else
        bits += 0x7FFFu + ((bits >> 16) & 1u);
      bits &= 0xFFFF0000u;
      std::memcpy(out + r * ld + i, &bits, 4);
    }
    if (k % 2 != 0) out[r * ld + k] = 0.0f;
  }
}

}  // namespace

namespace trinity {

bool amx_usable() {
  static const bool usable = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    const bool bf16 = (edx & (1u << 22)) != 0, tile = (edx & (1u << 24)) != 0;
    if (!bf16 || !tile) return false;
    // Linux enables the tile data state per process on request (it is 8 KiB of every context switch):
    // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). It fails where the kernel or hypervisor withholds it.
    constexpr long kReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return usable;
}

void packed_gemm(const float* x, int64_t m, int64_t k_len, const float* packed, int64_t n, float* y, Isa isa) {
  if (m <= 0) return;
  if (isa == Isa::kAvx2)
    gemm<Fp32Avx2>(x, m, k_len, packed, n, y);
  else
    gemm<Fp32>(x, m, k_len, packed, n, y);
}

void packed_gemm_bf16(const float* x, int64_t m, int64_t k_len, const uint16_t* packed, int64_t n, float* y,
                      Isa isa) {
  if (m <= 0) return;
  const int64_t pairs = (k_len + 1) / 2;
  if (isa == Isa::kAvx512 || isa == Isa::kAmx) {
    std::vector<uint32_t> xb(m * pairs);
    to_bf16_pairs(x, m, k_len, xb.data());
    if (isa == Isa::kAmx && pairs % kAmxPairs == 0)
      gemm_amx(xb.data(), m, pairs, packed, n, y);
    else
      gemm<Bf16>(xb.data(), m, pairs, packed, n, y);
  } else {
    std::vector<float> xb(m * 2 * pairs);
    to_bf16_floats(x, m, k_len, xb.data());
    if (isa == Isa::kAvx512Core)
      gemm<Bf16Avx512Core>(xb.data(), m, pairs, packed, n, y);
    else
      gemm<Bf16Avx2>(xb.data(), m, pairs, packed, n, y);
  }
}

}  // namespace trinity

namespace {

// Runs f, mapping any exception (libtorch's thread pool rethrows what a worker threw) to -1: nothing is thrown
// across the C boundary.
template <typename F>
int guarded(F f) {
  try {
    f();
    return 0;
  } catch (const std::exception&) {
    return -1;
  }
}

// Packs `count` row-major weight matrices stacked along n (sources[i] has rows[i] rows of k_len) into panels of
// 16 output columns holding k in steps of S (S is 1 for fp32 and 2 for bf16, the last step zero-padded), with
// every kGroup consecutive panels interleaved step by step: [groups][ceil(k / S)][panels of the group][16][S], the
// last group holding the 1 or 2 panels left over. A kernel works on one group at a time, so each thread then
// reads its weights as one forward stream, where panel after panel would be kGroup streams restarting at every
// group (the file comment has what that cost at batch 1).
template <typename T, int64_t S>
void pack_panels(const T* const* sources, const int64_t* rows, int64_t count, int64_t k_len, T* packed) {
  int64_t n = 0;
  for (int64_t i = 0; i < count; ++i) n += rows[i];
  const int64_t panels = n / kPanel;
  const int64_t steps = (k_len + S - 1) / S;
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    const T* row[kPanel];
    for (int64_t panel = begin; panel < end; ++panel) {
      for (int64_t c = 0; c < kPanel; ++c) {
        int64_t r = panel * kPanel + c;
        int64_t i = 0;
        while (r >= rows[i]) r -= rows[i++];
        row[c] = sources[i] + r * k_len;
      }
      const int64_t first = panel / kGroup * kGroup;
      const int64_t in_group = std::min(kGroup, panels - first);
      T* out = packed + first * steps * S * kPanel + (panel - first) * kPanel * S;
      for (int64_t s = 0; s < steps; ++s)
        for (int64_t c = 0; c < kPanel; ++c)
          for (int64_t e = 0; e < S; ++e) {
            const int64_t k = s * S + e;
            out[(s * in_group * kPanel + c) * S + e] = k < k_len ? row[c][k] : T{0};
          }
    }
  });
}

}  // namespace

// 1 when the AMX kernels can run here (trinity::amx_usable), else 0.
extern "C" int trinity_amx_usable() { return trinity::amx_usable() ? 1 : 0; }

// isa: trinity::Isa's value, which the caller checked this CPU has. Returns 0, or -1 when libtorch's thread pool
// reported an error.
extern "C" int trinity_packed_gemm(const float* x, int64_t m, int64_t k_len, const float* packed, int64_t n,
                                   float* y, int64_t isa) {
  return guarded([&] { trinity::packed_gemm(x, m, k_len, packed, n, y, static_cast<Isa>(isa)); });
}

// y = x W^T with bf16 weights packed by trinity_pack_panels_bf16; x and y fp32. Returns 0, or -1 on a thread-pool
// or allocation error.
extern "C" int trinity_packed_gemm_bf16(const float* x, int64_t m, int64_t k_len, const uint16_t* packed, int64_t n,
                                        float* y, int64_t isa) {
  return guarded([&] { trinity::packed_gemm_bf16(x, m, k_len, packed, n, y, static_cast<Isa>(isa)); });
}

// Packs fp32 weights into the grouped panel layout that trinity_packed_gemm reads (pack_panels), in one pass and
// without an intermediate copy: at model load that pass is the first touch of ~half a gigabyte for SmolLM2, so a
// concatenate-then-transpose cost twice that in page faults. n (the sum of rows) must be a multiple of 16.
// Returns 0, or -1 on a thread-pool error.
extern "C" int trinity_pack_panels(const float* const* sources, const int64_t* rows, int64_t count, int64_t k_len,
                                   float* packed) {
  return guarded([&] { pack_panels<float, 1>(sources, rows, count, k_len, packed); });
}

// The bf16 counterpart (sources are bf16 bit patterns): the layout with k in pairs that
// trinity_packed_gemm_bf16 reads. Returns 0, or -1 on a thread-pool error.
extern "C" int trinity_pack_panels_bf16(const uint16_t* const* sources, const int64_t* rows, int64_t count,
                                        int64_t k_len, uint16_t* packed) {
  return guarded([&] { pack_panels<uint16_t, 2>(sources, rows, count, k_len, packed); });
}
