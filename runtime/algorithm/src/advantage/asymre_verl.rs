//! `asymre_verl`: the trainer-side AsymRE baseline (Trinity-RFT's deprecated `ASYMREAdvantageFn`).
//!
//! s_i = Σ_t token_level_rewards_i; per group b = mean(s) + `baseline_shift` (n = 1: b = 0);
//! A_i = (s_i − b)·m_i; returns = A.

use crate::advantage::grpo_verl::sequence_scores;
use crate::advantage::{AdvantageFn, AdvantageFnEntry, AdvantageOutput, broadcast_rows, mean_f32};
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::{Batch, group_rows};
use crate::error::AlgorithmError;
use crate::metrics::Metrics;

const NAME: &str = "asymre_verl";

const ARGS: &[ArgSpec] = &[arg("baseline_shift", ArgDefault::Float(-0.1))];

#[derive(Debug)]
struct AsymReVerl {
    baseline_shift: f32,
}

fn build(args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    Ok(Box::new(AsymReVerl { baseline_shift: args.f64("baseline_shift")? as f32 }))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: true, build } }

impl AdvantageFn for AsymReVerl {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let mut scores = sequence_scores(batch, NAME)?;
        for group in group_rows(batch.groups(NAME)?) {
            let s: Vec<f32> = group.iter().map(|&i| scores[i]).collect();
            let baseline = if s.len() == 1 { 0.0 } else { mean_f32(&s) + self.baseline_shift };
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
        crate::testing::check_fixtures("advantage_asymre_verl");
    }
}
