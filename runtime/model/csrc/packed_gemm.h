// The packed small-batch matmuls, fp32 and bf16 weights (packed_gemm.cpp), shared with the fused decode step (decode_step.cpp).
#pragma once

#include <cstdint>

namespace trinity {

// The instruction set a kernel runs on, chosen by the caller (Rust's `packed::Isa`, from runtime CPU detection):
// one binary carries both and runs on any x86-64 CPU that has at least AVX2 + FMA. The values are the FFI's.
enum class Isa : int64_t {
  kAvx512 = 1,  // AVX-512F (+ AVX512-BF16 for bf16 weights): a 16-column panel is one zmm
  kAvx2 = 2,    // AVX2 + FMA: a 16-column panel is two ymm; bf16 weights are widened to fp32 in registers
  kAmx = 3,     // bf16 weights only: AVX-512's kernels with the matmuls on AMX tiles (amx_usable())
  kAvx512Core = 4,  // bf16 weights only, AVX-512F without AVX512-BF16: a panel is one zmm, widened to fp32
};

// Whether this CPU has AMX-TILE + AMX-BF16 and the kernel lets this process use the tile registers (Linux hands
// them out on request: arch_prctl ARCH_REQ_XCOMP_PERM). Asked once; later calls return the first answer.
bool amx_usable();

// y[m][n] = sum_k x[m][k] * w[n][k] with w packed by pack_panels (panels of 16 columns, k-major, in groups of 3
// interleaved step by step); x and y row-major, n a multiple of 16.
// Runs on libtorch's intra-op thread pool; may throw what at::parallel_for rethrows.
void packed_gemm(const float* x, int64_t m, int64_t k_len, const float* packed, int64_t n, float* y, Isa isa);

// The same with bf16 weights packed with k in pairs (steps of [16][2]); x is rounded to bf16, y accumulates in fp32.
void packed_gemm_bf16(const float* x, int64_t m, int64_t k_len, const uint16_t* packed, int64_t n, float* y,
                      Isa isa);

}  // namespace trinity
