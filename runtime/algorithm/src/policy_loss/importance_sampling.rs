//! `importance_sampling`: the plain importance-sampled policy gradient (Trinity-RFT's
//! `ImportanceSamplingLossFn`, used for on-policy distillation).
//!
//! Δ = clamp(ℓ − ℓ_old, −20, 20); L = −A·e^Δ; loss = agg(L, m).
//! Metrics: `pg_loss`, `ratio/mean` = masked_mean(e^Δ), `approx_kl` = masked_mean(−Δ).

use tch::Tensor;

use crate::aggregation::LossAggMode;
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::masked::masked_mean;
use crate::metrics::Metrics;
use crate::policy_loss::{Inputs, PolicyLossFn, PolicyLossFnEntry, advantages, agg_mode, item, old_logprob};

const NAME: &str = "importance_sampling";

const ARGS: &[ArgSpec] = &[arg("loss_agg_mode", ArgDefault::Str("token-mean"))];

#[derive(Debug)]
struct ImportanceSampling {
    loss_agg_mode: LossAggMode,
}

fn build(args: &Args) -> Result<Box<dyn PolicyLossFn>, AlgorithmError> {
    Ok(Box::new(ImportanceSampling { loss_agg_mode: agg_mode(args, "loss_agg_mode")? }))
}

inventory::submit! { PolicyLossFnEntry { name: NAME, args: ARGS, build } }

impl PolicyLossFn for ImportanceSampling {
    fn loss_agg_mode(&self) -> Option<LossAggMode> {
        Some(self.loss_agg_mode)
    }

    fn loss(&self, batch: &Batch) -> Result<(Tensor, Metrics), AlgorithmError> {
        let Inputs { logprob, mask } = Inputs::new(batch, NAME)?;
        let old = old_logprob(batch, NAME)?;
        let adv = advantages(batch, NAME)?;
        let log_ratio = (logprob - old).clamp(-20.0, 20.0);
        let ratio = log_ratio.exp();
        let pg_loss = self.loss_agg_mode.aggregate(&(-adv * &ratio), mask, None);
        let mut metrics = Metrics::new();
        metrics.insert("pg_loss".into(), item(&pg_loss));
        metrics.insert("ratio/mean".into(), item(&masked_mean(&ratio, mask, None)));
        metrics.insert("approx_kl".into(), item(&masked_mean(&(-log_ratio), mask, None)));
        Ok((pg_loss, metrics))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("policy_loss_importance_sampling");
    }
}
