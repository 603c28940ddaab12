//! The fused decode step (`csrc/decode_step.cpp`): every decoder layer for one new token per sequence,
//! in one call, on the packed weights.
//!
//! With the projections on the packed kernel, a libtorch decode step still spent most of its time in ~30 small
//! ops per layer (dispatch, allocation, thread-pool wake-ups) and in `scaled_dot_product_attention`'s flash
//! kernel, which runs tiny MKL gemms per row and head. The fused step keeps the libtorch path's numerics (see
//! the C++ file) and replaces all of that with one loop; [`crate::Decoder::forward_with_cache`] takes it for
//! single-token steps whenever the model is packed (fp32, or bf16 weights with fp32 activations), and the
//! libtorch path stays for prefill and for models that are not packed.

use std::ffi::c_void;

use tch::Tensor;

use crate::error::{ModelError, Result};

/// Model shape as the kernel reads it; mirrors `TrinityDecodeShape`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct DecodeShape {
    pub hidden: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    pub intermediate: i64,
    /// Columns per (slot, KV head) in the cache: its capacity plus the scratch column.
    pub cache_cols: i64,
    pub eps: f64,
    /// 1 when the packed projections are bf16, 0 when fp32.
    pub bf16_weights: i64,
    /// The instruction set to run on ([`crate::packed::Isa`] as i64): the one the projections were packed for.
    pub isa: i64,
}

/// One layer's weights (packed projections in the shape's weight type, fp32 norms and biases) and fp32 cache
/// storage; mirrors
/// `TrinityDecodeLayer`. Absent optional tensors are null.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct DecodeLayer {
    pub input_norm: *const f32,
    pub qkv: *const c_void,
    pub qkv_bias: *const f32,
    pub q_norm: *const f32,
    pub k_norm: *const f32,
    pub o: *const c_void,
    pub o_bias: *const f32,
    pub post_norm: *const f32,
    pub gate_up: *const c_void,
    pub gate_up_bias: *const f32,
    pub down: *const c_void,
    pub down_bias: *const f32,
    pub keys: *mut f32,
    pub values: *mut f32,
}

#[cfg(packed_gemm)]
unsafe extern "C" {
    fn trinity_decode_layers(
        shape: *const DecodeShape,
        layers: *const DecodeLayer,
        n_layers: i64,
        rows: i64,
        slots: *const i64,
        positions: *const i64,
        cos: *const f32,
        sin: *const f32,
        x: *mut f32,
    ) -> i32;
}

/// Runs every layer of `layers` over `x` (`[rows, hidden]` fp32, contiguous, updated in place): row `r` is the
/// next token of cache slot `slots[r]` at position `positions[r]`; `cos` / `sin` are `[rows, head_dim]`.
///
/// # Safety
/// Every pointer in `layers` must point at a live, contiguous CPU tensor of the size its field documents for
/// `shape` (fp32, except the packed projections, which are bf16 when `shape.bf16_weights` is 1; the caches
/// `[slots, kv_heads, cache_cols, head_dim]`), the CPU must have `shape.isa` (the packed copies' set, checked when
/// they were packed), nothing else may access the caches during the call, each
/// `slots[r]` must be below the caches' slot count, each `positions[r]` below `cache_cols - 1`, and no slot may
/// repeat.
pub(crate) unsafe fn run(
    shape: &DecodeShape,
    layers: &[DecodeLayer],
    slots: &[i64],
    positions: &[i64],
    cos: &Tensor,
    sin: &Tensor,
    x: &Tensor,
) -> Result<()> {
    let rows = slots.len() as i64;
    let table = [rows, shape.head_dim];
    let hidden = [rows, shape.hidden];
    let fp32 = |t: &Tensor| t.kind() == tch::Kind::Float && t.device() == tch::Device::Cpu && t.is_contiguous();
    if positions.len() != slots.len()
        || cos.size() != table
        || sin.size() != table
        || x.size() != hidden
        || !(fp32(cos) && fp32(sin) && fp32(x))
    {
        return Err(ModelError::InvalidInput(format!(
            "fused decode: {rows} rows, {} positions, cos {:?}, sin {:?}, x {:?}",
            positions.len(),
            cos.size(),
            sin.size(),
            x.size()
        )));
    }
    #[cfg(packed_gemm)]
    {
        // SAFETY: shapes of cos, sin and x were checked above; the layer table and slot bounds are the caller's
        // contract (this function's safety section).
        let status = unsafe {
            trinity_decode_layers(
                shape,
                layers.as_ptr(),
                layers.len() as i64,
                rows,
                slots.as_ptr(),
                positions.as_ptr(),
                cos.data_ptr() as *const f32,
                sin.data_ptr() as *const f32,
                x.data_ptr() as *mut f32,
            )
        };
        if status != 0 {
            return Err(ModelError::InvalidInput("fused decode step failed in libtorch's thread pool".into()));
        }
        Ok(())
    }
    #[cfg(not(packed_gemm))]
    {
        let _ = (shape, layers);
        Err(ModelError::InvalidInput("the fused decode step is not built for this target".into()))
    }
}
