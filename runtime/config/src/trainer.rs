//! `trainer:` — checkpoint cadence and training-engine limits.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::verl::VerlConfig;

/// The trainer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TrainerConfig {
    /// Name used in logs and metrics.
    pub name: String,
    /// `verl` (Trinity-RFT's name) and `native` both select trinity's libtorch trainer.
    pub trainer_type: String,
    /// `fsdp`, `fsdp2` (Trinity-RFT's names; sharded data parallel across a launcher's ranks) or `megatron` (replicated).
    pub trainer_strategy: String,
    /// Save a checkpoint every this many train steps; 0 saves only at the end.
    pub save_interval: u64,
    /// Train steps in all; unset means as many as the explorer produces.
    pub total_steps: Option<u64>,
    /// When to also write Hugging Face weights: `last`, `always` or `never`.
    pub save_hf_checkpoint: String,
    /// Maximum global gradient norm (same knob as `algorithm.optimizer.clip_grad`; this one wins when set).
    pub grad_clip: Option<f64>,
    /// Form micro-batches by token budget instead of a fixed row count.
    pub use_dynamic_bsz: bool,
    /// Token budget of one micro-batch; unset means `2 × max_model_len`.
    pub max_token_len_per_gpu: Option<u32>,
    /// Sequence-parallel degree of Trinity-RFT's veRL trainer.
    pub ulysses_sequence_parallel_size: u32,
    /// How Trinity-RFT's trainer processes coordinate checkpoint writes.
    pub save_strategy: String,
    /// Scale micro-batch losses by their token share (Trinity-RFT, experimental).
    pub fix_actor_microbatch_loss_scale: bool,
    /// Pack sequences without padding (newer Trinity-RFT; veRL's `use_remove_padding`).
    pub use_remove_padding: bool,
    /// Balance tokens across data-parallel ranks (newer Trinity-RFT; veRL's `balance_batch`).
    pub balance_batch: bool,
    /// With a critic (PPO), the actor is updated from train step `critic_warmup` on (1-based; veRL's
    /// `critic_warmup <= global_steps`), so the first `critic_warmup - 1` steps train only the critic. The veRL
    /// spelling `trainer.trainer_config.trainer.critic_warmup` sets the same value. No effect without a critic.
    pub critic_warmup: u32,
    /// Keep the parameters in host memory (newer Trinity-RFT). A CPU run holds them there already; a trainer on CUDA
    /// refuses `true` at start, since moving parameters to the GPU only while they are used is not implemented
    /// (`optimizer_offload` moves the larger optimizer state).
    pub param_offload: bool,
    /// Keep AdamW's moments and fp32 masters (the policy's and the critic's) in host memory and run the update
    /// there, as FSDP2's CPU offload does: on an accelerator this frees 12 of the 16 bytes a parameter of bf16
    /// training for a copy of each gradient to the host and of each update back. On a CPU run it is the same
    /// memory. The actor's `fsdp_config.optimizer_offload` wins over it, as in Trinity-RFT.
    pub optimizer_offload: bool,
    /// Offload gradients to host memory (newer Trinity-RFT).
    pub grad_offload: bool,
    /// FSDP2's CPU offload policy (newer Trinity-RFT): parameters, gradients and optimizer state on the host, the
    /// update run there. A CPU run holds them all there (and takes `optimizer_offload`'s path); a trainer on CUDA
    /// refuses `true` at start, as for `param_offload`.
    pub offload_policy: bool,
    /// Megatron parallel sizes (newer Trinity-RFT).
    pub megatron: serde_json::Map<String, serde_json::Value>,
    /// Inline veRL settings (`actor_rollout_ref`, `critic`, `algorithm`, `trainer`), read into typed sections
    /// with Trinity-RFT's precedence against the top-level keys.
    pub trainer_config: VerlConfig,
    /// Keep at most this many checkpoints (oldest deleted first); unset or 0 (Trinity-RFT 0.6.0's default, and
    /// veRL's meaning of 0) keeps all.
    pub max_checkpoints_to_keep: Option<u32>,
    /// Log the best and worst rollouts of each step.
    pub enable_preview: bool,
    /// Training precision. `auto`: bf16 compute with fp32 master weights and optimizer state where the hardware
    /// has fast bf16 (CUDA; CPUs with AVX512-BF16 or AMX), fp32 elsewhere. `bfloat16` forces that mixed mode,
    /// `float32` trains in fp32 throughout.
    pub dtype: String,
}

/// The keys whose default Trinity-RFT 0.6.0 changed from 0.5.2's, with (0.6.0's default, 0.5.2's), read from the
/// two releases' config dataclasses (`trinity/common/config.py`; no other field's default changed). trinity takes
/// 0.6.0's; resolution logs one line naming those a config leaves out, so a config written for 0.5.2 says what
/// it now runs with.
pub const CHANGED_DEFAULTS_060: [(&str, &str, &str); 3] = [
    ("trainer.trainer_strategy", "fsdp2", "fsdp"),
    ("trainer.max_checkpoints_to_keep", "0, keep all", "unset, keep all"),
    ("trainer.enable_preview", "false", "true"),
];

impl Default for TrainerConfig {
    fn default() -> Self {
        TrainerConfig {
            name: "trainer".to_owned(),
            trainer_type: "verl".to_owned(),
            trainer_strategy: "fsdp2".to_owned(),
            save_interval: 0,
            total_steps: None,
            save_hf_checkpoint: "last".to_owned(),
            grad_clip: None,
            use_dynamic_bsz: true,
            max_token_len_per_gpu: None,
            ulysses_sequence_parallel_size: 1,
            save_strategy: "unrestricted".to_owned(),
            fix_actor_microbatch_loss_scale: false,
            use_remove_padding: true,
            balance_batch: true,
            critic_warmup: 0,
            param_offload: false,
            optimizer_offload: false,
            grad_offload: false,
            offload_policy: false,
            megatron: serde_json::Map::new(),
            trainer_config: VerlConfig::default(),
            max_checkpoints_to_keep: None,
            enable_preview: false,
            dtype: "auto".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_trinity_rft_0_6_0s() {
        let trainer = TrainerConfig::default();
        let used = |key: &str| CHANGED_DEFAULTS_060.iter().find(|(k, _, _)| *k == key).map(|(_, new, _)| *new);
        assert_eq!(Some(trainer.trainer_strategy.as_str()), used("trainer.trainer_strategy"));
        assert_eq!(Some(trainer.enable_preview.to_string().as_str()), used("trainer.enable_preview"));
        // Unset is 0.6.0's 0: every checkpoint is kept.
        assert_eq!(trainer.max_checkpoints_to_keep, None);
        assert!(used("trainer.max_checkpoints_to_keep").unwrap().starts_with("0,"));
    }
}
