//! `grpo_verl`: veRL's GRPO outcome advantage (Trinity-RFT's deprecated `GRPOAdvantageFn`), trainer side.
//!
//! s_i = Σ_t token_level_rewards_i; per group (`group_id`, veRL's `uid`): μ, σ = mean, unbiased std of s
//! (one row: μ = 0, σ = 1); A_i = (s_i − μ)/(σ + ε)·m_i; returns = A.

use crate::advantage::{AdvantageFn, AdvantageFnEntry, AdvantageOutput, broadcast_rows, mean_f32, std_f32};
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::{Batch, group_rows};
use crate::error::AlgorithmError;
use crate::metrics::Metrics;

const NAME: &str = "grpo_verl";

const ARGS: &[ArgSpec] = &[arg("epsilon", ArgDefault::Float(1e-6))];

#[derive(Debug)]
struct GrpoVerl {
    epsilon: f32,
}

fn build(args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    Ok(Box::new(GrpoVerl { epsilon: args.f64("epsilon")? as f32 }))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: true, build } }

/// Σ_t token_level_rewards per row, in `f32`.
pub(crate) fn sequence_scores(batch: &Batch, component: &str) -> Result<Vec<f32>, AlgorithmError> {
    let sums = batch.token_level_scores(component)?.sum_dim_intlist(-1, false, tch::Kind::Float);
    Ok(crate::batch::tensor_to_vec(&sums).into_iter().map(|v| v as f32).collect())
}

impl AdvantageFn for GrpoVerl {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let mut scores = sequence_scores(batch, NAME)?;
        for group in group_rows(batch.groups(NAME)?) {
            let s: Vec<f32> = group.iter().map(|&i| scores[i]).collect();
            let (mean, std) = if s.len() == 1 { (0.0, 1.0) } else { (mean_f32(&s), std_f32(&s)) };
            for &i in &group {
                scores[i] = (scores[i] - mean) / (std + self.epsilon);
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
        crate::testing::check_fixtures("advantage_grpo_verl");
    }
}
