//! `opmd`: online policy mirror descent baseline (Trinity-RFT's `OPMDGroupAdvantage`), explorer side.
//!
//! Per task group of n rows: b = mean(R) (`opmd_baseline = "mean"`) or b = τ·(logsumexp(R/τ) − log n)
//! (`"logavgexp"`); n = 1 → b = 0. A = R − b, no std normalization.
//! Metrics: `group_advantages/group_baseline/…` and `group_advantages/reward_mean/…` (mean, max, min).

use tch::Tensor;

use crate::advantage::{AdvantageFn, AdvantageFnEntry, AdvantageOutput, group_output, mean_f32};
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::{Batch, group_rows};
use crate::error::AlgorithmError;

const NAME: &str = "opmd";

const ARGS: &[ArgSpec] = &[arg("opmd_baseline", ArgDefault::Str("mean")), arg("tau", ArgDefault::Float(1.0))];

#[derive(Debug)]
struct Opmd {
    logavgexp: bool,
    tau: f32,
}

fn build(args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    Ok(Box::new(Opmd {
        logavgexp: args.choice("opmd_baseline", &["mean", "logavgexp"])? == "logavgexp",
        tau: args.f64("tau")? as f32,
    }))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: false, build } }

/// τ·(logsumexp(R/τ) − log n), in `f32` as Trinity-RFT computes it.
fn logavgexp(r: &[f32], tau: f32) -> f32 {
    let t = Tensor::from_slice(r) / f64::from(tau);
    let lse = t.logsumexp([-1], false).double_value(&[]) as f32;
    let log_n = (r.len() as f32).ln();
    tau * (lse - log_n)
}

impl AdvantageFn for Opmd {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let rewards: Vec<f32> = batch.row_rewards(NAME)?.into_iter().map(|r| r as f32).collect();
        let groups = group_rows(batch.groups(NAME)?);
        let mut scores = vec![0f32; rewards.len()];
        let mut per_group = Vec::new();
        for group in &groups {
            let r: Vec<f32> = group.iter().map(|&i| rewards[i]).collect();
            let mean = mean_f32(&r);
            let baseline = match (group.len(), self.logavgexp) {
                (1, _) => 0.0,
                (_, false) => mean,
                (_, true) => logavgexp(&r, self.tau),
            };
            for &i in group {
                scores[i] = rewards[i] - baseline;
            }
            per_group.push(vec![("group_baseline", f64::from(baseline)), ("reward_mean", f64::from(mean))]);
        }
        Ok(group_output(&scores, &batch.action_mask, &groups, &per_group))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("advantage_opmd");
    }
}
