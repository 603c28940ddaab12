//! The CPU AdamW update and gradient norm in one pass over memory.
//!
//! Written with libtorch ops, one AdamW step reads and writes every parameter-sized tensor about ten times and
//! allocates half a dozen parameter-sized temporaries (the fp32 gradient, `g·(1−β₁)`, `g·(1−β₂)`, `√v`, the
//! denominator, the update); for SmolLM2's 135M parameters that is gigabytes of memory traffic and page faults
//! per step on a machine that streams about 35 GB/s. Here each element is loaded once, updated in registers
//! and stored once, on a few threads over fixed-size chunks. The arithmetic is the same sequence of fp32
//! operations as the libtorch path in [`super::AdamW::step`] (which stays for other devices and layouts), so
//! both agree to the rounding of a fused multiply-add.
//!
//! The loops are generic over the gradient's dtype and branch-free inside, so the compiler vectorizes them, and
//! they are compiled again for AVX2 and for AVX-512, the widest taken where the CPU has it. A per-element match
//! on the dtype had kept them scalar: clipping and the update took 0.33–0.50 s of each SmolLM2 GRPO train step
//! (bf16 with fp32 masters, 2 cores of a Xeon with AMX), a fifth of the trainer's CPU samples; vectorized,
//! 0.13–0.21 s.

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
}

/// A gradient element: fp32, or bf16 as its bits. The loops below are generic over it so that each dtype gets a
/// branch-free body the compiler vectorizes (a per-element match on the dtype kept them scalar).
trait GradElem: Copy {
    fn f32(self) -> f32;
    /// An fp32 value stored as this element (bf16 rounds to nearest even).
    fn from_f32(x: f32) -> Self;
}

impl GradElem for f32 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }

    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl GradElem for u16 {
    #[inline(always)]
    fn f32(self) -> f32 {
        f32::from_bits(u32::from(self) << 16)
    }

    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        to_bf16(x)
    }
}

/// fp32 → bf16 with round-to-nearest-even, as libtorch converts (NaN stays a quiet NaN).
#[inline(always)]
fn to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounded = (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
    // A select rather than an early return, so that the update loop stays vectorizable.
    if x.is_nan() { 0x7fc0 } else { rounded }
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
    pub(super) fn new(
        var: &Tensor,
        grad: &Tensor,
        master: Option<&Tensor>,
        exp_avg: &Tensor,
        exp_avg_sq: &Tensor,
    ) -> Option<Slot> {
        let weight = master.unwrap_or(var);
        let len = weight.numel();
        let cpu = |t: &Tensor| t.device() == Device::Cpu && t.is_contiguous() && t.numel() == len;
        let fp32 = |t: &Tensor| cpu(t) && t.kind() == Kind::Float;
        if !(grad.defined() && cpu(grad) && fp32(weight) && fp32(exp_avg) && fp32(exp_avg_sq) && cpu(var)) {
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
            grad: Grad::of(grad)?,
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

/// The instruction sets the loops below are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum Width {
    Portable,
    Avx2,
    Avx512,
}

/// Every set this CPU runs the loops on, widest first, checked once (the tests run them all).
fn widths() -> &'static [Width] {
    static WIDTHS: std::sync::OnceLock<Vec<Width>> = std::sync::OnceLock::new();
    WIDTHS.get_or_init(|| {
        let mut widths = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx512bw") && has!("avx512vl") {
                widths.push(Width::Avx512);
            }
            if has!("avx2") && has!("fma") {
                widths.push(Width::Avx2);
            }
        }
        widths.push(Width::Portable);
        widths
    })
}

fn widest() -> Width {
    widths()[0]
}

/// `fn $name<G>(width, args) -> ret`: runs `$body(args)` compiled for `width`. The body is written once,
/// `#[inline(always)]`, so each copy is compiled (and vectorized) for its set's registers.
macro_rules! on_width {
    ($name:ident, $body:ident, ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        fn $name<G: GradElem>(width: Width, $($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                fn avx512<G: GradElem>($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }

                #[target_feature(enable = "avx2,fma")]
                fn avx2<G: GradElem>($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }

                match width {
                    // SAFETY: `widths` lists Avx512 only where the CPU has AVX-512 F, BW and VL.
                    Width::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: `widths` lists Avx2 only where the CPU has AVX2 and FMA.
                    Width::Avx2 => return unsafe { avx2($($arg),*) },
                    Width::Portable => {}
                }
            }
            let _ = width;
            $body($($arg),*)
        }
    };
}

/// One AdamW update of every slot.
///
/// # Safety
/// Every slot's pointers must be valid for `len` elements, stay alive for the call, and no two slots (nor
/// anything else during the call) may share memory with a slot's weight, moments or bf16 parameter.
pub(super) unsafe fn adamw(slots: &[Slot], c: Coefficients, threads: usize) {
    let width = widest();
    parallel(slots, threads, |s, start, end| {
        let n = end - start;
        // SAFETY: `start..end` lies within the slot's `len` elements and the buffers are exclusively ours (the
        // caller's contract); threads work on disjoint ranges.
        unsafe {
            let w = std::slice::from_raw_parts_mut(s.weight.add(start), n);
            let m = std::slice::from_raw_parts_mut(s.exp_avg.add(start), n);
            let v = std::slice::from_raw_parts_mut(s.exp_avg_sq.add(start), n);
            let low = s.low.map(|p| std::slice::from_raw_parts_mut(p.add(start), n));
            match s.grad {
                Grad::F32(p) => {
                    update(width, Range { w, m, v, g: std::slice::from_raw_parts(p.add(start), n), low }, &c)
                }
                Grad::Bf16(p) => {
                    update(width, Range { w, m, v, g: std::slice::from_raw_parts(p.add(start), n), low }, &c)
                }
            }
        }
    });
}

/// One range of a slot's buffers: weight, moments, gradient and the bf16 copy to refresh, if any.
struct Range<'a, G> {
    w: &'a mut [f32],
    m: &'a mut [f32],
    v: &'a mut [f32],
    g: &'a [G],
    low: Option<&'a mut [u16]>,
}

// The AdamW update of one range, on a set's vectors.
on_width!(update, update_body, (range: Range<'_, G>, c: &Coefficients) -> ());

/// The update itself: the same fp32 operations in the same order as the libtorch path (no contraction into
/// fused multiply-adds: Rust does not contract). Without weight decay the factor is 1, which leaves `w` exact.
#[inline(always)]
fn update_body<G: GradElem>(range: Range<'_, G>, c: &Coefficients) {
    let Range { w, m, v, g, low } = range;
    let decay = c.decay.unwrap_or(1.0);
    let one = |w: &mut f32, m: &mut f32, v: &mut f32, g: G| {
        let g = g.f32();
        *w *= decay;
        *m = *m * c.beta1 + g * c.one_minus_beta1;
        *v = *v * c.beta2 + g * (g * c.one_minus_beta2);
        let denom = v.sqrt() / c.bias2_sqrt + c.eps;
        *w += *m / denom * c.step;
    };
    match low {
        Some(low) => {
            for ((((w, m), v), &g), low) in w.iter_mut().zip(m).zip(v).zip(g).zip(low) {
                one(w, m, v, g);
                *low = to_bf16(*w);
            }
        }
        None => {
            for (((w, m), v), &g) in w.iter_mut().zip(m).zip(v).zip(g) {
                one(w, m, v, g);
            }
        }
    }
}

/// Σ g² over every slot's gradient, in f64 (per chunk in f64 lanes of eight, then summed).
///
/// # Safety
/// Every slot's gradient pointer must be valid for `len` elements for the duration of the call.
pub(super) unsafe fn sum_of_squares(slots: &[Slot], threads: usize) -> f64 {
    let width = widest();
    let total = std::sync::Mutex::new(0.0f64);
    parallel(slots, threads, |s, start, end| {
        // SAFETY: `start..end` lies within the gradient's `len` elements (the caller's contract).
        let sum = unsafe {
            match s.grad {
                Grad::F32(p) => squares(width, std::slice::from_raw_parts(p.add(start), end - start)),
                Grad::Bf16(p) => squares(width, std::slice::from_raw_parts(p.add(start), end - start)),
            }
        };
        *total.lock().unwrap_or_else(std::sync::PoisonError::into_inner) += sum;
    });
    total.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Multiplies every slot's gradient by `coef` in place, as PyTorch's `clip_grad_norm_` does: in fp32, a bf16
/// gradient rounded back to nearest even. Gradient clipping's scaling, which libtorch ran as one
/// bf16 kernel per parameter: 75 ms of a SmolLM2 GRPO train step (272 parameters, 2 cores).
///
/// # Safety
/// Every slot's gradient pointer must be valid for `len` elements, and nothing else may read or write the
/// gradients during the call.
pub(super) unsafe fn scale_grads(slots: &[Slot], coef: f32, threads: usize) {
    let width = widest();
    parallel(slots, threads, |s, start, end| {
        let n = end - start;
        // SAFETY: `start..end` lies within the gradient's `len` elements, which are ours alone for the call (the
        // caller's contract); threads work on disjoint ranges.
        unsafe {
            match s.grad {
                Grad::F32(p) => scale(width, std::slice::from_raw_parts_mut(p.cast_mut().add(start), n), coef),
                Grad::Bf16(p) => scale(width, std::slice::from_raw_parts_mut(p.cast_mut().add(start), n), coef),
            }
        }
    });
}

on_width!(scale, scale_body, (g: &mut [G], coef: f32) -> ());

#[inline(always)]
fn scale_body<G: GradElem>(g: &mut [G], coef: f32) {
    for x in g {
        *x = G::from_f32(x.f32() * coef);
    }
}

on_width!(squares, squares_body, (g: &[G]) -> f64);

/// Σ g² in eight f64 lanes (a fixed summation order, so the result does not depend on the vector width).
#[inline(always)]
fn squares_body<G: GradElem>(g: &[G]) -> f64 {
    let mut lanes = [0.0f64; 8];
    let mut chunks = g.chunks_exact(8);
    for chunk in &mut chunks {
        for (acc, &x) in lanes.iter_mut().zip(chunk) {
            let x = f64::from(x.f32());
            *acc += x * x;
        }
    }
    for &x in chunks.remainder() {
        let x = f64::from(x.f32());
        lanes[0] += x * x;
    }
    lanes.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loops, on every set this CPU has (portable, AVX2, AVX-512), give the bits of the update written out one
    /// element at a time, for both gradient dtypes, with weight decay, a bf16 copy and a NaN gradient that must
    /// come out as bf16 NaN; and the same sum of squares.
    #[test]
    fn vector_loops_give_the_scalar_update_bit_for_bit() {
        let n = 1000;
        let values = |seed: u32| -> Vec<f32> {
            (0..n).map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0).collect()
        };
        let c = Coefficients {
            decay: Some(0.999),
            beta1: 0.9,
            one_minus_beta1: 0.1,
            beta2: 0.999,
            one_minus_beta2: 0.001,
            bias2_sqrt: 0.0316,
            eps: 1e-8,
            step: -1e-3,
        };
        let mut g32 = values(7);
        g32[17] = f32::NAN;
        let g16: Vec<u16> = g32.iter().map(|&x| to_bf16(x)).collect();
        let start = || (values(1), values(2), values(3).iter().map(|x| x.abs()).collect::<Vec<_>>());
        let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for bf16 in [false, true] {
            let grad = |i: usize| if bf16 { g16[i].f32() } else { g32[i] };
            let (mut w, mut m, mut v) = start();
            let mut low = vec![0u16; n];
            for i in 0..n {
                let g = grad(i);
                w[i] *= 0.999;
                m[i] = m[i] * c.beta1 + g * c.one_minus_beta1;
                v[i] = v[i] * c.beta2 + g * (g * c.one_minus_beta2);
                w[i] += m[i] / (v[i].sqrt() / c.bias2_sqrt + c.eps) * c.step;
                low[i] = to_bf16(w[i]);
            }
            let want = (bits(&w), bits(&m), bits(&v), low);
            let want_squares: f64 = (0..17).map(|i| f64::from(grad(i)).powi(2)).sum();
            assert_eq!(want.3[17], 0x7fc0, "a NaN update must give bf16 NaN");
            for &width in widths() {
                let (mut w, mut m, mut v) = start();
                let mut low = vec![0u16; n];
                let squares = if bf16 {
                    update(width, Range { w: &mut w, m: &mut m, v: &mut v, g: &g16, low: Some(&mut low) }, &c);
                    squares(width, &g16[..17])
                } else {
                    update(width, Range { w: &mut w, m: &mut m, v: &mut v, g: &g32, low: Some(&mut low) }, &c);
                    squares(width, &g32[..17])
                };
                assert!((bits(&w), bits(&m), bits(&v), low) == want, "bf16 gradient {bf16}, {width:?}");
                assert!((squares - want_squares).abs() <= 1e-12 * want_squares, "{squares} vs {want_squares}");
            }
        }
    }

    /// Scaling in place gives PyTorch's clipping multiply bit for bit (the gradient times the fp32 coefficient,
    /// rounded to the gradient's dtype), in fp32 and bf16, on every set this CPU has.
    #[test]
    fn scaling_matches_pytorch_clipping() {
        let values: Vec<f32> = (0..999).map(|i| ((i * 7919) % 2003) as f32 / 97.0 - 10.0).collect();
        let coef = 0.123_456_79_f32;
        for kind in [Kind::Float, Kind::BFloat16] {
            let grad = Tensor::from_slice(&values).to_kind(kind);
            let want = (grad.to_kind(Kind::Float) * f64::from(coef)).to_kind(kind);
            let want = Vec::<f32>::try_from(want.to_kind(Kind::Float)).unwrap();
            for &width in widths() {
                let got: Vec<f32> = if kind == Kind::Float {
                    let mut g = values.clone();
                    scale(width, &mut g, coef);
                    g
                } else {
                    let mut g: Vec<u16> = values.iter().map(|&x| to_bf16(x)).collect();
                    scale(width, &mut g, coef);
                    g.iter().map(|x| x.f32()).collect()
                };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{kind:?}, {width:?}");
            }
        }
    }

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
