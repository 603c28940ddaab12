//! `on_policy_distill`: reverse-KL distillation advantage (Trinity-RFT's `OnPolicyDistillAdvantage`), trainer
//! side; needs `old_logprob` (the student's sampling logprobs) and `teacher_logprob`.
//!
//! A_t = kl_coef·(ℓ^teacher_t − ℓ^old_t)·m_t; returns = A.
//! Metrics: `kl/mean`, `kl/std` (unbiased, 0 for one row) of Σ_t m·(ℓ^old − ℓ^teacher) per row, and
//! `advantages/mean` = mean over rows of Σ_t A.

use tch::Kind;

use crate::advantage::{AdvantageFn, AdvantageFnEntry, AdvantageOutput};
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::masked::scalar;
use crate::metrics::Metrics;

const NAME: &str = "on_policy_distill";

const ARGS: &[ArgSpec] = &[arg("kl_coef", ArgDefault::Float(1.0))];

#[derive(Debug)]
struct OnPolicyDistill {
    kl_coef: f64,
}

fn build(args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    Ok(Box::new(OnPolicyDistill { kl_coef: args.f64("kl_coef")? }))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: true, build } }

/// Trinity-RFT's distillation metrics: mean and std over rows of a per-row sum, and the mean advantage sum.
pub(crate) fn row_sum_metrics(prefix: &str, per_token: &tch::Tensor, advantages: &tch::Tensor) -> Metrics {
    let sums = per_token.sum_dim_intlist(-1, false, Kind::Float);
    let mut m = Metrics::new();
    m.insert(format!("{prefix}/mean"), scalar(&sums.mean(Kind::Float)));
    let std = if sums.numel() > 1 { scalar(&sums.std(true)) } else { 0.0 };
    m.insert(format!("{prefix}/std"), std);
    m.insert("advantages/mean".into(), scalar(&advantages.sum_dim_intlist(-1, false, Kind::Float).mean(Kind::Float)));
    m
}

impl AdvantageFn for OnPolicyDistill {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let old = batch.need("old_logprob", &batch.old_logprob, NAME)?;
        let teacher = batch.need("teacher_logprob", &batch.teacher_logprob, NAME)?;
        let m = &batch.action_mask;
        let advantages = (teacher - old) * self.kl_coef * m;
        let metrics = row_sum_metrics("kl", &((old - teacher) * m), &advantages);
        Ok(AdvantageOutput::outcome(advantages, metrics))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("advantage_on_policy_distill");
    }
}
