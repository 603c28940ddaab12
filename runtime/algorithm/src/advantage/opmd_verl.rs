//! `opmd_verl`: the trainer-side OPMD baseline (Trinity-RFT's deprecated `OPMDAdvantageFn`).
//!
//! s_i = Σ_t token_level_rewards_i; per group b = mean(s) or τ·(logsumexp(s/τ) − log n) (n = 1: b = 0);
//! A_i = (s_i − b)·m_i; returns = A.

use tch::Tensor;

use crate::advantage::grpo_verl::sequence_scores;
use crate::advantage::{AdvantageFn, AdvantageFnEntry, AdvantageOutput, broadcast_rows, mean_f32};
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::{Batch, group_rows};
use crate::error::AlgorithmError;
use crate::metrics::Metrics;

const NAME: &str = "opmd_verl";

const ARGS: &[ArgSpec] = &[arg("opmd_baseline", ArgDefault::Str("mean")), arg("tau", ArgDefault::Float(1.0))];

#[derive(Debug)]
struct OpmdVerl {
    logavgexp: bool,
    tau: f64,
}

fn build(args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    Ok(Box::new(OpmdVerl {
        logavgexp: args.choice("opmd_baseline", &["mean", "logavgexp"])? == "logavgexp",
        tau: args.f64("tau")?,
    }))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: true, build } }

impl AdvantageFn for OpmdVerl {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let mut scores = sequence_scores(batch, NAME)?;
        for group in group_rows(batch.groups(NAME)?) {
            let s: Vec<f32> = group.iter().map(|&i| scores[i]).collect();
            let baseline = match (s.len(), self.logavgexp) {
                (1, _) => 0.0,
                (_, false) => mean_f32(&s),
                (n, true) => {
                    let lse = (Tensor::from_slice(&s) / self.tau).logsumexp([-1], false).double_value(&[]) as f32;
                    self.tau as f32 * (lse - (n as f32).ln())
                }
            };
            for &i in &group {
                scores[i] -= baseline;
            }
        }
        let advantages = broadcast_rows(&scores, &batch.action_mask);
        Ok(AdvantageOutput::outcome(advantages, Metrics::new()))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("advantage_opmd_verl");
    }
}
