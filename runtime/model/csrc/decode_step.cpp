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

namespace {

// Lanes [0, n) of a 16-lane vector, for the tail of a row whose length is not a multiple of 16.
inline __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }

// e^x to about 2 ulp: 2^n * p(r) with n = round(x / ln 2), r = x - n ln 2 (split in two constants for
// accuracy) and Cephes' degree-6 polynomial for e^r on |r| <= ln 2 / 2. Inputs are clamped to where fp32 e^x is
// finite and normal, which is all softmax (x <= 0) and SiLU need.
__attribute__((target("avx512f"))) inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// out = x * rsqrt(mean(x^2) + eps) * w over one row of n.
__attribute__((target("avx512f"))) void rms_norm(const float* x, int64_t n, const float* w, double eps,
                                                 float* out) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(lanes(n - i), x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  const float scale = 1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / static_cast<float>(n) + static_cast<float>(eps));
  const __m512 s = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(n - i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s);
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
  }
}

void add_bias(float* y, int64_t rows, int64_t n, const float* bias) {
  if (bias == nullptr) return;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) y[r * n + i] += bias[i];
}

void add_into(float* x, const float* y, int64_t count) {
  for (int64_t i = 0; i < count; ++i) x[i] += y[i];
}

// "Rotate half" RoPE on one head: out[i] = x[i] cos[i] - x[i + h] sin[i], out[i + h] = x[i + h] cos[i + h] +
// x[i] sin[i + h], h = d / 2.
void rope(float* x, const float* cos, const float* sin, int64_t d) {
  const int64_t h = d / 2;
  for (int64_t i = 0; i < h; ++i) {
    const float a = x[i];
    const float b = x[i + h];
    x[i] = a * cos[i] - b * sin[i];
    x[i + h] = b * cos[i + h] + a * sin[i + h];
  }
}

// Softmax of one head's scores in place.
__attribute__((target("avx512f"))) void softmax(float* s, int64_t len) {
  float max = -INFINITY;
  for (int64_t j = 0; j < len; ++j) max = std::max(max, s[j]);
  const __m512 mx = _mm512_set1_ps(max);
  __m512 total = _mm512_setzero_ps();
  for (int64_t j = 0; j < len; j += 16) {
    const __mmask16 m = lanes(len - j);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), mx));
    total = _mm512_add_ps(total, _mm512_maskz_mov_ps(m, e));
    _mm512_mask_storeu_ps(s + j, m, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(total));
  for (int64_t j = 0; j < len; j += 16) {
    const __mmask16 m = lanes(len - j);
    _mm512_mask_storeu_ps(s + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), inv));
  }
}

// Sums each of 16 vectors across its lanes: lane j of the result is the sum of v[j]. Pairwise halving (shuffle and
// add) takes 15 adds for all 16 instead of a full horizontal reduction per vector.
__attribute__((target("avx512f"))) inline __m512 sum16(const __m512* v) {
  __m512 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i)  // lanes 0-7 hold v[2i]'s 8 partial sums, lanes 8-15 v[2i+1]'s
    a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int i = 0; i < 4; ++i)  // 128-bit quarter q holds v[4i + q]'s 4 partial sums
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int i = 0; i < 2; ++i)  // quarter q: 2 partial sums of v[8i + q], then 2 of v[8i + 4 + q]
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // Lane 4q + m holds the sum of v[q + 4m]; permute into lane order.
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, sums);
}

// Attention of the `group` query heads that share one KV head, for one row: q [group][d] (contiguous heads),
// keys / values [len][d], out [group][d]. `scores` has room for len floats. C = d / 16 is a compile-time
// constant so a head's query and output stay in registers; the weighted sum of values runs two independent
// accumulator sets so it is not bound by the FMA latency of one chain.
template <int C>
__attribute__((target("avx512f"))) void attend(const float* q, int64_t group, const float* keys,
                                               const float* values, int64_t len, float scale, float* scores,
                                               float* out) {
  constexpr int64_t d = 16 * C;
  for (int64_t g = 0; g < group; ++g) {
    __m512 qv[C];
    for (int c = 0; c < C; ++c) qv[c] = _mm512_loadu_ps(q + g * d + 16 * c);
    int64_t first = 0;
    for (; first + 16 <= len; first += 16) {
      __m512 dots[16];
      for (int r = 0; r < 16; ++r) {
        const float* k = keys + (first + r) * d;
        dots[r] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k));
        for (int c = 1; c < C; ++c) dots[r] = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + 16 * c), dots[r]);
      }
      _mm512_storeu_ps(scores + first, _mm512_mul_ps(sum16(dots), _mm512_set1_ps(scale)));
    }
    for (int64_t j = first; j < len; ++j) {
      const float* k = keys + j * d;
      __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k));
      for (int c = 1; c < C; ++c) acc = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + 16 * c), acc);
      scores[j] = _mm512_reduce_add_ps(acc) * scale;
    }
    softmax(scores, len);
    __m512 a[C], b[C];
    for (int c = 0; c < C; ++c) a[c] = b[c] = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 1 < len; j += 2) {
      const __m512 p0 = _mm512_set1_ps(scores[j]);
      const __m512 p1 = _mm512_set1_ps(scores[j + 1]);
      for (int c = 0; c < C; ++c) {
        a[c] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(values + j * d + 16 * c), a[c]);
        b[c] = _mm512_fmadd_ps(p1, _mm512_loadu_ps(values + (j + 1) * d + 16 * c), b[c]);
      }
    }
    if (j < len) {
      const __m512 p0 = _mm512_set1_ps(scores[j]);
      for (int c = 0; c < C; ++c) a[c] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(values + j * d + 16 * c), a[c]);
    }
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + g * d + 16 * c, _mm512_add_ps(a[c], b[c]));
  }
}

// The same for any head size (the tests' tiny models use 8): plain loops, masked loads.
__attribute__((target("avx512f"))) void attend_any(const float* q, int64_t group, const float* keys,
                                                   const float* values, int64_t len, int64_t d, float scale,
                                                   float* scores, float* out) {
  for (int64_t g = 0; g < group; ++g) {
    for (int64_t j = 0; j < len; ++j) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t i = 0; i < d; i += 16) {
        const __mmask16 m = lanes(d - i);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + g * d + i), _mm512_maskz_loadu_ps(m, keys + j * d + i), acc);
      }
      scores[j] = _mm512_reduce_add_ps(acc) * scale;
    }
    softmax(scores, len);
    for (int64_t i = 0; i < d; i += 16) {
      const __mmask16 m = lanes(d - i);
      __m512 acc = _mm512_setzero_ps();
      for (int64_t j = 0; j < len; ++j)
        acc = _mm512_fmadd_ps(_mm512_set1_ps(scores[j]), _mm512_maskz_loadu_ps(m, values + j * d + i), acc);
      _mm512_mask_storeu_ps(out + g * d + i, m, acc);
    }
  }
}

using AttendFn = void (*)(const float*, int64_t, const float*, const float*, int64_t, float, float*, float*);

// The register-resident variant for head sizes 16, 32, ..., 256, or null.
AttendFn attend_for(int64_t d) {
  switch (d) {
    case 16: return attend<1>;
    case 32: return attend<2>;
    case 48: return attend<3>;
    case 64: return attend<4>;
    case 80: return attend<5>;
    case 96: return attend<6>;
    case 128: return attend<8>;
    case 256: return attend<16>;
    default: return nullptr;
  }
}

// act[r][i] = silu(gate[r][i]) * up[r][i], from gate_up [rows][2 inter].
__attribute__((target("avx512f"))) void silu_mul(const float* gate_up, int64_t rows, int64_t inter, float* act) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * inter;
    const float* u = g + inter;
    float* a = act + r * inter;
    for (int64_t i = 0; i < inter; i += 16) {
      const __mmask16 m = lanes(inter - i);
      const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
      const __m512 silu = _mm512_div_ps(gv, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
      _mm512_mask_storeu_ps(a + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, u + i)));
    }
  }
}

// y [rows][n] = x [rows][k] times one of the layer's packed projections, in the shape's weight type.
void project(const TrinityDecodeShape& s, const float* x, int64_t rows, int64_t k, const void* w, int64_t n,
             float* y) {
  if (s.bf16_weights != 0)
    trinity::packed_gemm_bf16(x, rows, k, static_cast<const uint16_t*>(w), n, y);
  else
    trinity::packed_gemm(x, rows, k, static_cast<const float*>(w), n, y);
}

void decode(const TrinityDecodeShape& s, const TrinityDecodeLayer* layers, int64_t n_layers, int64_t rows,
            const int64_t* slots, const int64_t* positions, const float* cos, const float* sin, float* x) {
  const int64_t d = s.head_dim;
  const int64_t group = s.heads / s.kv_heads;
  const int64_t n_qkv = (s.heads + 2 * s.kv_heads) * d;
  const int64_t n_attn = s.heads * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const AttendFn fixed = attend_for(d);
  std::vector<float> h(rows * s.hidden), qkv(rows * n_qkv), attn(rows * n_attn), proj(rows * s.hidden);
  std::vector<float> gate_up(rows * 2 * s.intermediate), act(rows * s.intermediate);
  for (int64_t l = 0; l < n_layers; ++l) {
    const TrinityDecodeLayer& w = layers[l];
    for (int64_t r = 0; r < rows; ++r) rms_norm(x + r * s.hidden, s.hidden, w.input_norm, s.eps, &h[r * s.hidden]);
    project(s, h.data(), rows, s.hidden, w.qkv, n_qkv, qkv.data());
    add_bias(qkv.data(), rows, n_qkv, w.qkv_bias);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = &qkv[r * n_qkv];
      for (int64_t head = 0; head < s.heads + s.kv_heads; ++head) {
        float* v = row + head * d;
        const float* norm = head < s.heads ? w.q_norm : w.k_norm;
        if (norm != nullptr) rms_norm(v, d, norm, s.eps, v);
        rope(v, cos + r * d, sin + r * d, d);
      }
      for (int64_t kv = 0; kv < s.kv_heads; ++kv) {
        const int64_t at = ((slots[r] * s.kv_heads + kv) * s.cache_cols + positions[r]) * d;
        std::copy_n(row + (s.heads + kv) * d, d, w.keys + at);
        std::copy_n(row + (s.heads + s.kv_heads + kv) * d, d, w.values + at);
      }
    }
    at::parallel_for(0, rows * s.kv_heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scores(s.cache_cols);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t r = item / s.kv_heads;
        const int64_t kv = item % s.kv_heads;
        const int64_t len = positions[r] + 1;
        const int64_t base = (slots[r] * s.kv_heads + kv) * s.cache_cols * d;
        const float* q = &qkv[r * n_qkv + kv * group * d];
        float* out = &attn[r * n_attn + kv * group * d];
        if (fixed != nullptr)
          fixed(q, group, w.keys + base, w.values + base, len, scale, scores.data(), out);
        else
          attend_any(q, group, w.keys + base, w.values + base, len, d, scale, scores.data(), out);
      }
    });
    project(s, attn.data(), rows, n_attn, w.o, s.hidden, proj.data());
    add_bias(proj.data(), rows, s.hidden, w.o_bias);
    add_into(x, proj.data(), rows * s.hidden);
    for (int64_t r = 0; r < rows; ++r) rms_norm(x + r * s.hidden, s.hidden, w.post_norm, s.eps, &h[r * s.hidden]);
    project(s, h.data(), rows, s.hidden, w.gate_up, 2 * s.intermediate, gate_up.data());
    add_bias(gate_up.data(), rows, 2 * s.intermediate, w.gate_up_bias);
    silu_mul(gate_up.data(), rows, s.intermediate, act.data());
    project(s, act.data(), rows, s.intermediate, w.down, s.hidden, proj.data());
    add_bias(proj.data(), rows, s.hidden, w.down_bias);
    add_into(x, proj.data(), rows * s.hidden);
  }
}

}  // namespace

// x: [rows, hidden] embeddings in, last layer's output (before the final norm) out. Row r is the next token of
// cache slot slots[r] at position positions[r]; its key and value are written at that column, and it attends to
// columns 0..=positions[r]. cos / sin: [rows, head_dim]. Returns 0, or -1 when libtorch's thread pool or an
// allocation failed (nothing is thrown across the C boundary; x is then partly updated, the caller discards it).
extern "C" int trinity_decode_layers(const TrinityDecodeShape* shape, const TrinityDecodeLayer* layers,
                                     int64_t n_layers, int64_t rows, const int64_t* slots, const int64_t* positions,
                                     const float* cos, const float* sin, float* x) {
  try {
    decode(*shape, layers, n_layers, rows, slots, positions, cos, sin, x);
    return 0;
  } catch (const std::exception&) {
    return -1;
  }
}
