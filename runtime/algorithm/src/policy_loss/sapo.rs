//! `sapo`: soft adaptive policy optimization (Trinity-RFT's `SAPOPolicyLossFn`).
//!
//! r = e^{ℓ−ℓ_old}; τ = τ_pos where A > 0 else τ_neg; g = σ(τ(r − 1))·4/τ; L = −A·sg(g)·ℓ; loss = agg(L, m).
//! As in Trinity-RFT the detached weight is the gate value itself (≈ 2/τ at r = 1), not the derivative of the
//! paper's f(r). Requires τ_neg ≥ τ_pos.
//! Metrics: `sapo_loss`, `ppo_kl`, `avg_soft_gate`, `avg_ratio`, `pos_adv_frac`.

use tch::{Kind, Tensor};

use crate::aggregation::LossAggMode;
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::masked::masked_mean;
use crate::metrics::Metrics;
use crate::policy_loss::{Inputs, PolicyLossFn, PolicyLossFnEntry, advantages, agg_mode, item, old_logprob};

const NAME: &str = "sapo";

const ARGS: &[ArgSpec] = &[
    arg("tau_pos", ArgDefault::Float(1.0)),
    arg("tau_neg", ArgDefault::Float(1.05)),
    arg("loss_agg_mode", ArgDefault::Str("token-mean")),
];

#[derive(Debug)]
struct Sapo {
    tau_pos: f64,
    tau_neg: f64,
    loss_agg_mode: LossAggMode,
}

fn build(args: &Args) -> Result<Box<dyn PolicyLossFn>, AlgorithmError> {
    let (tau_pos, tau_neg) = (args.f64("tau_pos")?, args.f64("tau_neg")?);
    if tau_neg < tau_pos {
        return Err(args.invalid("tau_neg", format!("({tau_neg}) must be >= tau_pos ({tau_pos})")));
    }
    Ok(Box::new(Sapo { tau_pos, tau_neg, loss_agg_mode: agg_mode(args, "loss_agg_mode")? }))
}

inventory::submit! { PolicyLossFnEntry { name: NAME, args: ARGS, build } }

impl PolicyLossFn for Sapo {
    fn loss_agg_mode(&self) -> Option<LossAggMode> {
        Some(self.loss_agg_mode)
    }

    fn loss(&self, batch: &Batch) -> Result<(Tensor, Metrics), AlgorithmError> {
        let Inputs { logprob, mask } = Inputs::new(batch, NAME)?;
        let old = old_logprob(batch, NAME)?;
        let adv = advantages(batch, NAME)?;
        let delta = logprob - old;
        let ratio = delta.exp();
        let ppo_kl = masked_mean(&(-&delta), mask, None);
        let positive = adv.gt(0.0);
        let (pos, neg) = (self.tau_pos as f32, self.tau_neg as f32);
        let tau = Tensor::from(neg).where_scalarself_like(&positive, pos);
        // 4/τ is computed in f32 per branch, as torch divides the float32 τ tensor.
        let four_over_tau = Tensor::from(4.0 / neg).where_scalarself_like(&positive, 4.0 / pos);
        let gate = (&tau * (&ratio - 1.0)).sigmoid() * four_over_tau;
        let losses = -adv * gate.detach() * logprob;
        let loss = self.loss_agg_mode.aggregate(&losses, mask, None);
        let mut metrics = Metrics::new();
        metrics.insert("sapo_loss".into(), item(&loss));
        metrics.insert("ppo_kl".into(), item(&ppo_kl));
        metrics.insert("avg_soft_gate".into(), item(&masked_mean(&gate, mask, None)));
        metrics.insert("avg_ratio".into(), item(&masked_mean(&ratio, mask, None)));
        metrics.insert("pos_adv_frac".into(), item(&masked_mean(&adv.gt(0.0).to_kind(Kind::Float), mask, None)));
        Ok((loss, metrics))
    }
}

/// `torch.where(cond, a, self)` with a scalar `a`, broadcast to `cond`'s shape.
trait WhereScalarSelf {
    fn where_scalarself_like(&self, cond: &Tensor, a: f32) -> Tensor;
}

impl WhereScalarSelf for Tensor {
    fn where_scalarself_like(&self, cond: &Tensor, a: f32) -> Tensor {
        Tensor::where_scalarself(cond, f64::from(a), &self.expand_as(cond))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("policy_loss_sapo");
    }
}
