//! `sft`: supervised fine-tuning, the negative log-likelihood (Trinity-RFT's `SFTLossFn`).
//!
//! loss = agg(−ℓ, m). Metric: `sft_loss`.

use tch::Tensor;

use crate::aggregation::LossAggMode;
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::metrics::Metrics;
use crate::policy_loss::{Inputs, PolicyLossFn, PolicyLossFnEntry, agg_mode, item};

const NAME: &str = "sft";

const ARGS: &[ArgSpec] = &[arg("loss_agg_mode", ArgDefault::Str("token-mean"))];

/// The SFT loss; also the expert half of `mix`.
#[derive(Debug, Clone)]
pub struct Sft {
    pub loss_agg_mode: LossAggMode,
}

fn build(args: &Args) -> Result<Box<dyn PolicyLossFn>, AlgorithmError> {
    Ok(Box::new(Sft { loss_agg_mode: agg_mode(args, "loss_agg_mode")? }))
}

inventory::submit! { PolicyLossFnEntry { name: NAME, args: ARGS, build } }

impl PolicyLossFn for Sft {
    fn loss_agg_mode(&self) -> Option<LossAggMode> {
        Some(self.loss_agg_mode)
    }

    fn loss(&self, batch: &Batch) -> Result<(Tensor, Metrics), AlgorithmError> {
        let Inputs { logprob, mask } = Inputs::new(batch, NAME)?;
        let loss = self.loss_agg_mode.aggregate(&(-logprob), mask, None);
        let metrics = Metrics::from([("sft_loss".to_owned(), item(&loss))]);
        Ok((loss, metrics))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("policy_loss_sft");
    }
}
