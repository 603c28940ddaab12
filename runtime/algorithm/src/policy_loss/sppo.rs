//! `sppo`: simple PPO, token variant (Trinity-RFT's `sPPOPolicyLossFn`).
//!
//! r = sg(e^{ℓ−ℓ_old}); I = [1/(1+ε) ≤ r ≤ 1+ε]; L = −A·(ℓ − ℓ_old)·I; loss = agg(L, m).
//! Metrics: `pg_clipfrac` = masked_mean(¬I), `pg_loss`.

use tch::{Kind, Tensor};

use crate::aggregation::LossAggMode;
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::masked::masked_mean;
use crate::metrics::Metrics;
use crate::policy_loss::{Inputs, PolicyLossFn, PolicyLossFnEntry, advantages, agg_mode, item, old_logprob};

const NAME: &str = "sppo";

const ARGS: &[ArgSpec] = &[arg("epsilon", ArgDefault::Float(0.3)), arg("loss_agg_mode", ArgDefault::Str("token-mean"))];

#[derive(Debug)]
struct Sppo {
    epsilon: f64,
    loss_agg_mode: LossAggMode,
}

fn build(args: &Args) -> Result<Box<dyn PolicyLossFn>, AlgorithmError> {
    Ok(Box::new(Sppo { epsilon: args.f64("epsilon")?, loss_agg_mode: agg_mode(args, "loss_agg_mode")? }))
}

inventory::submit! { PolicyLossFnEntry { name: NAME, args: ARGS, build } }

impl PolicyLossFn for Sppo {
    fn loss_agg_mode(&self) -> Option<LossAggMode> {
        Some(self.loss_agg_mode)
    }

    fn loss(&self, batch: &Batch) -> Result<(Tensor, Metrics), AlgorithmError> {
        let Inputs { logprob, mask } = Inputs::new(batch, NAME)?;
        let old = old_logprob(batch, NAME)?;
        let adv = advantages(batch, NAME)?;
        let ratio = (logprob - old).exp().detach();
        let in_range = ratio.ge(1.0 / (1.0 + self.epsilon)).logical_and(&ratio.le(1.0 + self.epsilon));
        let losses = -adv * (logprob - old) * in_range.to_kind(Kind::Float);
        let pg_loss = self.loss_agg_mode.aggregate(&losses, mask, None);
        let mut metrics = Metrics::new();
        metrics
            .insert("pg_clipfrac".into(), item(&masked_mean(&in_range.logical_not().to_kind(Kind::Float), mask, None)));
        metrics.insert("pg_loss".into(), item(&pg_loss));
        Ok((pg_loss, metrics))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("policy_loss_sppo");
    }
}
