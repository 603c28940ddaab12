//! `asymre`: asymmetric REINFORCE (Trinity-RFT's `ASYMREGroupAdvantage`), explorer side.
//!
//! Per task group: b = mean(R) + `baseline_shift` (n = 1 → b = 0); A = R − b.
//! Metrics: `group_advantages/group_baseline/…` and `group_advantages/reward_mean/…`, where Trinity-RFT reports
//! reward_mean = b − shift (so −shift for a group of one).

use crate::advantage::{AdvantageFn, AdvantageFnEntry, AdvantageOutput, group_output, mean_f32};
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::{Batch, group_rows};
use crate::error::AlgorithmError;

const NAME: &str = "asymre";

const ARGS: &[ArgSpec] = &[arg("baseline_shift", ArgDefault::Float(-0.1))];

#[derive(Debug)]
struct AsymRe {
    baseline_shift: f64,
}

fn build(args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    Ok(Box::new(AsymRe { baseline_shift: args.f64("baseline_shift")? }))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: false, build } }

impl AdvantageFn for AsymRe {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let rewards: Vec<f32> = batch.row_rewards(NAME)?.into_iter().map(|r| r as f32).collect();
        let groups = group_rows(batch.groups(NAME)?);
        let mut scores = vec![0f32; rewards.len()];
        let mut per_group = Vec::new();
        for group in &groups {
            let baseline = if group.len() == 1 {
                0f32
            } else {
                let r: Vec<f32> = group.iter().map(|&i| rewards[i]).collect();
                // A float32 tensor plus a Python float stays float32.
                mean_f32(&r) + self.baseline_shift as f32
            };
            for &i in group {
                scores[i] = rewards[i] - baseline;
            }
            let b = f64::from(baseline);
            per_group.push(vec![("group_baseline", b), ("reward_mean", b - self.baseline_shift)]);
        }
        Ok(group_output(&scores, &batch.action_mask, &groups, &per_group))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("advantage_asymre");
    }
}
