//! The CPU AdamW update and gradient norm in one pass over memory.
//!
//! Written with libtorch ops, one AdamW step reads and writes every parameter-sized tensor about ten times and
//! allocates half a dozen parameter-sized temporaries (the fp32 gradient, `g·(1−β₁)`, `g·(1−β₂)`, `√v`, the
//! denominator, the update); for SmolLM2's 135M parameters that is gigabytes of memory traffic and page faults
//! per step on a machine that streams about 35 GB/s. Here each element is loaded once, updated in registers
//! and stored once, on a few threads over fixed-size chunks. The arithmetic is the same sequence of fp32
//! operations as the libtorch path in [`super::AdamW::step`] (which stays for other devices and layouts), so
//! both agree to the rounding of a fused multiply-add.

use std::sync::atomic::{AtomicUsize, Ordering};

use tch::{Device, Kind, Tensor};

/// Elements per unit of work: large enough that claiming one is cheap, small enough to balance two threads.
const CHUNK: usize = 1 << 16;

/// A gradient buffer in one of the two dtypes the trainer produces.
#[derive(Clone, Copy)]
enum Grad {
    F32(*const f32),
    Bf16(*const u16),
}

impl Grad {
    fn of(t: &Tensor) -> Option<Grad> {
        match t.kind() {
            Kind::Float => Some(Grad::F32(t.data_ptr() as *const f32)),
            Kind::BFloat16 => Some(Grad::Bf16(t.data_ptr() as *const u16)),
            _ => None,
        }
    }

    /// Element `i` as f32.
    ///
    /// # Safety
    /// `i` is within the buffer.
    #[inline(always)]
    unsafe fn get(self, i: usize) -> f32 {
        // SAFETY: the caller keeps `i` in bounds.
        unsafe {
            match self {
                Grad::F32(p) => *p.add(i),
                Grad::Bf16(p) => f32::from_bits(u32::from(*p.add(i)) << 16),
            }
        }
    }
}

/// fp32 → bf16 with round-to-nearest-even, as libtorch converts (NaN stays a quiet NaN).
#[inline(always)]
fn to_bf16(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7fc0;
    }
    let bits = x.to_bits();
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// One parameter's buffers: the fp32 value being updated (the master, or the parameter itself), the moments,
/// the gradient, and the bf16 parameter to refresh when the master is separate.
#[derive(Clone, Copy)]
pub(super) struct Slot {
    weight: *mut f32,
    exp_avg: *mut f32,
    exp_avg_sq: *mut f32,
    grad: Grad,
    low: Option<*mut u16>,
    len: usize,
}

// SAFETY: a Slot is a set of raw pointers into tensors that `AdamW::step` keeps alive and unaliased for the
// duration of the parallel update; each thread touches a disjoint element range.
unsafe impl Send for Slot {}
// SAFETY: as for Send: shared across the update's threads, each of which writes only its own element range.
unsafe impl Sync for Slot {}

impl Slot {
    /// The buffers of one parameter when the fused path can take them: all on the CPU, contiguous, fp32 moments
    /// and weight, an fp32 or bf16 gradient, and (with a master) a bf16 parameter. `None` otherwise.
    pub(super) fn new(var: &Tensor, master: Option<&Tensor>, exp_avg: &Tensor, exp_avg_sq: &Tensor) -> Option<Slot> {
        let grad = var.grad();
        let weight = master.unwrap_or(var);
        let len = weight.numel();
        let cpu = |t: &Tensor| t.device() == Device::Cpu && t.is_contiguous() && t.numel() == len;
        let fp32 = |t: &Tensor| cpu(t) && t.kind() == Kind::Float;
        if !(grad.defined() && cpu(&grad) && fp32(weight) && fp32(exp_avg) && fp32(exp_avg_sq) && cpu(var)) {
            return None;
        }
        let low = match master {
            Some(_) if var.kind() == Kind::BFloat16 => Some(var.data_ptr() as *mut u16),
            Some(_) => return None,
            None => None,
        };
        Some(Slot {
            weight: weight.data_ptr() as *mut f32,
            exp_avg: exp_avg.data_ptr() as *mut f32,
            exp_avg_sq: exp_avg_sq.data_ptr() as *mut f32,
            grad: Grad::of(&grad)?,
            low,
            len,
        })
    }
}

/// The scalars of one AdamW step, as fp32 like libtorch's scalar arguments on fp32 tensors.
#[derive(Clone, Copy)]
pub(super) struct Coefficients {
    pub decay: Option<f32>,
    pub beta1: f32,
    pub one_minus_beta1: f32,
    pub beta2: f32,
    pub one_minus_beta2: f32,
    pub bias2_sqrt: f32,
    pub eps: f32,
    /// `−lr / (1 − β₁ᵗ)`.
    pub step: f32,
}

/// Runs `work(slot, start, end)` over every slot in chunks of [`CHUNK`] elements on `threads` threads.
fn parallel(slots: &[Slot], threads: usize, work: impl Fn(&Slot, usize, usize) + Sync) {
    let mut jobs = Vec::new();
    for (index, slot) in slots.iter().enumerate() {
        jobs.extend((0..slot.len).step_by(CHUNK).map(|start| (index, start, (start + CHUNK).min(slot.len))));
    }
    let next = AtomicUsize::new(0);
    let run = || {
        loop {
            let claimed = next.fetch_add(1, Ordering::Relaxed);
            let Some(&(index, start, end)) = jobs.get(claimed) else { break };
            work(&slots[index], start, end);
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..threads.max(1) {
            scope.spawn(run);
        }
        run();
    });
}

/// One AdamW update of every slot.
///
/// # Safety
/// Every slot's pointers must be valid for `len` elements, stay alive for the call, and no two slots (nor
/// anything else during the call) may share memory with a slot's weight, moments or bf16 parameter.
pub(super) unsafe fn adamw(slots: &[Slot], c: Coefficients, threads: usize) {
    parallel(slots, threads, |s, start, end| {
        for i in start..end {
            // SAFETY: `i < len` and the slot's buffers are valid and exclusively ours for `len` elements (the
            // caller's contract); threads work on disjoint ranges.
            unsafe {
                let g = s.grad.get(i);
                let w = &mut *s.weight.add(i);
                let m = &mut *s.exp_avg.add(i);
                let v = &mut *s.exp_avg_sq.add(i);
                if let Some(decay) = c.decay {
                    *w *= decay;
                }
                *m = *m * c.beta1 + g * c.one_minus_beta1;
                *v = *v * c.beta2 + g * (g * c.one_minus_beta2);
                let denom = v.sqrt() / c.bias2_sqrt + c.eps;
                *w += *m / denom * c.step;
                if let Some(low) = s.low {
                    *low.add(i) = to_bf16(*w);
                }
            }
        }
    });
}

/// Σ g² over every slot's gradient, in f64 (per chunk in f32 lanes of eight, then summed in f64).
///
/// # Safety
/// Every slot's gradient pointer must be valid for `len` elements for the duration of the call.
pub(super) unsafe fn sum_of_squares(slots: &[Slot], threads: usize) -> f64 {
    let total = std::sync::Mutex::new(0.0f64);
    parallel(slots, threads, |s, start, end| {
        let mut lanes = [0.0f64; 8];
        let mut i = start;
        while i + 8 <= end {
            for (lane, acc) in lanes.iter_mut().enumerate() {
                // SAFETY: `i + lane < end <= len` (the caller's contract).
                let g = f64::from(unsafe { s.grad.get(i + lane) });
                *acc += g * g;
            }
            i += 8;
        }
        for j in i..end {
            // SAFETY: `j < end <= len`.
            let g = f64::from(unsafe { s.grad.get(j) });
            lanes[0] += g * g;
        }
        *total.lock().unwrap_or_else(std::sync::PoisonError::into_inner) += lanes.iter().sum::<f64>();
    });
    total.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_libtorch() {
        // Halfway cases both ways (ties go to the even neighbour), an inexact value, a subnormal, the specials.
        let tie_down = f32::from_bits(0x3F80_8000);
        let tie_up = f32::from_bits(0x3F81_8000);
        let values = [1.0f32, tie_down, tie_up, -2.7, 65504.0, 1e-40, f32::INFINITY, 0.0, -0.0];
        let ours: Vec<u16> = values.iter().map(|&x| to_bf16(x)).collect();
        let theirs = Tensor::from_slice(&values).to_kind(Kind::BFloat16);
        let back = Vec::<f32>::try_from(theirs.to_kind(Kind::Float)).unwrap();
        for (i, (&bits, want)) in ours.iter().zip(back).enumerate() {
            assert_eq!(f32::from_bits(u32::from(bits) << 16).to_bits(), want.to_bits(), "value {}", values[i]);
        }
        assert!(f32::from_bits(u32::from(to_bf16(f32::NAN)) << 16).is_nan());
    }
}
