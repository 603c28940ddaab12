//! `reinforce`: the raw reward as advantage (Trinity-RFT's `REINFORCEGroupAdvantage`), explorer side.
//!
//! A = R (no baseline). Metric: `group_advantages/reward_mean/…` over task groups.

use crate::advantage::{AdvantageFn, AdvantageFnEntry, AdvantageOutput, group_output, mean_f32};
use crate::args::{ArgSpec, Args};
use crate::batch::{Batch, group_rows};
use crate::error::AlgorithmError;

const NAME: &str = "reinforce";

const ARGS: &[ArgSpec] = &[];

#[derive(Debug)]
struct Reinforce;

fn build(_args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    Ok(Box::new(Reinforce))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: false, build } }

impl AdvantageFn for Reinforce {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let rewards: Vec<f32> = batch.row_rewards(NAME)?.into_iter().map(|r| r as f32).collect();
        let groups = group_rows(batch.groups(NAME)?);
        let per_group: Vec<_> = groups
            .iter()
            .map(|g| {
                let r: Vec<f32> = g.iter().map(|&i| rewards[i]).collect();
                vec![("reward_mean", f64::from(mean_f32(&r)))]
            })
            .collect();
        Ok(group_output(&rewards, &batch.action_mask, &groups, &per_group))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("advantage_reinforce");
    }
}
