//! `gspo`: group sequence policy optimization, token variant (Trinity-RFT's `GSPOLossFn`).
//!
//! Δ = ℓ − ℓ_old (no clamp); s_i = masked_mean_t(Δ); log r_{i,t} = ℓ − sg(ℓ) + sg(s_i) — the value is the
//! sequence ratio, the gradient token-wise; L = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high)) (no dual clip);
//! loss = agg(L, m), `seq-mean-token-mean` by default as in the paper.
//! Metrics: `pg_clipfrac`, `ppo_kl` = masked_mean(−Δ), `pg_loss`, `ppo_kl_seq` = mean_i(−s_i).

use tch::{Kind, Tensor};

use crate::aggregation::LossAggMode;
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::masked::masked_mean;
use crate::metrics::Metrics;
use crate::policy_loss::ppo::clip_bounds;
use crate::policy_loss::{Inputs, PolicyLossFn, PolicyLossFnEntry, advantages, agg_mode, item, old_logprob};

const NAME: &str = "gspo";

const ARGS: &[ArgSpec] = &[
    arg("clip_range", ArgDefault::Null),
    arg("clip_range_low", ArgDefault::Float(0.0003)),
    arg("clip_range_high", ArgDefault::Float(0.0004)),
    arg("loss_agg_mode", ArgDefault::Str("seq-mean-token-mean")),
];

#[derive(Debug)]
struct Gspo {
    low: f64,
    high: f64,
    loss_agg_mode: LossAggMode,
}

fn build(args: &Args) -> Result<Box<dyn PolicyLossFn>, AlgorithmError> {
    let (low, high) = clip_bounds(args)?;
    Ok(Box::new(Gspo { low, high, loss_agg_mode: agg_mode(args, "loss_agg_mode")? }))
}

inventory::submit! { PolicyLossFnEntry { name: NAME, args: ARGS, build } }

impl PolicyLossFn for Gspo {
    fn loss_agg_mode(&self) -> Option<LossAggMode> {
        Some(self.loss_agg_mode)
    }

    fn loss(&self, batch: &Batch) -> Result<(Tensor, Metrics), AlgorithmError> {
        let Inputs { logprob, mask } = Inputs::new(batch, NAME)?;
        let old = old_logprob(batch, NAME)?;
        let adv = advantages(batch, NAME)?;
        let delta = logprob - old;
        let seq = masked_mean(&delta, mask, Some(-1));
        let log_ratio = logprob - logprob.detach() + seq.detach().unsqueeze(-1);
        let ratio = log_ratio.exp();
        let l1 = -adv * &ratio;
        let l2 = -adv * ratio.clamp(1.0 - self.low, 1.0 + self.high);
        let pg_loss = self.loss_agg_mode.aggregate(&l1.maximum(&l2), mask, None);
        let mut metrics = Metrics::new();
        metrics.insert("pg_clipfrac".into(), item(&masked_mean(&l2.gt_tensor(&l1).to_kind(Kind::Float), mask, None)));
        metrics.insert("ppo_kl".into(), item(&masked_mean(&(-&delta), mask, None)));
        metrics.insert("pg_loss".into(), item(&pg_loss));
        metrics.insert("ppo_kl_seq".into(), item(&(-seq).mean(Kind::Float)));
        Ok((pg_loss, metrics))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("policy_loss_gspo");
    }
}
