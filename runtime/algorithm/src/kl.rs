//! KL functions (Trinity-RFT's `kl_fn.py`): `none`, `k1`, `k2`, `k3`, `low_var_kl`, `abs`, `corrected_k3`.
//!
//! With x = ℓ (current, or old for the reward penalty) and y = ℓ_ref:
//! * k1: x − y;  k2: ½(x − y)²;  k3: e^{y−x} − 1 − (y − x);  abs: |x − y|;
//! * low_var_kl: k = clamp(y − x, −20, 20); clamp(e^k − k − 1, −10, 10);
//! * corrected_k3: k3 · clamp(e^{ℓ−ℓ_old}, 0, 2), plain k3 without ℓ_old;
//! * none: no KL at all (zero loss, the penalty passes rewards through, no metrics).
//!
//! Two uses. **KL loss** (`kl_loss_fn`): kl_coef·agg(KL(ℓ, ℓ_ref[, ℓ_old]), m); metrics `kl_loss` (the unscaled
//! aggregate) and `kl_coef`. **KL reward penalty** (`kl_penalty_fn`, trainer-side advantages only):
//! token_level_rewards = scores − kl_coef·KL(ℓ_old, ℓ_ref)·m; current_kl = mean_i masked_mean_t(KL·m); metrics
//! `kl` and `kl_coef` (the coefficient used). With `adaptive`, the coefficient then moves by the proportional
//! controller e = clip(current_kl/target_kl − 1, −0.2, 0.2), kl_coef ← kl_coef·(1 + e·batch_size/horizon).
//!
//! A KL function from an algorithm library or other external source ([`KlEstimator::Library`], through
//! [`crate::external::ExternalKl`]) supplies only the per-token estimate; the
//! coefficient, aggregation, reward penalty and adaptive controller above are the host's, as for built-ins.
//!
//! Trinity-RFT bug fixed here: its controller calls `torch.clip` on a Python float, which raises `TypeError`,
//! so `adaptive: true` cannot run there; we run the controller as written, in double precision.

use std::sync::Arc;

use serde_json::{Map, Value};
use tch::{Kind, Tensor};

use crate::aggregation::LossAggMode;
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::external::ExternalKl;
use crate::masked::{masked_mean, scalar};
use crate::metrics::Metrics;

/// Which estimator of KL(π‖π_ref) per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KlEstimator {
    None,
    K1,
    K2,
    K3,
    LowVarKl,
    Abs,
    CorrectedK3,
    /// The estimator of a loaded algorithm library's KL function.
    Library,
}

/// A registered KL function.
#[derive(Debug)]
pub struct KlFnEntry {
    pub name: &'static str,
    pub estimator: KlEstimator,
}

inventory::collect!(KlFnEntry);

/// Arguments every KL function accepts.
pub const KL_ARGS: &[ArgSpec] = &[
    arg("adaptive", ArgDefault::Bool(false)),
    arg("kl_coef", ArgDefault::Float(0.001)),
    arg("target_kl", ArgDefault::Null),
    arg("horizon", ArgDefault::Null),
];

inventory::submit! { KlFnEntry { name: "none", estimator: KlEstimator::None } }
inventory::submit! { KlFnEntry { name: "k1", estimator: KlEstimator::K1 } }
inventory::submit! { KlFnEntry { name: "k2", estimator: KlEstimator::K2 } }
inventory::submit! { KlFnEntry { name: "k3", estimator: KlEstimator::K3 } }
inventory::submit! { KlFnEntry { name: "low_var_kl", estimator: KlEstimator::LowVarKl } }
inventory::submit! { KlFnEntry { name: "abs", estimator: KlEstimator::Abs } }
inventory::submit! { KlFnEntry { name: "corrected_k3", estimator: KlEstimator::CorrectedK3 } }

/// A KL function with its coefficient and, for the reward penalty, the adaptive controller's state.
#[derive(Debug, Clone)]
pub struct KlFn {
    pub estimator: KlEstimator,
    pub kl_coef: f64,
    adaptive: Option<(f64, f64)>,
    /// For [`KlEstimator::Library`]: the external estimator and every resolved argument.
    library: Option<(Arc<dyn ExternalKl>, Map<String, Value>)>,
}

fn k3(logprob: &Tensor, reference: &Tensor) -> Tensor {
    let logr = reference - logprob;
    logr.exp() - 1.0 - logr
}

impl KlFn {
    /// Builds from resolved arguments; `adaptive` needs both `target_kl` and `horizon`.
    pub fn from_args(estimator: KlEstimator, args: &Args) -> Result<Self, AlgorithmError> {
        let adaptive = if args.bool("adaptive")? {
            let target = args.opt_f64("target_kl")?;
            let horizon = args.opt_f64("horizon")?;
            match (target, horizon) {
                (Some(t), Some(h)) => Some((t, h)),
                _ => return Err(args.invalid("adaptive", "needs target_kl and horizon")),
            }
        } else {
            None
        };
        Ok(KlFn { estimator, kl_coef: args.f64("kl_coef")?, adaptive, library: None })
    }

    /// Builds an external (library) KL function from resolved arguments (the common ones and its own).
    pub(crate) fn from_external(component: Arc<dyn ExternalKl>, args: &Args) -> Result<Self, AlgorithmError> {
        let mut f = KlFn::from_args(KlEstimator::Library, args)?;
        f.library = Some((component, args.values().clone()));
        Ok(f)
    }

    /// Whether this is the `none` function (no loss term, no penalty, no metrics).
    pub fn is_none(&self) -> bool {
        self.estimator == KlEstimator::None
    }

    /// Per-token KL of `logprob` from `reference`; `old` only matters for `corrected_k3` (and for library
    /// estimators that read it). Only a library estimator can fail.
    pub fn calculate(
        &self,
        logprob: &Tensor,
        reference: &Tensor,
        old: Option<&Tensor>,
    ) -> Result<Tensor, AlgorithmError> {
        Ok(match self.estimator {
            KlEstimator::None => logprob.zeros_like(),
            KlEstimator::K1 => logprob - reference,
            KlEstimator::K2 => (logprob - reference).square() * 0.5,
            KlEstimator::K3 => k3(logprob, reference),
            KlEstimator::LowVarKl => {
                let kl = (reference - logprob).clamp(-20.0, 20.0);
                (kl.exp() - &kl - 1.0).clamp(-10.0, 10.0)
            }
            KlEstimator::Abs => (logprob - reference).abs(),
            KlEstimator::CorrectedK3 => {
                let kl = k3(logprob, reference);
                match old {
                    Some(old) => (logprob - old).exp().clamp(0.0, 2.0) * kl,
                    None => kl,
                }
            }
            KlEstimator::Library => {
                // `from_external` is the only constructor that selects this estimator, and it sets `library`.
                let Some((component, args)) = &self.library else {
                    return Err(AlgorithmError::InvalidInput("a library KL function without its library".into()));
                };
                return component.kl(logprob, reference, old, args);
            }
        })
    }

    /// The KL loss term: `(kl_coef · aggregate, aggregate, metrics)`; for `none`, zeros and no metrics.
    pub fn loss(
        &self,
        batch: &Batch,
        mode: LossAggMode,
        component: &str,
    ) -> Result<(Tensor, Tensor, Metrics), AlgorithmError> {
        if self.is_none() {
            return Ok((Tensor::from(0f32), Tensor::from(0f32), Metrics::new()));
        }
        let logprob = batch.need("logprob", &batch.logprob, component)?;
        let reference = batch.need("ref_logprob", &batch.ref_logprob, component)?;
        let kl = self.calculate(logprob, reference, batch.old_logprob.as_ref())?;
        let agg = mode.aggregate(&kl, &batch.action_mask, None);
        let mut metrics = Metrics::new();
        metrics.insert("kl_loss".into(), scalar(&agg));
        metrics.insert("kl_coef".into(), self.kl_coef);
        Ok((&agg * self.kl_coef, agg, metrics))
    }

    /// Applies the KL penalty to per-token `scores`, returning the penalized rewards and `kl`, `kl_coef`
    /// metrics, then advances the adaptive controller. Needs `old_logprob` and `ref_logprob` (Trinity-RFT reads
    /// the latter unconditionally, so its "no reference" branch is unreachable).
    pub fn apply_penalty(
        &mut self,
        batch: &Batch,
        scores: &Tensor,
        component: &str,
    ) -> Result<(Tensor, Metrics), AlgorithmError> {
        if self.is_none() {
            return Ok((scores.shallow_clone(), Metrics::new()));
        }
        let mask = &batch.action_mask;
        let old = batch.need("old_logprob", &batch.old_logprob, component)?;
        let reference = batch.need("ref_logprob", &batch.ref_logprob, component)?;
        let kl = self.calculate(old, reference, None)? * mask;
        let coef = self.kl_coef;
        let rewards = scores - &kl * coef;
        let current_kl = scalar(&masked_mean(&kl, mask, Some(-1)).mean(Kind::Float));
        self.update_coef(current_kl, batch.rows());
        let metrics = Metrics::from([("kl".to_owned(), current_kl), ("kl_coef".to_owned(), coef)]);
        Ok((rewards, metrics))
    }

    /// The adaptive KL controller's step (a no-op unless `adaptive`).
    pub fn update_coef(&mut self, current_kl: f64, batch_size: usize) {
        if let Some((target, horizon)) = self.adaptive {
            let error = (current_kl / target - 1.0).clamp(-0.2, 0.2);
            self.kl_coef *= 1.0 + error * batch_size as f64 / horizon;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("kl");
    }

    #[test]
    fn adaptive_controller_moves_toward_target() {
        let specs = KL_ARGS;
        let user = serde_json::json!({"adaptive": true, "target_kl": 0.1, "horizon": 100.0, "kl_coef": 0.5});
        let args = Args::resolve(crate::registry::Kind::KlFn, "k1", specs, user.as_object()).unwrap();
        let mut kl = KlFn::from_args(KlEstimator::K1, &args).unwrap();
        kl.update_coef(1.0, 10);
        assert!((kl.kl_coef - 0.5 * (1.0 + 0.2 * 10.0 / 100.0)).abs() < 1e-7);
        kl.update_coef(0.0, 10);
        assert!(kl.kl_coef < 0.51);
        let bad = serde_json::json!({"adaptive": true});
        let args = Args::resolve(crate::registry::Kind::KlFn, "k1", specs, bad.as_object()).unwrap();
        assert!(KlFn::from_args(KlEstimator::K1, &args).unwrap_err().to_string().contains("target_kl"));
    }
}
