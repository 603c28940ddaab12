//! `reinforceplusplus`: REINFORCE++ (Trinity-RFT's `REINFORCEPLUSPLUSAdvantageFn`), trainer side.
//!
//! G_t = Σ_{k≥t} γ^{k−t} r_k over every padded position; A = masked_whiten(G, m)·m (statistics over the whole
//! batch); returns = G.

use tch::Tensor;

use crate::advantage::{AdvantageFn, AdvantageFnEntry, AdvantageOutput};
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::{Batch, tensor_to_vec};
use crate::error::AlgorithmError;
use crate::masked::masked_whiten;
use crate::metrics::Metrics;

const NAME: &str = "reinforceplusplus";

const ARGS: &[ArgSpec] = &[arg("gamma", ArgDefault::Float(1.0))];

#[derive(Debug)]
struct ReinforcePlusPlus {
    gamma: f32,
}

fn build(args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    Ok(Box::new(ReinforcePlusPlus { gamma: args.f64("gamma")? as f32 }))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: true, build } }

impl AdvantageFn for ReinforcePlusPlus {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let rewards = tensor_to_vec(&batch.token_level_scores(NAME)?);
        let (rows, len) = (batch.rows(), batch.len());
        let mut returns = vec![0f32; rows * len];
        for i in 0..rows {
            let mut running = 0f32;
            for t in (0..len).rev() {
                running = rewards[i * len + t] as f32 + self.gamma * running;
                returns[i * len + t] = running;
            }
        }
        let returns = Tensor::from_slice(&returns).view([rows as i64, len as i64]);
        let advantages = masked_whiten(&returns, &batch.action_mask, "returns")? * &batch.action_mask;
        Ok(AdvantageOutput { advantages, returns, metrics: Metrics::new(), rows: None, action_mask: None })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("advantage_reinforceplusplus");
    }
}
