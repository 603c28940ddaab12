//! `opmd`: the online policy mirror descent loss (Trinity-RFT's `OPMDPolicyLossFn`).
//!
//! loss = agg(−A·ℓ, m)/(1 + τ). Metric: `opmd_loss`.

use tch::Tensor;

use crate::aggregation::LossAggMode;
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::metrics::Metrics;
use crate::policy_loss::{Inputs, PolicyLossFn, PolicyLossFnEntry, advantages, agg_mode, item};

const NAME: &str = "opmd";

const ARGS: &[ArgSpec] = &[arg("tau", ArgDefault::Float(1.0)), arg("loss_agg_mode", ArgDefault::Str("token-mean"))];

#[derive(Debug)]
struct Opmd {
    tau: f64,
    loss_agg_mode: LossAggMode,
}

fn build(args: &Args) -> Result<Box<dyn PolicyLossFn>, AlgorithmError> {
    Ok(Box::new(Opmd { tau: args.f64("tau")?, loss_agg_mode: agg_mode(args, "loss_agg_mode")? }))
}

inventory::submit! { PolicyLossFnEntry { name: NAME, args: ARGS, build } }

impl PolicyLossFn for Opmd {
    fn loss_agg_mode(&self) -> Option<LossAggMode> {
        Some(self.loss_agg_mode)
    }

    fn loss(&self, batch: &Batch) -> Result<(Tensor, Metrics), AlgorithmError> {
        let Inputs { logprob, mask } = Inputs::new(batch, NAME)?;
        let adv = advantages(batch, NAME)?;
        let loss = self.loss_agg_mode.aggregate(&(-adv * logprob), mask, None) / (1.0 + self.tau);
        let metrics = Metrics::from([("opmd_loss".to_owned(), item(&loss))]);
        Ok((loss, metrics))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("policy_loss_opmd");
    }
}
