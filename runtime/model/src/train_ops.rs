//! RMSNorm, RoPE and the SwiGLU product as single fused kernels each way on AVX-512 CPUs (`csrc/train_ops.cpp`
//! says why), with the libtorch ops they replace as the path everywhere else: other CPUs and devices, other
//! dtypes, and builds without libtorch's headers or off x86-64.
//!
//! The fused kernels compute in fp32 and round once to the tensor's dtype; the libtorch path rounds bf16 after
//! every op. Both follow transformers' order for RMSNorm: normalize in fp32, round, then scale by the weight.

#[cfg(train_ops)]
use tch::Device;
use tch::{Kind, Tensor};

#[cfg(train_ops)]
use crate::error::ModelError;
use crate::error::Result;

#[cfg(train_ops)]
mod ffi {
    use std::ffi::{c_char, c_void};

    unsafe extern "C" {
        pub(super) fn trinity_train_op_error() -> *const c_char;
        pub(super) fn trinity_train_ops_usable() -> i32;
        pub(super) fn trinity_rms_norm(x: *mut c_void, w: *mut c_void, eps: f64, out: *mut *mut c_void) -> i32;
        pub(super) fn trinity_rope(x: *mut c_void, cos: *mut c_void, sin: *mut c_void, out: *mut *mut c_void) -> i32;
        pub(super) fn trinity_swiglu(g: *mut c_void, u: *mut c_void, out: *mut *mut c_void) -> i32;
    }
}

/// Whether the fused kernels take `x`: the CPU runs them (AVX-512), `x` on the CPU in fp32 or bf16.
#[cfg(train_ops)]
fn fused(x: &Tensor) -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: a CPU feature query without arguments.
    let usable = *USABLE.get_or_init(|| unsafe { ffi::trinity_train_ops_usable() } != 0);
    usable && x.device() == Device::Cpu && matches!(x.kind(), Kind::Float | Kind::BFloat16)
}

/// Calls one fused op and takes ownership of the tensor it returns.
#[cfg(train_ops)]
fn call(op: &str, f: impl FnOnce(*mut *mut std::ffi::c_void) -> i32) -> Result<Tensor> {
    let mut out = std::ptr::null_mut();
    if f(&mut out) == 0 && !out.is_null() {
        // SAFETY: on success the C++ side stored a new `at::Tensor*` that nothing else owns.
        return Ok(unsafe { Tensor::from_ptr(out.cast()) });
    }
    // SAFETY: the message is this thread's NUL-terminated error string, copied before any other call.
    let message = unsafe { std::ffi::CStr::from_ptr(ffi::trinity_train_op_error()) }.to_string_lossy().into_owned();
    Err(ModelError::InvalidInput(format!("fused {op}: {message}")))
}

#[cfg(train_ops)]
fn handle(t: &Tensor) -> *mut std::ffi::c_void {
    t.as_ptr() as *mut std::ffi::c_void
}

/// `w · round(x · rsqrt(mean(x²) + eps))` over the last dimension of `x`; `w` has that dimension's size.
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    #[cfg(train_ops)]
    if fused(x) && w.kind() == x.kind() {
        // SAFETY: both handles are live tch tensors borrowed for the call; the C++ side only reads them.
        return call("rms_norm", |out| unsafe { ffi::trinity_rms_norm(handle(x), handle(w), eps, out) });
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
    if fused(x) && x.dim() == 4 && cos.kind() == x.kind() && sin.kind() == x.kind() {
        // SAFETY: live tch tensors borrowed for the call; the C++ side only reads them.
        return call("rope", |out| unsafe { ffi::trinity_rope(handle(x), handle(cos), handle(sin), out) });
    }
    crate::rope::apply(x, cos, sin)
}

/// `silu(gate) · up`, elementwise.
pub(crate) fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    #[cfg(train_ops)]
    if fused(gate) && up.kind() == gate.kind() && up.size() == gate.size() {
        // SAFETY: live tch tensors borrowed for the call; the C++ side only reads them.
        return call("swiglu", |out| unsafe { ffi::trinity_swiglu(handle(gate), handle(up), out) });
    }
    Ok(gate.f_silu()? * up)
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
    /// one: exact to fp32 rounding in fp32, to bf16 rounding in bf16.
    #[test]
    fn fused_ops_match_the_spelled_out_ops_in_values_and_gradients() {
        tch::manual_seed(11);
        let (b, t, h, d) = (3, 5, 4, 16);
        let cpu = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, Device::Cpu));
        let angles = cpu(&[b, t, d / 2]);
        let angles = Tensor::cat(&[&angles, &angles], -1);
        let cases: Vec<(&str, Vec<Tensor>, usize)> = vec![
            ("rms_norm", vec![cpu(&[b, t, 48]) * 3.0, cpu(&[48]) + 1.0], 2),
            ("rms_norm", vec![cpu(&[b, t, h, d]), cpu(&[d])], 2),
            ("rope", vec![cpu(&[b, t, h, d]), angles.cos(), angles.sin()], 1),
            ("rope", vec![cpu(&[1, t, h, d]), angles.cos().narrow(0, 0, 1), angles.sin().narrow(0, 0, 1)], 1),
            ("swiglu", vec![cpu(&[b, t, 40]) * 2.0, cpu(&[b, t, 40])], 2),
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
            for (kind, tolerance) in [(Kind::Float, 1e-5), (Kind::BFloat16, 0.02)] {
                for (i, (w, g)) in want.iter().zip(run(kind, true)).enumerate() {
                    let scale = w.abs().max().double_value(&[]).max(1e-3);
                    let err = (w - &g).abs().max().double_value(&[]);
                    assert!(err <= tolerance * scale, "{op} {kind:?} output {i}: error {err} at scale {scale}");
                }
            }
        }
    }

    /// A weight of the wrong size is an error on either path; the fused kernel's names the op and the sizes.
    #[test]
    fn a_bad_shape_is_an_error_naming_the_op() {
        let x = Tensor::randn([2, 3, 8], (Kind::Float, Device::Cpu));
        let w = Tensor::ones([7], (Kind::Float, Device::Cpu));
        let err = rms_norm(&x, &w, 1e-5).unwrap_err().to_string();
        if fused(&x) {
            assert!(err.contains("fused rms_norm") && err.contains("7 elements"), "{err}");
        }
    }
}
