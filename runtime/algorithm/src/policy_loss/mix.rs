//! `mix`: PPO on the usual (rollout) rows plus SFT on the expert rows (Trinity-RFT's `MIXPolicyLossFn`); needs
//! `expert_mask`.
//!
//! With n_u usual and n_e expert rows in the micro-batch of B rows:
//! w = (mini/ngpus)/(B·(tbs_type/ngpus)) with `use_dynamic_bsz`, else (mini/micro)/(tbs_type/ngpus) (integer
//! divisions as in Trinity-RFT); loss = (1 − μ)·n_u·w_u·L_ppo(usual) + μ·n_e·w_e·L_sft(expert).
//! Metrics: the PPO metrics as `usual/…` and the SFT metric as `expert/…`, each scaled by its n·w, and `loss`;
//! a part with no rows contributes 0 and no metrics.

use tch::Tensor;

use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::metrics::Metrics;
use crate::policy_loss::ppo::Ppo;
use crate::policy_loss::sft::Sft;
use crate::policy_loss::{PolicyLossFn, PolicyLossFnEntry, agg_mode, item};

const NAME: &str = "mix";

/// The arguments `mix` and `mix_chord` share (batch-size bookkeeping and the PPO clip).
pub(crate) const SHARED_ARGS: [ArgSpec; 12] = [
    arg("clip_range", ArgDefault::Float(0.2)),
    arg("clip_range_low", ArgDefault::Null),
    arg("clip_range_high", ArgDefault::Null),
    arg("use_dynamic_bsz", ArgDefault::Null),
    arg("ppo_mini_batch_size", ArgDefault::Int(1)),
    arg("ppo_micro_batch_size_per_gpu", ArgDefault::Int(1)),
    arg("ngpus_trainer", ArgDefault::Int(1)),
    arg("train_batch_size_usual", ArgDefault::Int(1)),
    arg("train_batch_size_expert", ArgDefault::Int(1)),
    arg("loss_agg_mode", ArgDefault::Str("token-mean")),
    arg("sft_loss_agg_mode", ArgDefault::Null),
    arg("grpo_loss_agg_mode", ArgDefault::Null),
];

const ARGS: &[ArgSpec] = &{
    let mut all = [arg("mu", ArgDefault::Float(0.1)); 13];
    let mut i = 0;
    while i < SHARED_ARGS.len() {
        all[i + 1] = SHARED_ARGS[i];
        i += 1;
    }
    all
};

/// How the usual and expert parts are weighted and computed.
#[derive(Debug)]
pub(crate) struct MixParts {
    pub ppo: Ppo,
    pub expert: Box<dyn PolicyLossFn>,
    dynamic_bsz: bool,
    experience_per_gpu: i64,
    gradient_accumulation: i64,
    tbs_usual: i64,
    tbs_expert: i64,
}

/// A strictly positive integer argument (Trinity-RFT divides by these).
fn positive(args: &Args, name: &str) -> Result<i64, AlgorithmError> {
    let v = args.i64(name)?;
    if v <= 0 {
        return Err(args.invalid(name, format!("must be a positive integer, got {v}")));
    }
    Ok(v)
}

impl MixParts {
    /// Reads the shared arguments; `expert` is the SFT-like loss for expert rows, built with `sft_agg`.
    pub(crate) fn from_args(
        args: &Args,
        expert: impl FnOnce(crate::aggregation::LossAggMode) -> Box<dyn PolicyLossFn>,
    ) -> Result<Self, AlgorithmError> {
        let grpo_agg =
            if args.opt_str("grpo_loss_agg_mode")?.is_some() { "grpo_loss_agg_mode" } else { "loss_agg_mode" };
        let sft_agg = if args.opt_str("sft_loss_agg_mode")?.is_some() { "sft_loss_agg_mode" } else { "loss_agg_mode" };
        let ngpus = positive(args, "ngpus_trainer")?;
        let mini = positive(args, "ppo_mini_batch_size")?;
        let tbs_usual = positive(args, "train_batch_size_usual")? / ngpus;
        let tbs_expert = positive(args, "train_batch_size_expert")? / ngpus;
        if tbs_usual == 0 || tbs_expert == 0 {
            return Err(
                args.invalid("ngpus_trainer", "must not exceed train_batch_size_usual or train_batch_size_expert")
            );
        }
        Ok(MixParts {
            ppo: Ppo::from_args(args, grpo_agg)?,
            expert: expert(agg_mode(args, sft_agg)?),
            dynamic_bsz: args.opt_bool("use_dynamic_bsz")?.unwrap_or(false),
            experience_per_gpu: mini / ngpus,
            gradient_accumulation: mini / positive(args, "ppo_micro_batch_size_per_gpu")?,
            tbs_usual,
            tbs_expert,
        })
    }

    /// The weighted usual and expert losses (each n·w·L) and their prefixed, scaled metrics. With
    /// `always_report`, an empty part still reports its metrics as zeros (MIX-CHORD computes both parts
    /// unconditionally in Trinity-RFT).
    pub(crate) fn losses(
        &self,
        batch: &Batch,
        component: &str,
        always_report: bool,
    ) -> Result<(Tensor, Tensor, Metrics), AlgorithmError> {
        let expert_mask = batch
            .expert_mask
            .as_ref()
            .ok_or(AlgorithmError::MissingField { component: component.to_owned(), field: "expert_mask" })?;
        let rows = batch.rows() as f64;
        let usual_idx: Vec<i64> = (0..expert_mask.len()).filter(|&i| !expert_mask[i]).map(|i| i as i64).collect();
        let expert_idx: Vec<i64> = (0..expert_mask.len()).filter(|&i| expert_mask[i]).map(|i| i as i64).collect();
        let weight = |tbs: i64| {
            if self.dynamic_bsz {
                self.experience_per_gpu as f64 / (rows * tbs as f64)
            } else {
                self.gradient_accumulation as f64 / tbs as f64
            }
        };
        let mut metrics = Metrics::new();
        let mut part =
            |idx: &[i64], tbs: i64, loss_fn: &dyn PolicyLossFn, prefix: &str| -> Result<Tensor, AlgorithmError> {
                let scale = idx.len() as f64 * weight(tbs);
                if idx.is_empty() {
                    if always_report {
                        let probe = probe_metric_names(loss_fn);
                        metrics.extend(probe.into_iter().map(|k| (format!("{prefix}/{k}"), 0.0)));
                    }
                    return Ok(Tensor::from(0f32));
                }
                let (loss, m) = loss_fn.loss(&batch.select_rows(idx))?;
                metrics.extend(m.into_iter().map(|(k, v)| (format!("{prefix}/{k}"), v * scale)));
                Ok(loss * scale)
            };
        let usual = part(&usual_idx, self.tbs_usual, &self.ppo, "usual")?;
        let expert = part(&expert_idx, self.tbs_expert, self.expert.as_ref(), "expert")?;
        Ok((usual, expert, metrics))
    }
}

/// The metric names a loss reports, found by running it on a one-token dummy row.
fn probe_metric_names(loss_fn: &dyn PolicyLossFn) -> Vec<String> {
    let one = || Some(Tensor::zeros([1, 1], (tch::Kind::Float, tch::Device::Cpu)));
    let mut dummy = Batch::new(Tensor::ones([1, 1], (tch::Kind::Float, tch::Device::Cpu)));
    dummy.logprob = one();
    dummy.old_logprob = one();
    dummy.advantages = one();
    loss_fn.loss(&dummy).map(|(_, m)| m.into_keys().collect()).unwrap_or_default()
}

#[derive(Debug)]
struct Mix {
    mu: f64,
    parts: MixParts,
}

fn build(args: &Args) -> Result<Box<dyn PolicyLossFn>, AlgorithmError> {
    Ok(Box::new(Mix {
        mu: args.f64("mu")?,
        parts: MixParts::from_args(args, |agg| Box::new(Sft { loss_agg_mode: agg }))?,
    }))
}

inventory::submit! { PolicyLossFnEntry { name: NAME, args: ARGS, build } }

impl PolicyLossFn for Mix {
    fn loss(&self, batch: &Batch) -> Result<(Tensor, Metrics), AlgorithmError> {
        let (usual, expert, mut metrics) = self.parts.losses(batch, NAME, false)?;
        let loss = usual * (1.0 - self.mu) + expert * self.mu;
        metrics.insert("loss".into(), item(&loss));
        Ok((loss, metrics))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("policy_loss_mix");
    }
}
