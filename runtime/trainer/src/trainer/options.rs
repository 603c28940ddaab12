//! [`TrainerOptions`]: the training engine's knobs that are not part of the algorithm, and how a resolved
//! Trinity-RFT config sets them (which ZeRO stage a `trainer_strategy` selects, the offload keys, the
//! micro-batch budget).

use tch::Kind;
use trinity_config::algorithm::OptimizerConfig;
use trinity_config::verl::RolloutCorrectionSettings;

use crate::logprobs::HeadMode;
use crate::micro_batch::MicroBatching;
use crate::optimizer::zero::ZeroStage;
use crate::recompute::ActivationRecompute;

/// The default [`TrainerOptions::pass_tokens`]. `bench_train --dtype bf16 --seq 128` (SmolLM2-135M, 2 cores of a
/// Xeon with AMX) ran 265, 374, 434, 531 and 554 tokens/s in passes of 256, 512, 1024, 2048 and 4096 tokens: a
/// pass has a fixed cost of about half a second (every weight read and reordered, every gradient accumulated),
/// which 2048 tokens mostly amortise, while the activations kept for the backward keep growing with the pass.
pub const PASS_TOKENS: usize = 2048;

/// Knobs of the training engine that are not part of the algorithm.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainerOptions {
    /// The rollout temperature; logits are divided by it (Trinity: the first taskset's `rollout_args`).
    pub temperature: f64,
    /// How micro-batches are formed.
    pub micro_batching: MicroBatching,
    /// The most layout tokens one forward/backward pass runs: consecutive micro-batches run together up to this
    /// many, each keeping its own loss and weight ([`crate::micro_batch`]); `None`: one pass per micro-batch. On
    /// the CPU the trainer lowers it to what fits in memory; on an accelerator it runs each micro-batch alone, since
    /// there the budget is sized to its memory.
    pub pass_tokens: Option<usize>,
    /// Rows × positions per chunk of the output head (memory of one chunk ≈ this × vocab × 4 bytes × 3).
    pub logit_chunk_tokens: i64,
    /// Keep the head's autograd history for small micro-batches or recompute it ([`crate::logprobs`]). The
    /// default recomputes: on the CPU here it measured faster as well as leaner (see the crate's benchmark).
    pub head_mode: HeadMode,
    /// When the policy's layer activations are recomputed in the backward (`actor_rollout_ref.model.
    /// enable_gradient_checkpointing`, [`crate::recompute`]).
    pub activation_recompute: ActivationRecompute,
    /// The same for the critic (`critic.model.enable_gradient_checkpointing`).
    pub critic_activation_recompute: ActivationRecompute,
    /// Train steps in the run (needed by decaying schedules and warm-up ratios).
    pub total_steps: Option<u64>,
    /// Maximum global gradient norm.
    pub grad_clip: f64,
    /// Compute the entropy for the `actor/entropy` metric even when its loss coefficient is 0.
    pub entropy_metric: bool,
    /// veRL's `critic.cliprange_value`.
    pub cliprange_value: f64,
    /// dtype of the frozen reference copy; `None`: the policy's.
    pub reference_kind: Option<Kind>,
    /// veRL's `ppo_epochs`: passes over a train step's rows.
    pub ppo_epochs: u32,
    /// veRL's `ppo_mini_batch_size`, in rows: one optimizer step per this many rows; `None`: one per pass.
    pub mini_batch_rows: Option<usize>,
    /// veRL's `critic.ppo_epochs`: critic updates per train step; `None`: `ppo_epochs`.
    pub critic_epochs: Option<u32>,
    /// The critic's optimizer (veRL's `critic.optim`); `None`: the policy's.
    pub critic_optimizer: Option<OptimizerConfig>,
    /// Recompute `old_logprob` with the policy before the update instead of using the rollout logprobs (veRL's
    /// `rollout_correction.bypass_mode: false`).
    pub recompute_old_logprobs: bool,
    /// With recomputed old logprobs, how their difference from the rollout's is corrected (veRL's decoupled
    /// mode: importance weights, rejection sampling, `rollout_corr/*` metrics; see [`crate::trainer`] step 3b);
    /// `None`: not at all.
    pub rollout_correction: Option<RolloutCorrectionSettings>,
    /// With a critic, the actor is updated from this train step on (1-based, as veRL's `critic_warmup <=
    /// global_steps`); the steps before it train only the critic. 0 and 1: from the first step.
    pub critic_warmup: u64,
    /// Seeds what the trainer draws at random (the critic's fresh value head), so that two runs of one config
    /// train the same critic; the run's `explorer.rollout_model.seed`.
    pub seed: u64,
    /// With a process group of more than one rank: what of the policy's training state is split over the ranks
    /// ([`crate::optimizer::zero`]); with one rank or none it has no effect.
    pub zero_stage: ZeroStage,
    /// Bucket size of the sharded layout and its collectives, in bytes of the parameters' dtype.
    pub shard_bucket_bytes: usize,
    /// Keep the policy's and the critic's AdamW moments and masters in host memory and update there
    /// (`trainer.optimizer_offload`, or the actor's `fsdp_config.optimizer_offload`; [`crate::optimizer`]).
    pub optimizer_offload: bool,
    /// Keep the parameters in host memory (`param_offload`, or `offload_policy`, which offloads everything): holds
    /// on the CPU, where they are; refused on an accelerator, where it is not implemented.
    pub param_offload: bool,
    /// `fsdp_config.fsdp_size`: ranks one shard group spans; `None` or a value of at least the world size shards
    /// over every rank. Hybrid sharding (smaller groups, replicated across) is not implemented, so a smaller
    /// value is refused when the trainer joins its group.
    pub fsdp_size: Option<usize>,
    /// Routing replay (`algorithm.enable_router_replay`, [`crate::router_replay`]): the policy's forwards use
    /// the experts each row's rollout chose; every row must carry them.
    pub router_replay: bool,
}

impl Default for TrainerOptions {
    fn default() -> Self {
        TrainerOptions {
            temperature: 1.0,
            micro_batching: MicroBatching::TokenBudget(16384),
            pass_tokens: Some(PASS_TOKENS),
            logit_chunk_tokens: 1024,
            head_mode: HeadMode::Recompute,
            activation_recompute: ActivationRecompute::WhenShort,
            critic_activation_recompute: ActivationRecompute::WhenShort,
            total_steps: None,
            grad_clip: 1.0,
            entropy_metric: true,
            cliprange_value: 0.5,
            reference_kind: None,
            ppo_epochs: 1,
            mini_batch_rows: None,
            critic_epochs: None,
            critic_optimizer: None,
            recompute_old_logprobs: false,
            rollout_correction: None,
            critic_warmup: 0,
            seed: 42,
            zero_stage: ZeroStage::Replicated,
            shard_bucket_bytes: crate::optimizer::zero::DEFAULT_SHARD_BUCKET_BYTES,
            optimizer_offload: false,
            param_offload: false,
            fsdp_size: None,
            router_replay: false,
        }
    }
}

impl TrainerOptions {
    /// Options from a resolved config: temperature of the first training taskset (else `model.temperature`),
    /// `trainer.use_dynamic_bsz` / `max_token_len_per_gpu` (unset: 2 × `model.max_model_len`, else 16384;
    /// fixed micro-batches are one row, veRL's `ppo_micro_batch_size_per_gpu` default), `trainer.total_steps`
    /// and `trainer.grad_clip`.
    pub fn from_config(config: &trinity_config::Config) -> Self {
        let input = &config.buffer.explorer_input;
        let temperature = input
            .tasksets
            .first()
            .or(input.taskset.as_ref())
            .and_then(|t| t.rollout_args.temperature)
            .unwrap_or(config.model.temperature);
        let budget = config
            .trainer
            .max_token_len_per_gpu
            .map(|b| b as usize)
            .or(config.model.max_model_len.map(|l| 2 * l as usize))
            .unwrap_or(16384);
        let verl = &config.trainer.trainer_config;
        let actor = &verl.actor_rollout_ref.actor;
        let critic = &verl.critic;
        let defaults = TrainerOptions::default();
        let fsdp_flag =
            |key: &str, trainer: bool| actor.fsdp_config.get(key).and_then(|v| v.as_bool()).unwrap_or(trainer);
        TrainerOptions {
            // Temperature 0 means greedy sampling; its logprobs are taken at temperature 1, as veRL does.
            temperature: if temperature > 0.0 { temperature } else { 1.0 },
            micro_batching: if config.trainer.use_dynamic_bsz {
                MicroBatching::TokenBudget(budget)
            } else {
                MicroBatching::Rows(actor.ppo_micro_batch_size_per_gpu.unwrap_or(1).max(1) as usize)
            },
            total_steps: config.trainer.total_steps,
            grad_clip: config.trainer.grad_clip.unwrap_or(config.algorithm.optimizer.clip_grad),
            cliprange_value: if critic.cliprange_value > 0.0 {
                critic.cliprange_value
            } else {
                defaults.cliprange_value
            },
            ppo_epochs: actor.ppo_epochs.max(1),
            mini_batch_rows: actor.ppo_mini_batch_size.map(|m| m as usize),
            critic_epochs: critic.ppo_epochs,
            critic_optimizer: critic.optim_resolved.clone(),
            recompute_old_logprobs: !verl.algorithm.rollout_correction.bypass_mode,
            router_replay: config.algorithm.enable_router_replay,
            // Resolution has checked the keys (and refused what bypass mode cannot do), so `settings` succeeds.
            rollout_correction: (!verl.algorithm.rollout_correction.bypass_mode)
                .then(|| verl.algorithm.rollout_correction.settings().ok())
                .flatten(),
            activation_recompute: ActivationRecompute::from_gradient_checkpointing(
                verl.actor_rollout_ref.model.enable_gradient_checkpointing,
            ),
            critic_activation_recompute: ActivationRecompute::from_gradient_checkpointing(
                critic.model.enable_gradient_checkpointing,
            ),
            critic_warmup: u64::from(config.trainer.critic_warmup),
            // Trinity-RFT's FSDP strategies shard the parameters, gradients and optimizer state (FULL_SHARD,
            // `reshard_after_forward: true`, veRL's default): ZeRO stage 3. With `reshard_after_forward: false`
            // FSDP keeps the parameters gathered after the forward and shards the gradients and optimizer state
            // (SHARD_GRAD_OP): ZeRO stage 2. Either takes effect with several ranks.
            zero_stage: match (config.trainer.trainer_strategy.as_str(), fsdp_flag("reshard_after_forward", true)) {
                ("fsdp" | "fsdp2", true) => ZeroStage::Parameters,
                ("fsdp" | "fsdp2", false) => ZeroStage::Gradients,
                _ => ZeroStage::Replicated,
            },
            seed: config.explorer.rollout_model.seed,
            // The actor's `fsdp_config` wins over the trainer keys, as Trinity-RFT merges it over what it builds
            // from them; resolution checked both (and refused what trinity cannot do).
            // FSDP2's offload policy puts the optimizer state (and the parameters) on the host too.
            optimizer_offload: fsdp_flag("optimizer_offload", config.trainer.optimizer_offload)
                || fsdp_flag("offload_policy", config.trainer.offload_policy),
            param_offload: fsdp_flag("param_offload", config.trainer.param_offload)
                || fsdp_flag("offload_policy", config.trainer.offload_policy),
            fsdp_size: actor
                .fsdp_config
                .get("fsdp_size")
                .and_then(|v| v.as_i64())
                .filter(|&n| n > 0)
                .map(|n| n as usize),
            ..defaults
        }
    }
}
