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
// (forward 0.38-0.41 -> 0.29 s, backward 1.29-1.44 -> 1.08-1.10 s); fp32 3.13 -> 2.99 s. On 2 cores of an AMD
// EPYC with AVX2 only, fp32 at the same shape, forward + backward of one layer's op: RMSNorm 1.8-2.6 ms -> 0.72-0.87
// ms, SwiGLU 4.4-5.2 ms -> 3.4-4.5 ms (the whole iteration, ~7 s of mostly matmuls, moves within the noise).
//
// The kernels are written once (train_kernels.inc) and compiled for AVX-512 and for AVX2 + FMA, each with its own
// registers, as the decode step's are: one binary runs on either CPU, and the caller picks the set.
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
#include <cstring>
#include <exception>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "error_message.h"
#include "packed_gemm.h"

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

// The kernels (train_kernels.inc), compiled twice: for AVX-512 (16 lanes) and for AVX2 + FMA (8 lanes), each with
// the element access below for its registers. The Rust side picks the set from the CPU for every call
// (`train_ops::kernel_set`) and passes it in; a CPU with neither keeps libtorch's ops.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
namespace avx512 {

#include "simd_avx512.inc"

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
// The lanes of `tail` whose byte in `row` (a bool mask row) is set.
inline Mask bytes_set(Mask tail, const bool* row) {
  const __m128i bytes = _mm_maskz_loadu_epi8(tail, row);
  return _mm_test_epi8_mask(bytes, bytes);
}

#include "train_kernels.inc"

}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {

#include "simd_avx2.inc"

// How many elements from the first a masked access may touch: its highest lane + 1. Every mask the kernels build
// lies within its row's tail, so those elements are in bounds; AVX2 has no masked 16-bit or byte loads, so the
// accesses below copy that many and mask the rest.
inline int span(Mask m) {
  const unsigned bits = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(m)));
  return bits == 0 ? 0 : 32 - __builtin_clz(bits);
}

// Loads and stores of fp32 lanes from either element type; bf16 rounds to nearest even, NaN stays NaN.
inline V load(Mask m, const float* p) { return Simd::load(m, p); }
inline V load(Mask m, const c10::BFloat16* p) {
  const int n = span(m);
  __m128i h;
  if (n == 8) {
    h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  } else {
    uint16_t part[8] = {};
    std::memcpy(part, p, sizeof(uint16_t) * static_cast<size_t>(n));
    h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(part));
  }
  return Simd::keep(m, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
}
// The 8 lanes' bf16 bit patterns, packed into 16-bit words.
inline __m128i bf16_bits(V v) {
  const __m256i b = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i bits = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
}
inline void store(Mask m, float* p, V v) { Simd::store(m, p, v); }
inline void store(Mask m, c10::BFloat16* p, V v) {
  const __m128i h = bf16_bits(v);
  if (Simd::whole(m)) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
    return;
  }
  const unsigned bits = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(m)));
  uint16_t words[8];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(words), h);
  for (int i = 0; i < 8; ++i)
    if (bits >> i & 1u) std::memcpy(p + i, words + i, sizeof(uint16_t));
}
// v rounded to the element type and back: what storing and reloading it would give.
inline V round_as(const float*, V v) { return v; }
inline V round_as(const c10::BFloat16*, V v) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bf16_bits(v)), 16));
}
// The lanes of `tail` whose byte in `row` (a bool mask row) is set.
inline Mask bytes_set(Mask tail, const bool* row) {
  int64_t bytes = 0;
  std::memcpy(&bytes, row, static_cast<size_t>(span(tail)));
  const __m256i wide = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes));
  return _mm256_andnot_si256(_mm256_cmpeq_epi32(wide, _mm256_setzero_si256()), tail);
}

#include "train_kernels.inc"

}  // namespace avx2
#pragma GCC pop_options

namespace {

// Calls `f` with the kernels of instruction set `isa` (`trinity::Isa`'s numbering, which Rust's `packed::Isa`
// shares; a `Kernels` value of that set's namespace) and a null pointer of `t`'s element type, fp32 or bf16 (the
// ops check the dtype first), so that each op's kernel call is written once for both sets and both types.
template <typename F>
void kernels(int64_t isa, const at::Tensor& t, F f) {
  const auto set = static_cast<trinity::Isa>(isa);
  TORCH_CHECK(set == trinity::Isa::kAvx512 || set == trinity::Isa::kAvx2, "unknown instruction set ", isa);
  const bool fp32 = t.scalar_type() == at::kFloat;
  if (set == trinity::Isa::kAvx2) {
    if (fp32)
      f(avx2::Kernels{}, static_cast<float*>(nullptr));
    else
      f(avx2::Kernels{}, static_cast<c10::BFloat16*>(nullptr));
  } else if (fp32) {
    f(avx512::Kernels{}, static_cast<float*>(nullptr));
  } else {
    f(avx512::Kernels{}, static_cast<c10::BFloat16*>(nullptr));
  }
}


struct RmsNorm : public Function<RmsNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w_in, double eps,
                            int64_t isa) {
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
    kernels(isa, x, [&](auto k, auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      decltype(k)::rms_forward(x.data_ptr<T>(), w.data_ptr<T>(), rows, n, eps, y.data_ptr<T>(),
                               rstd.data_ptr<float>());
    });
    ctx->save_for_backward({x, w, rstd});
    ctx->saved_data["isa"] = isa;
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
    kernels(ctx->saved_data["isa"].toInt(), x, [&](auto k, auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      decltype(k)::rms_backward(x.data_ptr<T>(), w.data_ptr<T>(), rstd.data_ptr<float>(), dy.data_ptr<T>(), rows,
                                n, dx.data_ptr<T>(), dw.data_ptr<float>());
    });
    return {dx, dw.to(w.scalar_type()).view(w.sizes()), at::Tensor(), at::Tensor()};
  }
};

at::Tensor rope_run(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse, int64_t isa) {
  const int64_t b = x.size(0), t = x.size(1), heads = x.size(2), d = x.size(3);
  at::Tensor y = at::empty_like(x);
  const bool per_row = cos.size(0) != 1;
  kernels(isa, x, [&](auto k, auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    decltype(k)::rope_apply(x.data_ptr<T>(), cos.data_ptr<T>(), sin.data_ptr<T>(), b, t, heads, d, per_row,
                            inverse, y.data_ptr<T>());
  });
  return y;
}

struct Rope : public Function<Rope> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& cos_in,
                            const at::Tensor& sin_in, int64_t isa) {
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
    ctx->saved_data["isa"] = isa;
    return rope_run(x, cos, sin, false, isa);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor dy = grads[0].to(saved[0].scalar_type()).contiguous();
    return {rope_run(dy, saved[0], saved[1], true, ctx->saved_data["isa"].toInt()), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

struct SwiGlu : public Function<SwiGlu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& g_in, const at::Tensor& u_in, int64_t isa) {
    check_cpu(g_in, "swiglu gate");
    TORCH_CHECK(u_in.sizes() == g_in.sizes() && u_in.scalar_type() == g_in.scalar_type(), "swiglu up ",
                u_in.sizes(), " ", u_in.scalar_type(), " does not match the gate ", g_in.sizes(), " ",
                g_in.scalar_type());
    const at::Tensor g = g_in.contiguous();
    const at::Tensor u = u_in.contiguous();
    at::Tensor y = at::empty_like(g);
    kernels(isa, g, [&](auto k, auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      decltype(k)::swiglu_forward(g.data_ptr<T>(), u.data_ptr<T>(), g.numel(), y.data_ptr<T>());
    });
    ctx->save_for_backward({g, u});
    ctx->saved_data["isa"] = isa;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &g = saved[0], &u = saved[1];
    const at::Tensor dy = grads[0].to(g.scalar_type()).contiguous();
    at::Tensor dg = at::empty_like(g);
    at::Tensor du = at::empty_like(u);
    kernels(ctx->saved_data["isa"].toInt(), g, [&](auto k, auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      decltype(k)::swiglu_backward(g.data_ptr<T>(), u.data_ptr<T>(), dy.data_ptr<T>(), g.numel(),
                                   dg.data_ptr<T>(), du.data_ptr<T>());
    });
    return {dg, du, at::Tensor()};
  }
};

struct AttentionSoftmax : public Function<AttentionSoftmax> {
  // s: [B, KVH, G * Tq, Tk]; allowed: bool broadcastable to [Bm, 1, Tq, Tk] with Bm 1 or B, or, for causal
  // attention, an empty 1-D tensor (autograd's `apply` takes no undefined tensor among its inputs).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& s_in, const at::Tensor& allowed_in, int64_t tq,
                            double scale, int64_t isa) {
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
    kernels(isa, s, [&](auto k, auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      decltype(k)::softmax_forward(s.data_ptr<T>(), allowed.defined() ? allowed.data_ptr<bool>() : nullptr, rows,
                                   b == 0 ? 0 : rows / b, allowed.defined() && allowed.size(0) == b && b > 1, tq,
                                   tk, static_cast<float>(scale), p.data_ptr<T>());
    });
    ctx->save_for_backward({p});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["isa"] = isa;
    return p;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor p = ctx->get_saved_variables()[0];
    const at::Tensor dp = grads[0].to(p.scalar_type()).contiguous();
    const int64_t tk = p.size(3);
    at::Tensor ds = at::empty_like(p);
    kernels(ctx->saved_data["isa"].toInt(), p, [&](auto k, auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      decltype(k)::softmax_backward(p.data_ptr<T>(), dp.data_ptr<T>(), p.numel() / std::max<int64_t>(tk, 1), tk,
                                    static_cast<float>(ctx->saved_data["scale"].toDouble()), ds.data_ptr<T>());
    });
    return {ds, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Runs `op`, storing its result as a new handle in `*out`; a C++ exception becomes -1 and `last_error`.
template <typename Op>
int run(at::Tensor** out, Op op) {
  try {
    *out = new at::Tensor(op());
    return 0;
  } catch (const std::exception& e) {
    last_error = error_message(e);
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
    last_error = error_message(e);
    return -1;
  }
}

}  // namespace

extern "C" {

const char* trinity_train_op_error() { return last_error.c_str(); }

// Every entry point takes the instruction set to run on first (1: AVX-512 F, BW, VL and DQ; 2: AVX2 + FMA), which
// the caller checked the CPU has.

int trinity_rms_norm(int64_t isa, at::Tensor* x, at::Tensor* w, double eps, at::Tensor** out) {
  return run(out, [&] { return RmsNorm::apply(*x, *w, eps, isa); });
}

int trinity_rope(int64_t isa, at::Tensor* x, at::Tensor* cos, at::Tensor* sin, at::Tensor** out) {
  return run(out, [&] { return Rope::apply(*x, *cos, *sin, isa); });
}

int trinity_swiglu(int64_t isa, at::Tensor* g, at::Tensor* u, at::Tensor** out) {
  return run(out, [&] { return SwiGlu::apply(*g, *u, isa); });
}

// allowed: null for causal attention.
int trinity_attention_softmax(int64_t isa, at::Tensor* s, at::Tensor* allowed, int64_t tq, double scale,
                              at::Tensor** out) {
  return run(out, [&] {
    return AttentionSoftmax::apply(*s, allowed ? *allowed : at::empty({0}, at::kBool), tq, scale, isa);
  });
}

// weighted: null without entropy.
int trinity_vocab_softmax_add(int64_t isa, at::Tensor* z, at::Tensor* y, int64_t start, double temperature,
                              at::Tensor* mx, at::Tensor* sum, at::Tensor* weighted, at::Tensor* picked) {
  return run_status([&] {
    check_slab(*z, *y, {{mx, "running maxima"}, {sum, "running sums"}, {picked, "picked logits"}});
    if (weighted) check_slab(*z, *y, {{weighted, "running weighted sums"}});
    kernels(isa, *z, [&](auto k, auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      decltype(k)::vocab_softmax_add(z->data_ptr<T>(), y->data_ptr<int64_t>(), z->size(0), z->size(1), start,
                                     static_cast<float>(1.0 / temperature), mx->data_ptr<float>(),
                                     sum->data_ptr<float>(), weighted ? weighted->data_ptr<float>() : nullptr,
                                     picked->data_ptr<float>());
    });
  });
}

// mu and g_ent: both null when the loss does not depend on the entropy.
int trinity_vocab_logits_grad(int64_t isa, at::Tensor* z, at::Tensor* y, int64_t start, double temperature,
                              at::Tensor* lse, at::Tensor* g_lp, at::Tensor* mu, at::Tensor* g_ent,
                              at::Tensor** out) {
  return run(out, [&] {
    check_slab(*z, *y, {{lse, "logsumexps"}, {g_lp, "logprob gradients"}});
    if (mu) check_slab(*z, *y, {{mu, "entropy means"}, {g_ent, "entropy gradients"}});
    at::Tensor dz = at::empty_like(*z);
    kernels(isa, *z, [&](auto k, auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      decltype(k)::vocab_logits_grad(z->data_ptr<T>(), y->data_ptr<int64_t>(), z->size(0), z->size(1), start,
                                     static_cast<float>(1.0 / temperature), lse->data_ptr<float>(),
                                     g_lp->data_ptr<float>(), mu ? mu->data_ptr<float>() : nullptr,
                                     mu ? g_ent->data_ptr<float>() : nullptr, dz.data_ptr<T>());
    });
    return dz;
  });
}

}  // extern "C"
