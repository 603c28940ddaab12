//! `sft_is`: SFT with an importance weight (Trinity-RFT's `SFTISLossFn`, from CHORD).
//!
//! loss = agg(−ℓ·sg(e^ℓ), m). Metric: `sft_is_loss`.

use tch::Tensor;

use crate::aggregation::LossAggMode;
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::metrics::Metrics;
use crate::policy_loss::{Inputs, PolicyLossFn, PolicyLossFnEntry, agg_mode, item};

const NAME: &str = "sft_is";

const ARGS: &[ArgSpec] = &[arg("loss_agg_mode", ArgDefault::Str("token-mean"))];

#[derive(Debug)]
struct SftIs {
    loss_agg_mode: LossAggMode,
}

fn build(args: &Args) -> Result<Box<dyn PolicyLossFn>, AlgorithmError> {
    Ok(Box::new(SftIs { loss_agg_mode: agg_mode(args, "loss_agg_mode")? }))
}

inventory::submit! { PolicyLossFnEntry { name: NAME, args: ARGS, build } }

impl PolicyLossFn for SftIs {
    fn loss_agg_mode(&self) -> Option<LossAggMode> {
        Some(self.loss_agg_mode)
    }

    fn loss(&self, batch: &Batch) -> Result<(Tensor, Metrics), AlgorithmError> {
        let Inputs { logprob, mask } = Inputs::new(batch, NAME)?;
        let losses = -logprob * logprob.exp().detach();
        let loss = self.loss_agg_mode.aggregate(&losses, mask, None);
        let metrics = Metrics::from([("sft_is_loss".to_owned(), item(&loss))]);
        Ok((loss, metrics))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("policy_loss_sft_is");
    }
}
