//! Integration tests of the training engine on tiny random models (seconds on the CPU, fixed seeds).

mod aggregation;
mod checkpoint;
mod data_parallel;
mod entropy_clip;
mod forward_only;
mod grpo;
mod ppo;
mod rollout_correction;
mod router_replay;
mod sft;

use serde_json::Map;
use tch::{Device, Kind, Tensor};
use trinity_algorithm::registry;
use trinity_config::algorithm::{AlgorithmConfig, LossAggMode, OptimizerConfig};
use trinity_model::{Decoder, Family, ModelConfig, RandomWeights};
use trinity_trainer::{Components, TrainRow, Trainer, TrainerOptions};

pub(crate) const VOCAB: i64 = 16;

/// Held while a model draws its weights from libtorch's global generator: tests on other threads seed and draw
/// from it too, and two models of one seed must come out equal.
static GLOBAL_GENERATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A two-layer Llama-style model with random weights, seeded.
pub(crate) fn tiny_model(seed: i64, kind: Kind) -> Decoder {
    let _generator = GLOBAL_GENERATOR.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    tch::manual_seed(seed);
    let config = ModelConfig { vocab_size: VOCAB, max_position_embeddings: 64, ..ModelConfig::tiny(Family::Llama) };
    Decoder::load(config, &mut RandomWeights, kind, Device::Cpu).unwrap()
}

/// An `algorithm:` section as the config resolver leaves it: the preset's components (Trinity's global
/// fallback where it is silent) with the preset's arguments; `edit` changes it further.
pub(crate) fn algorithm(algorithm_type: &str, edit: impl FnOnce(&mut AlgorithmConfig)) -> AlgorithmConfig {
    let p = registry::preset(algorithm_type).unwrap();
    let or = |v: Option<String>, d: &str| Some(v.unwrap_or_else(|| d.to_owned()));
    let mut c = AlgorithmConfig {
        algorithm_type: algorithm_type.to_owned(),
        advantage_fn: or(p.advantage_fn, "ppo"),
        advantage_fn_args: p.advantage_fn_args,
        policy_loss_fn: or(p.policy_loss_fn, "ppo"),
        policy_loss_fn_args: p.policy_loss_fn_args,
        kl_penalty_fn: or(p.kl_penalty_fn, "none"),
        kl_loss_fn: or(p.kl_loss_fn, "k2"),
        entropy_loss_fn: or(p.entropy_loss_fn, "default"),
        loss_agg_mode: Some(LossAggMode::TokenMean),
        ..AlgorithmConfig::default()
    };
    edit(&mut c);
    c
}

pub(crate) fn optimizer(lr: f64) -> OptimizerConfig {
    OptimizerConfig { lr, weight_decay: 0.0, ..OptimizerConfig::default() }
}

pub(crate) fn trainer(policy: Decoder, algorithm: &AlgorithmConfig, lr: f64, options: TrainerOptions) -> Trainer {
    Trainer::new(policy, Components::from_config(algorithm).unwrap(), &optimizer(lr), options).unwrap()
}

/// A map from a JSON object literal.
pub(crate) fn args(v: serde_json::Value) -> Option<Map<String, serde_json::Value>> {
    v.as_object().cloned()
}

/// `n` rows whose responses differ in length (1 to 7 tokens, some masked), so that micro-batches and ranks' shares
/// hold different numbers of trained tokens; with advantages (GRPO) or without (SFT).
pub(crate) fn uneven_rows(n: usize, with_advantages: bool) -> Vec<TrainRow> {
    (0..n)
        .map(|i| {
            let prompt: Vec<i64> = (0..2 + i % 2).map(|j| 1 + ((i + j) % 5) as i64).collect();
            let response: Vec<i64> = (0..1 + (i * 5) % 7).map(|j| 3 + ((i * 7 + j * 3) % 11) as i64).collect();
            let mut r = TrainRow::sft(&prompt, &response);
            r.logprobs = (0..response.len()).map(|j| -2.0 - 0.1 * j as f32 - 0.05 * i as f32).collect();
            if response.len() > 2 {
                r.action_mask[1] = false;
            }
            if with_advantages {
                r.advantages = Some((0..response.len()).map(|j| (i as f32 - 3.5) * 0.3 + 0.1 * j as f32).collect());
            }
            r.group_id = Some(format!("task-{}", i / 4));
            r
        })
        .collect()
}

/// Largest absolute difference between the parameters of two models.
pub(crate) fn max_param_diff(a: &Decoder, b: &Decoder) -> f64 {
    let (pa, pb) = (a.named_parameters().unwrap(), b.named_parameters().unwrap());
    pa.iter()
        .zip(&pb)
        .map(|((_, x), (_, y))| (x.to_kind(Kind::Float) - y.to_kind(Kind::Float)).abs().max().double_value(&[]))
        .fold(0.0, f64::max)
}

/// Next-token distribution after `prompt`, `[vocab]` f32.
pub(crate) fn next_token_probs(model: &Decoder, prompt: &[i64]) -> Tensor {
    tch::no_grad(|| {
        let ids = Tensor::from_slice(prompt).view([1, -1]);
        let hidden = model.forward_hidden(&ids, None).unwrap();
        let last = hidden.narrow(1, prompt.len() as i64 - 1, 1);
        model.logits(&last).unwrap().to_kind(Kind::Float).softmax(-1, Kind::Float).view([-1])
    })
}
