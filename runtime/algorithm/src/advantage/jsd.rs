//! `jsd`: Jensen–Shannon distillation advantage (Trinity-RFT's `JSDAdvantage`), trainer side; needs
//! `old_logprob` and `teacher_logprob`.
//!
//! s = ℓ^old/T, t = ℓ^teacher/T (sampled tokens only). β = `lambda_coef`: β = 0 → j = s − t; β = 1 → j = t − s;
//! otherwise log M = logsumexp(s + log(1−β), t + log β) and j = β(t − log M) + (1−β)(s − log M).
//! A = −kl_coef·j·m; returns = A. `chunk_size` only bounds memory in Trinity-RFT; the values are the same.
//! Metrics: `jsd/mean`, `jsd/std` of Σ_t m·j per row, and `advantages/mean`.

use tch::Tensor;

use crate::advantage::on_policy_distill::row_sum_metrics;
use crate::advantage::{AdvantageFn, AdvantageFnEntry, AdvantageOutput};
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;

const NAME: &str = "jsd";

const ARGS: &[ArgSpec] = &[
    arg("lambda_coef", ArgDefault::Float(0.5)),
    arg("kl_coef", ArgDefault::Float(1.0)),
    arg("temperature", ArgDefault::Float(1.0)),
    arg("chunk_size", ArgDefault::Null),
];

#[derive(Debug)]
struct Jsd {
    beta: f64,
    kl_coef: f64,
    temperature: f64,
}

fn build(args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    if args.opt_i64("chunk_size")?.is_some_and(|c| c <= 0) {
        return Err(args.invalid("chunk_size", "must be a positive integer or null"));
    }
    Ok(Box::new(Jsd {
        beta: args.f64("lambda_coef")?,
        kl_coef: args.f64("kl_coef")?,
        temperature: args.f64("temperature")?,
    }))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: true, build } }

impl AdvantageFn for Jsd {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let old = batch.need("old_logprob", &batch.old_logprob, NAME)?;
        let teacher = batch.need("teacher_logprob", &batch.teacher_logprob, NAME)?;
        // Fresh tensors, never in-place: the batch's own tensors must stay as they are.
        let (s, t) = if self.temperature != 1.0 {
            (old / self.temperature, teacher / self.temperature)
        } else {
            (old.shallow_clone(), teacher.shallow_clone())
        };
        let m = &batch.action_mask;
        let jsd = if self.beta == 0.0 {
            &s - &t
        } else if self.beta == 1.0 {
            &t - &s
        } else {
            let beta = Tensor::from(self.beta as f32);
            let log_beta = beta.log();
            let log_1m_beta = (-&beta).log1p();
            let log_m = Tensor::stack(&[&s + &log_1m_beta, &t + &log_beta], 0).logsumexp([0], false);
            &beta * (&t - &log_m) + (1.0 - &beta) * (&s - &log_m)
        } * m;
        let advantages = &jsd * (-self.kl_coef) * m;
        let metrics = row_sum_metrics("jsd", &(&jsd * m), &advantages);
        Ok(AdvantageOutput::outcome(advantages, metrics))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("advantage_jsd");
    }
}
