//! Packed weights for the decode step's small matrix multiplies (x86-64 with AVX-512 or AVX2 + FMA; fp32 or
//! bf16 weights).
//!
//! A decode step runs every weight of the model against a few rows, one per running sequence. libtorch's sgemm
//! is tuned for many rows and runs these shapes at a fraction of the CPU's fp32 throughput, so the generation
//! engine packs each projection once (panels of 16 output columns k-major, every 3 panels interleaved k step by k
//! step so that a kernel's unit of work reads one forward stream) and multiplies with the
//! register-tiled kernel in `csrc/packed_gemm.cpp`, on libtorch's thread pool. Projections that read the same
//! input are packed together (q, k and v; gate and up) so one call streams them all.
//!
//! The packed copy is derived data: whoever changes the source weights must repack
//! ([`crate::Decoder::weights_changed`]). It is inference only (no autograd): training keeps libtorch's kernels.
//! Prefill uses it too: for a 16-prompt prefill of ~600 rows it measured about twice as fast as libtorch's sgemm
//! here, because the panels stay in L2 while every 8-row tile streams them.
//!
//! bf16 weights are packed with k in pairs, the operand layout of AVX512-BF16's dot product. Inputs and outputs
//! stay fp32 either way: a bf16 model on the packed path computes with fp32 activations and bf16 weights (the
//! inputs of each matmul are rounded to bf16, as in a bf16 matmul; sums accumulate in fp32).
//!
//! One binary runs on every x86-64 CPU: the kernels are compiled for each instruction set ([`Isa`]) and the one
//! to run is chosen at runtime from the CPU's features, per weight dtype. AVX-512 reads a 16-column panel as one
//! zmm and bf16 pairs with `vdpbf16ps` (AVX512-BF16). AVX-512 CPUs without BF16 (Skylake-SP to Ice Lake,
//! [`Isa::Avx512Core`]) widen each bf16 pair to two fp32 vectors in registers (a 16-bit shift and a mask), so
//! bf16 still streams half the bytes of fp32 per token. AVX2 + FMA (AMD Zen 1-3, Intel before Skylake-SP) reads
//! the same panels as two ymm, widening bf16 the same way. The layout is the same for every set; a
//! [`PackedLinear`] records which set it runs on. Older CPUs keep libtorch's kernels. On CPUs with AMX, bf16
//! weights get one more set, [`Isa::Amx`]: the same panels are AMX's operand layout, so the matmuls run on the
//! tile unit, reading them in place (1.1-2.2× the AVX-512 kernel's decode speed).

use tch::{Device, Kind, Tensor};

use crate::error::{ModelError, Result};
use crate::weight_arena::{Buffer, WeightArena};

const PANEL: i64 = 16;

#[cfg(packed_gemm)]
unsafe extern "C" {
    fn trinity_packed_gemm(x: *const f32, m: i64, k: i64, packed: *const f32, n: i64, y: *mut f32, isa: i64) -> i32;
    fn trinity_pack_panels(sources: *const *const f32, rows: *const i64, count: i64, k: i64, packed: *mut f32) -> i32;
    fn trinity_packed_gemm_bf16(
        x: *const f32,
        m: i64,
        k: i64,
        packed: *const u16,
        n: i64,
        y: *mut f32,
        isa: i64,
    ) -> i32;
    fn trinity_amx_usable() -> i32;
    fn trinity_pack_panels_bf16(
        sources: *const *const u16,
        rows: *const i64,
        count: i64,
        k: i64,
        packed: *mut u16,
    ) -> i32;
}

/// The instruction set a packed kernel runs on; the discriminants are `trinity::Isa`'s in `csrc/packed_gemm.h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F + FMA for fp32 weights; AVX512-BF16 (+ BW, VL) for bf16 weights.
    Avx512 = 1,
    /// AVX2 + FMA, for either dtype.
    Avx2 = 2,
    /// bf16 weights on a CPU with AMX: the AVX-512 set's kernels, with the matmuls on the tile unit (same
    /// layout; `csrc/packed_gemm.cpp` says why and what it measured).
    Amx = 3,
    /// bf16 weights on AVX-512F without AVX512-BF16 (Intel Skylake-SP to Ice Lake, oneDNN's `avx512_core`): the
    /// AVX-512 set's kernels with each bf16 pair widened to fp32 in registers, as AVX2 does at half the width.
    Avx512Core = 4,
}

impl Isa {
    /// Whether this build and CPU can run this set's kernels on `kind` weights.
    pub fn runs(self, kind: Kind) -> bool {
        #[cfg(packed_gemm)]
        {
            use std::arch::is_x86_feature_detected as has;
            match (self, kind) {
                (Isa::Avx512, Kind::Float) => has!("avx512f") && has!("fma"),
                (Isa::Avx512, Kind::BFloat16) => {
                    has!("avx512f") && has!("fma") && has!("avx512bf16") && has!("avx512bw") && has!("avx512vl")
                }
                (Isa::Avx512Core, Kind::BFloat16) => has!("avx512f") && has!("fma"),
                (Isa::Avx2, Kind::Float | Kind::BFloat16) => has!("avx2") && has!("fma"),
                (Isa::Amx, Kind::BFloat16) => {
                    // SAFETY: takes no arguments; it reads CPUID and asks the kernel for the tile state once.
                    Isa::Avx512.runs(kind) && unsafe { trinity_amx_usable() } == 1
                }
                _ => false,
            }
        }
        #[cfg(not(packed_gemm))]
        {
            let _ = (self, kind);
            false
        }
    }

    /// Every set this build and CPU can run on `kind` weights, fastest first (the tests run them all).
    pub fn available(kind: Kind) -> Vec<Isa> {
        [Isa::Amx, Isa::Avx512, Isa::Avx512Core, Isa::Avx2].into_iter().filter(|isa| isa.runs(kind)).collect()
    }

    /// The fastest set for `kind` weights here, or `None` where only libtorch's kernels apply.
    pub fn best(kind: Kind) -> Option<Isa> {
        Isa::available(kind).first().copied()
    }
}

/// Whether `kind` weights can be packed on this build and CPU.
pub fn packs(kind: Kind) -> bool {
    Isa::best(kind).is_some()
}

/// One or more `[n_i, k]` weight matrices (stacked along n) in panel layout, with their stacked bias.
#[derive(Debug)]
pub struct PackedLinear {
    /// fp32 `n·k` elements, or bf16 `n·2·⌈k/2⌉` (k in pairs), in the grouped panel layout that
    /// `csrc/packed_gemm.cpp`'s `pack_panels` writes; the shape only sizes the buffer.
    packed: Tensor,
    /// The memory `packed` views, in huge pages ([`crate::weight_arena`]); `None` when `packed` owns its own.
    /// Declared after `packed`, so the view is dropped first.
    _memory: Option<Buffer>,
    bias: Option<Tensor>,
    n: i64,
    k: i64,
    isa: Isa,
}

impl PackedLinear {
    /// Packs `weights` (each `[n_i, k]`, all fp32 or all bf16, CPU) stacked along the output dimension, for
    /// `isa` (the decoder passes [`Isa::best`] for the weights' dtype), into memory from `arena` (one per model,
    /// so its projections share huge pages). `biases` are all present or all absent.
    /// Returns `None` when the kernel cannot serve these weights (another dtype or device, a CPU without `isa`
    /// for this dtype, or a total output size that is not a multiple of 16).
    pub(crate) fn pack_for(
        arena: &mut WeightArena,
        isa: Isa,
        weights: &[&Tensor],
        biases: &[Option<&Tensor>],
    ) -> Result<Option<Self>> {
        let Some(kind) = weights.first().map(|w| w.kind()) else { return Ok(None) };
        if !isa.runs(kind) {
            return Ok(None);
        }
        let Some((n, k)) = stacked_shape(weights, kind) else { return Ok(None) };
        if k == 0 || n % PANEL != 0 {
            return Ok(None);
        }
        let sources: Vec<Tensor> = weights.iter().map(|w| w.f_contiguous()).collect::<std::result::Result<_, _>>()?;
        let shape = if kind == Kind::Float { [n / PANEL, k, PANEL] } else { [n / PANEL, (k + 1) / 2, 2 * PANEL] };
        let (packed, memory) = empty_in(arena, shape, kind)?;
        fill_panels(&sources, k, &packed)?;
        let bias = match biases.iter().copied().collect::<Option<Vec<&Tensor>>>() {
            Some(b) if !b.is_empty() => Some(tch::no_grad(|| Tensor::f_cat(&b, 0))?.f_to_kind(Kind::Float)?),
            _ => None,
        };
        Ok(Some(PackedLinear { packed, _memory: memory, bias, n, k, isa }))
    }

    /// Rewrites the packed copy in place from `weights` and `biases`, which must have the dtype and stacked shape it
    /// was packed from (the same weights after an update). A weight sync refreshes hundreds of megabytes of panels
    /// every step; writing them where they are, instead of packing into new buffers, takes no fresh pages from the
    /// OS (each one faulted in and cleared) and never holds two copies at once.
    pub fn repack(&mut self, weights: &[&Tensor], biases: &[Option<&Tensor>]) -> Result<()> {
        let same = stacked_shape(weights, self.packed.kind()) == Some((self.n, self.k));
        let present: Vec<&Tensor> = biases.iter().copied().flatten().collect();
        if !same || present.is_empty() == self.bias.is_some() {
            return Err(ModelError::InvalidInput(
                "repack: the weights differ in dtype or shape from the ones packed; pack them anew".into(),
            ));
        }
        let sources: Vec<Tensor> = weights.iter().map(|w| w.f_contiguous()).collect::<std::result::Result<_, _>>()?;
        fill_panels(&sources, self.k, &self.packed)?;
        if let Some(bias) = &mut self.bias {
            tch::no_grad(|| bias.f_copy_(&Tensor::f_cat(&present, 0)?))?;
        }
        Ok(())
    }

    /// The panel-layout weights, for the fused decode step (valid while `self` lives).
    pub(crate) fn weight_ptr(&self) -> *const std::ffi::c_void {
        self.packed.data_ptr() as *const std::ffi::c_void
    }

    /// Whether the packed weights are bf16 (else fp32).
    pub(crate) fn is_bf16(&self) -> bool {
        self.packed.kind() == Kind::BFloat16
    }

    /// The stacked fp32 bias, or null.
    pub(crate) fn bias_ptr(&self) -> *const f32 {
        self.bias.as_ref().map_or(std::ptr::null(), |b| b.data_ptr() as *const f32)
    }

    /// The instruction set this copy's matmuls run on (the tests assert it).
    #[cfg(test)]
    pub(crate) fn isa(&self) -> Isa {
        self.isa
    }

    /// Output features.
    pub fn out_features(&self) -> i64 {
        self.n
    }

    /// `x @ Wᵀ (+ b)` for `x` `[..., k]` fp32 on the CPU → `[..., n]`. Errors on a wrong inner size or dtype.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let size = x.size();
        if size.last() != Some(&self.k) || x.kind() != Kind::Float || x.device() != Device::Cpu {
            return Err(ModelError::InvalidInput(format!(
                "packed linear expects fp32 CPU input [..., {}], got {:?} {:?} {:?}",
                self.k,
                x.kind(),
                x.device(),
                size
            )));
        }
        let x = x.f_contiguous()?;
        let m = size[..size.len() - 1].iter().product::<i64>();
        let mut out_shape = size.clone();
        *out_shape.last_mut().expect("non-empty shape") = self.n;
        let y = Tensor::f_empty(out_shape.as_slice(), (Kind::Float, Device::Cpu))?;
        if m > 0 {
            self.run(&x, m, &y)?;
        }
        Ok(match &self.bias {
            Some(b) => y + b,
            None => y,
        })
    }

    #[cfg(packed_gemm)]
    fn run(&self, x: &Tensor, m: i64, y: &Tensor) -> Result<()> {
        let (xp, yp) = (x.data_ptr() as *const f32, y.data_ptr() as *mut f32);
        // `pack_for` checked that this CPU has the set for the weights' dtype.
        let isa = self.isa as i64;
        let status = if self.is_bf16() {
            // SAFETY: `x` is a contiguous fp32 CPU tensor of m·k elements, `self.packed` a contiguous bf16 CPU
            // tensor of n·2·⌈k/2⌉ elements in the paired panel layout (n a multiple of 16, checked at packing),
            // and `y` a freshly allocated contiguous fp32 CPU tensor of m·n elements that nothing else
            // references; all three outlive the call, which only reads x and packed and writes y within those
            // bounds.
            unsafe { trinity_packed_gemm_bf16(xp, m, self.k, self.packed.data_ptr() as *const u16, self.n, yp, isa) }
        } else {
            // SAFETY: as above, with `self.packed` a contiguous fp32 CPU tensor of n·k elements in panel layout.
            unsafe { trinity_packed_gemm(xp, m, self.k, self.packed.data_ptr() as *const f32, self.n, yp, isa) }
        };
        if status != 0 {
            return Err(ModelError::InvalidInput("packed matmul failed in libtorch's thread pool".into()));
        }
        Ok(())
    }

    #[cfg(not(packed_gemm))]
    fn run(&self, _x: &Tensor, _m: i64, _y: &Tensor) -> Result<()> {
        Err(ModelError::InvalidInput("packed matmul is not built for this target".into()))
    }
}

/// An uninitialised contiguous CPU tensor of `shape` and `kind` in memory from `arena`, with the buffer it views;
/// an ordinary tensor (and `None`) where the arena has no memory to give.
fn empty_in(arena: &mut WeightArena, shape: [i64; 3], kind: Kind) -> Result<(Tensor, Option<Buffer>)> {
    let bytes = shape.iter().product::<i64>() as usize * kind.elt_size_in_bytes();
    let Some(buffer) = arena.alloc(bytes) else { return Ok((Tensor::f_empty(shape, (kind, Device::Cpu))?, None)) };
    // SAFETY: `buffer` is `bytes` of zeroed, 64-byte-aligned memory (valid values of any dtype), exactly the
    // contiguous `shape` of `kind`; the tensor only views it, and the `PackedLinear` that keeps the tensor keeps the
    // buffer too, dropping the view first.
    let tensor = unsafe { Tensor::f_from_blob(buffer.ptr(), &shape, &[], kind, Device::Cpu)? };
    Ok((tensor, Some(buffer)))
}

/// `(n, k)` of `weights` stacked along n, when every one is a 2-D `kind` CPU tensor of the same k.
fn stacked_shape(weights: &[&Tensor], kind: Kind) -> Option<(i64, i64)> {
    let k = weights.first()?.size().get(1).copied()?;
    let stackable =
        weights.iter().all(|w| w.kind() == kind && w.device() == Device::Cpu && w.dim() == 2 && w.size()[1] == k);
    stackable.then(|| (weights.iter().map(|w| w.size()[0]).sum(), k))
}

/// Writes `sources` (contiguous `[n_i, k]` in `packed`'s dtype, n = Σ n_i a multiple of 16) into `packed`
/// (fp32 `n·k` or bf16 `n·2·⌈k/2⌉` elements in the grouped panel layout), every element of it.
#[cfg(packed_gemm)]
fn fill_panels(sources: &[Tensor], k: i64, packed: &Tensor) -> Result<()> {
    let rows: Vec<i64> = sources.iter().map(|t| t.size()[0]).collect();
    let count = sources.len() as i64;
    let status = if packed.kind() == Kind::BFloat16 {
        let pointers: Vec<*const u16> = sources.iter().map(|t| t.data_ptr() as *const u16).collect();
        // SAFETY: every source is a live contiguous bf16 CPU tensor of rows[i]·k elements (checked by `pack_for`
        // or `repack`, made contiguous there) and `packed` a contiguous bf16 tensor of Σ rows[i]·2·⌈k/2⌉ elements
        // that no kernel reads meanwhile (the caller holds it mutably or just created it); the call reads only the
        // sources and writes only `packed`, within those bounds.
        unsafe { trinity_pack_panels_bf16(pointers.as_ptr(), rows.as_ptr(), count, k, packed.data_ptr() as *mut u16) }
    } else {
        let pointers: Vec<*const f32> = sources.iter().map(|t| t.data_ptr() as *const f32).collect();
        // SAFETY: as above, for fp32 sources and an fp32 `packed` of Σ rows[i]·k elements.
        unsafe { trinity_pack_panels(pointers.as_ptr(), rows.as_ptr(), count, k, packed.data_ptr() as *mut f32) }
    };
    if status != 0 {
        return Err(ModelError::InvalidInput("packing weights failed in libtorch's thread pool".into()));
    }
    Ok(())
}

#[cfg(not(packed_gemm))]
fn fill_panels(_sources: &[Tensor], _k: i64, _packed: &Tensor) -> Result<()> {
    Err(ModelError::InvalidInput("packed matmul is not built for this target".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    /// Random `[n, k]` weights of `kind` for each n in `ns` and, with `bias`, fp32 biases, packed together for
    /// `isa`; returns the stacked weights (as fp32) and bias the packed copy must reproduce.
    fn random_packed(isa: Isa, k: i64, ns: &[i64], kind: Kind, bias: bool) -> (Tensor, Option<Tensor>, PackedLinear) {
        let ws: Vec<Tensor> = ns.iter().map(|&n| Tensor::randn([n, k], (kind, Device::Cpu))).collect();
        let bs: Vec<Option<Tensor>> =
            ns.iter().map(|&n| bias.then(|| Tensor::randn([n], (Kind::Float, Device::Cpu)))).collect();
        let packed = PackedLinear::pack_for(
            &mut WeightArena::default(),
            isa,
            &ws.iter().collect::<Vec<_>>(),
            &bs.iter().map(Option::as_ref).collect::<Vec<_>>(),
        )
        .unwrap()
        .expect("eligible");
        assert_eq!(packed.isa(), isa, "the copy runs on the set it was packed for");
        let b = bias.then(|| Tensor::cat(&bs.iter().flatten().collect::<Vec<_>>(), 0));
        (Tensor::cat(&ws, 0).to_kind(Kind::Float), b, packed)
    }

    /// The instruction sets to test for `kind`: all this CPU has. Where it has none, packing must decline (the
    /// libtorch fallback) and the list is empty; an AVX2 + FMA CPU (every supported CI machine) always has one,
    /// so these tests cannot pass on the fallback there.
    fn sets_to_test(kind: Kind) -> Vec<Isa> {
        let isas = Isa::available(kind);
        assert_eq!(Isa::best(kind), isas.first().copied(), "the fastest set is the first");
        #[cfg(packed_gemm)]
        {
            let avx2 = std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
            assert_eq!(isas.contains(&Isa::Avx2), avx2, "{kind:?}: AVX2 kernel where the CPU has AVX2 + FMA");
        }
        isas
    }

    #[test]
    fn matches_libtorch_for_every_row_count_and_tail() {
        tch::manual_seed(0);
        for isa in sets_to_test(Kind::Float) {
            // 16 + 32 + 64 outputs: panel groups of 3, 2 and 1 all occur; k = 41 is odd.
            for (k, bias) in [(40_i64, true), (41, false)] {
                let (w, b, packed) = random_packed(isa, k, &[16, 32, 64], Kind::Float, bias);
                assert_eq!(packed.out_features(), 112);
                for m in (1_i64..=16).chain([23, 64]) {
                    let x = Tensor::randn([m, k], (Kind::Float, Device::Cpu));
                    let want = x.linear(&w, b.as_ref());
                    let got = packed.forward(&x).unwrap();
                    assert_eq!(got.size(), [m, 112]);
                    assert!(max_diff(&got, &want) < 1e-4, "{isa:?} k = {k} m = {m}: {}", max_diff(&got, &want));
                }
                // Leading dimensions are flattened into rows.
                let x = Tensor::randn([2, 3, k], (Kind::Float, Device::Cpu));
                assert!(max_diff(&packed.forward(&x).unwrap(), &x.linear(&w, b.as_ref())) < 1e-4, "{isa:?}");
            }
        }
    }

    #[test]
    fn bf16_weights_match_the_bf16_rounded_product() {
        tch::manual_seed(0);
        for isa in sets_to_test(Kind::BFloat16) {
            // An odd k exercises the zero padding of the last pair; 48 outputs make one group of 3 panels, 64 a
            // group of 3 and one of 1, 32 one group of 2. k = 64 and 96 (a whole number of 16-pair tile steps)
            // take the AMX tiles, in blocks of up to 16 rows (23 and 64 rows: several blocks, a partial last one).
            for (k, ns, bias) in
                [(41_i64, [16_i64, 32], true), (64, [48, 16], false), (7, [16, 16], true), (96, [32, 48], true)]
            {
                let (w, b, packed) = random_packed(isa, k, &ns, Kind::BFloat16, bias);
                assert!(packed.is_bf16());
                for m in (1_i64..=16).chain([23, 64]) {
                    let x = Tensor::randn([m, k], (Kind::Float, Device::Cpu));
                    // What the kernel computes: inputs rounded to bf16, products and sums in fp32.
                    let want = x.to_kind(Kind::BFloat16).to_kind(Kind::Float).linear(&w, b.as_ref());
                    let got = packed.forward(&x).unwrap();
                    assert_eq!(got.kind(), Kind::Float);
                    assert!(max_diff(&got, &want) < 1e-3, "{isa:?} k = {k}, m = {m}: {}", max_diff(&got, &want));
                }
            }
        }
    }

    #[test]
    fn bf16_rounding_of_the_input_is_round_to_nearest_even() {
        // Ties: the kernel's input rounding must agree with libtorch's bf16 conversion, which a wrong rounding rule
        // (truncation, ties away from zero) would not.
        let values: Vec<f32> = vec![
            1.0 + 2f32.powi(-8),                  // tie, even below: rounds down
            1.0 + 3.0 * 2f32.powi(-8),            // tie, odd below: rounds up
            1.0 + 2f32.powi(-8) + 2f32.powi(-20), // above the tie: up
            -(1.0 + 3.0 * 2f32.powi(-8)),
            3.0e38,
        ];
        let k = values.len() as i64;
        let x = Tensor::from_slice(&values).view([1, k]);
        for isa in sets_to_test(Kind::BFloat16) {
            // Identity weights (padded to 16 outputs) read back the rounded input.
            let w = Tensor::eye_m(16, k, (Kind::BFloat16, Device::Cpu));
            let packed =
                PackedLinear::pack_for(&mut WeightArena::default(), isa, &[&w], &[None]).unwrap().expect("eligible");
            let got = packed.forward(&x).unwrap().narrow(1, 0, k);
            let want = x.to_kind(Kind::BFloat16).to_kind(Kind::Float);
            let (got, want) =
                (Vec::<f32>::try_from(got.flatten(0, -1)).unwrap(), Vec::<f32>::try_from(want.flatten(0, -1)).unwrap());
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g, w, "{isa:?}: {got:?} vs {want:?}");
            }
        }
    }

    #[test]
    fn repack_rewrites_the_copy_in_place() {
        tch::manual_seed(0);
        for kind in [Kind::Float, Kind::BFloat16] {
            for isa in sets_to_test(kind) {
                let (_, _, mut packed) = random_packed(isa, 41, &[16, 32], kind, true);
                let before = packed.weight_ptr();
                let ws = [Tensor::randn([16, 41], (kind, Device::Cpu)), Tensor::randn([32, 41], (kind, Device::Cpu))];
                let bs =
                    [Tensor::randn([16], (Kind::Float, Device::Cpu)), Tensor::randn([32], (Kind::Float, Device::Cpu))];
                packed.repack(&[&ws[0], &ws[1]], &[Some(&bs[0]), Some(&bs[1])]).unwrap();
                assert_eq!(packed.weight_ptr(), before, "{isa:?} {kind:?}: no new buffer");
                let x = Tensor::randn([5, 41], (Kind::Float, Device::Cpu));
                let w = Tensor::cat(&ws, 0).to_kind(Kind::Float);
                let x_in = if kind == Kind::Float { x.shallow_clone() } else { x.to_kind(kind).to_kind(Kind::Float) };
                let want = x_in.linear(&w, Some(&Tensor::cat(&bs, 0)));
                assert!(max_diff(&packed.forward(&x).unwrap(), &want) < 1e-3, "{isa:?} {kind:?}");
                let err = packed.repack(&[&ws[0]], &[Some(&bs[0])]).unwrap_err();
                assert!(err.to_string().contains("pack them anew"), "{err}");
                let err = packed.repack(&[&ws[0], &ws[1]], &[None, None]).unwrap_err();
                assert!(err.to_string().contains("pack them anew"), "a bias dropped: {err}");
            }
        }
    }

    /// Copies packed from one arena share its memory and each keeps it mapped: the arena and the other copies
    /// can go first.
    #[test]
    fn copies_from_one_arena_outlive_it_and_each_other() {
        tch::manual_seed(1);
        for kind in [Kind::Float, Kind::BFloat16] {
            for isa in sets_to_test(kind) {
                let ws = [Tensor::randn([32, 24], (kind, Device::Cpu)), Tensor::randn([16, 24], (kind, Device::Cpu))];
                let mut arena = WeightArena::default();
                let mut pack = |w: &Tensor| PackedLinear::pack_for(&mut arena, isa, &[w], &[None]).unwrap().unwrap();
                let (first, second) = (pack(&ws[0]), pack(&ws[1]));
                drop(arena);
                if cfg!(target_os = "linux") {
                    let (a, b) = (first.weight_ptr() as usize, second.weight_ptr() as usize);
                    assert_eq!(a % (2 << 20), 0, "{isa:?} {kind:?}: the chunk starts on a huge page");
                    assert_eq!(b - a, (32 * 24 * kind.elt_size_in_bytes()).next_multiple_of(64), "back to back");
                }
                drop(first);
                let x = Tensor::randn([3, 24], (Kind::Float, Device::Cpu));
                let x_in = if kind == Kind::Float { x.shallow_clone() } else { x.to_kind(kind).to_kind(Kind::Float) };
                let want = x_in.linear::<Tensor>(&ws[1].to_kind(Kind::Float), None);
                assert!(max_diff(&second.forward(&x).unwrap(), &want) < 1e-3, "{isa:?} {kind:?}");
            }
        }
    }

    #[test]
    fn ineligible_weights_and_inputs_are_refused() {
        let odd = Tensor::randn([24, 8], (Kind::Float, Device::Cpu));
        assert!(
            PackedLinear::pack_for(&mut WeightArena::default(), Isa::Avx2, &[&odd], &[None]).unwrap().is_none(),
            "24 outputs is not a multiple of 16"
        );
        let half = Tensor::randn([16, 8], (Kind::Half, Device::Cpu));
        assert!(PackedLinear::pack_for(&mut WeightArena::default(), Isa::Avx2, &[&half], &[None]).unwrap().is_none());
        let (f, b) = (Tensor::randn([16, 8], (Kind::Float, Device::Cpu)), half.to_kind(Kind::BFloat16));
        assert!(
            PackedLinear::pack_for(&mut WeightArena::default(), Isa::Avx2, &[&f, &b], &[None, None]).unwrap().is_none(),
            "mixed dtypes"
        );
        if let Some(p) = PackedLinear::pack_for(
            &mut WeightArena::default(),
            Isa::Avx2,
            &[&Tensor::randn([16, 8], (Kind::Float, Device::Cpu))],
            &[None],
        )
        .unwrap()
        {
            let err = p.forward(&Tensor::randn([2, 9], (Kind::Float, Device::Cpu))).unwrap_err();
            assert!(err.to_string().contains("[..., 8]"), "{err}");
        }
    }
}
