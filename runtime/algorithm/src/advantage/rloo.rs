//! `rloo`: REINFORCE leave-one-out (Trinity-RFT's `RLOOAdvantageFn`), trainer side.
//!
//! s_i = Σ_t token_level_rewards_i; in a group of n > 1: A_i = s_i·n/(n−1) − μ·n/(n−1) (= s_i minus the mean
//! of the others); n = 1: A_i = s_i. Broadcast over the mask; returns = A.

use crate::advantage::grpo_verl::sequence_scores;
use crate::advantage::{AdvantageFn, AdvantageFnEntry, AdvantageOutput, broadcast_rows, mean_f32};
use crate::args::{ArgSpec, Args};
use crate::batch::{Batch, group_rows};
use crate::error::AlgorithmError;
use crate::metrics::Metrics;

const NAME: &str = "rloo";

const ARGS: &[ArgSpec] = &[];

#[derive(Debug)]
struct Rloo;

fn build(_args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    Ok(Box::new(Rloo))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: true, build } }

impl AdvantageFn for Rloo {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let mut scores = sequence_scores(batch, NAME)?;
        for group in group_rows(batch.groups(NAME)?) {
            let n = group.len();
            if n == 1 {
                continue;
            }
            let s: Vec<f32> = group.iter().map(|&i| scores[i]).collect();
            let mean = mean_f32(&s);
            let (nf, n1) = (n as f32, (n - 1) as f32);
            for &i in &group {
                scores[i] = scores[i] * nf / n1 - mean * nf / n1;
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
        crate::testing::check_fixtures("advantage_rloo");
    }
}
