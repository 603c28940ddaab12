//! `mix_chord`: CHORD's mix of PPO and φ-weighted SFT with a scheduled μ (Trinity-RFT's
//! `MIXCHORDPolicyLossFn`); needs `expert_mask` and `step`.
//!
//! As `mix`, with the expert part `sft_phi` (or `sft` when `enable_phi_function` is false) and
//! μ(step) = step/warm·peak while step < warm; valley once step ≥ warm + decay; otherwise
//! (peak − valley)·½(1 + cos(π(step − warm)/decay)) + valley. Every row must carry the same step.
//! Metrics: `usual/…`, `expert/…` (always both: a part with no rows reports zeros), `loss`, `mu`.
//!
//! Deviation: Trinity-RFT runs a part with no rows anyway, which yields NaN under the seq-mean aggregation
//! modes (the mean of an empty batch); we count an empty part as 0, which is what the token-mean modes give.

use tch::Tensor;

use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::metrics::Metrics;
use crate::policy_loss::mix::{MixParts, SHARED_ARGS};
use crate::policy_loss::sft::Sft;
use crate::policy_loss::sft_phi::SftPhi;
use crate::policy_loss::{PolicyLossFn, PolicyLossFnEntry, item};

const NAME: &str = "mix_chord";

const OWN_ARGS: [ArgSpec; 5] = [
    arg("mu_warmup_steps", ArgDefault::Int(0)),
    arg("mu_decay_steps", ArgDefault::Int(0)),
    arg("mu_peak", ArgDefault::Float(0.1)),
    arg("mu_valley", ArgDefault::Float(0.1)),
    arg("enable_phi_function", ArgDefault::Bool(true)),
];

const ARGS: &[ArgSpec] = &{
    let mut all = [OWN_ARGS[0]; 17];
    let mut i = 0;
    while i < OWN_ARGS.len() {
        all[i] = OWN_ARGS[i];
        i += 1;
    }
    let mut j = 0;
    while j < SHARED_ARGS.len() {
        all[OWN_ARGS.len() + j] = SHARED_ARGS[j];
        j += 1;
    }
    all
};

/// CHORD's μ schedule: linear warm-up to `peak`, cosine decay to `valley`, then `valley`.
pub fn mu_schedule(step: f64, warmup: f64, decay: f64, peak: f64, valley: f64) -> f64 {
    if step < warmup {
        return step / warmup * peak;
    }
    if step >= warmup + decay {
        return valley;
    }
    let cosine = 0.5 * (1.0 + (std::f64::consts::PI * (step - warmup) / decay).cos());
    (peak - valley) * cosine + valley
}

#[derive(Debug)]
struct MixChord {
    warmup: f64,
    decay: f64,
    peak: f64,
    valley: f64,
    parts: MixParts,
}

fn build(args: &Args) -> Result<Box<dyn PolicyLossFn>, AlgorithmError> {
    let phi = args.bool("enable_phi_function")?;
    Ok(Box::new(MixChord {
        warmup: args.i64("mu_warmup_steps")? as f64,
        decay: args.i64("mu_decay_steps")? as f64,
        peak: args.f64("mu_peak")?,
        valley: args.f64("mu_valley")?,
        parts: MixParts::from_args(args, |agg| -> Box<dyn PolicyLossFn> {
            if phi {
                Box::new(SftPhi { loss_agg_mode: agg, cutoff_prob: 1.0 })
            } else {
                Box::new(Sft { loss_agg_mode: agg })
            }
        })?,
    }))
}

inventory::submit! { PolicyLossFnEntry { name: NAME, args: ARGS, build } }

impl PolicyLossFn for MixChord {
    fn loss(&self, batch: &Batch) -> Result<(Tensor, Metrics), AlgorithmError> {
        let steps =
            batch.step.as_ref().ok_or(AlgorithmError::MissingField { component: NAME.into(), field: "step" })?;
        let (lo, hi) = (steps.iter().min(), steps.iter().max());
        let step = match (lo, hi) {
            (Some(lo), Some(hi)) if lo == hi => *lo,
            _ => {
                return Err(AlgorithmError::field(
                    "step",
                    format!("mix_chord needs one step per batch, got {lo:?}..{hi:?}"),
                ));
            }
        };
        let (usual, expert, mut metrics) = self.parts.losses(batch, NAME, true)?;
        let mu = mu_schedule(step as f64, self.warmup, self.decay, self.peak, self.valley);
        let loss = usual * (1.0 - mu) + expert * mu;
        metrics.insert("loss".into(), item(&loss));
        metrics.insert("mu".into(), mu);
        Ok((loss, metrics))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("policy_loss_mix_chord");
    }

    #[test]
    fn schedule_warms_up_and_decays() {
        use super::mu_schedule;
        assert_eq!(mu_schedule(50.0, 100.0, 200.0, 0.5, 0.02), 0.25);
        assert!((mu_schedule(100.0, 100.0, 200.0, 0.5, 0.02) - 0.5).abs() < 1e-12);
        assert_eq!(mu_schedule(300.0, 100.0, 200.0, 0.5, 0.02), 0.02);
        assert_eq!(mu_schedule(0.0, 0.0, 0.0, 0.1, 0.3), 0.3);
    }
}
