// Fused CPU forward and backward of the decoder's elementwise pieces that training runs on every layer: RMSNorm,
// RoPE, the SwiGLU product and the attention softmax (scale, mask, softmax in fp32), as autograd functions.
//
// Why: spelled out in libtorch ops, a bf16 RMSNorm is eight kernels forward (casts, square, mean, rsqrt, two
// products) and a dozen backward, RoPE six each way, SwiGLU three; each kernel streams its operands through
// memory, allocates its result and forks the OpenMP pool. Over SmolLM2's 30 layers that is ~1,000 small kernels a
// train step, about as much time as its matmuls. Here each piece is one pass each way, computed in fp32 and rounded
// once to the tensor's dtype (the spelled-out bf16 path rounds after every op, so results differ by bf16
// rounding). Rows are spread over libtorch's pool with `at::parallel_for`. Measured with the example `bench_train
// --dtype bf16 --seq 106` (SmolLM2-135M, 8 rows, 2 cores of a Xeon with AMX): 1.77-1.85 s an iteration -> 1.45-1.47 s
// (forward 0.38-0.41 -> 0.29 s, backward 1.29-1.44 -> 1.08-1.10 s); fp32 3.13 -> 2.99 s.
//
// The entry points are `extern "C"` for the Rust side (`src/train_ops.rs`): tensors in as tch's `at::Tensor*`
// handles, the result out as a new handle the caller owns; 0 on success, -1 on a libtorch error, whose message
// `trinity_train_op_error` returns on the same thread.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Function;
using torch::autograd::variable_list;

thread_local std::string last_error;

// Rows of `n` per parallel chunk: about 16K elements, so small tensors do not fork the pool for nothing.
int64_t grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }

void check_cpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), what, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, what, " must be fp32 or bf16, got ",
              t.scalar_type());
}

}  // namespace

// The kernels, 16 fp32 lanes wide. Only AVX-512 CPUs run them (`trinity_train_ops_usable`); elsewhere the Rust
// side keeps libtorch's ops, which are vectorized for every CPU, where a portable copy of these would not be.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
namespace avx512 {

#include "simd_avx512.inc"

using V = Simd::V;
using Mask = Simd::Mask;
constexpr int64_t kW = Simd::kWidth;

// Loads and stores of fp32 lanes from either element type; bf16 rounds to nearest even, NaN stays NaN.
inline V load(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
inline V load(Mask m, const c10::BFloat16* p) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512i bf16_bits(V v) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(_mm512_srli_epi32(r, 16), nan, _mm512_set1_epi32(0x7fc0));
}
inline void store(Mask m, float* p, V v) { _mm512_mask_storeu_ps(p, m, v); }
inline void store(Mask m, c10::BFloat16* p, V v) {
  _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(bf16_bits(v)));
}
// v rounded to the element type and back: what storing and reloading it would give.
inline V round_as(const float*, V v) { return v; }
inline V round_as(const c10::BFloat16*, V v) { return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(v), 16)); }

// ---- RMSNorm: y = w * round(x * rstd), rstd = 1 / sqrt(mean(x^2) + eps) per row (transformers' order). ----

template <typename T>
void rms_forward(const T* x, const T* w, int64_t rows, int64_t n, double eps, T* y, float* rstd) {
  at::parallel_for(0, rows, grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * n;
      V acc = Simd::zero();
      for (int64_t i = 0; i < n; i += kW) {
        const V v = load(Simd::lanes(n - i), xr + i);
        acc = Simd::fma(v, v, acc);
      }
      const float s = 1.0f / std::sqrt(Simd::reduce(acc) / static_cast<float>(n) + static_cast<float>(eps));
      rstd[r] = s;
      const V sv = Simd::set1(s);
      for (int64_t i = 0; i < n; i += kW) {
        const Mask m = Simd::lanes(n - i);
        const V xhat = round_as(x, Simd::mul(load(m, xr + i), sv));
        store(m, y + r * n + i, Simd::mul(load(m, w + i), xhat));
      }
    }
  });
}

// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w, xhat = x * rstd; dw = sum over rows of dy * round(xhat).
template <typename T>
void rms_backward(const T* x, const T* w, const float* rstd, const T* dy, int64_t rows, int64_t n, T* dx,
                  float* dw) {
  const int threads = at::get_num_threads();
  std::vector<float> partial(static_cast<size_t>(threads) * n, 0.0f);
  at::parallel_for(0, rows, grain(n), [&](int64_t begin, int64_t end) {
    float* acc = partial.data() + static_cast<size_t>(at::get_thread_num()) * n;
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * n;
      const T* dyr = dy + r * n;
      const V sv = Simd::set1(rstd[r]);
      V dot = Simd::zero();
      for (int64_t i = 0; i < n; i += kW) {
        const Mask m = Simd::lanes(n - i);
        const V xhat = Simd::mul(load(m, xr + i), sv);
        const V d = load(m, dyr + i);
        dot = Simd::fma(Simd::mul(d, load(m, w + i)), xhat, dot);
        store(m, acc + i, Simd::fma(d, round_as(x, xhat), load(m, acc + i)));
      }
      const V mean = Simd::set1(Simd::reduce(dot) / static_cast<float>(n));
      for (int64_t i = 0; i < n; i += kW) {
        const Mask m = Simd::lanes(n - i);
        const V xhat = Simd::mul(load(m, xr + i), sv);
        const V g = Simd::mul(load(m, dyr + i), load(m, w + i));
        store(m, dx + r * n + i, Simd::mul(sv, Simd::sub(g, Simd::mul(xhat, mean))));
      }
    }
  });
  for (int t = 0; t < threads; ++t)
    for (int64_t i = 0; i < n; ++i) dw[i] += partial[static_cast<size_t>(t) * n + i];
}

// ---- RoPE, "rotate half": y[i] = x[i] c[i] - x[i+h] s[i], y[i+h] = x[i+h] c[i+h] + x[i] s[i+h], h = d/2. ----
// x is [B, T, H, D]; cos and sin are [Bc, T, D] with Bc 1 or B. `inverse` applies the transposed rotation, which
// is what the backward applies to the output's gradient.

template <typename T>
void rope_apply(const T* x, const T* cos, const T* sin, int64_t b, int64_t t, int64_t heads, int64_t d,
                bool per_row, bool inverse, T* y) {
  const int64_t h = d / 2;
  at::parallel_for(0, b * t * heads, grain(d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t bt = r / heads;
      const int64_t table = ((per_row ? bt / t : 0) * t + bt % t) * d;
      const T* c = cos + table;
      const T* s = sin + table;
      const T* xr = x + r * d;
      T* yr = y + r * d;
      for (int64_t i = 0; i < h; i += kW) {
        const Mask m = Simd::lanes(h - i);
        const V a = load(m, xr + i), z = load(m, xr + i + h);
        const V c1 = load(m, c + i), c2 = load(m, c + i + h), s1 = load(m, s + i), s2 = load(m, s + i + h);
        if (!inverse) {
          store(m, yr + i, Simd::sub(Simd::mul(a, c1), Simd::mul(z, s1)));
          store(m, yr + i + h, Simd::fma(a, s2, Simd::mul(z, c2)));
        } else {
          store(m, yr + i, Simd::fma(z, s2, Simd::mul(a, c1)));
          store(m, yr + i + h, Simd::sub(Simd::mul(z, c2), Simd::mul(a, s1)));
        }
      }
    }
  });
}

// ---- SwiGLU: y = silu(g) * u. ----

inline V sigmoid(V g) {
  const V one = Simd::set1(1.0f);
  return Simd::div(one, Simd::add(one, Simd::exp(Simd::sub(Simd::zero(), g))));
}

template <typename T>
void swiglu_forward(const T* g, const T* u, int64_t count, T* y) {
  at::parallel_for(0, count, 16384, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i += kW) {
      const Mask m = Simd::lanes(end - i);
      const V a = load(m, g + i);
      store(m, y + i, Simd::mul(Simd::mul(a, sigmoid(a)), load(m, u + i)));
    }
  });
}

// dg = dy * u * s * (1 + g (1 - s)), du = dy * g * s, s = sigmoid(g).
template <typename T>
void swiglu_backward(const T* g, const T* u, const T* dy, int64_t count, T* dg, T* du) {
  at::parallel_for(0, count, 16384, [&](int64_t begin, int64_t end) {
    const V one = Simd::set1(1.0f);
    for (int64_t i = begin; i < end; i += kW) {
      const Mask m = Simd::lanes(end - i);
      const V a = load(m, g + i), d = load(m, dy + i);
      const V s = sigmoid(a);
      store(m, du + i, Simd::mul(Simd::mul(d, a), s));
      const V slope = Simd::fma(a, Simd::sub(one, s), one);
      store(m, dg + i, Simd::mul(Simd::mul(Simd::mul(d, load(m, u + i)), s), slope));
    }
  });
}


// ---- Attention softmax: p = softmax(scale * s) over the keys a query may see; keys it may not see get p = 0. ----
// s is [B, KVH, G * Tq, Tk]: the G query heads of each kv head stacked along the query axis, so row r of a batch
// is query r % Tq. `allowed` is [Bm, Tq, Tk] bool (Bm 1 or B), or null for causal attention (key j <= query i).
// A query that may see no key gets all zeros (libtorch's softmax would give NaN, which the backward would spread).

// Lanes [j, j + 16) of a mask row that are set, within `tail`.
inline Mask allowed_lanes(Mask tail, const bool* row) {
  const __m128i bytes = _mm_maskz_loadu_epi8(tail, row);
  return _mm_test_epi8_mask(bytes, bytes);
}

// The lanes of keys [j, j + 16) that query `i` sees: its mask row's, or the causal ones, within the row's length.
inline Mask seen(const bool* row, int64_t i, int64_t j, int64_t tk) {
  const Mask tail = Simd::lanes(tk - j);
  if (row) return allowed_lanes(tail, row + j);
  return j > i ? Mask(0) : Mask(tail & Simd::lanes(i - j + 1));
}

template <typename T>
void softmax_forward(const T* s, const bool* allowed, int64_t rows, int64_t rows_per_batch, bool mask_per_batch,
                     int64_t tq, int64_t tk, float scale, T* p) {
  at::parallel_for(0, rows, grain(tk), [&](int64_t begin, int64_t end) {
    std::vector<float> e(static_cast<size_t>(tk));
    const V sv = Simd::set1(scale);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i = r % tq;
      const bool* row = allowed ? allowed + ((mask_per_batch ? r / rows_per_batch : 0) * tq + i) * tk : nullptr;
      const T* sr = s + r * tk;
      T* pr = p + r * tk;
      V mx = Simd::set1(-INFINITY);
      for (int64_t j = 0; j < tk; j += kW) {
        const Mask m = seen(row, i, j, tk);
        mx = _mm512_mask_max_ps(mx, m, mx, Simd::mul(load(m, sr + j), sv));
      }
      const float top = _mm512_reduce_max_ps(mx);
      if (top == -INFINITY) {
        for (int64_t j = 0; j < tk; j += kW) store(Simd::lanes(tk - j), pr + j, Simd::zero());
        continue;
      }
      const V topv = Simd::set1(top);
      V sum = Simd::zero();
      for (int64_t j = 0; j < tk; j += kW) {
        const Mask m = seen(row, i, j, tk);
        const V x = Simd::keep(m, Simd::exp(Simd::sub(Simd::mul(load(m, sr + j), sv), topv)));
        store(Simd::lanes(tk - j), e.data() + j, x);
        sum = Simd::add(sum, x);
      }
      const V inv = Simd::set1(1.0f / Simd::reduce(sum));
      for (int64_t j = 0; j < tk; j += kW) {
        const Mask m = Simd::lanes(tk - j);
        store(m, pr + j, Simd::mul(load(m, e.data() + j), inv));
      }
    }
  });
}

// ds = scale * p * (dp - sum(p * dp)) per row, from the forward's p (zero where masked, so ds is too).
template <typename T>
void softmax_backward(const T* p, const T* dp, int64_t rows, int64_t tk, float scale, T* ds) {
  at::parallel_for(0, rows, grain(tk), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* pr = p + r * tk;
      const T* gr = dp + r * tk;
      V dot = Simd::zero();
      for (int64_t j = 0; j < tk; j += kW) {
        const Mask m = Simd::lanes(tk - j);
        dot = Simd::fma(load(m, pr + j), load(m, gr + j), dot);
      }
      const V mean = Simd::set1(Simd::reduce(dot));
      const V sv = Simd::set1(scale);
      for (int64_t j = 0; j < tk; j += kW) {
        const Mask m = Simd::lanes(tk - j);
        store(m, ds + r * tk + j, Simd::mul(sv, Simd::mul(load(m, pr + j), Simd::sub(load(m, gr + j), mean))));
      }
    }
  });
}

// ---- The output head over one vocabulary slab (the trainer's head, `VocabSoftmax` on the Rust side). ----
// z is [rows, cols]: the logits of vocabulary columns [start, start + cols), taken over the temperature in fp32
// (zt = z / T). `y` holds each row's target id.

// Folds a slab into each row's running softmax statistics: the maximum `mx`, the sum of e^(zt - mx), the sum
// of e^(zt - mx) * zt (`weighted`, null without entropy), and the target's zt when the slab holds it (`picked`).
template <typename T>
void vocab_softmax_add(const T* z, const int64_t* y, int64_t rows, int64_t cols, int64_t start, float inv_t,
                       float* mx, float* sum, float* weighted, float* picked) {
  at::parallel_for(0, rows, grain(cols), [&](int64_t begin, int64_t end) {
    const V it = Simd::set1(inv_t);
    for (int64_t r = begin; r < end; ++r) {
      const T* zr = z + r * cols;
      V top = Simd::set1(-INFINITY);
      for (int64_t j = 0; j < cols; j += kW) {
        const Mask m = Simd::lanes(cols - j);
        top = _mm512_mask_max_ps(top, m, top, Simd::mul(load(m, zr + j), it));
      }
      const float next = std::max(mx[r], _mm512_reduce_max_ps(top));
      const V nv = Simd::set1(next);
      V s = Simd::zero(), w = Simd::zero();
      for (int64_t j = 0; j < cols; j += kW) {
        const Mask m = Simd::lanes(cols - j);
        const V x = Simd::mul(load(m, zr + j), it);
        const V e = Simd::keep(m, Simd::exp(Simd::sub(x, nv)));
        s = Simd::add(s, e);
        if (weighted) w = Simd::fma(e, x, w);
      }
      const float rescale = std::exp(mx[r] - next);  // 0 for the first slab (mx = -inf)
      sum[r] = sum[r] * rescale + Simd::reduce(s);
      if (weighted) weighted[r] = weighted[r] * rescale + Simd::reduce(w);
      mx[r] = next;
      const int64_t k = y[r] - start;
      if (k >= 0 && k < cols) picked[r] = static_cast<float>(zr[k]) * inv_t;
    }
  });
}

// The loss's gradient by the slab's logits, from each row's logsumexp `lse` and the upstream gradients of its
// logprob (`g_lp`) and, when `mu` is not null, of its entropy (`g_ent`, with mu = sum p zt = lse - H):
// dz = (g_lp (onehot(y) - p) - g_ent p (zt - mu)) / T, p = e^(zt - lse).
template <typename T>
void vocab_logits_grad(const T* z, const int64_t* y, int64_t rows, int64_t cols, int64_t start, float inv_t,
                       const float* lse, const float* g_lp, const float* mu, const float* g_ent, T* dz) {
  at::parallel_for(0, rows, grain(cols), [&](int64_t begin, int64_t end) {
    const V it = Simd::set1(inv_t);
    for (int64_t r = begin; r < end; ++r) {
      const T* zr = z + r * cols;
      const V l = Simd::set1(lse[r]), minus_g = Simd::set1(-g_lp[r]);
      const V m_v = Simd::set1(mu ? mu[r] : 0.0f), minus_ge = Simd::set1(mu ? -g_ent[r] : 0.0f);
      const int64_t k = y[r] - start;
      for (int64_t j = 0; j < cols; j += kW) {
        const Mask m = Simd::lanes(cols - j);
        const V x = Simd::mul(load(m, zr + j), it);
        const V p = Simd::exp(Simd::sub(x, l));
        V g = Simd::mul(p, minus_g);
        if (mu) g = Simd::fma(Simd::mul(p, Simd::sub(x, m_v)), minus_ge, g);
        if (k >= j && k < j + kW) g = _mm512_mask_add_ps(g, Mask(1u << (k - j)), g, Simd::set1(g_lp[r]));
        store(m, dz + r * cols + j, Simd::mul(g, it));
      }
    }
  });
}

}  // namespace avx512
#pragma GCC pop_options

namespace {

using avx512::rms_backward;
using avx512::rms_forward;
using avx512::rope_apply;
using avx512::softmax_backward;
using avx512::softmax_forward;
using avx512::swiglu_backward;
using avx512::swiglu_forward;
using avx512::vocab_logits_grad;
using avx512::vocab_softmax_add;

// Calls `f` with a null pointer of `t`'s element type, fp32 or bf16 (the ops check the dtype first), so that each
// op's kernel call is written once for both.
template <typename F>
void by_dtype(const at::Tensor& t, F f) {
  if (t.scalar_type() == at::kFloat)
    f(static_cast<float*>(nullptr));
  else
    f(static_cast<c10::BFloat16*>(nullptr));
}

struct RmsNorm : public Function<RmsNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w_in, double eps) {
    check_cpu(x_in, "rms_norm input");
    TORCH_CHECK(w_in.scalar_type() == x_in.scalar_type(), "rms_norm weight dtype ", w_in.scalar_type(),
                " differs from the input's ", x_in.scalar_type());
    const at::Tensor x = x_in.contiguous();
    const at::Tensor w = w_in.contiguous();
    const int64_t n = x.size(-1);
    TORCH_CHECK(w.numel() == n, "rms_norm weight has ", w.numel(), " elements for rows of ", n);
    const int64_t rows = n == 0 ? 0 : x.numel() / n;
    at::Tensor y = at::empty_like(x);
    at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
    by_dtype(x, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      rms_forward(x.data_ptr<T>(), w.data_ptr<T>(), rows, n, eps, y.data_ptr<T>(), rstd.data_ptr<float>());
    });
    ctx->save_for_backward({x, w, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &rstd = saved[2];
    const at::Tensor dy = grads[0].to(x.scalar_type()).contiguous();
    const int64_t n = x.size(-1);
    const int64_t rows = n == 0 ? 0 : x.numel() / n;
    at::Tensor dx = at::empty_like(x);
    at::Tensor dw = at::zeros({n}, x.options().dtype(at::kFloat));
    by_dtype(x, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      rms_backward(x.data_ptr<T>(), w.data_ptr<T>(), rstd.data_ptr<float>(), dy.data_ptr<T>(), rows, n,
                   dx.data_ptr<T>(), dw.data_ptr<float>());
    });
    return {dx, dw.to(w.scalar_type()).view(w.sizes()), at::Tensor()};
  }
};

at::Tensor rope_run(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse) {
  const int64_t b = x.size(0), t = x.size(1), heads = x.size(2), d = x.size(3);
  at::Tensor y = at::empty_like(x);
  const bool per_row = cos.size(0) != 1;
  by_dtype(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rope_apply(x.data_ptr<T>(), cos.data_ptr<T>(), sin.data_ptr<T>(), b, t, heads, d, per_row, inverse,
               y.data_ptr<T>());
  });
  return y;
}

struct Rope : public Function<Rope> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& cos_in,
                            const at::Tensor& sin_in) {
    check_cpu(x_in, "rope input");
    TORCH_CHECK(x_in.dim() == 4 && x_in.size(3) % 2 == 0, "rope input must be [B, T, H, D] with D even, got ",
                x_in.sizes());
    const at::Tensor x = x_in.contiguous();
    const at::Tensor cos = cos_in.to(x.scalar_type()).contiguous();
    const at::Tensor sin = sin_in.to(x.scalar_type()).contiguous();
    TORCH_CHECK(cos.dim() == 3 && (cos.size(0) == 1 || cos.size(0) == x.size(0)) && cos.size(1) == x.size(1) &&
                    cos.size(2) == x.size(3) && sin.sizes() == cos.sizes(),
                "rope tables must be [1 or B, T, D] for input ", x.sizes(), ", got ", cos.sizes(), " and ",
                sin.sizes());
    ctx->save_for_backward({cos, sin});
    return rope_run(x, cos, sin, false);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor dy = grads[0].to(saved[0].scalar_type()).contiguous();
    return {rope_run(dy, saved[0], saved[1], true), at::Tensor(), at::Tensor()};
  }
};

struct SwiGlu : public Function<SwiGlu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& g_in, const at::Tensor& u_in) {
    check_cpu(g_in, "swiglu gate");
    TORCH_CHECK(u_in.sizes() == g_in.sizes() && u_in.scalar_type() == g_in.scalar_type(), "swiglu up ",
                u_in.sizes(), " ", u_in.scalar_type(), " does not match the gate ", g_in.sizes(), " ",
                g_in.scalar_type());
    const at::Tensor g = g_in.contiguous();
    const at::Tensor u = u_in.contiguous();
    at::Tensor y = at::empty_like(g);
    by_dtype(g, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      swiglu_forward(g.data_ptr<T>(), u.data_ptr<T>(), g.numel(), y.data_ptr<T>());
    });
    ctx->save_for_backward({g, u});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &g = saved[0], &u = saved[1];
    const at::Tensor dy = grads[0].to(g.scalar_type()).contiguous();
    at::Tensor dg = at::empty_like(g);
    at::Tensor du = at::empty_like(u);
    by_dtype(g, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      swiglu_backward(g.data_ptr<T>(), u.data_ptr<T>(), dy.data_ptr<T>(), g.numel(), dg.data_ptr<T>(),
                      du.data_ptr<T>());
    });
    return {dg, du};
  }
};

struct AttentionSoftmax : public Function<AttentionSoftmax> {
  // s: [B, KVH, G * Tq, Tk]; allowed: bool broadcastable to [Bm, 1, Tq, Tk] with Bm 1 or B, or, for causal
  // attention, an empty 1-D tensor (autograd's `apply` takes no undefined tensor among its inputs).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& s_in, const at::Tensor& allowed_in, int64_t tq,
                            double scale) {
    check_cpu(s_in, "attention scores");
    TORCH_CHECK(s_in.dim() == 4 && tq > 0 && s_in.size(2) % tq == 0, "attention scores must be [B, KVH, G*Tq, Tk] "
                "for Tq ", tq, ", got ", s_in.sizes());
    const at::Tensor s = s_in.contiguous();
    const int64_t b = s.size(0), tk = s.size(3);
    at::Tensor allowed;
    if (allowed_in.dim() != 1 || allowed_in.numel() != 0) {
      TORCH_CHECK(allowed_in.dim() == 4 && (allowed_in.size(0) == 1 || allowed_in.size(0) == b),
                  "attention mask must broadcast to [", b, ", 1, ", tq, ", ", tk, "], got ", allowed_in.sizes());
      allowed = allowed_in.to(at::kBool).expand({allowed_in.size(0), 1, tq, tk}).contiguous();
    } else {
      TORCH_CHECK(tq == tk, "causal attention needs as many queries as keys, got ", tq, " and ", tk);
    }
    at::Tensor p = at::empty_like(s);
    const int64_t rows = s.numel() / std::max<int64_t>(tk, 1);
    by_dtype(s, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      softmax_forward(s.data_ptr<T>(), allowed.defined() ? allowed.data_ptr<bool>() : nullptr, rows,
                      b == 0 ? 0 : rows / b, allowed.defined() && allowed.size(0) == b && b > 1, tq, tk,
                      static_cast<float>(scale), p.data_ptr<T>());
    });
    ctx->save_for_backward({p});
    ctx->saved_data["scale"] = scale;
    return p;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor p = ctx->get_saved_variables()[0];
    const at::Tensor dp = grads[0].to(p.scalar_type()).contiguous();
    const int64_t tk = p.size(3);
    at::Tensor ds = at::empty_like(p);
    by_dtype(p, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      softmax_backward(p.data_ptr<T>(), dp.data_ptr<T>(), p.numel() / std::max<int64_t>(tk, 1), tk,
                       static_cast<float>(ctx->saved_data["scale"].toDouble()), ds.data_ptr<T>());
    });
    return {ds, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Runs `op`, storing its result as a new handle in `*out`; a C++ exception becomes -1 and `last_error`.
template <typename Op>
int run(at::Tensor** out, Op op) {
  try {
    *out = new at::Tensor(op());
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return -1;
  }
}

// Checks for the vocabulary-slab kernels: logits [rows, cols] fp32 or bf16, targets int64 and fp32 row vectors
// (`what` names each), all contiguous on the CPU.
void check_slab(const at::Tensor& z, const at::Tensor& y,
                std::initializer_list<std::pair<const at::Tensor*, const char*>> rows) {
  check_cpu(z, "slab logits");
  TORCH_CHECK(z.dim() == 2 && z.is_contiguous(), "slab logits must be contiguous [rows, cols], got ", z.sizes());
  TORCH_CHECK(y.scalar_type() == at::kLong && y.dim() == 1 && y.size(0) == z.size(0) && y.is_contiguous(),
              "slab targets must be ", z.size(0), " contiguous int64 ids, got ", y.sizes(), " ", y.scalar_type());
  for (const auto& [t, what] : rows)
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->dim() == 1 && t->size(0) == z.size(0) && t->is_contiguous(),
                what, " must be ", z.size(0), " contiguous fp32 values, got ", t->sizes(), " ", t->scalar_type());
}

// Runs `op` for its effect; a C++ exception becomes -1 and `last_error`.
template <typename Op>
int run_status(Op op) {
  try {
    op();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return -1;
  }
}

}  // namespace

extern "C" {

const char* trinity_train_op_error() { return last_error.c_str(); }

// 1 when this CPU runs the kernels (AVX-512 F, BW, VL and DQ), else 0.
int trinity_train_ops_usable() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

int trinity_rms_norm(at::Tensor* x, at::Tensor* w, double eps, at::Tensor** out) {
  return run(out, [&] { return RmsNorm::apply(*x, *w, eps); });
}

int trinity_rope(at::Tensor* x, at::Tensor* cos, at::Tensor* sin, at::Tensor** out) {
  return run(out, [&] { return Rope::apply(*x, *cos, *sin); });
}

int trinity_swiglu(at::Tensor* g, at::Tensor* u, at::Tensor** out) {
  return run(out, [&] { return SwiGlu::apply(*g, *u); });
}

// allowed: null for causal attention.
int trinity_attention_softmax(at::Tensor* s, at::Tensor* allowed, int64_t tq, double scale, at::Tensor** out) {
  return run(out, [&] {
    return AttentionSoftmax::apply(*s, allowed ? *allowed : at::empty({0}, at::kBool), tq, scale);
  });
}

// weighted: null without entropy.
int trinity_vocab_softmax_add(at::Tensor* z, at::Tensor* y, int64_t start, double temperature, at::Tensor* mx,
                              at::Tensor* sum, at::Tensor* weighted, at::Tensor* picked) {
  return run_status([&] {
    check_slab(*z, *y, {{mx, "running maxima"}, {sum, "running sums"}, {picked, "picked logits"}});
    if (weighted) check_slab(*z, *y, {{weighted, "running weighted sums"}});
    by_dtype(*z, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      vocab_softmax_add(z->data_ptr<T>(), y->data_ptr<int64_t>(), z->size(0), z->size(1), start,
                        static_cast<float>(1.0 / temperature), mx->data_ptr<float>(), sum->data_ptr<float>(),
                        weighted ? weighted->data_ptr<float>() : nullptr, picked->data_ptr<float>());
    });
  });
}

// mu and g_ent: both null when the loss does not depend on the entropy.
int trinity_vocab_logits_grad(at::Tensor* z, at::Tensor* y, int64_t start, double temperature, at::Tensor* lse,
                              at::Tensor* g_lp, at::Tensor* mu, at::Tensor* g_ent, at::Tensor** out) {
  return run(out, [&] {
    check_slab(*z, *y, {{lse, "logsumexps"}, {g_lp, "logprob gradients"}});
    if (mu) check_slab(*z, *y, {{mu, "entropy means"}, {g_ent, "entropy gradients"}});
    at::Tensor dz = at::empty_like(*z);
    by_dtype(*z, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      vocab_logits_grad(z->data_ptr<T>(), y->data_ptr<int64_t>(), z->size(0), z->size(1), start,
                        static_cast<float>(1.0 / temperature), lse->data_ptr<float>(), g_lp->data_ptr<float>(),
                        mu ? mu->data_ptr<float>() : nullptr, mu ? g_ent->data_ptr<float>() : nullptr,
                        dz.data_ptr<T>());
    });
    return dz;
  });
}

}  // extern "C"
