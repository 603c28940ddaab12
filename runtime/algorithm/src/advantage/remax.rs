//! `remax`: ReMax (Trinity-RFT's `REMAXAdvantageFn`), trainer side; needs per-row `reward_baselines`.
//!
//! returns_t = Σ_{k≥t} m_k·r_k; A = returns − b·m.

use tch::{Kind, Tensor};

use crate::advantage::{AdvantageFn, AdvantageFnEntry, AdvantageOutput};
use crate::args::{ArgSpec, Args};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::metrics::Metrics;

const NAME: &str = "remax";

const ARGS: &[ArgSpec] = &[];

#[derive(Debug)]
struct Remax;

fn build(_args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    Ok(Box::new(Remax))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: true, build } }

impl AdvantageFn for Remax {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let scores = batch.token_level_scores(NAME)?;
        let baselines = batch
            .reward_baselines
            .as_ref()
            .ok_or(AlgorithmError::MissingField { component: NAME.into(), field: "reward_baselines" })?;
        let b: Vec<f32> = baselines.iter().map(|&v| v as f32).collect();
        let m = &batch.action_mask;
        let returns = (&scores * m).flip([-1]).cumsum(-1, Kind::Float).flip([-1]);
        let advantages = &returns - Tensor::from_slice(&b).unsqueeze(-1) * m;
        Ok(AdvantageOutput { advantages, returns, metrics: Metrics::new(), rows: None, action_mask: None })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("advantage_remax");
    }
}
