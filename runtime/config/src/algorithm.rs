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
    /// Replay the rollout's mixture-of-experts routing in training (Trinity-RFT 0.6.0; veRL's router replay
    /// mode R3): the rollout engine records the experts of every token (`explorer.rollout_model.
    /// enable_return_routed_experts` is set from this), experiences store them, and the policy's forwards (the
    /// update and the old-logprob recomputation) use them; the reference model keeps its own routing. Needs a
    /// mixture-of-experts model (Qwen3-MoE).
    pub enable_router_replay: bool,
    /// Use the rollout engine's logprobs as the old logprobs (newer Trinity-RFT's spelling of
    /// `trainer.trainer_config.algorithm.rollout_correction.bypass_mode`).
    pub bypass_old_logprobs: bool,
    /// Off-policy corrections (importance weights, rejection sampling), Trinity-RFT 0.6.0's spelling of
    /// `trainer.trainer_config.algorithm.rollout_correction`, which it sets when given.
    pub rollout_correction: Option<crate::verl::RolloutCorrection>,
    /// What resolution decided for the run, typed: the rollouts per task and the sample strategy with its
    /// arguments (see [`ResolvedAlgorithm`]).
    #[serde(skip)]
    pub resolved: ResolvedAlgorithm,
}

/// The algorithm's values that resolution always decides, without `Option`s or names to compare: the resolver
/// builds it once from `repeat_times` (the user's, else the preset's, else 1) and the sample strategy with its
/// merged arguments, and refuses a config where it cannot. The `Option` fields of [`AlgorithmConfig`] keep the
/// file's shape ("not written" must stay visible to stages, which resolve the config as written, and to
/// `--dry-run`'s dump, which shows the filled values); the run reads this. Not read from or written to a file; an
/// unresolved config holds `repeat_times` 0 here, which no resolved one does.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResolvedAlgorithm {
    /// Rollouts per task, at least 1.
    pub repeat_times: u32,
    /// The sample strategy and its arguments.
    pub sample_strategy: SampleStrategy,
}

/// `algorithm.sample_strategy` with its arguments (Trinity-RFT's `SAMPLE_STRATEGY` registry), parsed once by the
/// resolver ([`SampleStrategy::parse`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum SampleStrategy {
    /// Every experience the buffer gives, in order.
    #[default]
    Default,
    /// Trinity-RFT's global fallback; trinity reads the buffer as `default` does.
    Warmup,
    /// Experiences sampled with a model more than `max_staleness` versions older than the trainer's are skipped
    /// (`None`: no limit).
    StalenessControl { max_staleness: Option<u64> },
    /// Each train step mixes `ceil(expert_data_ratio × train_batch_size)` expert rows from the auxiliary buffer
    /// `sft_dataset_name` with the rest from the experience buffer (Trinity-RFT's `MixSampleStrategy`).
    Mix { expert_data_ratio: f64, sft_dataset_name: String },
}

impl SampleStrategy {
    /// Every name `algorithm.sample_strategy` accepts.
    pub const NAMES: [&'static str; 4] = ["default", "warmup", "staleness_control", "mix"];

    /// The strategy `name` selects, with its arguments from `args` (the merged map; what it leaves out takes
    /// Trinity-RFT's default: `expert_data_ratio` 0.5, `sft_dataset_name` `sft_dataset`, `max_staleness` none).
    /// The error names the argument at fault (`sample_strategy_args.<arg>`), or is `None` for an unknown name.
    pub fn parse(name: &str, args: Option<&Map<String, Value>>) -> Result<SampleStrategy, Option<(String, String)>> {
        let arg = |key: &str| args.and_then(|a| a.get(key)).filter(|v| !v.is_null());
        let bad = |key: &str, message: &str| Some((format!("sample_strategy_args.{key}"), message.to_owned()));
        Ok(match name {
            "default" => SampleStrategy::Default,
            "warmup" => SampleStrategy::Warmup,
            "staleness_control" => SampleStrategy::StalenessControl {
                max_staleness: match arg("max_staleness") {
                    None => None,
                    Some(v) => Some(v.as_u64().ok_or_else(|| {
                        bad("max_staleness", "must be a whole number of model versions (null: no limit)")
                    })?),
                },
            },
            "mix" => SampleStrategy::Mix {
                expert_data_ratio: match arg("expert_data_ratio") {
                    None => 0.5,
                    Some(v) => v
                        .as_f64()
                        .filter(|r| (0.0..=1.0).contains(r))
                        .ok_or_else(|| bad("expert_data_ratio", "must be a number between 0 and 1"))?,
                },
                sft_dataset_name: match arg("sft_dataset_name") {
                    None => "sft_dataset".to_owned(),
                    Some(v) => v
                        .as_str()
                        .ok_or_else(|| bad("sft_dataset_name", "must be the name of an auxiliary buffer"))?
                        .to_owned(),
                },
            },
            _ => return Err(None),
        })
    }

    /// The name configs use.
    pub fn name(&self) -> &'static str {
        match self {
            SampleStrategy::Default => "default",
            SampleStrategy::Warmup => "warmup",
            SampleStrategy::StalenessControl { .. } => "staleness_control",
            SampleStrategy::Mix { .. } => "mix",
        }
    }

    /// The expert rows of strategy `mix` in a train step of `train_batch_size` rows, with the ratio they come from:
    /// `ceil(expert_data_ratio · train_batch_size)`, as Trinity-RFT's `MixSampleStrategy` computes it. `None` for
    /// every other strategy. The run draws this many rows and the runnable check counts them.
    pub fn expert_rows(&self, train_batch_size: u32) -> Option<(u64, f64)> {
        match self {
            SampleStrategy::Mix { expert_data_ratio, .. } => {
                Some(((expert_data_ratio * f64::from(train_batch_size)).ceil() as u64, *expert_data_ratio))
            }
            _ => None,
        }
    }

    /// `max_staleness` of strategy `staleness_control`; `None` for no limit and for every other strategy.
    pub fn max_staleness(&self) -> Option<u64> {
        match self {
            SampleStrategy::StalenessControl { max_staleness } => *max_staleness,
            _ => None,
        }
    }
}

/// Trinity-RFT's fallback components (its `AlgorithmConfigValidator`'s `default_config`), used for each key that
/// neither the config nor the `algorithm_type` preset sets. The one table of them: resolution fills configs from
/// it and `trinity algorithm eval` reads it.
pub const FALLBACK_COMPONENTS: [(&str, &str); 7] = [
    ("sample_strategy", "warmup"),
    ("policy_loss_fn", "ppo"),
    ("advantage_fn", "ppo"),
    ("kl_penalty_fn", "none"),
    ("kl_loss_fn", "k2"),
    ("entropy_loss_fn", "default"),
    ("loss_agg_mode", "token-mean"),
];

/// The fallback of `key` (`advantage_fn`, `sample_strategy`, ...) in [`FALLBACK_COMPONENTS`].
pub fn fallback_component(key: &str) -> Option<&'static str> {
    FALLBACK_COMPONENTS.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
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
            resolved: ResolvedAlgorithm::default(),
        }
    }
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
        let mix = |ratio: Option<f64>| {
            let args = ratio.map(|r| Map::from_iter([("expert_data_ratio".to_owned(), Value::from(r))]));
            SampleStrategy::parse("mix", args.as_ref()).unwrap()
        };
        assert_eq!(mix(Some(0.2)).expert_rows(320), Some((64, 0.2)));
        assert_eq!(mix(Some(0.11)).expert_rows(864), Some((96, 0.11)));
        assert_eq!(mix(None).expert_rows(5), Some((3, 0.5)));
        assert_eq!(SampleStrategy::Default.expert_rows(64), None);
    }

    #[test]
    fn sample_strategies_parse_with_their_arguments_and_name_the_one_at_fault() {
        for name in SampleStrategy::NAMES {
            assert_eq!(SampleStrategy::parse(name, None).unwrap().name(), name);
        }
        let args = |json: Value| json.as_object().cloned();
        let staleness =
            SampleStrategy::parse("staleness_control", args(serde_json::json!({"max_staleness": 2})).as_ref());
        assert_eq!(staleness.unwrap().max_staleness(), Some(2));
        let unlimited =
            SampleStrategy::parse("staleness_control", args(serde_json::json!({"max_staleness": null})).as_ref());
        assert_eq!(unlimited.unwrap(), SampleStrategy::StalenessControl { max_staleness: None });
        let named =
            SampleStrategy::parse("mix", args(serde_json::json!({"sft_dataset_name": "gold"})).as_ref()).unwrap();
        assert_eq!(named, SampleStrategy::Mix { expert_data_ratio: 0.5, sft_dataset_name: "gold".into() });
        let err = SampleStrategy::parse("staleness_control", args(serde_json::json!({"max_staleness": -1})).as_ref());
        assert_eq!(err.unwrap_err().unwrap().0, "sample_strategy_args.max_staleness");
        let err = SampleStrategy::parse("mix", args(serde_json::json!({"expert_data_ratio": 2})).as_ref());
        assert_eq!(err.unwrap_err().unwrap().0, "sample_strategy_args.expert_data_ratio");
        assert_eq!(SampleStrategy::parse("mixed", None), Err(None));
    }

    #[test]
    fn the_fallback_table_is_trinitys() {
        assert_eq!(fallback_component("sample_strategy"), Some("warmup"));
        assert_eq!(fallback_component("kl_loss_fn"), Some("k2"));
        assert_eq!(fallback_component("repeat_times"), None);
    }
}
