//! `sft_phi`: SFT weighted by φ(p) = p(1 − p) (Trinity-RFT's `SFTPhiLossFn`, from CHORD).
//!
//! p = e^ℓ (before any cutoff); ℓ' = min(ℓ, log cutoff_prob) when cutoff_prob < 1, else ℓ;
//! loss = agg(−ℓ'·sg(p(1 − p)), m). Requires 0 ≤ cutoff_prob ≤ 1. Metric: `sft_phi_loss`.

use tch::Tensor;

use crate::aggregation::LossAggMode;
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::metrics::Metrics;
use crate::policy_loss::{Inputs, PolicyLossFn, PolicyLossFnEntry, agg_mode, item};

const NAME: &str = "sft_phi";

const ARGS: &[ArgSpec] =
    &[arg("loss_agg_mode", ArgDefault::Str("token-mean")), arg("cutoff_prob", ArgDefault::Float(1.0))];

/// The φ-weighted SFT loss; also the expert half of `mix_chord`.
#[derive(Debug, Clone)]
pub struct SftPhi {
    pub loss_agg_mode: LossAggMode,
    pub cutoff_prob: f64,
}

fn build(args: &Args) -> Result<Box<dyn PolicyLossFn>, AlgorithmError> {
    let cutoff_prob = args.f64("cutoff_prob")?;
    if !(0.0..=1.0).contains(&cutoff_prob) {
        return Err(args.invalid("cutoff_prob", format!("must lie in [0, 1], got {cutoff_prob}")));
    }
    Ok(Box::new(SftPhi { loss_agg_mode: agg_mode(args, "loss_agg_mode")?, cutoff_prob }))
}

inventory::submit! { PolicyLossFnEntry { name: NAME, args: ARGS, build } }

impl PolicyLossFn for SftPhi {
    fn loss_agg_mode(&self) -> Option<LossAggMode> {
        Some(self.loss_agg_mode)
    }

    fn loss(&self, batch: &Batch) -> Result<(Tensor, Metrics), AlgorithmError> {
        let Inputs { logprob, mask } = Inputs::new(batch, NAME)?;
        let prob = logprob.exp();
        let clipped =
            if self.cutoff_prob < 1.0 { logprob.clamp_max(self.cutoff_prob.ln()) } else { logprob.shallow_clone() };
        let phi = &prob * (-&prob + 1.0);
        let loss = self.loss_agg_mode.aggregate(&(-clipped * phi.detach()), mask, None);
        let metrics = Metrics::from([("sft_phi_loss".to_owned(), item(&loss))]);
        Ok((loss, metrics))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("policy_loss_sft_phi");
    }
}
