//! `trainer.trainer_config`: Trinity-RFT's inline veRL settings, read into typed sections.
//!
//! Trinity-RFT merges this tree onto its veRL schema (`trainer/verl/verl_config.py`) and then overwrites many
//! of its values from the top-level keys (`synchronize_config`). trinity keeps the same shape so every key
//! gets a category ([`crate::category`]): the few that change the numbers are mapped onto the top-level keys
//! or kept typed for the trainer ([`crate::verl_resolve`]); device-placement and memory knobs are accepted
//! with a note; keys Trinity-RFT itself overwrites are accepted with a note naming the key that wins.
//!
//! Free-form sections (`fsdp_config`, `megatron`, `profile`, ...) are maps: every key in them is a
//! placement knob of an engine trinity does not run, so their inner keys need no category of their own.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The veRL tree under `trainer.trainer_config`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct VerlConfig {
    /// veRL's data section; Trinity-RFT fills it from `buffer.train_batch_size` and `model.trust_remote_code`.
    pub data: Map<String, Value>,
    /// Actor, reference model and rollout settings.
    pub actor_rollout_ref: ActorRolloutRef,
    /// The critic (value model) of PPO.
    pub critic: VerlCritic,
    /// veRL's reward-model worker.
    pub reward_model: Map<String, Value>,
    /// veRL's reward settings.
    pub reward: Map<String, Value>,
    /// veRL's custom reward function (a Python file).
    pub custom_reward_function: Map<String, Value>,
    /// Advantage and KL settings.
    pub algorithm: VerlAlgorithm,
    /// veRL's trainer loop settings.
    pub trainer: VerlTrainer,
    /// veRL's profiler.
    pub global_profiler: Map<String, Value>,
    /// Copied from the top-level `synchronizer` by Trinity-RFT.
    pub synchronizer: Option<Value>,
    /// Copied from `trainer.enable_preview` by Trinity-RFT.
    pub enable_preview: Option<bool>,
}

/// `actor_rollout_ref`: the policy's model, its optimisation and its frozen reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ActorRolloutRef {
    /// veRL runs actor and rollout in one process group.
    pub hybrid_engine: bool,
    /// The actor's model.
    pub model: VerlActorModel,
    /// The actor's optimisation.
    pub actor: VerlActor,
    /// The reference model (KL term).
    #[serde(rename = "ref")]
    pub reference: VerlRef,
    /// veRL's rollout worker; Trinity-RFT's explorer replaces it.
    pub rollout: Map<String, Value>,
    /// Set from `synchronizer.sync_timeout` by Trinity-RFT.
    pub nccl_timeout: Option<f64>,
    /// Copied from the top-level `synchronizer` by Trinity-RFT.
    pub synchronizer: Option<Value>,
    /// Set from `explorer.name` by Trinity-RFT.
    pub explorer_name: Option<String>,
}

impl Default for ActorRolloutRef {
    fn default() -> Self {
        ActorRolloutRef {
            hybrid_engine: true,
            model: VerlActorModel::default(),
            actor: VerlActor::default(),
            reference: VerlRef::default(),
            rollout: Map::new(),
            nccl_timeout: None,
            synchronizer: None,
            explorer_name: None,
        }
    }
}

/// `actor_rollout_ref.model`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct VerlActorModel {
    /// Set from `model.model_path` by Trinity-RFT.
    pub path: Option<String>,
    /// A Python module imported before the model loads.
    pub external_lib: Option<String>,
    /// Overrides of the model's config.json.
    pub override_config: Map<String, Value>,
    /// Recompute layer activations in the backward pass instead of keeping them: the same gradients for one more
    /// forward of the layers. On the CPU a pass recomputes when the activations it would keep do not fit in half
    /// the memory available, so the configured micro-batches keep their size; on an accelerator every pass does, as
    /// in veRL. `false` keeps them, and on the CPU lowers the micro-batch token budget to what fits.
    pub enable_gradient_checkpointing: bool,
    /// Pack sequences without padding (flash-attention varlen).
    pub use_remove_padding: bool,
    /// Fused logprob/entropy kernels.
    pub use_fused_kernels: bool,
    /// Backend of the fused kernels.
    pub fused_kernel_options: Map<String, Value>,
    /// Set from `model.custom_chat_template` by Trinity-RFT.
    pub custom_chat_template: Option<String>,
    /// Offload activations to host memory.
    pub enable_activation_offload: bool,
    /// Load the model through shared memory.
    pub use_shm: bool,
    /// Set from `model.trust_remote_code` by Trinity-RFT.
    pub trust_remote_code: Option<bool>,
    /// LoRA rank; 0 trains every weight.
    pub lora_rank: u32,
    /// LoRA alpha.
    pub lora_alpha: Option<u32>,
    /// Modules LoRA adapts.
    pub target_modules: Option<Value>,
    /// Modules LoRA leaves alone.
    pub exclude_modules: Option<Value>,
    /// A LoRA adapter to start from.
    pub lora_adapter_path: Option<String>,
    /// Multi-token prediction settings.
    pub mtp: Map<String, Value>,
    /// Set from `model.rope_scaling` by Trinity-RFT.
    pub rope_scaling: Option<Value>,
    /// Set from `model.rope_theta` by Trinity-RFT.
    pub rope_theta: Option<f64>,
}

impl Default for VerlActorModel {
    fn default() -> Self {
        VerlActorModel {
            path: None,
            external_lib: None,
            override_config: Map::new(),
            enable_gradient_checkpointing: true,
            use_remove_padding: true,
            use_fused_kernels: false,
            fused_kernel_options: Map::new(),
            custom_chat_template: None,
            enable_activation_offload: false,
            use_shm: false,
            trust_remote_code: None,
            lora_rank: 0,
            lora_alpha: None,
            target_modules: None,
            exclude_modules: None,
            lora_adapter_path: None,
            mtp: Map::new(),
            rope_scaling: None,
            rope_theta: None,
        }
    }
}

/// `actor_rollout_ref.actor`: how the policy is optimised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct VerlActor {
    /// `fsdp`, `fsdp2` or `megatron`; set from `trainer.trainer_strategy` when unset.
    pub strategy: Option<String>,
    /// Experiences per optimizer step; a train step of `buffer.train_batch_size` experiences takes
    /// `train_batch_size / ppo_mini_batch_size` optimizer steps per epoch. Unset: `buffer.train_batch_size`
    /// (one optimizer step per epoch, which is also what Trinity-RFT v0.5.2 always does: its veRL bridge
    /// overwrites this value with `buffer.train_batch_size`).
    pub ppo_mini_batch_size: Option<u32>,
    /// veRL's global micro-batch size (deprecated there).
    pub ppo_micro_batch_size: Option<u32>,
    /// Rows per micro-batch per GPU when `use_dynamic_bsz` is off.
    pub ppo_micro_batch_size_per_gpu: Option<u32>,
    /// Micro-batches by token budget; `trainer.use_dynamic_bsz` when unset.
    pub use_dynamic_bsz: Option<bool>,
    /// Group rows sharing a prompt.
    pub use_prefix_grouper: bool,
    /// veRL diagnostics of the policy's squared probabilities.
    pub calculate_sum_pi_squared: bool,
    /// Recompute those diagnostics in the backward pass.
    pub sum_pi_squared_checkpointing: bool,
    /// Token budget of one micro-batch; `trainer.max_token_len_per_gpu` when unset.
    pub ppo_max_token_len_per_gpu: Option<u32>,
    /// `trainer.fix_actor_microbatch_loss_scale` when unset.
    pub fix_actor_microbatch_loss_scale: Option<bool>,
    /// Maximum gradient norm; `trainer.grad_clip` when unset (Trinity-RFT lets this one win).
    pub grad_clip: Option<f64>,
    /// Passes over each train step's experiences, each pass split into mini-batches.
    pub ppo_epochs: u32,
    /// Shuffle rows between epochs.
    pub shuffle: bool,
    /// `trainer.ulysses_sequence_parallel_size` when unset.
    pub ulysses_sequence_parallel_size: Option<u32>,
    /// Compute the entropy in chunks to save memory.
    pub entropy_from_logits_with_chunking: bool,
    /// Recompute the entropy in the backward pass to save memory.
    pub entropy_checkpointing: bool,
    /// What veRL writes to and reads from its checkpoints.
    pub checkpoint: Map<String, Value>,
    /// The actor's optimizer; Trinity-RFT overwrites it from `algorithm.optimizer`.
    pub optim: Map<String, Value>,
    /// FSDP sharding, offload and precision.
    pub fsdp_config: Map<String, Value>,
    /// Megatron parallelism, offload and recomputation.
    pub megatron: Map<String, Value>,
    /// veRL's profiler.
    pub profile: Map<String, Value>,
    /// Seed of veRL's data loader.
    pub data_loader_seed: Option<u64>,
    /// Load the weights (false starts from random weights).
    pub load_weight: bool,
    /// veRL's own policy-loss settings; Trinity-RFT uses `algorithm.policy_loss_fn` instead.
    pub policy_loss: Map<String, Value>,
    /// veRL's profiler.
    pub profiler: Map<String, Value>,
    /// Mixture-of-experts routing replay.
    pub router_replay: Map<String, Value>,
    /// Token-loss reduction; `algorithm.loss_agg_mode` when that is unset.
    pub loss_agg_mode: Option<String>,
    /// veRL's loss scale factor.
    pub loss_scale_factor: Option<f64>,
    /// PPO clip range; `policy_loss_fn_args.clip_range` when that is unset.
    pub clip_ratio: Option<f64>,
    /// Lower PPO clip range; `policy_loss_fn_args.clip_range_low` when that is unset.
    pub clip_ratio_low: Option<f64>,
    /// Upper PPO clip range; `policy_loss_fn_args.clip_range_high` when that is unset.
    pub clip_ratio_high: Option<f64>,
    /// Entropy bonus; `entropy_loss_fn_args.entropy_coef` when that is unset.
    pub entropy_coeff: Option<f64>,
    /// KL loss on or off; `algorithm.kl_loss_fn: none` when false and that is unset.
    pub use_kl_loss: Option<bool>,
    /// KL loss weight; `kl_loss_fn_args.kl_coef` when that is unset.
    pub kl_loss_coef: Option<f64>,
    /// veRL's KL estimator name (`kl`/`k1`, `abs`, `mse`/`k2`, `low_var_kl`/`k3`); `algorithm.kl_loss_fn`
    /// when that is unset.
    pub kl_loss_type: Option<String>,
}

impl Default for VerlActor {
    fn default() -> Self {
        VerlActor {
            strategy: None,
            ppo_mini_batch_size: None,
            ppo_micro_batch_size: None,
            ppo_micro_batch_size_per_gpu: None,
            use_dynamic_bsz: None,
            use_prefix_grouper: false,
            calculate_sum_pi_squared: false,
            sum_pi_squared_checkpointing: false,
            ppo_max_token_len_per_gpu: None,
            fix_actor_microbatch_loss_scale: None,
            grad_clip: None,
            ppo_epochs: 1,
            shuffle: false,
            ulysses_sequence_parallel_size: None,
            entropy_from_logits_with_chunking: false,
            entropy_checkpointing: false,
            checkpoint: Map::new(),
            optim: Map::new(),
            fsdp_config: Map::new(),
            megatron: Map::new(),
            profile: Map::new(),
            data_loader_seed: None,
            load_weight: true,
            policy_loss: Map::new(),
            profiler: Map::new(),
            router_replay: Map::new(),
            loss_agg_mode: None,
            loss_scale_factor: None,
            clip_ratio: None,
            clip_ratio_low: None,
            clip_ratio_high: None,
            entropy_coeff: None,
            use_kl_loss: None,
            kl_loss_coef: None,
            kl_loss_type: None,
        }
    }
}

/// `actor_rollout_ref.ref`: the frozen reference model. Every key is about memory and placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct VerlRef {
    /// `fsdp`, `fsdp2` or `megatron`.
    pub strategy: Option<String>,
    /// FSDP sharding and offload of the reference model.
    pub fsdp_config: Map<String, Value>,
    /// veRL's global micro-batch size for reference logprobs (deprecated there).
    pub log_prob_micro_batch_size: Option<u32>,
    /// Rows per micro-batch per GPU for reference logprobs.
    pub log_prob_micro_batch_size_per_gpu: Option<u32>,
    /// Micro-batches by token budget for reference logprobs.
    pub log_prob_use_dynamic_bsz: Option<bool>,
    /// Group rows sharing a prompt.
    pub use_prefix_grouper: bool,
    /// Token budget of one reference micro-batch.
    pub log_prob_max_token_len_per_gpu: Option<u32>,
    /// Sequence-parallel degree of the reference model.
    pub ulysses_sequence_parallel_size: Option<u32>,
    /// Compute the entropy in chunks to save memory.
    pub entropy_from_logits_with_chunking: bool,
    /// Recompute the entropy to save memory.
    pub entropy_checkpointing: bool,
    /// What veRL saves of the reference model.
    pub checkpoint: Map<String, Value>,
    /// Megatron parallelism of the reference model.
    pub megatron: Map<String, Value>,
    /// veRL's profiler.
    pub profile: Map<String, Value>,
    /// Load the weights.
    pub load_weight: bool,
    /// veRL's profiler.
    pub profiler: Map<String, Value>,
    /// Mixture-of-experts routing replay.
    pub router_replay: Map<String, Value>,
}

impl Default for VerlRef {
    fn default() -> Self {
        VerlRef {
            strategy: None,
            fsdp_config: Map::new(),
            log_prob_micro_batch_size: None,
            log_prob_micro_batch_size_per_gpu: None,
            log_prob_use_dynamic_bsz: None,
            use_prefix_grouper: false,
            log_prob_max_token_len_per_gpu: None,
            ulysses_sequence_parallel_size: None,
            entropy_from_logits_with_chunking: false,
            entropy_checkpointing: false,
            checkpoint: Map::new(),
            megatron: Map::new(),
            profile: Map::new(),
            load_weight: true,
            profiler: Map::new(),
            router_replay: Map::new(),
        }
    }
}

/// `critic`: the value model of PPO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct VerlCritic {
    /// Set from the algorithm preset (`use_critic`) by Trinity-RFT.
    pub enable: Option<bool>,
    /// `fsdp`, `fsdp2` or `megatron`.
    pub strategy: Option<String>,
    /// The critic's optimizer; unset fields follow `algorithm.optimizer` (resolved into
    /// [`VerlCritic::optim_resolved`]).
    pub optim: CriticOptim,
    /// The critic's model.
    pub model: VerlCriticModel,
    /// Set from `buffer.train_batch_size` by Trinity-RFT.
    pub ppo_mini_batch_size: Option<u32>,
    /// veRL's global micro-batch size (deprecated there).
    pub ppo_micro_batch_size: Option<u32>,
    /// Rows per critic micro-batch per GPU.
    pub ppo_micro_batch_size_per_gpu: Option<u32>,
    /// veRL's global forward micro-batch size (deprecated there).
    pub forward_micro_batch_size: Option<u32>,
    /// Rows per critic forward micro-batch per GPU.
    pub forward_micro_batch_size_per_gpu: Option<u32>,
    /// Micro-batches by token budget.
    pub use_dynamic_bsz: Option<bool>,
    /// Token budget of one critic micro-batch.
    pub ppo_max_token_len_per_gpu: Option<u32>,
    /// Token budget of one critic forward micro-batch.
    pub forward_max_token_len_per_gpu: Option<u32>,
    /// Sequence-parallel degree of the critic.
    pub ulysses_sequence_parallel_size: Option<u32>,
    /// Passes of the critic over each train step's experiences; unset: the actor's `ppo_epochs` (veRL's default).
    pub ppo_epochs: Option<u32>,
    /// Shuffle rows between critic epochs.
    pub shuffle: bool,
    /// The critic's own gradient clip.
    pub grad_clip: Option<f64>,
    /// Value clip range of the critic loss (veRL's `cliprange_value`); 0 uses the algorithm's default.
    pub cliprange_value: f64,
    /// What veRL saves of the critic.
    pub checkpoint: Map<String, Value>,
    /// Set from `algorithm.repeat_times` by Trinity-RFT.
    pub rollout_n: Option<u32>,
    /// Token-loss reduction of the critic loss.
    pub loss_agg_mode: String,
    /// Megatron parallelism of the critic.
    pub megatron: Map<String, Value>,
    /// veRL's profiler.
    pub profile: Map<String, Value>,
    /// Seed of veRL's data loader.
    pub data_loader_seed: Option<u64>,
    /// Load the weights.
    pub load_weight: bool,
    /// Set from `synchronizer.sync_timeout` by Trinity-RFT.
    pub nccl_timeout: Option<f64>,
    /// Set by Trinity-RFT.
    pub ray_namespace: Option<String>,
    /// veRL's profiler.
    pub profiler: Map<String, Value>,
    /// The critic's resolved optimizer: `optim` over `algorithm.optimizer`, then Trinity-RFT's critic defaults.
    /// Filled at resolution; a value written here is replaced.
    pub optim_resolved: Option<crate::algorithm::OptimizerConfig>,
}

impl Default for VerlCritic {
    fn default() -> Self {
        VerlCritic {
            enable: None,
            strategy: None,
            optim: CriticOptim::default(),
            model: VerlCriticModel::default(),
            ppo_mini_batch_size: None,
            ppo_micro_batch_size: None,
            ppo_micro_batch_size_per_gpu: None,
            forward_micro_batch_size: None,
            forward_micro_batch_size_per_gpu: None,
            use_dynamic_bsz: None,
            ppo_max_token_len_per_gpu: None,
            forward_max_token_len_per_gpu: None,
            ulysses_sequence_parallel_size: None,
            ppo_epochs: None,
            shuffle: false,
            grad_clip: None,
            cliprange_value: 0.0,
            checkpoint: Map::new(),
            rollout_n: None,
            loss_agg_mode: "token-mean".to_owned(),
            megatron: Map::new(),
            profile: Map::new(),
            data_loader_seed: None,
            load_weight: true,
            nccl_timeout: None,
            ray_namespace: None,
            profiler: Map::new(),
            optim_resolved: None,
        }
    }
}

/// `critic.optim`: the critic's optimizer. Unset fields follow `algorithm.optimizer`, except where
/// Trinity-RFT's veRL schema has its own critic default (noted per field).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CriticOptim {
    /// veRL's optimizer name (`adam`, `adamw`); AdamW either way.
    pub optimizer: Option<String>,
    /// Python implementation of the optimizer.
    pub optimizer_impl: Option<String>,
    /// The critic's learning rate; veRL's default 1e-6 when unset.
    pub lr: Option<f64>,
    /// Warm-up steps; negative means "use the ratio".
    pub lr_warmup_steps: Option<i64>,
    /// Warm-up length as a fraction of the training steps.
    pub lr_warmup_steps_ratio: Option<f64>,
    /// Floor of the decayed learning rate as a fraction of `lr`; 0.01 when unset.
    pub min_lr_ratio: Option<f64>,
    /// Deprecated spelling of `lr_scheduler_type`.
    pub warmup_style: Option<String>,
    /// `constant`, `cosine` or `linear`; `constant` when unset.
    pub lr_scheduler_type: Option<String>,
    /// Set from `trainer.total_steps` by Trinity-RFT.
    pub total_training_steps: Option<i64>,
    /// Adam's β₁ and β₂.
    pub betas: Option<[f64; 2]>,
    /// Maximum gradient norm of the critic.
    pub clip_grad: Option<f64>,
    /// Megatron's warm-up start learning rate.
    pub lr_warmup_init: Option<f64>,
    /// Megatron's decay steps.
    pub lr_decay_steps: Option<i64>,
    /// Megatron's decay style.
    pub lr_decay_style: Option<String>,
    /// Megatron's minimum learning rate.
    pub min_lr: Option<f64>,
    /// Decoupled weight decay.
    pub weight_decay: Option<f64>,
    /// Megatron's weight-decay schedule.
    pub weight_decay_incr_style: Option<String>,
    /// Megatron's WSD decay style.
    pub lr_wsd_decay_style: Option<String>,
    /// Megatron's WSD decay steps.
    pub lr_wsd_decay_steps: Option<i64>,
    /// Megatron's scheduler checkpointing.
    pub use_checkpoint_opt_param_scheduler: Option<bool>,
    /// Extra optimizer arguments.
    pub override_optimizer_config: Option<Map<String, Value>>,
}

/// `critic.model`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct VerlCriticModel {
    /// Set from `model.critic_model_path` by Trinity-RFT.
    pub path: Option<String>,
    /// Set from `model.critic_model_path` by Trinity-RFT.
    pub tokenizer_path: Option<String>,
    /// Overrides of the critic model's config.json.
    pub override_config: Map<String, Value>,
    /// A Python module imported before the model loads.
    pub external_lib: Option<String>,
    /// Set from `model.trust_remote_code`.
    pub trust_remote_code: Option<bool>,
    /// Recompute the critic's layer activations in the backward pass, as the actor's
    /// `actor_rollout_ref.model.enable_gradient_checkpointing` does for the policy.
    pub enable_gradient_checkpointing: bool,
    /// Pack sequences without padding.
    pub use_remove_padding: bool,
    /// FSDP sharding and offload of the critic.
    pub fsdp_config: Map<String, Value>,
    /// Set from `model.rope_scaling` by Trinity-RFT.
    pub rope_scaling: Option<Value>,
    /// Set from `model.rope_theta` by Trinity-RFT.
    pub rope_theta: Option<f64>,
}

impl Default for VerlCriticModel {
    fn default() -> Self {
        VerlCriticModel {
            path: None,
            tokenizer_path: None,
            override_config: Map::new(),
            external_lib: None,
            trust_remote_code: None,
            enable_gradient_checkpointing: true,
            use_remove_padding: true,
            fsdp_config: Map::new(),
            rope_scaling: None,
            rope_theta: None,
        }
    }
}

/// `algorithm` of the veRL tree.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct VerlAlgorithm {
    /// How the trainer treats rollout logprobs.
    pub rollout_correction: RolloutCorrection,
    /// Discount; `advantage_fn_args.gamma` when that is unset and the advantage function takes it.
    pub gamma: Option<f64>,
    /// GAE λ; `advantage_fn_args.lam` when that is unset and the advantage function takes it.
    pub lam: Option<f64>,
    /// veRL's advantage estimator; Trinity-RFT uses `algorithm.advantage_fn`.
    pub adv_estimator: Option<String>,
    /// veRL's GRPO normalisation; Trinity-RFT uses `advantage_fn_args`.
    pub norm_adv_by_std_in_grpo: Option<bool>,
    /// Set from `algorithm.kl_penalty_fn` by Trinity-RFT.
    pub use_kl_in_reward: Option<bool>,
    /// veRL's KL penalty name; Trinity-RFT uses `algorithm.kl_penalty_fn`.
    pub kl_penalty: Option<String>,
    /// KL reward-penalty controller.
    pub kl_ctrl: KlCtrl,
}

/// `algorithm.rollout_correction`: veRL's `RolloutCorrectionConfig` (Trinity-RFT 0.6.0 also takes it as the
/// top-level `algorithm.rollout_correction`). The trainer compares the rollout engine's logprobs with the old
/// logprobs: importance-sampling weights (`rollout_is`) multiply the policy loss per token, rejection sampling
/// (`rollout_rs`) takes tokens or whole responses out of the loss, and `rollout_corr/*` metrics are logged. Only
/// with `bypass_mode: false` do the two differ; in bypass mode the old logprobs are the rollout's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutCorrection {
    /// `true`: the rollout engine's logprobs are the old logprobs of the PPO ratio (Trinity-RFT's default).
    /// `false`: the trainer recomputes old logprobs before the update (veRL's decoupled mode) and corrects for
    /// their difference from the rollout's.
    pub bypass_mode: bool,
    /// Importance-sampling weights π_old/π_rollout: `token` (one per token), `sequence` (the product over the
    /// response) or `null` (none; the metrics are still logged). Unset it is `null`, where veRL's dataclass says
    /// `sequence`: Trinity-RFT 0.6.0 computes the weights but its actor never applies them, so a config that
    /// only sets `bypass_mode: false` trains there, and here, on recomputed old logprobs alone.
    pub rollout_is: Option<String>,
    /// Upper bound the weights are truncated to (truncated importance sampling).
    pub rollout_is_threshold: f64,
    /// Divide the weights by their mean over the step's batch (over tokens for `token`, over responses for
    /// `sequence`), after truncation.
    pub rollout_is_batch_normalize: bool,
    /// Rejection sampling: a comma-separated list of criteria, each `token_k1|k2|k3`, `seq_sum_k1|k2|k3`,
    /// `seq_mean_k1|k2|k3` or `seq_max_k2|k3` (k1 = −log r, k2 = ½(log r)², k3 = r − 1 − log r of the ratio
    /// r = π_old/π_rollout, per token or summed / averaged / maximised over the response); a token, or a whole
    /// response for the `seq_*` criteria, that fails one leaves the loss. `null`: none.
    pub rollout_rs: Option<String>,
    /// Thresholds of `rollout_rs`, one per criterion (comma-separated) or one for all: `lower_upper` ratio
    /// bounds for the k1 criteria (a single number u means 1/u to u), an upper bound for k2 and k3.
    pub rollout_rs_threshold: Option<NumberOrText>,
    /// veRL's loss in bypass mode; `ppo_clip` is the configured policy loss.
    pub loss_type: String,
}

impl Default for RolloutCorrection {
    fn default() -> Self {
        RolloutCorrection {
            bypass_mode: true,
            rollout_is: None,
            rollout_is_threshold: 2.0,
            rollout_is_batch_normalize: false,
            rollout_rs: None,
            rollout_rs_threshold: None,
            loss_type: "ppo_clip".to_owned(),
        }
    }
}

/// A value YAML may give as a number or as a string (`2.0`, `"0.5_2.0"`, `"2.0,0.01"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum NumberOrText {
    Number(f64),
    Text(String),
}

impl NumberOrText {
    /// The text veRL parses (`str(x)` of a number).
    pub fn text(&self) -> String {
        match self {
            NumberOrText::Number(x) => x.to_string(),
            NumberOrText::Text(s) => s.clone(),
        }
    }
}

/// Importance-sampling weight level (`rollout_is`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IsLevel {
    Token,
    Sequence,
}

/// The statistic of one rejection criterion (`rollout_rs`), veRL's `SUPPORTED_ROLLOUT_RS_OPTIONS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RsAggregate {
    Token,
    SeqSum,
    SeqMean,
    SeqMax,
}

/// One rejection criterion: its statistic (k1, k2 or k3 of the log ratio, `estimator`), how it is aggregated,
/// and its bounds: for k1 `lower ≤ k1 ≤ upper` is compared in log space (`ln lower ≤ stat ≤ ln upper`), for k2
/// and k3 `stat ≤ upper`.
#[derive(Debug, Clone, PartialEq)]
pub struct RsCriterion {
    /// The option's name, e.g. `seq_mean_k1` (metrics are named after it).
    pub name: String,
    pub aggregate: RsAggregate,
    /// 1, 2 or 3.
    pub estimator: u8,
    /// The k1 criteria's lower ratio bound.
    pub lower: Option<f64>,
    pub upper: f64,
}

/// `rollout_correction` checked and parsed, for the trainer.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutCorrectionSettings {
    pub is_level: Option<IsLevel>,
    pub is_threshold: f64,
    pub is_batch_normalize: bool,
    pub rs: Vec<RsCriterion>,
}

impl RolloutCorrection {
    /// Checks and parses the IS and RS keys (veRL's `compute_rollout_correction_weights` and
    /// `_parse_rollout_rs_thresholds` rules); the error names the key and says why.
    pub fn settings(&self) -> Result<RolloutCorrectionSettings, (&'static str, String)> {
        let is_level = match self.rollout_is.as_deref() {
            None => None,
            Some("token") => Some(IsLevel::Token),
            Some("sequence") => Some(IsLevel::Sequence),
            Some(other) => {
                return Err(("rollout_is", format!("`{other}` is not an IS level: use token, sequence or null")));
            }
        };
        let t = self.rollout_is_threshold;
        if !(t.is_finite() && t > 0.0) {
            return Err(("rollout_is_threshold", format!("must be positive, got {t}")));
        }
        let rs = match &self.rollout_rs {
            None => Vec::new(),
            Some(modes) => parse_rs(modes, self.rollout_rs_threshold.as_ref())?,
        };
        Ok(RolloutCorrectionSettings {
            is_level,
            is_threshold: t,
            is_batch_normalize: self.rollout_is_batch_normalize,
            rs,
        })
    }
}

/// `rollout_rs` and `rollout_rs_threshold` as veRL parses them: options deduplicated in order, one threshold
/// for all or one per option.
fn parse_rs(modes: &str, threshold: Option<&NumberOrText>) -> Result<Vec<RsCriterion>, (&'static str, String)> {
    let mut names: Vec<&str> = Vec::new();
    for name in modes.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    if names.is_empty() {
        return Err(("rollout_rs", "must name at least one criterion (or be null)".into()));
    }
    let Some(threshold) = threshold else {
        return Err(("rollout_rs_threshold", "must be given when rollout_rs is set".into()));
    };
    let text = threshold.text();
    let mut specs: Vec<&str> = text.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if specs.len() == 1 && names.len() > 1 {
        specs = vec![specs[0]; names.len()];
    }
    if specs.len() != names.len() {
        let n = names.len();
        return Err(("rollout_rs_threshold", format!("needs one threshold for all criteria or {n}, got `{text}`")));
    }
    let number = |s: &str| -> Result<f64, (&'static str, String)> {
        match s.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
            _ => Err(("rollout_rs_threshold", format!("`{s}` is not a positive number"))),
        }
    };
    names
        .into_iter()
        .zip(specs)
        .map(|(name, spec)| {
            let (aggregate, estimator) = match name {
                "token_k1" => (RsAggregate::Token, 1),
                "token_k2" => (RsAggregate::Token, 2),
                "token_k3" => (RsAggregate::Token, 3),
                "seq_sum_k1" => (RsAggregate::SeqSum, 1),
                "seq_sum_k2" => (RsAggregate::SeqSum, 2),
                "seq_sum_k3" => (RsAggregate::SeqSum, 3),
                "seq_mean_k1" => (RsAggregate::SeqMean, 1),
                "seq_mean_k2" => (RsAggregate::SeqMean, 2),
                "seq_mean_k3" => (RsAggregate::SeqMean, 3),
                "seq_max_k2" => (RsAggregate::SeqMax, 2),
                "seq_max_k3" => (RsAggregate::SeqMax, 3),
                other => {
                    return Err((
                        "rollout_rs",
                        format!(
                            "`{other}` is not a rejection criterion: use token_k1, token_k2, token_k3, seq_sum_k1, \
                             seq_sum_k2, seq_sum_k3, seq_mean_k1, seq_mean_k2, seq_mean_k3, seq_max_k2 or seq_max_k3"
                        ),
                    ));
                }
            };
            let (lower, upper) = if estimator == 1 {
                match spec.split_once('_') {
                    Some((l, u)) => (Some(number(l)?), number(u)?),
                    None => {
                        let u = number(spec)?;
                        (Some(1.0 / u), u)
                    }
                }
            } else if spec.contains('_') {
                return Err(("rollout_rs_threshold", format!("`{name}` takes one upper bound, not `{spec}`")));
            } else {
                (None, number(spec)?)
            };
            Ok(RsCriterion { name: name.to_owned(), aggregate, estimator, lower, upper })
        })
        .collect()
}

/// `algorithm.kl_ctrl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct KlCtrl {
    /// `fixed` or veRL's `adaptive`.
    #[serde(rename = "type")]
    pub kind: String,
    /// KL penalty weight; `kl_penalty_fn_args.kl_coef` when that is unset.
    pub kl_coef: Option<f64>,
    /// Horizon of the adaptive controller.
    pub horizon: f64,
    /// Target KL of the adaptive controller.
    pub target_kl: f64,
}

impl Default for KlCtrl {
    fn default() -> Self {
        KlCtrl { kind: "fixed".to_owned(), kl_coef: None, horizon: 10000.0, target_kl: 0.1 }
    }
}

/// `trainer` of the veRL tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct VerlTrainer {
    /// Reorder rows so data-parallel ranks get similar token counts.
    pub balance_batch: bool,
    /// Set by Trinity-RFT from `buffer.total_epochs`.
    pub total_epochs: Option<u32>,
    /// Set by Trinity-RFT from `trainer.total_steps`.
    pub total_training_steps: Option<i64>,
    /// Set from `project`.
    pub project_name: Option<String>,
    /// Set from `group`.
    pub group_name: Option<String>,
    /// Set from `name`.
    pub experiment_name: Option<String>,
    /// Set from `monitor.monitor_type`.
    pub logger: Option<Value>,
    /// Generations logged to W&B.
    pub val_generations_to_log_to_wandb: u32,
    /// Set from the cluster.
    pub nnodes: Option<u32>,
    /// Set from the cluster.
    pub n_gpus_per_node: Option<u32>,
    /// Set from `trainer.save_interval`.
    pub save_freq: Option<i64>,
    /// Set from `continue_from_checkpoint`.
    pub resume_mode: Option<String>,
    /// A checkpoint to resume from.
    pub resume_from_path: Option<String>,
    /// Set from `explorer.eval_interval`.
    pub test_freq: Option<i64>,
    /// Train steps during which only the critic is updated.
    pub critic_warmup: u32,
    /// HDFS mirror of checkpoints.
    pub default_hdfs_dir: Option<String>,
    /// Deprecated in veRL.
    pub remove_previous_ckpt_in_save: bool,
    /// Delete local checkpoints after loading.
    pub del_local_ckpt_after_load: bool,
    /// Set from the checkpoint directory.
    pub default_local_dir: Option<String>,
    /// Set from `explorer.eval_on_startup`.
    pub val_before_train: Option<bool>,
    /// Trinity-RFT's internal rollout mode.
    pub training_rollout_mode: Option<String>,
    /// Trinity-RFT's internal buffer switch.
    pub enable_exp_buffer: Option<bool>,
    /// Set from `synchronizer.sync_interval`.
    pub sync_freq: Option<i64>,
    /// Actor checkpoints kept; `trainer.max_checkpoints_to_keep` wins when set.
    pub max_actor_ckpt_to_keep: Option<u32>,
    /// Critic checkpoints kept; trinity keeps the critic with the actor.
    pub max_critic_ckpt_to_keep: Option<u32>,
    /// `cuda` or `npu`.
    pub device: Option<String>,
}

impl Default for VerlTrainer {
    fn default() -> Self {
        VerlTrainer {
            balance_batch: true,
            total_epochs: None,
            total_training_steps: None,
            project_name: None,
            group_name: None,
            experiment_name: None,
            logger: None,
            val_generations_to_log_to_wandb: 0,
            nnodes: None,
            n_gpus_per_node: None,
            save_freq: None,
            resume_mode: None,
            resume_from_path: None,
            test_freq: None,
            critic_warmup: 0,
            default_hdfs_dir: None,
            remove_previous_ckpt_in_save: false,
            del_local_ckpt_after_load: false,
            default_local_dir: None,
            val_before_train: None,
            training_rollout_mode: None,
            enable_exp_buffer: None,
            sync_freq: None,
            max_actor_ckpt_to_keep: None,
            max_critic_ckpt_to_keep: None,
            device: None,
        }
    }
}
