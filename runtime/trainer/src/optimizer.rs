//! AdamW with fp32 master weights, global gradient-norm clipping and a safetensors state file.
//!
//! The update is PyTorch's `torch.optim.AdamW` (the optimizer veRL builds for the actor and the critic), applied
//! to every parameter, norms and biases included, as veRL does:
//! ```text
//! p ← p·(1 − lr·wd);  m ← β₁m + (1 − β₁)g;  v ← β₂v + (1 − β₂)g²
//! p ← p − lr/(1 − β₁ᵗ) · m / (√v/√(1 − β₂ᵗ) + ε)
//! ```
//! Invariants:
//! - Moments and master weights are fp32. A parameter stored in fp32 is its own master; one stored in bf16/f16
//!   (mixed precision, as FSDP's `MixedPrecision(param_dtype=bf16)` in veRL) gets an fp32 master copy, the
//!   update happens on the master and is then written into the parameter in place, so anything holding the
//!   parameter tensor (the model, a synchronizer) sees the new values without reallocation.
//! - [`AdamW::clip_grad_norm`] follows `torch.nn.utils.clip_grad_norm_`: the global L2 norm over all gradients
//!   (fp32), scaled by `max_norm / (norm + 1e-6)` when that is below 1. A non-finite norm leaves the gradients
//!   alone; the trainer then skips the update, as veRL does.
//! - The state file ([`AdamW::save`]) holds `exp_avg/NAME`, `exp_avg_sq/NAME`, `master/NAME` (only for
//!   mixed-precision parameters) and a one-element `step` tensor; loading checks names and shapes.
//! - Offload (`optimizer_offload`, [`AdamW::placed`]): moments and masters live in host memory and the update runs
//!   there, as FSDP2's CPU offload does: each gradient is copied to the host, the moments and the master (or,
//!   for an fp32 parameter, which then has no master, the update itself) are computed there, and the new values
//!   are copied back into the parameter on its device. A parameter on the host (a CPU run) takes the same path
//!   with no copies, so offloaded and resident state train alike; the state file is the same either way.
//! - Sharded data parallel ([`zero`]): each parameter may carry a shard, the contiguous range of its flattened
//!   elements this rank updates; its moments and master then hold only those elements (1-D), the update reads the
//!   shard's gradient that [`zero`] reduced, and writes only the shard of the parameter (the other ranks' shards
//!   arrive by all-gather). Without a shard a parameter is whole, in its own shape, as above.
//! - A state built [`AdamW::deferred`] is allocated only when first used, whole, or by [`zero`] as this rank's
//!   shards alone, so sharding lowers the start's peak as well as the step's.

mod fused;
pub mod zero;
pub mod zero3;

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use tch::{Kind, Tensor};

use crate::error::{Result, TrainerError};

/// AdamW hyper-parameters (the learning rate comes per step from the schedule).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWSettings {
    pub betas: [f64; 2],
    pub eps: f64,
    pub weight_decay: f64,
}

impl From<&trinity_config::algorithm::OptimizerConfig> for AdamWSettings {
    fn from(c: &trinity_config::algorithm::OptimizerConfig) -> Self {
        AdamWSettings { betas: c.betas, eps: c.eps, weight_decay: c.weight_decay }
    }
}

#[derive(Debug)]
struct Param {
    name: String,
    /// The model's tensor (a leaf that receives `.grad`).
    var: Tensor,
    /// fp32 copy when `var` is not fp32.
    master: Option<Tensor>,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// Sharded data parallel: the elements of the flattened parameter this rank updates (moments and master hold
    /// only these, 1-D); `None`: all of them, in the parameter's shape.
    shard: Option<Range<i64>>,
    /// With a shard: the reduced gradient of its elements for the coming update, set by [`zero`].
    shard_grad: Option<Tensor>,
}

impl Param {
    /// The gradient the update reads: the parameter's own, or with a shard the shard's.
    fn grad(&self) -> Option<Tensor> {
        match &self.shard {
            None => Some(self.var.grad()).filter(Tensor::defined),
            Some(_) => self.shard_grad.as_ref().map(Tensor::shallow_clone),
        }
    }

    /// The elements of the parameter this rank updates (a view sharing its storage).
    fn owned(&self) -> Result<Tensor> {
        match &self.shard {
            None => Ok(self.var.shallow_clone()),
            Some(r) => Ok(tch::no_grad(|| self.var.f_view([-1])?.f_narrow(0, r.start, r.end - r.start))?),
        }
    }
}

/// AdamW over a fixed list of named parameters.
#[derive(Debug)]
pub struct AdamW {
    params: Vec<Param>,
    settings: AdamWSettings,
    step: i64,
    /// Whether the moments and masters are in host memory (see the module docs).
    offloaded: bool,
    /// Whether the state is not allocated yet ([`AdamW::deferred`]): the moments are empty and no master exists.
    deferred: bool,
}

impl AdamW {
    /// Takes the parameters (shallow handles to the model's variables) and allocates zero moments beside them.
    pub fn new(params: Vec<(String, Tensor)>, settings: AdamWSettings) -> Result<Self> {
        Self::placed(params, settings, false)
    }

    /// [`AdamW::new`] with the moments and masters in host memory when `offload` (`optimizer_offload`).
    pub fn placed(params: Vec<(String, Tensor)>, settings: AdamWSettings, offload: bool) -> Result<Self> {
        let mut adamw = Self::deferred(params, settings, offload)?;
        adamw.materialize()?;
        Ok(adamw)
    }

    /// [`AdamW::placed`] without allocating the state yet, for an optimizer that sharded data parallel may split:
    /// [`zero::Zero::new`] then allocates only this rank's shard of it, so no rank ever holds the whole state (a
    /// 7B model's 84 GB of fp32 moments and masters would not fit on one GPU even for a moment). Until then the
    /// state is a fresh one: zero moments and masters equal to the parameters, which is what
    /// [`AdamW::materialize`] allocates on first use when nothing shards it.
    pub fn deferred(params: Vec<(String, Tensor)>, settings: AdamWSettings, offload: bool) -> Result<Self> {
        let params = params
            .into_iter()
            .map(|(name, var)| -> Result<Param> {
                let home = if offload { tch::Device::Cpu } else { var.device() };
                let empty = || Tensor::f_empty([0], (Kind::Float, home));
                Ok(Param {
                    name,
                    exp_avg: empty()?,
                    exp_avg_sq: empty()?,
                    master: None,
                    var,
                    shard: None,
                    shard_grad: None,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(AdamW { params, settings, step: 0, offloaded: offload, deferred: true })
    }

    /// Allocates a deferred state whole ([`AdamW::deferred`]); a no-op once it exists (whole or sharded).
    pub fn materialize(&mut self) -> Result<()> {
        if !std::mem::replace(&mut self.deferred, false) {
            return Ok(());
        }
        let offload = self.offloaded;
        tch::no_grad(|| -> Result<()> {
            for p in &mut self.params {
                let home = if offload { tch::Device::Cpu } else { p.var.device() };
                p.master = match p.var.kind() {
                    Kind::Float => None,
                    _ => Some(p.var.f_to_kind(Kind::Float)?.f_to_device(home)?),
                };
                p.exp_avg = Tensor::f_zeros(p.var.size(), (Kind::Float, home))?;
                p.exp_avg_sq = Tensor::f_zeros(p.var.size(), (Kind::Float, home))?;
            }
            Ok(())
        })
    }

    /// The hyper-parameters (for a stage-3 layout that takes the parameters over).
    pub(crate) fn settings(&self) -> AdamWSettings {
        self.settings
    }

    /// Whether the state is still unallocated ([`AdamW::deferred`]).
    pub fn is_deferred(&self) -> bool {
        self.deferred
    }

    /// Whether the moments and masters are in host memory (`optimizer_offload`).
    pub fn is_offloaded(&self) -> bool {
        self.offloaded
    }

    /// Where the moments and masters are: host memory when offloaded, else with the parameters.
    pub fn state_devices(&self) -> Vec<tch::Device> {
        self.params.iter().map(|p| p.exp_avg.device()).collect()
    }

    /// Updates taken so far (`t` in the bias correction).
    pub fn step_count(&self) -> i64 {
        self.step
    }

    /// Elements of optimizer state this rank holds (moments and master weights): with sharded data parallel
    /// about 1/world of the whole.
    pub fn state_elements(&self) -> i64 {
        let master = |p: &Param| p.master.as_ref().map_or(0, |m| m.numel() as i64);
        self.params.iter().map(|p| p.exp_avg.numel() as i64 + p.exp_avg_sq.numel() as i64 + master(p)).sum()
    }

    /// Whether the state is sharded over data-parallel ranks ([`zero`]).
    pub fn is_sharded(&self) -> bool {
        self.params.iter().any(|p| p.shard.is_some())
    }

    /// The fp32 values of every parameter (the master copy where there is one), by name. With a sharded state,
    /// the parameters themselves (their masters are split over the ranks).
    pub fn master_weights(&self) -> Vec<(String, Tensor)> {
        // A deferred state's masters would be copies of the parameters.
        if self.is_sharded() || self.deferred {
            return self.params.iter().map(|p| (p.name.clone(), p.var.shallow_clone())).collect();
        }
        self.params.iter().map(|p| (p.name.clone(), p.master.as_ref().unwrap_or(&p.var).shallow_clone())).collect()
    }

    /// The parameters (shallow handles), in order: what a data-parallel step reduces the gradients of.
    pub(crate) fn param_vars(&self) -> Vec<Tensor> {
        self.params.iter().map(|p| p.var.shallow_clone()).collect()
    }

    /// Moments and master weights by their state-file names (shallow handles), for a data-parallel start; none
    /// while the state is deferred (a fresh state follows from the parameters, which are broadcast).
    pub(crate) fn state_tensors(&self) -> Vec<(String, Tensor)> {
        if self.deferred {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(self.params.len() * 3);
        for p in &self.params {
            out.push((format!("exp_avg/{}", p.name), p.exp_avg.shallow_clone()));
            out.push((format!("exp_avg_sq/{}", p.name), p.exp_avg_sq.shallow_clone()));
            if let Some(m) = &p.master {
                out.push((format!("master/{}", p.name), m.shallow_clone()));
            }
        }
        out
    }

    /// Sets the update count (`t` of the bias correction), for a data-parallel start.
    pub(crate) fn set_step_count(&mut self, step: i64) {
        self.step = step;
    }

    /// Clears every gradient: drops it (PyTorch's and veRL's `zero_grad(set_to_none=True)`), so the next backward
    /// writes its result as the gradient instead of adding it into zeros; a parameter that then gets no gradient
    /// is left alone by [`AdamW::step`], as in PyTorch.
    pub fn zero_grad(&mut self) {
        for p in &mut self.params {
            trinity_model::release_grad(&mut p.var);
            p.shard_grad = None;
        }
    }

    /// The buffers of every parameter that has a gradient, when the fused CPU path can take them all.
    fn fused_slots(&self) -> Option<Vec<fused::Slot>> {
        self.params
            .iter()
            .filter_map(|p| Some((p, p.grad()?)))
            .map(|(p, g)| fused::Slot::new(&p.owned().ok()?, &g, p.master.as_ref(), &p.exp_avg, &p.exp_avg_sq))
            .collect()
    }

    /// The global L2 norm of the gradients (parameters without a gradient count as zero); with a sharded state,
    /// of this rank's shards only ([`zero`] sums the ranks' squares).
    pub fn grad_norm(&self) -> Result<f64> {
        Ok(self.grad_sum_of_squares()?.sqrt())
    }

    /// The sum of the squared gradients the update reads, in f64.
    pub(crate) fn grad_sum_of_squares(&self) -> Result<f64> {
        if let Some(slots) = self.fused_slots() {
            // SAFETY: the slots point into this optimizer's tensors and the parameters' gradients, alive and
            // unchanged for the call (`&self`); only gradients are read.
            return Ok(unsafe { fused::sum_of_squares(&slots, threads()) });
        }
        let mut total = 0.0;
        for p in &self.params {
            if let Some(g) = p.grad() {
                total += g.f_to_kind(Kind::Float)?.f_square()?.f_sum(Kind::Double)?.f_double_value(&[])?;
            }
        }
        Ok(total)
    }

    /// Scales the gradients so their global norm is at most `max_norm`; returns the norm before clipping.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> Result<f64> {
        self.materialize()?;
        let norm = self.grad_norm()?;
        self.clip_to(norm, max_norm)?;
        Ok(norm)
    }

    /// Scales the gradients by `max_norm / (norm + 1e-6)` when that is below 1 and `norm` is finite.
    pub(crate) fn clip_to(&mut self, norm: f64, max_norm: f64) -> Result<()> {
        self.materialize()?;
        let coef = max_norm / (norm + 1e-6);
        if norm.is_finite() && coef < 1.0 {
            if let Some(slots) = self.fused_slots() {
                // SAFETY: the slots point into this optimizer's parameters' gradients, alive and ours alone for
                // the call (`&mut self`).
                unsafe { fused::scale_grads(&slots, coef as f32, threads()) };
                return Ok(());
            }
            // In fp32, as PyTorch's `clip_grad_norm_` scales (tch's in-place multiply of a bf16 tensor by a scalar
            // would round the coefficient to bf16 first).
            tch::no_grad(|| -> Result<()> {
                for p in &self.params {
                    if let Some(mut g) = p.grad() {
                        g.f_copy_(&g.f_to_kind(Kind::Float)?.f_mul_scalar(coef as f32 as f64)?)?;
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// One AdamW update with learning rate `lr` from the current gradients (parameters without a gradient
    /// are left alone, as in PyTorch).
    pub fn step(&mut self, lr: f64) -> Result<()> {
        self.materialize()?;
        self.step += 1;
        let [b1, b2] = self.settings.betas;
        let t = self.step as i32;
        let bias1 = 1.0 - b1.powi(t);
        let bias2_sqrt = (1.0 - b2.powi(t)).sqrt();
        let (eps, wd) = (self.settings.eps, self.settings.weight_decay);
        if let Some(slots) = self.fused_slots() {
            let coefficients = fused::Coefficients {
                decay: (wd != 0.0).then_some((1.0 - lr * wd) as f32),
                beta1: b1 as f32,
                one_minus_beta1: (1.0 - b1) as f32,
                beta2: b2 as f32,
                one_minus_beta2: (1.0 - b2) as f32,
                bias2_sqrt: bias2_sqrt as f32,
                eps: eps as f32,
                step: (-lr / bias1) as f32,
            };
            // SAFETY: every slot points into a distinct parameter's own master (or fp32 parameter), moments and
            // bf16 parameter, all alive and exclusively borrowed through `&mut self` for the call; gradients are
            // only read.
            unsafe { fused::adamw(&slots, coefficients, threads()) };
            return Ok(());
        }
        tch::no_grad(|| -> Result<()> {
            for p in &mut self.params {
                let Some(g) = p.grad() else { continue };
                // Offloaded: the gradient comes to the state's host memory (a no-op for a parameter there already).
                let g = g.f_to_kind(Kind::Float)?.f_to_device(p.exp_avg.device())?;
                let mut owned = p.owned()?;
                let mut target = match &p.master {
                    Some(m) => m.shallow_clone(),
                    None => owned.shallow_clone(),
                };
                if wd != 0.0 {
                    let _ = target.f_mul_scalar_(1.0 - lr * wd)?;
                }
                let _ = p.exp_avg.f_mul_scalar_(b1)?.f_add_(&(&g * (1.0 - b1)))?;
                let _ = p.exp_avg_sq.f_mul_scalar_(b2)?.f_addcmul_(&g, &(&g * (1.0 - b2)))?;
                let denom = (p.exp_avg_sq.f_sqrt()? / bias2_sqrt).f_add_scalar(eps)?;
                let update = p.exp_avg.f_div(&denom)? * (-lr / bias1);
                // An offloaded fp32 parameter has no master: the update computed on the host goes to its device.
                let _ = target.f_add_(&update.f_to_device(target.device())?)?;
                if p.master.is_some() {
                    owned.f_copy_(&target)?;
                }
            }
            Ok(())
        })
    }

    /// Writes the moments, master weights and step count to a safetensors file.
    pub fn save(&self, path: &Path) -> Result<()> {
        if self.is_sharded() {
            return Err(TrainerError::DataParallel(
                "the optimizer state is sharded over the data-parallel ranks: save it through the trainer, which \
                 gathers it"
                    .into(),
            ));
        }
        let mut tensors: Vec<(String, Tensor)> = Vec::with_capacity(self.params.len() * 2 + 1);
        let cpu = tch::Device::Cpu;
        for p in &self.params {
            if self.deferred {
                // The fresh state the first use would allocate, one parameter at a time.
                let zeros = || Tensor::f_zeros(p.var.size(), (Kind::Float, cpu));
                tensors.push((format!("exp_avg/{}", p.name), zeros()?));
                tensors.push((format!("exp_avg_sq/{}", p.name), zeros()?));
                if p.var.kind() != Kind::Float {
                    tensors.push((format!("master/{}", p.name), p.var.f_to_kind(Kind::Float)?.f_to_device(cpu)?));
                }
                continue;
            }
            tensors.push((format!("exp_avg/{}", p.name), p.exp_avg.f_to_device(cpu)?));
            tensors.push((format!("exp_avg_sq/{}", p.name), p.exp_avg_sq.f_to_device(cpu)?));
            if let Some(m) = &p.master {
                tensors.push((format!("master/{}", p.name), m.f_to_device(cpu)?));
            }
        }
        tensors.push(("step".to_owned(), Tensor::from_slice(&[self.step])));
        trinity_model::write_safetensors(path, &tensors)?;
        Ok(())
    }

    /// Restores a state written by [`AdamW::save`] for the same parameters (names and shapes must match; a
    /// mixed-precision parameter is set from its saved master).
    pub fn load(&mut self, path: &Path) -> Result<()> {
        if self.is_sharded() {
            return Err(TrainerError::DataParallel(
                "the optimizer state is sharded over the data-parallel ranks: load it through the trainer".into(),
            ));
        }
        self.materialize()?;
        let bad = |problem: String| TrainerError::OptimizerState { path: path.to_path_buf(), problem };
        let mut saved: HashMap<String, Tensor> = Tensor::read_safetensors(path)?.into_iter().collect();
        let step = saved.remove("step").ok_or_else(|| bad("no `step` entry".into()))?;
        let step = step.f_int64_value(&[0])?;
        tch::no_grad(|| -> Result<()> {
            for p in &mut self.params {
                let mut take = |key: String, like: &Tensor| -> Result<Tensor> {
                    let t = saved.remove(&key).ok_or_else(|| bad(format!("no entry `{key}`")))?;
                    if t.size() != like.size() {
                        return Err(bad(format!("`{key}` has shape {:?}, the parameter {:?}", t.size(), like.size())));
                    }
                    Ok(t)
                };
                let avg = take(format!("exp_avg/{}", p.name), &p.var)?;
                let avg_sq = take(format!("exp_avg_sq/{}", p.name), &p.var)?;
                p.exp_avg.f_copy_(&avg)?;
                p.exp_avg_sq.f_copy_(&avg_sq)?;
                if let Some(master) = &mut p.master {
                    let m = take(format!("master/{}", p.name), &p.var)?;
                    master.f_copy_(&m)?;
                    p.var.f_copy_(&m)?;
                }
            }
            Ok(())
        })?;
        if let Some(extra) = saved.keys().next() {
            return Err(bad(format!("entry `{extra}` matches no parameter")));
        }
        self.step = step;
        Ok(())
    }
}

/// Threads for the fused update: the calling thread's libtorch setting.
fn threads() -> usize {
    usize::try_from(tch::get_num_threads()).unwrap_or(1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> AdamWSettings {
        AdamWSettings { betas: [0.9, 0.999], eps: 1e-8, weight_decay: 0.01 }
    }

    /// Two AdamW steps on f(p) = Σ p², checked against the formula computed by hand in f64.
    #[test]
    fn matches_torch_adamw_formula() {
        let p = Tensor::from_slice(&[1.0f32, -2.0]).set_requires_grad(true);
        let mut opt = AdamW::new(vec![("p".into(), p.shallow_clone())], settings()).unwrap();
        let mut want = [1.0f64, -2.0];
        let (mut m, mut v) = ([0.0f64; 2], [0.0f64; 2]);
        for t in 1..=2 {
            opt.zero_grad();
            p.square().sum(Kind::Float).backward();
            opt.step(0.1).unwrap();
            for i in 0..2 {
                let g = 2.0 * want[i];
                want[i] *= 1.0 - 0.1 * 0.01;
                m[i] = 0.9 * m[i] + 0.1 * g;
                v[i] = 0.999 * v[i] + 0.001 * g * g;
                let mhat = m[i] / (1.0 - 0.9f64.powi(t));
                let denom = (v[i].sqrt() / (1.0 - 0.999f64.powi(t)).sqrt()) + 1e-8;
                want[i] -= 0.1 * mhat / denom;
            }
        }
        let got = Vec::<f32>::try_from(&p.detach()).unwrap();
        for i in 0..2 {
            assert!((got[i] as f64 - want[i]).abs() < 1e-5, "{got:?} vs {want:?}");
        }
        assert_eq!(opt.step_count(), 2);
    }

    /// The fused CPU update against the libtorch one (taken when a tensor is not contiguous), over several
    /// steps of fp32 and bf16 parameters larger than one work chunk.
    #[test]
    fn fused_update_matches_the_libtorch_path() {
        let _rng = crate::torch_rng();
        for kind in [Kind::Float, Kind::BFloat16] {
            tch::manual_seed(3);
            let init = Tensor::randn([300, 700], (Kind::Float, tch::Device::Cpu));
            let fused_p = init.to_kind(kind).copy().set_requires_grad(true);
            // A leaf with transposed strides is not contiguous, so its optimizer keeps to libtorch ops.
            let plain_p = init.to_kind(kind).tr().contiguous().tr().detach().set_requires_grad(true);
            assert!(!plain_p.is_contiguous());
            let mut fused = AdamW::new(vec![("w".into(), fused_p.shallow_clone())], settings()).unwrap();
            let mut plain = AdamW::new(vec![("w".into(), plain_p.shallow_clone())], settings()).unwrap();
            for step in 0..3 {
                let target = Tensor::randn([300, 700], (Kind::Float, tch::Device::Cpu));
                for (opt, p, fast) in [(&mut fused, &fused_p, true), (&mut plain, &plain_p, false)] {
                    opt.zero_grad();
                    (p.to_kind(Kind::Float) - &target).square().sum(Kind::Float).backward();
                    assert_eq!(opt.fused_slots().is_some(), fast, "{kind:?} step {step}");
                    let norm = opt.clip_grad_norm(50.0).unwrap();
                    assert!(norm > 50.0, "{norm}");
                    opt.step(1e-2).unwrap();
                }
                let a = &fused.master_weights()[0].1;
                let b = &plain.master_weights()[0].1;
                let diff = (a - b).abs().max().double_value(&[]);
                assert!(diff < 1e-6, "{kind:?} step {step}: masters differ by {diff}");
                let low = (&fused_p - &plain_p).abs().max().to_kind(Kind::Float).double_value(&[]);
                assert!(low <= 2.0f64.powi(-6), "{kind:?} step {step}: parameters differ by {low}");
            }
        }
    }

    /// Offloaded state (host memory: on a CPU run the parameters' own) trains exactly as resident state, through
    /// the fused update and the libtorch one (a non-contiguous parameter), in fp32 and bf16, and its state file is
    /// the same.
    #[test]
    fn offloaded_state_trains_as_resident_state() {
        let _rng = crate::torch_rng();
        for kind in [Kind::Float, Kind::BFloat16] {
            tch::manual_seed(5);
            let init = Tensor::randn([40, 30], (Kind::Float, tch::Device::Cpu)).to_kind(kind);
            let params = || {
                let contiguous = init.copy().set_requires_grad(true);
                let strided = init.tr().contiguous().tr().detach().set_requires_grad(true);
                (contiguous, strided)
            };
            let ((a, a2), (b, b2)) = (params(), params());
            let named =
                |x: &Tensor, y: &Tensor| vec![("x".to_owned(), x.shallow_clone()), ("y".into(), y.shallow_clone())];
            let mut resident = AdamW::placed(named(&a, &a2), settings(), false).unwrap();
            let mut offloaded = AdamW::placed(named(&b, &b2), settings(), true).unwrap();
            assert!(offloaded.is_offloaded() && !resident.is_offloaded());
            assert!(offloaded.state_devices().iter().all(|d| *d == tch::Device::Cpu));
            for _ in 0..3 {
                let target = Tensor::randn([40, 30], (Kind::Float, tch::Device::Cpu));
                for (opt, x, y) in [(&mut resident, &a, &a2), (&mut offloaded, &b, &b2)] {
                    opt.zero_grad();
                    let loss = (x.to_kind(Kind::Float) - &target).square().sum(Kind::Float)
                        + (y.to_kind(Kind::Float) * &target).sum(Kind::Float);
                    loss.backward();
                    opt.clip_grad_norm(10.0).unwrap();
                    opt.step(1e-2).unwrap();
                }
            }
            assert!(a.equal(&b) && a2.equal(&b2), "{kind:?}: offloaded training differs");
            let dir = tempfile::tempdir().unwrap();
            resident.save(&dir.path().join("r.safetensors")).unwrap();
            offloaded.save(&dir.path().join("o.safetensors")).unwrap();
            let read = |f: &str| {
                let entries = Tensor::read_safetensors(dir.path().join(f)).unwrap();
                entries.into_iter().collect::<std::collections::BTreeMap<_, _>>()
            };
            let (r, o) = (read("r.safetensors"), read("o.safetensors"));
            assert_eq!(r.len(), o.len());
            for ((rn, rt), (on, ot)) in r.iter().zip(&o) {
                assert!(rn == on && rt.equal(ot), "{kind:?}: state entry {rn} differs");
            }
        }
    }

    /// A deferred state holds nothing until its first use, then trains exactly as one allocated at the start, and
    /// its state file before any step is the fresh state's.
    #[test]
    fn a_deferred_state_allocates_on_first_use_and_trains_as_a_placed_one() {
        for kind in [Kind::Float, Kind::BFloat16] {
            let init = Tensor::from_slice(&[0.5f32, -1.5, 2.0, 0.25]).to_kind(kind);
            let (a, b) = (init.copy().set_requires_grad(true), init.copy().set_requires_grad(true));
            let mut placed = AdamW::placed(vec![("w".into(), a.shallow_clone())], settings(), false).unwrap();
            let mut deferred = AdamW::deferred(vec![("w".into(), b.shallow_clone())], settings(), false).unwrap();
            assert!(deferred.is_deferred() && !placed.is_deferred());
            assert_eq!(deferred.state_elements(), 0);
            assert!(deferred.state_tensors().is_empty());
            let dir = tempfile::tempdir().unwrap();
            placed.save(&dir.path().join("p.safetensors")).unwrap();
            deferred.save(&dir.path().join("d.safetensors")).unwrap();
            let read = |f: &str| {
                let entries = Tensor::read_safetensors(dir.path().join(f)).unwrap();
                entries.into_iter().collect::<std::collections::BTreeMap<_, _>>()
            };
            let (p, d) = (read("p.safetensors"), read("d.safetensors"));
            assert_eq!(p.len(), if kind == Kind::Float { 3 } else { 4 });
            for ((pn, pt), (dn, dt)) in p.iter().zip(&d) {
                assert!(pn == dn && pt.equal(dt), "{kind:?}: fresh state entry {pn} differs");
            }
            for _ in 0..3 {
                for (opt, x) in [(&mut placed, &a), (&mut deferred, &b)] {
                    opt.zero_grad();
                    (x.to_kind(Kind::Float) * Tensor::from_slice(&[1.0f32, -2.0, 3.0, 0.5]))
                        .sum(Kind::Float)
                        .backward();
                    opt.clip_grad_norm(1.0).unwrap();
                    opt.step(1e-2).unwrap();
                }
            }
            assert!(!deferred.is_deferred());
            assert_eq!(deferred.state_elements(), placed.state_elements());
            assert!(a.equal(&b), "{kind:?}: a deferred state trains differently");
        }
    }

    #[test]
    fn clipping_scales_to_max_norm() {
        let p = Tensor::from_slice(&[3.0f32, 4.0]).set_requires_grad(true);
        let mut opt = AdamW::new(vec![("p".into(), p.shallow_clone())], settings()).unwrap();
        (&p * &p).sum(Kind::Float).backward(); // grad (6, 8), norm 10
        let norm = opt.clip_grad_norm(1.0).unwrap();
        assert!((norm - 10.0).abs() < 1e-6);
        assert!((opt.grad_norm().unwrap() - 1.0).abs() < 1e-5);
    }

    #[test]
    fn bf16_parameters_update_through_fp32_masters() {
        let p = Tensor::from_slice(&[1.0f32, 1.0]).to_kind(Kind::BFloat16).set_requires_grad(true);
        let mut opt =
            AdamW::new(vec![("p".into(), p.shallow_clone())], AdamWSettings { weight_decay: 0.0, ..settings() })
                .unwrap();
        // Steps far below bf16 resolution at 1.0 (2^-8) accumulate in the master and show up eventually.
        for _ in 0..20 {
            opt.zero_grad();
            p.to_kind(Kind::Float).sum(Kind::Float).backward();
            opt.step(1e-3).unwrap();
        }
        let master = &opt.master_weights()[0].1;
        assert!((master.double_value(&[0]) - (1.0 - 20.0 * 1e-3)).abs() < 1e-4);
        assert!(p.double_value(&[0]) < 1.0 - 2.0f64.powi(-8));
    }

    #[test]
    fn state_round_trips_and_mismatches_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("optimizer.safetensors");
        let p = Tensor::from_slice(&[1.0f32, -2.0]).to_kind(Kind::BFloat16).set_requires_grad(true);
        let mut opt = AdamW::new(vec![("w".into(), p.shallow_clone())], settings()).unwrap();
        p.to_kind(Kind::Float).square().sum(Kind::Float).backward();
        opt.step(0.1).unwrap();
        opt.save(&path).unwrap();

        let q = Tensor::from_slice(&[0.0f32, 0.0]).to_kind(Kind::BFloat16).set_requires_grad(true);
        let mut other = AdamW::new(vec![("w".into(), q.shallow_clone())], settings()).unwrap();
        other.load(&path).unwrap();
        assert_eq!(other.step_count(), 1);
        assert!(bool::try_from(other.params[0].exp_avg.eq_tensor(&opt.params[0].exp_avg).all()).unwrap());
        assert!(bool::try_from(other.params[0].exp_avg_sq.eq_tensor(&opt.params[0].exp_avg_sq).all()).unwrap());
        assert!(bool::try_from(q.eq_tensor(&p).all()).unwrap());

        let r = Tensor::zeros([3], (Kind::BFloat16, tch::Device::Cpu)).set_requires_grad(true);
        let mut wrong = AdamW::new(vec![("w".into(), r)], settings()).unwrap();
        let err = wrong.load(&path).unwrap_err().to_string();
        assert!(err.contains("exp_avg/w") && err.contains("shape"), "{err}");
        let s = Tensor::zeros([2], (Kind::BFloat16, tch::Device::Cpu)).set_requires_grad(true);
        let mut renamed = AdamW::new(vec![("v".into(), s)], settings()).unwrap();
        assert!(renamed.load(&path).unwrap_err().to_string().contains("exp_avg/v"));
    }
}
