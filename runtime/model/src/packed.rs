//! Packed weights for the decode step's small matrix multiplies (x86-64 with AVX-512; fp32 weights, or bf16
//! weights where the CPU has AVX512-BF16).
//!
//! A decode step runs every weight of the model against a few rows, one per running sequence. libtorch's sgemm
//! is tuned for many rows and runs these shapes at a fraction of the CPU's fp32 throughput, so the generation
//! engine packs each projection once (`[n / 16, k, 16]`, 16 output columns k-major) and multiplies with the
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

use tch::{Device, Kind, Tensor};

use crate::error::{ModelError, Result};

const PANEL: i64 = 16;

#[cfg(packed_gemm)]
unsafe extern "C" {
    fn trinity_packed_gemm(x: *const f32, m: i64, k: i64, packed: *const f32, n: i64, y: *mut f32) -> i32;
    fn trinity_pack_panels(sources: *const *const f32, rows: *const i64, count: i64, k: i64, packed: *mut f32) -> i32;
    fn trinity_packed_gemm_bf16(x: *const f32, m: i64, k: i64, packed: *const u16, n: i64, y: *mut f32) -> i32;
    fn trinity_pack_panels_bf16(
        sources: *const *const u16,
        rows: *const i64,
        count: i64,
        k: i64,
        packed: *mut u16,
    ) -> i32;
}

/// Whether this build and CPU can run the packed kernel.
pub fn supported() -> bool {
    #[cfg(packed_gemm)]
    {
        std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(packed_gemm))]
    {
        false
    }
}

/// Whether this build and CPU can run the packed kernel on bf16 weights.
pub fn bf16_supported() -> bool {
    #[cfg(packed_gemm)]
    {
        supported()
            && std::arch::is_x86_feature_detected!("avx512bf16")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(packed_gemm))]
    {
        false
    }
}

/// Whether `kind` weights can be packed on this build and CPU.
pub fn packs(kind: Kind) -> bool {
    match kind {
        Kind::Float => supported(),
        Kind::BFloat16 => bf16_supported(),
        _ => false,
    }
}

/// One or more `[n_i, k]` weight matrices (stacked along n) in panel layout, with their stacked bias.
#[derive(Debug)]
pub struct PackedLinear {
    /// fp32 `[n / 16, k, 16]`, or bf16 `[n / 16, (k + 1) / 2, 32]` (k in pairs).
    packed: Tensor,
    bias: Option<Tensor>,
    n: i64,
    k: i64,
}

impl PackedLinear {
    /// Packs `weights` (each `[n_i, k]`, all fp32 or all bf16, CPU) stacked along the output dimension.
    /// `biases` are all present or all absent. Returns `None` when the kernel cannot serve these weights
    /// (another dtype or device, no AVX-512 or AVX512-BF16, or a total output size that is not a multiple of 16).
    pub fn pack(weights: &[&Tensor], biases: &[Option<&Tensor>]) -> Result<Option<Self>> {
        let Some(kind) = weights.first().map(|w| w.kind()) else { return Ok(None) };
        if !packs(kind) {
            return Ok(None);
        }
        let k = weights[0].size().get(1).copied().unwrap_or(0);
        let eligible =
            weights.iter().all(|w| w.kind() == kind && w.device() == Device::Cpu && w.dim() == 2 && w.size()[1] == k);
        let n: i64 = weights.iter().map(|w| w.size()[0]).sum();
        if !eligible || k == 0 || n % PANEL != 0 {
            return Ok(None);
        }
        let sources: Vec<Tensor> = weights.iter().map(|w| w.f_contiguous()).collect::<std::result::Result<_, _>>()?;
        let shape = if kind == Kind::Float { [n / PANEL, k, PANEL] } else { [n / PANEL, (k + 1) / 2, 2 * PANEL] };
        let packed = Tensor::f_empty(shape, (kind, Device::Cpu))?;
        fill_panels(&sources, k, &packed)?;
        let bias = match biases.iter().copied().collect::<Option<Vec<&Tensor>>>() {
            Some(b) if !b.is_empty() => Some(tch::no_grad(|| Tensor::f_cat(&b, 0))?.f_to_kind(Kind::Float)?),
            _ => None,
        };
        Ok(Some(PackedLinear { packed, bias, n, k }))
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
        let status = if self.is_bf16() {
            // SAFETY: `x` is a contiguous fp32 CPU tensor of m·k elements, `self.packed` a contiguous bf16 CPU
            // tensor of n·2·⌈k/2⌉ elements in the paired panel layout (n a multiple of 16, checked at packing),
            // and `y` a freshly allocated contiguous fp32 CPU tensor of m·n elements that nothing else
            // references; all three outlive the call, which only reads x and packed and writes y within those
            // bounds.
            unsafe { trinity_packed_gemm_bf16(xp, m, self.k, self.packed.data_ptr() as *const u16, self.n, yp) }
        } else {
            // SAFETY: as above, with `self.packed` a contiguous fp32 CPU tensor of n·k elements in panel layout.
            unsafe { trinity_packed_gemm(xp, m, self.k, self.packed.data_ptr() as *const f32, self.n, yp) }
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

/// Writes `sources` (contiguous `[n_i, k]` in `packed`'s dtype, n = Σ n_i a multiple of 16) into `packed`
/// (fp32 `[n / 16, k, 16]` or bf16 `[n / 16, (k + 1) / 2, 32]`).
#[cfg(packed_gemm)]
fn fill_panels(sources: &[Tensor], k: i64, packed: &Tensor) -> Result<()> {
    let rows: Vec<i64> = sources.iter().map(|t| t.size()[0]).collect();
    let count = sources.len() as i64;
    let status = if packed.kind() == Kind::BFloat16 {
        let pointers: Vec<*const u16> = sources.iter().map(|t| t.data_ptr() as *const u16).collect();
        // SAFETY: every source is a live contiguous bf16 CPU tensor of rows[i]·k elements (checked by `pack`,
        // made contiguous there) and `packed` a fresh contiguous bf16 tensor of Σ rows[i]·2·⌈k/2⌉ elements that
        // nothing else references; the call reads only the sources and writes only `packed`, within those bounds.
        unsafe { trinity_pack_panels_bf16(pointers.as_ptr(), rows.as_ptr(), count, k, packed.data_ptr() as *mut u16) }
    } else {
        let pointers: Vec<*const f32> = sources.iter().map(|t| t.data_ptr() as *const f32).collect();
        // SAFETY: as above, for fp32 sources and a fresh fp32 `packed` of Σ rows[i]·k elements.
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

    /// Random `[n, k]` weights of `kind` for each n in `ns` and fp32 biases, packed together; returns the
    /// stacked weights (as fp32) and biases the packed copy must reproduce.
    fn random_packed(k: i64, ns: &[i64], kind: Kind) -> (Tensor, Tensor, PackedLinear) {
        let ws: Vec<Tensor> = ns.iter().map(|&n| Tensor::randn([n, k], (kind, Device::Cpu))).collect();
        let bs: Vec<Tensor> = ns.iter().map(|&n| Tensor::randn([n], (Kind::Float, Device::Cpu))).collect();
        let packed = PackedLinear::pack(&ws.iter().collect::<Vec<_>>(), &bs.iter().map(Some).collect::<Vec<_>>())
            .unwrap()
            .expect("eligible");
        (Tensor::cat(&ws, 0).to_kind(Kind::Float), Tensor::cat(&bs, 0), packed)
    }

    #[test]
    fn matches_libtorch_for_every_row_count_and_tail() {
        if !supported() {
            eprintln!("skipped: no AVX-512 on this CPU");
            return;
        }
        tch::manual_seed(0);
        // 16 + 32 + 48 + 16 outputs: panel groups of 3, 2 and 1 all occur.
        let k = 40;
        let (w, b, packed) = random_packed(k, &[16, 32, 64], Kind::Float);
        assert_eq!(packed.out_features(), 112);
        for m in [1_i64, 3, 7, 8, 9, 16, 23, 64] {
            let x = Tensor::randn([m, k], (Kind::Float, Device::Cpu));
            let want = x.linear(&w, Some(&b));
            let got = packed.forward(&x).unwrap();
            assert_eq!(got.size(), [m, 112]);
            assert!(max_diff(&got, &want) < 1e-4, "m = {m}: {}", max_diff(&got, &want));
        }
        // Leading dimensions are flattened into rows.
        let x = Tensor::randn([2, 3, k], (Kind::Float, Device::Cpu));
        assert!(max_diff(&packed.forward(&x).unwrap(), &x.linear(&w, Some(&b))) < 1e-4);
    }

    #[test]
    fn bf16_weights_match_the_bf16_rounded_product() {
        if !bf16_supported() {
            eprintln!("skipped: no AVX512-BF16 on this CPU");
            return;
        }
        tch::manual_seed(0);
        // An odd k exercises the zero padding of the last pair; 48 outputs make one group of 3 panels, 64 a group
        // of 3 and one of 1.
        for (k, ns) in [(41_i64, [16_i64, 32]), (64, [48, 16])] {
            let (w, b, packed) = random_packed(k, &ns, Kind::BFloat16);
            assert!(packed.is_bf16());
            for m in [1_i64, 5, 8, 13, 64] {
                let x = Tensor::randn([m, k], (Kind::Float, Device::Cpu));
                // What the kernel computes: inputs rounded to bf16, products and sums in fp32.
                let want = x.to_kind(Kind::BFloat16).to_kind(Kind::Float).linear(&w, Some(&b));
                let got = packed.forward(&x).unwrap();
                assert_eq!(got.kind(), Kind::Float);
                assert!(max_diff(&got, &want) < 1e-3, "k = {k}, m = {m}: {}", max_diff(&got, &want));
            }
        }
    }

    #[test]
    fn ineligible_weights_and_inputs_are_refused() {
        let odd = Tensor::randn([24, 8], (Kind::Float, Device::Cpu));
        assert!(PackedLinear::pack(&[&odd], &[None]).unwrap().is_none(), "24 outputs is not a multiple of 16");
        let half = Tensor::randn([16, 8], (Kind::Half, Device::Cpu));
        assert!(PackedLinear::pack(&[&half], &[None]).unwrap().is_none());
        let (f, b) = (Tensor::randn([16, 8], (Kind::Float, Device::Cpu)), half.to_kind(Kind::BFloat16));
        assert!(PackedLinear::pack(&[&f, &b], &[None, None]).unwrap().is_none(), "mixed dtypes");
        if let Some(p) = PackedLinear::pack(&[&Tensor::randn([16, 8], (Kind::Float, Device::Cpu))], &[None]).unwrap() {
            let err = p.forward(&Tensor::randn([2, 9], (Kind::Float, Device::Cpu))).unwrap_err();
            assert!(err.to_string().contains("[..., 8]"), "{err}");
        }
    }
}
