//! `cispo`: clipped importance-sampling-weight policy optimization (Trinity-RFT's `CISPOPolicyLossFn`).
//!
//! r = e^{ℓ−ℓ_old}; r̂ = clamp(r, 1 − ε_low, 1 + ε_high); with `enable_mask_clip`, M = 0 where
//! (r > 1 + ε'_high ∧ A > 0) or (r < 1 − ε'_low ∧ A < 0), else 1; L = −A·sg(r̂)·sg(M)·ℓ; loss = agg(L, m).
//! Metrics: `cispo_loss`, `ppo_kl` = masked_mean(ℓ_old − ℓ), `unmasked_frac` = masked_mean(M).

use tch::{Kind, Tensor};

use crate::aggregation::LossAggMode;
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::masked::masked_mean;
use crate::metrics::Metrics;
use crate::policy_loss::{Inputs, PolicyLossFn, PolicyLossFnEntry, advantages, agg_mode, item, old_logprob};

const NAME: &str = "cispo";

const ARGS: &[ArgSpec] = &[
    arg("clip_range_low", ArgDefault::Float(1.0)),
    arg("clip_range_high", ArgDefault::Float(0.28)),
    arg("enable_mask_clip", ArgDefault::Bool(false)),
    arg("mask_clip_range_low", ArgDefault::Float(1.0)),
    arg("mask_clip_range_high", ArgDefault::Float(0.28)),
    arg("loss_agg_mode", ArgDefault::Str("token-mean")),
];

#[derive(Debug)]
struct Cispo {
    low: f64,
    high: f64,
    enable_mask_clip: bool,
    mask_low: f64,
    mask_high: f64,
    loss_agg_mode: LossAggMode,
}

fn build(args: &Args) -> Result<Box<dyn PolicyLossFn>, AlgorithmError> {
    Ok(Box::new(Cispo {
        low: args.f64("clip_range_low")?,
        high: args.f64("clip_range_high")?,
        enable_mask_clip: args.bool("enable_mask_clip")?,
        mask_low: args.f64("mask_clip_range_low")?,
        mask_high: args.f64("mask_clip_range_high")?,
        loss_agg_mode: agg_mode(args, "loss_agg_mode")?,
    }))
}

inventory::submit! { PolicyLossFnEntry { name: NAME, args: ARGS, build } }

impl PolicyLossFn for Cispo {
    fn loss_agg_mode(&self) -> Option<LossAggMode> {
        Some(self.loss_agg_mode)
    }

    fn loss(&self, batch: &Batch) -> Result<(Tensor, Metrics), AlgorithmError> {
        let Inputs { logprob, mask } = Inputs::new(batch, NAME)?;
        let old = old_logprob(batch, NAME)?;
        let adv = advantages(batch, NAME)?;
        let delta = logprob - old;
        let ratio = delta.exp();
        let ppo_kl = masked_mean(&(-&delta), mask, None);
        let clamped = ratio.clamp(1.0 - self.low, 1.0 + self.high);
        let mut keep = ratio.ones_like();
        if self.enable_mask_clip {
            let zero = ratio.zeros_like();
            let high = ratio.gt(1.0 + self.mask_high).logical_and(&adv.gt(0.0));
            keep = zero.where_self(&high, &keep);
            let low = ratio.lt(1.0 - self.mask_low).logical_and(&adv.lt(0.0));
            keep = zero.where_self(&low, &keep);
        }
        let keep = keep.detach();
        let losses = -adv * clamped.detach() * &keep * logprob;
        let loss = self.loss_agg_mode.aggregate(&losses, mask, None);
        let mut metrics = Metrics::new();
        metrics.insert("cispo_loss".into(), item(&loss));
        metrics.insert("ppo_kl".into(), item(&ppo_kl));
        metrics.insert("unmasked_frac".into(), item(&masked_mean(&keep.to_kind(Kind::Float), mask, None)));
        Ok((loss, metrics))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("policy_loss_cispo");
    }
}
