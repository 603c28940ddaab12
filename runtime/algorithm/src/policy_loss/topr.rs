//! `topr`: tapered off-policy REINFORCE (Trinity-RFT's `TOPRPolicyLossFn`).
//!
//! r = e^{ℓ−ℓ_old}; α = clamp(r, 0, 1) where A ≤ threshold, else 1; L = −sg(α)·A·ℓ; loss = agg(L, m).
//! (With the `reinforce` advantage, A is the raw reward.) Metrics: `topr_loss`, `avg_alpha`, `avg_ratio`.

use tch::Tensor;

use crate::aggregation::LossAggMode;
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::masked::masked_mean;
use crate::metrics::Metrics;
use crate::policy_loss::{Inputs, PolicyLossFn, PolicyLossFnEntry, advantages, agg_mode, item, old_logprob};

const NAME: &str = "topr";

const ARGS: &[ArgSpec] =
    &[arg("advantage_threshold", ArgDefault::Float(0.0)), arg("loss_agg_mode", ArgDefault::Str("token-mean"))];

#[derive(Debug)]
struct Topr {
    threshold: f64,
    loss_agg_mode: LossAggMode,
}

fn build(args: &Args) -> Result<Box<dyn PolicyLossFn>, AlgorithmError> {
    Ok(Box::new(Topr { threshold: args.f64("advantage_threshold")?, loss_agg_mode: agg_mode(args, "loss_agg_mode")? }))
}

inventory::submit! { PolicyLossFnEntry { name: NAME, args: ARGS, build } }

impl PolicyLossFn for Topr {
    fn loss_agg_mode(&self) -> Option<LossAggMode> {
        Some(self.loss_agg_mode)
    }

    fn loss(&self, batch: &Batch) -> Result<(Tensor, Metrics), AlgorithmError> {
        let Inputs { logprob, mask } = Inputs::new(batch, NAME)?;
        let old = old_logprob(batch, NAME)?;
        let rewards = advantages(batch, NAME)?;
        let ratio = (logprob - old).exp();
        let alpha = ratio.clamp(0.0, 1.0).where_self(&rewards.le(self.threshold), &ratio.ones_like());
        let losses = -alpha.detach() * rewards * logprob;
        let loss = self.loss_agg_mode.aggregate(&losses, mask, None);
        let mut metrics = Metrics::new();
        metrics.insert("topr_loss".into(), item(&loss));
        metrics.insert("avg_alpha".into(), item(&masked_mean(&alpha, mask, None)));
        metrics.insert("avg_ratio".into(), item(&masked_mean(&ratio, mask, None)));
        Ok((loss, metrics))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("policy_loss_topr");
    }
}
