//! `ppo`: the clipped surrogate with dual clip (Trinity-RFT's `PPOPolicyLossFn`).
//!
//! ```text
//! Δ = ℓ − ℓ_old  (ℓ − sg(ℓ) with fallback_to_policy_gradient);  Δ ← clamp(Δ, −20, 20);  r = e^Δ
//! L1 = −A·r;  L2 = −A·clip(r, 1 − ε_low, 1 + ε_high);  Lc = max(L1, L2)
//! L3 = −A·c;  L = min(L3, Lc) where A < 0, else Lc                     (dual clip, c = clip_ratio_c > 1)
//! sequence masking: KL_i = Σ_t m(−Δ) / (Σ_t m + 1e-10); L ← 0 where A < 0 and KL_i > δ
//! loss = agg(L, m)
//! ```
//! ε_low / ε_high default to `clip_range`. Metrics: `pg_clipfrac` = masked_mean(L2 > L1),
//! `pg_clipfrac_lower` = masked_mean((Lc > L3)·[A < 0]), `ppo_kl` = masked_mean(−Δ), `pg_loss`, and with
//! sequence masking `seq_mask/masked_tokens` and `seq_mask/mean_sequence_kl`.

use tch::{Kind, Tensor};

use crate::aggregation::LossAggMode;
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::masked::masked_mean;
use crate::metrics::Metrics;
use crate::policy_loss::{Inputs, PolicyLossFn, PolicyLossFnEntry, advantages, agg_mode, item, old_logprob};

const NAME: &str = "ppo";

const ARGS: &[ArgSpec] = &[
    arg("clip_range", ArgDefault::Float(0.2)),
    arg("clip_range_low", ArgDefault::Null),
    arg("clip_range_high", ArgDefault::Null),
    arg("clip_ratio_c", ArgDefault::Float(3.0)),
    arg("loss_agg_mode", ArgDefault::Str("token-mean")),
    arg("enable_sequence_masking", ArgDefault::Bool(false)),
    arg("delta_sequence_masking", ArgDefault::Float(0.1)),
    arg("fallback_to_policy_gradient", ArgDefault::Bool(false)),
];

/// The PPO loss; also the "usual" half of the MIX losses.
#[derive(Debug, Clone)]
pub struct Ppo {
    pub clip_range_low: f64,
    pub clip_range_high: f64,
    pub clip_ratio_c: f64,
    pub loss_agg_mode: LossAggMode,
    pub enable_sequence_masking: bool,
    pub delta_sequence_masking: f64,
    pub fallback_to_policy_gradient: bool,
}

/// `clip_range_low`/`clip_range_high`, each falling back to `clip_range`; one of them must be set.
pub(crate) fn clip_bounds(args: &Args) -> Result<(f64, f64), AlgorithmError> {
    let range = args.opt_f64("clip_range")?;
    let low = args.opt_f64("clip_range_low")?.or(range);
    let high = args.opt_f64("clip_range_high")?.or(range);
    let low = low.ok_or_else(|| args.invalid("clip_range_low", "must be set (directly or through clip_range)"))?;
    let high = high.ok_or_else(|| args.invalid("clip_range_high", "must be set (directly or through clip_range)"))?;
    Ok((low, high))
}

impl Ppo {
    pub(crate) fn from_args(args: &Args, agg_arg: &str) -> Result<Self, AlgorithmError> {
        let (clip_range_low, clip_range_high) = clip_bounds(args)?;
        let clip_ratio_c = if args.accepts("clip_ratio_c") { args.f64("clip_ratio_c")? } else { 3.0 };
        if clip_ratio_c <= 1.0 {
            return Err(args.invalid("clip_ratio_c", format!("must be greater than 1.0, got {clip_ratio_c}")));
        }
        let flag = |name: &str| -> Result<bool, AlgorithmError> {
            if args.accepts(name) { args.bool(name) } else { Ok(false) }
        };
        Ok(Ppo {
            clip_range_low,
            clip_range_high,
            clip_ratio_c,
            loss_agg_mode: agg_mode(args, agg_arg)?,
            enable_sequence_masking: flag("enable_sequence_masking")?,
            delta_sequence_masking: if args.accepts("delta_sequence_masking") {
                args.f64("delta_sequence_masking")?
            } else {
                0.1
            },
            fallback_to_policy_gradient: flag("fallback_to_policy_gradient")?,
        })
    }
}

fn build(args: &Args) -> Result<Box<dyn PolicyLossFn>, AlgorithmError> {
    Ok(Box::new(Ppo::from_args(args, "loss_agg_mode")?))
}

inventory::submit! { PolicyLossFnEntry { name: NAME, args: ARGS, build } }

impl PolicyLossFn for Ppo {
    fn loss_agg_mode(&self) -> Option<LossAggMode> {
        Some(self.loss_agg_mode)
    }

    fn loss(&self, batch: &Batch) -> Result<(Tensor, Metrics), AlgorithmError> {
        let Inputs { logprob, mask } = Inputs::new(batch, NAME)?;
        let old = old_logprob(batch, NAME)?;
        let adv = advantages(batch, NAME)?;
        let delta = if self.fallback_to_policy_gradient { logprob - logprob.detach() } else { logprob - old };
        let delta = delta.clamp(-20.0, 20.0);
        let ratio = delta.exp();
        let ppo_kl = masked_mean(&(-&delta), mask, None);

        let l1 = -adv * &ratio;
        let l2 = -adv * ratio.clamp(1.0 - self.clip_range_low, 1.0 + self.clip_range_high);
        let lc = l1.maximum(&l2);
        let clipfrac = masked_mean(&l2.gt_tensor(&l1).to_kind(Kind::Float), mask, None);
        let l3 = -adv * self.clip_ratio_c;
        let dual = l3.minimum(&lc);
        let negative = adv.lt(0.0);
        let clipfrac_lower =
            masked_mean(&(lc.gt_tensor(&l3).to_kind(Kind::Float) * negative.to_kind(Kind::Float)), mask, None);
        let mut losses = dual.where_self(&negative, &lc);

        let mut metrics = Metrics::new();
        if self.enable_sequence_masking {
            let kl_per_token = -&delta;
            let seq_kl = (&kl_per_token * mask).sum_dim_intlist(-1, false, Kind::Float)
                / (mask.sum_dim_intlist(-1, false, Kind::Float) + 1e-10);
            let exceeds = seq_kl.gt(self.delta_sequence_masking).unsqueeze(-1).expand_as(adv);
            let should_mask = negative.logical_and(&exceeds);
            losses = &losses * should_mask.logical_not().to_kind(Kind::Float);
            let masked_tokens = item(&should_mask.to_kind(Kind::Float).sum(Kind::Float));
            metrics.insert("seq_mask/masked_tokens".into(), masked_tokens / (item(&mask.sum(Kind::Float)) + 1e-10));
            metrics.insert("seq_mask/mean_sequence_kl".into(), item(&seq_kl.mean(Kind::Float)));
        }
        let pg_loss = self.loss_agg_mode.aggregate(&losses, mask, None);
        metrics.insert("pg_clipfrac".into(), item(&clipfrac));
        metrics.insert("pg_clipfrac_lower".into(), item(&clipfrac_lower));
        metrics.insert("ppo_kl".into(), item(&ppo_kl));
        metrics.insert("pg_loss".into(), item(&pg_loss));
        Ok((pg_loss, metrics))
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{eval_json, json};

    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("policy_loss_ppo");
    }

    #[test]
    fn missing_old_logprob_is_named() {
        let err = crate::testing::eval_err(json!({
            "policy_loss_fn": "ppo",
            "batch": {"logprob": [[0.1]], "advantages": [[1.0]], "action_mask": [[1]]}
        }));
        assert!(err.contains("ppo") && err.contains("old_logprob"), "{err}");
    }

    #[test]
    fn clip_ratio_c_must_exceed_one() {
        let err = crate::testing::eval_err(json!({
            "policy_loss_fn": "ppo", "policy_loss_fn_args": {"clip_ratio_c": 1.0},
            "batch": {"logprob": [[0.1]], "old_logprob": [[0.1]], "advantages": [[1.0]], "action_mask": [[1]]}
        }));
        assert!(err.contains("clip_ratio_c"), "{err}");
        let _ = eval_json;
    }
}
