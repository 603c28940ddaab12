//! `ppo`: generalized advantage estimation (Trinity-RFT's `PPOAdvantageFn`), trainer side, needs critic values.
//!
//! Over every padded position t = L−1 … 0 (the mask is not consulted, as in Trinity-RFT):
//! δ_t = r_t + γ·V_{t+1} − V_t (V_L = 0), Â_t = δ_t + γλ·Â_{t+1}; returns = Â + V;
//! advantages = masked_whiten(Â, m) — the whitening is always on and spans the whole batch.

use tch::Tensor;

use crate::advantage::{AdvantageFn, AdvantageFnEntry, AdvantageOutput};
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::{Batch, tensor_to_vec};
use crate::error::AlgorithmError;
use crate::masked::masked_whiten;
use crate::metrics::Metrics;

const NAME: &str = "ppo";

const ARGS: &[ArgSpec] = &[arg("gamma", ArgDefault::Float(1.0)), arg("lam", ArgDefault::Float(1.0))];

#[derive(Debug)]
struct Gae {
    gamma: f64,
    lam: f64,
}

fn build(args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    Ok(Box::new(Gae { gamma: args.f64("gamma")?, lam: args.f64("lam")? }))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: true, build } }

impl AdvantageFn for Gae {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let rewards = tensor_to_vec(&batch.token_level_scores(NAME)?);
        let values_t = batch.need("values", &batch.values, NAME)?;
        let values = tensor_to_vec(values_t);
        let (rows, len) = (batch.rows(), batch.len());
        let gamma = self.gamma as f32;
        let gamma_lam = (self.gamma * self.lam) as f32;
        let mut adv = vec![0f32; rows * len];
        for i in 0..rows {
            let mut last = 0f32;
            for t in (0..len).rev() {
                let next = if t + 1 < len { values[i * len + t + 1] as f32 } else { 0.0 };
                let delta = (rewards[i * len + t] as f32 + gamma * next) - values[i * len + t] as f32;
                last = delta + gamma_lam * last;
                adv[i * len + t] = last;
            }
        }
        let adv = Tensor::from_slice(&adv).view([rows as i64, len as i64]);
        let returns = &adv + values_t;
        let advantages = masked_whiten(&adv, &batch.action_mask, "advantages")?;
        Ok(AdvantageOutput { advantages, returns, metrics: Metrics::new(), rows: None, action_mask: None })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("advantage_ppo");
    }
}
