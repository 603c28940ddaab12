//! Entropy losses (Trinity-RFT's `entropy_loss_fn.py`): `default`, `mix`, `none`.
//!
//! default: entropy_coef·agg(H, m, loss_agg_mode); mix: the same over non-expert rows only (needs
//! `expert_mask`); none: nothing. The term is *subtracted* from the loss, so a positive coefficient raises
//! entropy. Metric: `entropy_loss` (the unscaled aggregate). An entropy loss from an algorithm library
//! ([`EntropyKind::Library`], through [`crate::external::ExternalEntropy`]) computes the unscaled aggregate and its metrics; the coefficient is the host's.

use std::sync::Arc;

use serde_json::{Map, Value};
use tch::Tensor;

use crate::aggregation::LossAggMode;
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::external::ExternalEntropy;
use crate::masked::scalar;
use crate::metrics::Metrics;

/// Which rows the entropy bonus covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntropyKind {
    Default,
    Mix,
    None,
    /// A loaded algorithm library's entropy loss.
    Library,
}

/// A registered entropy loss.
#[derive(Debug)]
pub struct EntropyLossFnEntry {
    pub name: &'static str,
    pub kind: EntropyKind,
}

inventory::collect!(EntropyLossFnEntry);

/// Arguments every entropy loss accepts.
pub const ENTROPY_ARGS: &[ArgSpec] = &[arg("entropy_coef", ArgDefault::Float(0.0))];

inventory::submit! { EntropyLossFnEntry { name: "default", kind: EntropyKind::Default } }
inventory::submit! { EntropyLossFnEntry { name: "mix", kind: EntropyKind::Mix } }
inventory::submit! { EntropyLossFnEntry { name: "none", kind: EntropyKind::None } }

/// An entropy loss with its coefficient.
#[derive(Debug, Clone)]
pub struct EntropyLossFn {
    pub kind: EntropyKind,
    pub entropy_coef: f64,
    /// For [`EntropyKind::Library`]: the external function and every resolved argument.
    library: Option<(Arc<dyn ExternalEntropy>, Map<String, Value>)>,
}

impl EntropyLossFn {
    pub fn from_args(kind: EntropyKind, args: &Args) -> Result<Self, AlgorithmError> {
        Ok(EntropyLossFn { kind, entropy_coef: args.f64("entropy_coef")?, library: None })
    }

    /// Builds an external (library) entropy loss from resolved arguments (`entropy_coef` and its own).
    pub(crate) fn from_external(component: Arc<dyn ExternalEntropy>, args: &Args) -> Result<Self, AlgorithmError> {
        let mut f = EntropyLossFn::from_args(EntropyKind::Library, args)?;
        f.library = Some((component, args.values().clone()));
        Ok(f)
    }

    /// `(entropy_coef · aggregate, aggregate, metrics)`; for `none`, zeros and no metrics.
    pub fn loss(
        &self,
        batch: &Batch,
        mode: LossAggMode,
        component: &str,
    ) -> Result<(Tensor, Tensor, Metrics), AlgorithmError> {
        let rows: Vec<i64> = match self.kind {
            EntropyKind::None => return Ok((Tensor::from(0f32), Tensor::from(0f32), Metrics::new())),
            EntropyKind::Library => {
                // `from_external` is the only constructor that selects this kind, and it sets `library`.
                let Some((f, args)) = &self.library else {
                    return Err(AlgorithmError::InvalidInput(format!("{component}: library entropy loss unset")));
                };
                let (agg, metrics) = f.entropy(batch, mode.name(), args)?;
                return Ok((&agg * self.entropy_coef, agg, metrics));
            }
            EntropyKind::Default => (0..batch.rows() as i64).collect(),
            EntropyKind::Mix => {
                let expert = batch
                    .expert_mask
                    .as_ref()
                    .ok_or(AlgorithmError::MissingField { component: component.to_owned(), field: "expert_mask" })?;
                (0..expert.len()).filter(|&i| !expert[i]).map(|i| i as i64).collect()
            }
        };
        let entropy = batch.need("entropy", &batch.entropy, component)?;
        let (entropy, mask) = if rows.len() == batch.rows() {
            (entropy.shallow_clone(), batch.action_mask.shallow_clone())
        } else {
            let idx = Tensor::from_slice(&rows);
            (entropy.index_select(0, &idx), batch.action_mask.index_select(0, &idx))
        };
        let agg = mode.aggregate(&entropy, &mask, None);
        let metrics = Metrics::from([("entropy_loss".to_owned(), scalar(&agg))]);
        Ok((&agg * self.entropy_coef, agg, metrics))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("entropy");
    }
}
