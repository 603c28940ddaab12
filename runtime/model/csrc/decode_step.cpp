// One decode step through every decoder layer, in a single call: RMSNorm, the packed q/k/v projection,
// q/k norm, RoPE, the KV-cache write, attention over each slot's cached prefix, the output projection, the
// MLP and both residuals.
//
// Why this exists: with the projections on the packed kernel, a libtorch decode step of SmolLM2 (30 layers,
// 16 sequences) still spent most of its time outside the matmuls: about 30 small ops per layer, each with its
// dispatch, allocation and thread-pool wake-up, and scaled_dot_product_attention's flash kernel, which runs
// tiny MKL gemms per (row, head) and was a fifth of all decode samples on its own. A decode step's tensors are
// small ([rows, hidden] with rows <= the batch), so everything but the matmuls and the attention runs on the
// calling thread, and those two run on libtorch's intra-op pool (at::parallel_for), so no second pool competes
// for the cores.
//
// The kernels are written once (decode_kernels.inc, against a vector width and its operations) and compiled twice
// in this file: for AVX-512 and for AVX2 + FMA, each under its own `#pragma GCC target`, so one binary runs on
// either CPU and the caller (Rust's `packed::Isa`, from runtime detection) picks the set through the shape.
//
// Numerics follow the libtorch path it replaces (decoder.rs): fp32 activations, norms and cache throughout (with
// bf16 weights only the projections round their inputs to bf16, see packed_gemm.cpp), RMSNorm as
// x * rsqrt(mean(x^2) + eps) * w, the "rotate half" RoPE with cos/sin tables computed by the caller,
// softmax(q k^T / sqrt(d)) v, and SiLU as g / (1 + exp(-g)). Sums are accumulated in a different order than
// libtorch's, so results agree to float rounding (the tests hold them to 1e-4), not bit for bit.

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <numeric>
#include <vector>

#include "packed_gemm.h"

// Must match `DecodeShape` in src/decode_step.rs.
struct TrinityDecodeShape {
  int64_t hidden;
  int64_t heads;
  int64_t kv_heads;
  int64_t head_dim;
  int64_t intermediate;
  int64_t cache_cols;  // columns per (slot, kv head) in the cache: capacity + 1 scratch column
  double eps;
  int64_t bf16_weights;  // 1: the packed projections are bf16 (packed_gemm_bf16's layout), 0: fp32
  int64_t isa;           // trinity::Isa: the instruction set to run on, which the caller checked the CPU has
};

// Must match `DecodeLayer` in src/decode_step.rs. Optional tensors are null when absent.
struct TrinityDecodeLayer {
  const float* input_norm;  // [hidden]
  const void* qkv;          // packed [(heads + 2 kv_heads) * head_dim / 16, hidden, 16] (bf16: k in pairs)
  const float* qkv_bias;    // [(heads + 2 kv_heads) * head_dim] or null
  const float* q_norm;      // [head_dim] or null
  const float* k_norm;      // [head_dim] or null
  const void* o;            // packed [hidden / 16, heads * head_dim, 16]
  const float* o_bias;      // [hidden] or null
  const float* post_norm;   // [hidden]
  const void* gate_up;      // packed [2 intermediate / 16, hidden, 16]: gate outputs, then up outputs
  const float* gate_up_bias;
  const void* down;         // packed [hidden / 16, intermediate, 16]
  const float* down_bias;
  float* keys;              // cache [slots, kv_heads, cache_cols, head_dim]
  float* values;
};

#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512 {

#include "simd_avx512.inc"

#include "decode_kernels.inc"

}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {

#include "simd_avx2.inc"

#include "decode_kernels.inc"

}  // namespace avx2
#pragma GCC pop_options

// x: [rows, hidden] embeddings in, last layer's output (before the final norm) out. Row r is the next token of
// cache slot slots[r] at position positions[r]; its key and value are written at that column, and it attends to
// columns 0..=positions[r]. cos / sin: [rows, head_dim]. Returns 0, or -1 when libtorch's thread pool or an
// allocation failed (nothing is thrown across the C boundary; x is then partly updated, the caller discards it).
extern "C" int trinity_decode_layers(const TrinityDecodeShape* shape, const TrinityDecodeLayer* layers,
                                     int64_t n_layers, int64_t rows, const int64_t* slots, const int64_t* positions,
                                     const float* cos, const float* sin, float* x) {
  try {
    if (static_cast<trinity::Isa>(shape->isa) != trinity::Isa::kAvx2)
      avx512::decode(*shape, layers, n_layers, rows, slots, positions, cos, sin, x);
    else
      avx2::decode(*shape, layers, n_layers, rows, slots, positions, cos, sin, x);
    return 0;
  } catch (const std::exception&) {
    return -1;
  }
}
