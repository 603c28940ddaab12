//! RMSNorm, RoPE, the SwiGLU product and the attention softmax as single fused kernels each way on x86-64 CPUs
//! with AVX-512 or AVX2 + FMA (`csrc/train_ops.cpp` says why), with the libtorch ops they replace as the path
//! everywhere else: other CPUs and devices, other dtypes, and builds without libtorch's headers or off x86-64.
//!
//! The fused kernels compute in fp32 and round once to the tensor's dtype; the libtorch path rounds bf16 after
//! every op. Both follow transformers' order for RMSNorm: normalize in fp32, round, then scale by the weight.

#[cfg(train_ops)]
use tch::Device;
use tch::{Kind, Tensor};

use crate::error::{ModelError, Result};
#[cfg(train_ops)]
use crate::packed::Isa;

#[cfg(train_ops)]
pub(crate) mod ffi {
    use std::ffi::{c_char, c_void};

    unsafe extern "C" {
        pub(super) fn trinity_train_op_error() -> *const c_char;
        pub(super) fn trinity_rms_norm(
            isa: i64,
            x: *mut c_void,
            w: *mut c_void,
            eps: f64,
            out: *mut *mut c_void,
        ) -> i32;
        pub(super) fn trinity_rope(
            isa: i64,
            x: *mut c_void,
            cos: *mut c_void,
            sin: *mut c_void,
            out: *mut *mut c_void,
        ) -> i32;
        pub(super) fn trinity_swiglu(isa: i64, g: *mut c_void, u: *mut c_void, out: *mut *mut c_void) -> i32;
        pub(super) fn trinity_attention_softmax(
            isa: i64,
            s: *mut c_void,
            allowed: *mut c_void,
            tq: i64,
            scale: f64,
            out: *mut *mut c_void,
        ) -> i32;
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn trinity_vocab_softmax_add(
            isa: i64,
            z: *mut c_void,
            y: *mut c_void,
            start: i64,
            temperature: f64,
            max: *mut c_void,
            sum: *mut c_void,
            weighted: *mut c_void,
            picked: *mut c_void,
        ) -> i32;
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn trinity_vocab_logits_grad(
            isa: i64,
            z: *mut c_void,
            y: *mut c_void,
            start: i64,
            temperature: f64,
            lse: *mut c_void,
            g_lp: *mut c_void,
            mu: *mut c_void,
            g_ent: *mut c_void,
            out: *mut *mut c_void,
        ) -> i32;
    }
}

/// The instruction sets this CPU runs the fused kernels on, fastest first: AVX-512 (F, BW, VL and DQ), then AVX2
/// with FMA.
#[cfg(train_ops)]
pub(crate) fn kernel_sets() -> &'static [Isa] {
    static SETS: std::sync::OnceLock<Vec<Isa>> = std::sync::OnceLock::new();
    SETS.get_or_init(|| {
        use std::arch::is_x86_feature_detected as has;
        let mut sets = Vec::new();
        if has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512dq") && has!("fma") {
            sets.push(Isa::Avx512);
        }
        if has!("avx2") && has!("fma") {
            sets.push(Isa::Avx2);
        }
        sets
    })
}

/// The instruction set the fused kernels run `x` on, or `None` where libtorch's ops do: `x` not on the CPU or
/// neither fp32 nor bf16, or a CPU with neither set.
#[cfg(train_ops)]
pub(crate) fn kernel_set(x: &Tensor) -> Option<Isa> {
    if x.device() != Device::Cpu || !matches!(x.kind(), Kind::Float | Kind::BFloat16) {
        return None;
    }
    #[cfg(test)]
    if let Some(forced) = testing::FORCED.get() {
        return forced;
    }
    kernel_sets().first().copied()
}

/// Tests run every path this CPU has: each instruction set's kernels and libtorch's ops.
#[cfg(all(test, train_ops))]
pub(crate) mod testing {
    use std::cell::Cell;

    use super::{Isa, kernel_sets};

    thread_local! {
        /// The path `kernel_set` gives on this thread while a test forces one: `Some(None)` is libtorch's.
        pub(super) static FORCED: Cell<Option<Option<Isa>>> = const { Cell::new(None) };
    }

    /// Every path: each instruction set this CPU has, then libtorch's ops (`None`).
    pub(crate) fn paths() -> Vec<Option<Isa>> {
        kernel_sets().iter().copied().map(Some).chain([None]).collect()
    }

    /// While alive, this thread's fused ops take `path`; the ops' backward runs on the set its forward took.
    pub(crate) struct Forced(Option<Option<Isa>>);

    impl Forced {
        pub(crate) fn new(path: Option<Isa>) -> Self {
            Forced(FORCED.replace(Some(path)))
        }
    }

    impl Drop for Forced {
        fn drop(&mut self) {
            FORCED.set(self.0);
        }
    }
}

/// Calls one fused op and takes ownership of the tensor it returns.
#[cfg(train_ops)]
pub(crate) fn call(op: &str, f: impl FnOnce(*mut *mut std::ffi::c_void) -> i32) -> Result<Tensor> {
    let mut out = std::ptr::null_mut();
    if f(&mut out) == 0 && !out.is_null() {
        // SAFETY: on success the C++ side stored a new `at::Tensor*` that nothing else owns.
        return Ok(unsafe { Tensor::from_ptr(out.cast()) });
    }
    Err(failure(op))
}

/// Calls one fused op that works in place (its status only).
#[cfg(train_ops)]
pub(crate) fn call_in_place(op: &str, f: impl FnOnce() -> i32) -> Result<()> {
    if f() == 0 { Ok(()) } else { Err(failure(op)) }
}

/// The error of the fused op that just failed on this thread.
#[cfg(train_ops)]
fn failure(op: &str) -> ModelError {
    // SAFETY: the message is this thread's NUL-terminated error string, copied before any other call.
    let message = unsafe { std::ffi::CStr::from_ptr(ffi::trinity_train_op_error()) }.to_string_lossy().into_owned();
    ModelError::InvalidInput(format!("fused {op}: {message}"))
}

#[cfg(train_ops)]
pub(crate) fn handle(t: &Tensor) -> *mut std::ffi::c_void {
    t.as_ptr() as *mut std::ffi::c_void
}

/// `w · round(x · rsqrt(mean(x²) + eps))` over the last dimension of `x`; `w` has that dimension's size.
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    #[cfg(train_ops)]
    if let Some(isa) = kernel_set(x).filter(|_| w.kind() == x.kind()) {
        // SAFETY: both handles are live tch tensors borrowed for the call; the C++ side only reads them.
        return call("rms_norm", |out| unsafe { ffi::trinity_rms_norm(isa as i64, handle(x), handle(w), eps, out) });
    }
    if x.kind() == Kind::Float {
        // libtorch's fused kernel: one pass instead of five ops.
        let dim = x.size().last().copied().unwrap_or(0);
        return Ok(x.f_rms_norm([dim], Some(w), Some(eps))?);
    }
    let xf = x.f_to_kind(Kind::Float)?;
    let var = xf.f_pow_tensor_scalar(2)?.f_mean_dim(-1, true, Kind::Float)?;
    let normed = xf * (var + eps).f_rsqrt()?;
    Ok(w * normed.f_to_kind(x.kind())?)
}

/// "Rotate half" RoPE of `x` `[B, T, H, D]` by the tables `cos`, `sin` `[1 or B, T, D]` (no gradient to them).
pub(crate) fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    #[cfg(train_ops)]
    if let Some(isa) = kernel_set(x).filter(|_| x.dim() == 4 && cos.kind() == x.kind() && sin.kind() == x.kind()) {
        // SAFETY: live tch tensors borrowed for the call; the C++ side only reads them.
        return call("rope", |out| unsafe { ffi::trinity_rope(isa as i64, handle(x), handle(cos), handle(sin), out) });
    }
    crate::rope::apply(x, cos, sin)
}

/// `silu(gate) · up`, elementwise.
pub(crate) fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    #[cfg(train_ops)]
    if let Some(isa) = kernel_set(gate).filter(|_| up.kind() == gate.kind() && up.size() == gate.size()) {
        // SAFETY: live tch tensors borrowed for the call; the C++ side only reads them.
        return call("swiglu", |out| unsafe { ffi::trinity_swiglu(isa as i64, handle(gate), handle(up), out) });
    }
    Ok(gate.f_silu()? * up)
}

/// The attention probabilities `softmax(scale · s)` for scores `s` `[B, KVH, G·Tq, Tk]` in which the `G` query
/// heads of each kv head are stacked along the query axis (row `r` is query `r % Tq`), over the keys each query
/// may see: `allowed` (bool, broadcastable to `[B or 1, 1, Tq, Tk]`) or, without it, causally. In `s`'s dtype,
/// computed in fp32 (transformers' eager order: the scores scaled, softmax in fp32, rounded once).
///
/// The fused kernel is one pass each way where libtorch runs five forward (scale, mask, cast, softmax, cast) and
/// as many backward, and it saves only the rounded probabilities. A query that may see no key gets zeros on both
/// paths (libtorch's softmax alone would give NaN there, and its backward would spread it); the decoder never
/// builds such a mask, but a caller's mask may.
pub(crate) fn attention_softmax(s: &Tensor, allowed: Option<&Tensor>, tq: i64, scale: f64) -> Result<Tensor> {
    #[cfg(train_ops)]
    if let Some(isa) = kernel_set(s) {
        let mask = allowed.map_or(std::ptr::null_mut(), handle);
        // SAFETY: live tch tensors (or null for no mask) borrowed for the call; the C++ side only reads them.
        return call("attention_softmax", |out| unsafe {
            ffi::trinity_attention_softmax(isa as i64, handle(s), mask, tq, scale, out)
        });
    }
    let [_, _, rows, tk] = s.size()[..] else {
        return Err(ModelError::InvalidInput(format!("attention scores {:?} are not 4-D", s.size())));
    };
    let causal_mask;
    let allowed = match allowed {
        Some(m) => m,
        None => {
            causal_mask = crate::attention::causal(tk, s.device())?.f_view([1, 1, tq, tk])?;
            &causal_mask
        }
    };
    // The mask per query, repeated for the group's heads: `[B or 1, 1, G·Tq, Tk]`, true where masked out.
    let lead = allowed.size()[0];
    let blocked = allowed.f_logical_not()?.f_expand([lead, 1, tq, tk], false)?.f_repeat([1, 1, rows / tq, 1])?;
    let probs = (s * scale).f_masked_fill(&blocked, f64::NEG_INFINITY)?.f_softmax(-1, Kind::Float)?;
    // NaN only in the rows of queries that see no key; their gradient is zero either way (masked_fill's).
    Ok(probs.f_nan_to_num(0.0, 0.0, 0.0)?.f_to_kind(s.kind())?)
}

#[cfg(all(test, train_ops))]
mod tests {
    use super::*;

    /// The spelled-out ops in fp32: the reference both dtypes are checked against.
    fn reference(op: &str, inputs: &[Tensor]) -> Tensor {
        let x = &inputs[0];
        match op {
            "rms_norm" => {
                let var = x.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float);
                &inputs[1] * (x * (var + 1e-5).rsqrt())
            }
            "rope" => {
                let half = x.size()[3] / 2;
                let rotated = Tensor::cat(&[&x.narrow(-1, half, half).neg(), &x.narrow(-1, 0, half)], -1);
                x * inputs[1].unsqueeze(2) + rotated * inputs[2].unsqueeze(2)
            }
            _ => x.silu() * &inputs[1],
        }
    }

    fn ours(op: &str, inputs: &[Tensor]) -> Tensor {
        match op {
            "rms_norm" => rms_norm(&inputs[0], &inputs[1], 1e-5),
            "rope" => rope(&inputs[0], &inputs[1], &inputs[2]),
            _ => swiglu(&inputs[0], &inputs[1]),
        }
        .unwrap()
    }

    /// Each fused op against the spelled-out fp32 ops, in values and in the gradients of every input that takes
    /// one, on every path this CPU has: exact to fp32 rounding in fp32, to bf16 rounding in bf16. Row lengths that
    /// are not a multiple of either vector width exercise the tails.
    #[test]
    fn fused_ops_match_the_spelled_out_ops_in_values_and_gradients() {
        tch::manual_seed(11);
        let (b, t, h, d) = (3, 5, 4, 20);
        let cpu = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, Device::Cpu));
        let angles = cpu(&[b, t, d / 2]);
        let angles = Tensor::cat(&[&angles, &angles], -1);
        let cases: Vec<(&str, Vec<Tensor>, usize)> = vec![
            ("rms_norm", vec![cpu(&[b, t, 37]) * 3.0, cpu(&[37]) + 1.0], 2),
            ("rms_norm", vec![cpu(&[b, t, h, d]), cpu(&[d])], 2),
            ("rope", vec![cpu(&[b, t, h, d]), angles.cos(), angles.sin()], 1),
            ("rope", vec![cpu(&[1, t, h, d]), angles.cos().narrow(0, 0, 1), angles.sin().narrow(0, 0, 1)], 1),
            ("swiglu", vec![cpu(&[b, t, 40]) * 2.0, cpu(&[b, t, 40])], 2),
            ("swiglu", vec![cpu(&[b, t, 41]) * 2.0, cpu(&[b, t, 41])], 2),
        ];
        for (op, inputs, trainable) in &cases {
            let upstream = cpu(&inputs[0].size());
            let run = |kind: Kind, fused_op: bool| {
                let leaves: Vec<Tensor> = inputs
                    .iter()
                    .enumerate()
                    .map(|(i, x)| x.to_kind(kind).detach().set_requires_grad(i < *trainable))
                    .collect();
                let out = if fused_op { ours(op, &leaves) } else { reference(op, &leaves) };
                assert_eq!(out.kind(), kind, "{op}");
                (out.to_kind(Kind::Float) * &upstream).sum(Kind::Float).backward();
                let mut all = vec![out.to_kind(Kind::Float)];
                all.extend(leaves[..*trainable].iter().map(|l| l.grad().to_kind(Kind::Float)));
                all
            };
            let want = run(Kind::Float, false);
            for path in testing::paths() {
                let _path = testing::Forced::new(path);
                for (kind, tolerance) in [(Kind::Float, 1e-5), (Kind::BFloat16, 0.02)] {
                    for (i, (w, g)) in want.iter().zip(run(kind, true)).enumerate() {
                        let scale = w.abs().max().double_value(&[]).max(1e-3);
                        let err = (w - &g).abs().max().double_value(&[]);
                        assert!(err <= tolerance * scale, "{op} {path:?} {kind:?} output {i}: {err} at scale {scale}");
                    }
                }
            }
        }
    }

    /// The fused attention softmax against scale, mask and softmax spelled out in fp32, in values and score
    /// gradients: causal with 3 query heads per kv head, a per-row mask with fewer queries than keys (a response
    /// after its prompt) and a shared mask. A query that sees no key gets zeros and passes no gradient back.
    #[test]
    fn fused_attention_softmax_matches_the_spelled_out_softmax() {
        tch::manual_seed(5);
        let cpu = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, Device::Cpu));
        let (b, kv, g, scale) = (2, 2, 3, 0.125);
        let padded = cpu(&[b, 1, 7, 37]).gt(-0.8);
        let _ = padded.get(1).get(0).get(4).fill_(0);
        let cases = [
            (cpu(&[b, kv, g * 21, 21]) * 4.0, None, 21),
            (cpu(&[b, kv, g * 7, 37]) * 4.0, Some(padded), 7),
            (
                cpu(&[b, kv, g * 5, 19]),
                Some(cpu(&[1, 1, 5, 19]).gt(0.0).logical_or(&Tensor::eye(5, (Kind::Bool, Device::Cpu)).pad(
                    [0, 14],
                    "constant",
                    None,
                ))),
                5,
            ),
        ];
        for (scores, allowed, tq) in cases {
            let tk = scores.size()[3];
            let mask = match &allowed {
                Some(m) => m.shallow_clone(),
                None => crate::attention::causal(tk, Device::Cpu).unwrap().view([1, 1, tq, tk]),
            };
            let blocked = mask.logical_not().expand([mask.size()[0], 1, tq, tk], false).repeat([1, 1, g, 1]);
            let upstream = cpu(&scores.size());
            let run = |kind: Kind, fused_op: bool| {
                let s = scores.to_kind(kind).detach().set_requires_grad(true);
                let p = if fused_op {
                    attention_softmax(&s, allowed.as_ref(), tq, scale).unwrap()
                } else {
                    (&s * scale).masked_fill(&blocked, f64::NEG_INFINITY).softmax(-1, Kind::Float)
                };
                assert_eq!(p.kind(), if fused_op { kind } else { Kind::Float });
                // Rows with no visible key are NaN in the reference: leave them out of the loss there.
                let p = p.to_kind(Kind::Float);
                (p.nan_to_num(0.0, 0.0, 0.0) * &upstream).sum(Kind::Float).backward();
                (p, s.grad().to_kind(Kind::Float))
            };
            let (want_p, want_ds) = run(Kind::Float, false);
            let seen = want_p.isnan().logical_not();
            for (path, kind, tolerance) in
                testing::paths().into_iter().flat_map(|p| [(p, Kind::Float, 1e-5), (p, Kind::BFloat16, 0.02)])
            {
                let (p, ds) = {
                    let _path = testing::Forced::new(path);
                    run(kind, true)
                };
                let p_err = (&p - &want_p).abs().masked_select(&seen).max().double_value(&[]);
                let ds_err = (&ds - want_ds.nan_to_num(0.0, 0.0, 0.0)).abs().max().double_value(&[]);
                let ds_scale = want_ds.nan_to_num(0.0, 0.0, 0.0).abs().max().double_value(&[]);
                let at = format!("{path:?} {kind:?} tq {tq}");
                assert!(p_err <= tolerance, "{at}: probabilities off by {p_err}");
                assert!(ds_err <= tolerance * ds_scale, "{at}: gradient off by {ds_err} at {ds_scale}");
                assert_eq!(p.masked_select(&seen.logical_not()).abs().sum(Kind::Float).double_value(&[]), 0.0, "{at}");
            }
        }
    }

    /// A weight of the wrong size is an error on either path; the fused kernel's names the op and the sizes.
    #[test]
    fn a_bad_shape_is_an_error_naming_the_op() {
        let x = Tensor::randn([2, 3, 8], (Kind::Float, Device::Cpu));
        let w = Tensor::ones([7], (Kind::Float, Device::Cpu));
        for path in testing::paths() {
            let _path = testing::Forced::new(path);
            let err = rms_norm(&x, &w, 1e-5).unwrap_err().to_string();
            if path.is_some() {
                assert!(err.contains("fused rms_norm") && err.contains("7 elements"), "{path:?}: {err}");
            }
        }
    }
}
