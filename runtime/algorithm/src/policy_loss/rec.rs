//! `rec`: the REC family of clipped REINFORCE losses (Trinity-RFT's `RECPolicyLossFn`).
//!
//! r = sg(e^{ℓ−ℓ_old}); ρ_i = sg(exp(masked_mean_t(ℓ − ℓ_old))). In-range indicator I by `clip_mode`:
//! * `none`: 1;  `two-side`: 1 − ε_l ≤ r ≤ 1 + ε_h;
//! * `one-side`: (r ≤ 1 + ε_h ∧ A ≥ 0) ∨ (r ≥ 1 − ε_l ∧ A ≤ 0);  `gspo-one-side`: the same with ρ_i for r;
//! * `ring`: two-side ∨ (A ≥ 0 ∧ r ≤ 1 − ε'_l) ∨ (A ≤ 0 ∧ r ≥ 1 + ε'_h).
//!
//! `weight`: `importance_sampling` A ← A·r; `gspo_importance_sampling` A ← A·ρ_i; `advantage` A ← A·e^{A/temp}.
//! L = −A·ℓ·I; regularizer `forward-kl`: L −= c·ℓ; `k2`: L += c·(ℓ − ℓ_old)².
//! The loss is a token mean (there is no `loss_agg_mode` argument), except `gspo-one-side`, which uses
//! seq-mean-token-mean. Metrics: `pg_clipfrac` = masked_mean(¬I), `pg_loss`.
//!
//! Trinity-RFT only defines ρ under `gspo-one-side`, so `gspo_importance_sampling` with another clip mode
//! fails there with an unbound variable; here it is an argument error.

use tch::{Kind, Tensor};

use crate::aggregation::LossAggMode;
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::masked::masked_mean;
use crate::metrics::Metrics;
use crate::policy_loss::{Inputs, PolicyLossFn, PolicyLossFnEntry, advantages, item, old_logprob};

const NAME: &str = "rec";

const ARGS: &[ArgSpec] = &[
    arg("epsilon_low", ArgDefault::Float(0.2)),
    arg("epsilon_high", ArgDefault::Float(0.2)),
    arg("epsilon_low_prime", ArgDefault::Float(0.6)),
    arg("epsilon_high_prime", ArgDefault::Int(2)),
    arg("clip_mode", ArgDefault::Str("none")),
    arg("weight", ArgDefault::Str("none")),
    arg("regularizer", ArgDefault::Str("none")),
    arg("regularizer_coef", ArgDefault::Float(0.0)),
    arg("temp", ArgDefault::Float(1.0)),
];

#[derive(Debug)]
struct Rec {
    el: f64,
    eh: f64,
    el_prime: f64,
    eh_prime: f64,
    clip_mode: String,
    weight: String,
    regularizer: String,
    coef: f64,
    temp: f64,
}

fn build(args: &Args) -> Result<Box<dyn PolicyLossFn>, AlgorithmError> {
    let positive = |name: &str, upper_one: bool| -> Result<f64, AlgorithmError> {
        let v = args.f64(name)?;
        if v <= 0.0 || (upper_one && v > 1.0) {
            let range = if upper_one { "(0, 1]" } else { "(0, inf)" };
            return Err(args.invalid(name, format!("must lie in {range}, got {v}")));
        }
        Ok(v)
    };
    let rec = Rec {
        el: positive("epsilon_low", true)?,
        eh: positive("epsilon_high", false)?,
        el_prime: positive("epsilon_low_prime", true)?,
        eh_prime: positive("epsilon_high_prime", false)?,
        clip_mode: args.choice("clip_mode", &["none", "one-side", "gspo-one-side", "two-side", "ring"])?,
        weight: args.choice("weight", &["none", "importance_sampling", "gspo_importance_sampling", "advantage"])?,
        regularizer: args.choice("regularizer", &["none", "k2", "forward-kl"])?,
        coef: args.f64("regularizer_coef")?,
        temp: positive("temp", false)?,
    };
    if rec.coef < 0.0 {
        return Err(args.invalid("regularizer_coef", format!("must be >= 0, got {}", rec.coef)));
    }
    if rec.weight == "gspo_importance_sampling" && rec.clip_mode != "gspo-one-side" {
        return Err(args.invalid("weight", "`gspo_importance_sampling` needs clip_mode `gspo-one-side`"));
    }
    Ok(Box::new(rec))
}

inventory::submit! { PolicyLossFnEntry { name: NAME, args: ARGS, build } }

impl PolicyLossFn for Rec {
    /// REC ignores `loss_agg_mode` (as Trinity-RFT does): token-mean, seq-mean-token-mean for `gspo-one-side`.
    fn loss_agg_mode(&self) -> Option<LossAggMode> {
        Some(if self.clip_mode == "gspo-one-side" { LossAggMode::SeqMeanTokenMean } else { LossAggMode::TokenMean })
    }

    fn loss(&self, batch: &Batch) -> Result<(Tensor, Metrics), AlgorithmError> {
        let Inputs { logprob, mask } = Inputs::new(batch, NAME)?;
        let old = old_logprob(batch, NAME)?;
        let mut adv = advantages(batch, NAME)?.shallow_clone();
        let ratio = (logprob - old).exp().detach();
        let seq_ratio = masked_mean(&(logprob - old), mask, Some(-1)).detach().exp().unsqueeze(-1);
        let (pos, neg) = (adv.ge(0.0), adv.le(0.0));
        let two_side = || ratio.ge(1.0 - self.el).logical_and(&ratio.le(1.0 + self.eh));
        let in_range = match self.clip_mode.as_str() {
            "two-side" => two_side(),
            "one-side" => {
                ratio.le(1.0 + self.eh).logical_and(&pos).logical_or(&neg.logical_and(&ratio.ge(1.0 - self.el)))
            }
            "gspo-one-side" => {
                seq_ratio.le(1.0 + self.eh).logical_and(&pos).logical_or(&seq_ratio.ge(1.0 - self.el).logical_and(&neg))
            }
            "ring" => two_side()
                .logical_or(&pos.logical_and(&ratio.le(1.0 - self.el_prime)))
                .logical_or(&neg.logical_and(&ratio.ge(1.0 + self.eh_prime))),
            _ => ratio.ones_like().to_kind(Kind::Bool),
        };
        adv = match self.weight.as_str() {
            "importance_sampling" => &adv * &ratio,
            "gspo_importance_sampling" => &adv * &seq_ratio,
            "advantage" => &adv * (&adv / self.temp).exp(),
            _ => adv,
        };
        let losses = -&adv * logprob * in_range.to_kind(Kind::Float);
        let losses = match self.regularizer.as_str() {
            "forward-kl" => losses - logprob * self.coef,
            "k2" => losses + (logprob - old).square() * self.coef,
            _ => losses,
        };
        let pg_loss = if self.clip_mode == "gspo-one-side" {
            LossAggMode::SeqMeanTokenMean.aggregate(&losses, mask, None)
        } else {
            masked_mean(&losses, mask, None)
        };
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
        crate::testing::check_fixtures("policy_loss_rec");
    }
}
