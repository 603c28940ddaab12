//! `algorithm:` — which RL algorithm the trainer runs, and its optimizer.
//!
//! Component names and their `*_args` stay unresolved here; [`crate::resolve`] fills them from the
//! `algorithm_type` preset and the registered components' defaults (see [`crate::Catalog`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The RL algorithm: a preset (`algorithm_type`) plus optional per-component overrides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AlgorithmConfig {
    /// Preset bundling the components below (`ppo`, `grpo`, `rloo`, `opmd`, `sft`, `dpo`, ...).
    pub algorithm_type: String,
    /// Rollouts per task (the group size of group-relative algorithms). Unset: the preset's default.
    pub repeat_times: Option<u32>,
    /// AdamW settings and the learning-rate schedule.
    pub optimizer: OptimizerConfig,
    /// How the trainer draws experiences from the buffer. Unset: the preset's choice.
    pub sample_strategy: Option<String>,
    /// Arguments of the sample strategy, merged over its defaults.
    pub sample_strategy_args: Option<Map<String, Value>>,
    /// Advantage estimator. Unset: the preset's choice.
    pub advantage_fn: Option<String>,
    /// Arguments of the advantage estimator, merged over its defaults.
    pub advantage_fn_args: Option<Map<String, Value>>,
    /// KL function applied as a reward penalty. Unset: the preset's choice.
    pub kl_penalty_fn: Option<String>,
    /// Arguments of the KL reward penalty, merged over its defaults.
    pub kl_penalty_fn_args: Option<Map<String, Value>>,
    /// Policy loss. Unset: the preset's choice.
    pub policy_loss_fn: Option<String>,
    /// Arguments of the policy loss, merged over its defaults.
    pub policy_loss_fn_args: Option<Map<String, Value>>,
    /// KL function added to the loss. Unset: the preset's choice.
    pub kl_loss_fn: Option<String>,
    /// Arguments of the KL loss (e.g. `kl_coef`), merged over its defaults.
    pub kl_loss_fn_args: Option<Map<String, Value>>,
    /// Entropy regulariser. Unset: the preset's choice.
    pub entropy_loss_fn: Option<String>,
    /// Arguments of the entropy loss (e.g. `entropy_coef`), merged over its defaults.
    pub entropy_loss_fn_args: Option<Map<String, Value>>,
    /// How token losses are reduced to one number. Unset: the preset's choice, else `token-mean`.
    pub loss_agg_mode: Option<LossAggMode>,
    /// Replay the rollout's mixture-of-experts routing in training (newer Trinity-RFT).
    pub enable_router_replay: bool,
    /// Use the rollout engine's logprobs as the old logprobs (newer Trinity-RFT's spelling of
    /// `trainer.trainer_config.algorithm.rollout_correction.bypass_mode`).
    pub bypass_old_logprobs: bool,
    /// Off-policy corrections (importance weights, rejection sampling), Trinity-RFT 0.6.0's spelling of
    /// `trainer.trainer_config.algorithm.rollout_correction`, which it sets when given.
    pub rollout_correction: Option<crate::verl::RolloutCorrection>,
}

impl Default for AlgorithmConfig {
    fn default() -> Self {
        AlgorithmConfig {
            algorithm_type: "ppo".to_owned(),
            repeat_times: None,
            optimizer: OptimizerConfig::default(),
            sample_strategy: None,
            sample_strategy_args: None,
            advantage_fn: None,
            advantage_fn_args: None,
            kl_penalty_fn: None,
            kl_penalty_fn_args: None,
            policy_loss_fn: None,
            policy_loss_fn_args: None,
            kl_loss_fn: None,
            kl_loss_fn_args: None,
            entropy_loss_fn: None,
            entropy_loss_fn_args: None,
            loss_agg_mode: None,
            enable_router_replay: false,
            bypass_old_logprobs: true,
            rollout_correction: None,
        }
    }
}

/// The expert rows of sample strategy `mix` in a train step of `train_batch_size` rows, with the ratio they come
/// from: `ceil(expert_data_ratio · train_batch_size)`, as Trinity-RFT's `MixSampleStrategy` computes it (ratio 0.5
/// when unset). `None` for every other strategy. The run draws this many rows and the runnable check counts them.
pub fn mix_expert_rows(algorithm: &AlgorithmConfig, train_batch_size: u32) -> Option<(u64, f64)> {
    if algorithm.sample_strategy.as_deref() != Some("mix") {
        return None;
    }
    let args = algorithm.sample_strategy_args.as_ref();
    let ratio = args.and_then(|a| a.get("expert_data_ratio")).and_then(Value::as_f64).unwrap_or(0.5);
    Some(((ratio * f64::from(train_batch_size)).ceil() as u64, ratio))
}

/// Token-loss reduction, with Trinity-RFT's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum LossAggMode {
    /// Mean over every response token of the micro-batch.
    #[serde(rename = "token-mean")]
    TokenMean,
    /// Sum over each sequence's tokens, then mean over sequences.
    #[serde(rename = "seq-mean-token-sum")]
    SeqMeanTokenSum,
    /// Mean over each sequence's tokens, then mean over sequences.
    #[serde(rename = "seq-mean-token-mean")]
    SeqMeanTokenMean,
    /// Sum over each sequence's tokens divided by the padded length, then mean over sequences.
    #[serde(rename = "seq-mean-token-sum-norm")]
    SeqMeanTokenSumNorm,
}

impl LossAggMode {
    /// The name configs use.
    pub fn name(self) -> &'static str {
        match self {
            LossAggMode::TokenMean => "token-mean",
            LossAggMode::SeqMeanTokenSum => "seq-mean-token-sum",
            LossAggMode::SeqMeanTokenMean => "seq-mean-token-mean",
            LossAggMode::SeqMeanTokenSumNorm => "seq-mean-token-sum-norm",
        }
    }
}

/// AdamW and the learning-rate schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OptimizerConfig {
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warm-up steps; negative means "use `lr_warmup_steps_ratio`".
    pub lr_warmup_steps: i64,
    /// Warm-up length as a fraction of the total training steps (used when `lr_warmup_steps` < 0).
    pub lr_warmup_steps_ratio: f64,
    /// Floor of the decayed learning rate, as a fraction of `lr`.
    pub min_lr_ratio: f64,
    /// Deprecated Trinity-RFT spelling of `lr_scheduler_type`; copied into it when set.
    pub warmup_style: Option<LrScheduler>,
    /// Shape of the learning rate after warm-up.
    pub lr_scheduler_type: LrScheduler,
    /// Optimizer family; AdamW (decoupled weight decay) is what `adam` means in Trinity-RFT.
    pub optimizer_type: OptimizerType,
    /// Adam's β₁ and β₂.
    pub betas: [f64; 2],
    /// Adam's ε.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Maximum global gradient norm before the step; `trainer.grad_clip` is the same knob.
    pub clip_grad: f64,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        OptimizerConfig {
            lr: 1e-6,
            lr_warmup_steps: -1,
            lr_warmup_steps_ratio: 0.0,
            min_lr_ratio: 0.01,
            warmup_style: None,
            lr_scheduler_type: LrScheduler::Constant,
            optimizer_type: OptimizerType::Adam,
            betas: [0.9, 0.999],
            eps: 1e-8,
            weight_decay: 0.01,
            clip_grad: 1.0,
        }
    }
}

/// Learning-rate schedules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LrScheduler {
    /// Warm-up, then constant.
    Constant,
    /// Warm-up, then cosine decay to `min_lr_ratio · lr`.
    Cosine,
    /// Warm-up, then linear decay to `min_lr_ratio · lr`.
    Linear,
}

/// Optimizer families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerType {
    /// AdamW.
    Adam,
    /// AdamW (explicit spelling).
    Adamw,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_expert_share_rounds_up() {
        let mix = |ratio: Option<f64>| AlgorithmConfig {
            sample_strategy: Some("mix".into()),
            sample_strategy_args: ratio.map(|r| Map::from_iter([("expert_data_ratio".to_owned(), Value::from(r))])),
            ..AlgorithmConfig::default()
        };
        assert_eq!(mix_expert_rows(&mix(Some(0.2)), 320), Some((64, 0.2)));
        assert_eq!(mix_expert_rows(&mix(Some(0.11)), 864), Some((96, 0.11)));
        assert_eq!(mix_expert_rows(&mix(None), 5), Some((3, 0.5)));
        assert_eq!(mix_expert_rows(&AlgorithmConfig::default(), 64), None);
    }
}
