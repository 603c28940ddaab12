//! `trainer.trainer_config.actor_rollout_ref.actor.fsdp_config`: veRL's FSDP engine settings for the actor, key by
//! key. Trinity-RFT builds this section from `trainer.param_offload`, `optimizer_offload` and `offload_policy` and
//! merges the user's section over it, so a key here wins over the trainer key. Each key is honoured, refused with
//! why, or named in a note; none is dropped silently, and a misspelt FSDP key is refused with the key it
//! resembles, as veRL's dataclass would refuse it. The trainer reads `optimizer_offload`, `param_offload`,
//! `offload_policy` (refusing parameter offload on CUDA at start) and `fsdp_size` (checked against the world size).

use serde_json::Value;

use crate::config::Config;
use crate::error::closest;
use crate::resolve::Resolver;

const AT: &str = "trainer.trainer_config.actor_rollout_ref.actor.fsdp_config";

/// Keys of veRL's FSDP engine config that Trinity-RFT fills from other keys, and what they map to here.
const BUILT_FROM_TRAINER_KEYS: &[&str] = &[
    "strategy",
    "ulysses_sequence_parallel_size",
    "use_dynamic_bsz",
    "max_token_len_per_gpu",
    "use_remove_padding",
    "use_fused_kernels",
    "router_replay",
    "forward_only",
    "entropy_from_logits_with_chunking",
    "entropy_checkpointing",
];

/// Keys about how FSDP wraps, prefetches or seeds its modules: no effect on trinity's bucketed sharding.
const ENGINE_ONLY: &[&str] =
    &["wrap_policy", "forward_prefetch", "use_orig_params", "limit_all_gathers", "use_torch_compile", "seed"];

impl Resolver<'_> {
    /// Checks the actor's `fsdp_config` key by key (see the module docs); the trainer reads `optimizer_offload`
    /// and `fsdp_size` from it.
    pub(crate) fn resolve_fsdp_config(&mut self, config: &Config) {
        let fsdp = config.trainer.trainer_config.actor_rollout_ref.actor.fsdp_config.clone();
        for (name, value) in &fsdp {
            let key = format!("{AT}.{name}");
            match name.as_str() {
                "optimizer_offload" => {
                    let Some(on) = self.boolean(&key, value) else { continue };
                    self.notes.push(format!(
                        "`{key}` ({on}) wins over trainer.optimizer_offload, as in Trinity-RFT: AdamW's moments and \
                         masters {}",
                        if on { "in host memory, updated there" } else { "beside the parameters" }
                    ));
                }
                "param_offload" | "offload_policy" => {
                    if self.boolean(&key, value) == Some(true) {
                        self.notes.push(format!(
                            "`{key}` (true) wins over trainer.{name}: a CPU run holds the parameters in host memory \
                             already; a trainer on CUDA refuses it at start (parameter offload is not implemented \
                             there)"
                        ));
                    }
                }
                "reshard_after_forward" => {
                    let Some(on) = self.boolean(&key, value) else { continue };
                    self.notes.push(format!(
                        "`{key}` ({on}): {}",
                        if on {
                            "FSDP's full sharding: with trainer_strategy fsdp/fsdp2 on several ranks trinity shards \
                             the parameters, gradients and AdamW's state (ZeRO stage 3), each layer gathered around \
                             its computations"
                        } else {
                            "FSDP's SHARD_GRAD_OP keeps the parameters gathered after the forward: trinity shards \
                             AdamW's state and the gradients (ZeRO stage 2) and keeps the parameters whole on every \
                             rank"
                        }
                    ));
                }
                "fsdp_size" => match value.as_i64() {
                    Some(size) if size <= 0 => {}
                    Some(size) => self.notes.push(format!(
                        "`{key}` ({size}): the trainer refuses it at start unless it is at least the number of \
                         data-parallel ranks (hybrid sharding is not implemented)"
                    )),
                    None => {
                        let error = self.invalid(&key, format!("must be an integer (-1: every rank), got {value}"));
                        self.record(Err(error));
                    }
                },
                "model_dtype" | "dtype" | "mixed_precision" => self.check_precision(&key, name, value),
                other if BUILT_FROM_TRAINER_KEYS.contains(&other) => self.notes.push(format!(
                    "`{key}`: Trinity-RFT builds it from the trainer.* key of that name, which trinity reads; no \
                     effect here"
                )),
                other if ENGINE_ONLY.contains(&other) => self.notes.push(format!(
                    "`{key}`: how FSDP wraps and schedules its modules; trinity shards in buckets of consecutive \
                     parameters, so it has no effect here"
                )),
                other => {
                    let known = ["optimizer_offload", "param_offload", "offload_policy", "reshard_after_forward"]
                        .into_iter()
                        .chain(["fsdp_size", "model_dtype", "dtype", "mixed_precision"])
                        .chain(BUILT_FROM_TRAINER_KEYS.iter().copied())
                        .chain(ENGINE_ONLY.iter().copied());
                    match closest(other, known) {
                        Some(near) => {
                            let error = self.invalid(&key, format!("not an FSDP setting; did you mean `{near}`?"));
                            self.record(Err(error));
                        }
                        None => self.notes.push(format!("`{key}`: not an FSDP setting trinity knows; no effect")),
                    }
                }
            }
        }
    }

    /// A boolean `value` of `key`, or an error recorded.
    fn boolean(&mut self, key: &str, value: &Value) -> Option<bool> {
        let b = value.as_bool();
        if b.is_none() {
            let error = self.invalid(key, format!("must be true or false, got {value}"));
            self.record(Err(error));
        }
        b
    }

    /// FSDP's precision keys: trinity's precision is `trainer.dtype`, so only the values Trinity-RFT itself
    /// builds (fp32 storage, bf16 compute, no further mixed-precision settings) are accepted.
    fn check_precision(&mut self, key: &str, name: &str, value: &Value) {
        let default = match name {
            "model_dtype" => value.is_null() || matches!(value.as_str(), Some("fp32" | "float32")),
            "dtype" => value.is_null() || matches!(value.as_str(), Some("bf16" | "bfloat16")),
            _ => value.is_null() || value.as_object().is_some_and(|m| m.is_empty()),
        };
        if default {
            self.notes.push(format!("`{key}`: Trinity-RFT's value; trinity's precision follows trainer.dtype"));
        } else {
            let error = self.invalid(
                key,
                format!(
                    "trinity's training precision is set by trainer.dtype (bfloat16: bf16 compute with fp32 masters, \
                     float32, or auto), not by FSDP's precision keys; set trainer.dtype and remove `{name}`"
                ),
            );
            self.record(Err(error));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{assert_names, loaded, refusal};

    const BASE: &str = "model:\n  model_path: /m\n  max_model_len: 64\nbuffer:\n  explorer_input:\n    taskset:\n      \
                        path: /t.jsonl\n";

    fn with_fsdp(body: &str) -> String {
        format!("{BASE}trainer:\n  trainer_config:\n    actor_rollout_ref:\n      actor:\n        fsdp_config:\n{body}")
    }

    #[test]
    fn optimizer_offload_is_honoured_from_either_spelling() {
        let top = loaded(&format!("{BASE}trainer:\n  optimizer_offload: true\n"));
        assert!(top.config.trainer.optimizer_offload);
        assert!(!top.notes.iter().any(|n| n.to_string().contains("optimizer_offload")), "{:?}", top.notes);
        let verl = loaded(&with_fsdp("          optimizer_offload: true\n          reshard_after_forward: false\n"));
        let fsdp = &verl.config.trainer.trainer_config.actor_rollout_ref.actor.fsdp_config;
        assert_eq!(fsdp["optimizer_offload"], true);
        let notes: Vec<String> = verl.notes.iter().map(ToString::to_string).collect();
        assert!(notes.iter().any(|n| n.contains("optimizer_offload` (true) wins")), "{notes:?}");
        assert!(notes.iter().any(|n| n.contains("reshard_after_forward` (false)")), "{notes:?}");
    }

    #[test]
    fn foreign_precision_and_misspelt_keys_are_refused_with_why_and_parameter_offload_noted() {
        // Parameter offload holds on a CPU run; a CUDA trainer refuses it at start (the note says so).
        let offload = loaded(&with_fsdp("          param_offload: true\n"));
        let notes: Vec<String> = offload.notes.iter().map(ToString::to_string).collect();
        assert!(notes.iter().any(|n| n.contains("param_offload` (true)") && n.contains("refuses")), "{notes:?}");
        let top = loaded(&format!("{BASE}trainer:\n  param_offload: true\n  offload_policy: true\n"));
        assert!(top.config.trainer.param_offload && top.config.trainer.offload_policy);
        let error = refusal(&with_fsdp("          mixed_precision:\n            param_dtype: fp32\n"));
        assert_names(
            &error,
            "trainer.trainer_config.actor_rollout_ref.actor.fsdp_config.mixed_precision",
            &["trainer.dtype"],
        );
        let error = refusal(&with_fsdp("          optimzer_offload: true\n"));
        assert_names(
            &error,
            "trainer.trainer_config.actor_rollout_ref.actor.fsdp_config.optimzer_offload",
            &["did you mean `optimizer_offload`"],
        );
        let error = refusal(&with_fsdp("          fsdp_size: all\n"));
        assert_names(&error, "trainer.trainer_config.actor_rollout_ref.actor.fsdp_config.fsdp_size", &["integer"]);
        // The defaults load, each named in a note.
        let fine = loaded(&with_fsdp(
            "          param_offload: false\n          fsdp_size: -1\n          wrap_policy:\n            \
             min_num_params: 0\n          dtype: bfloat16\n",
        ));
        let notes: Vec<String> = fine.notes.iter().map(ToString::to_string).collect();
        assert!(notes.iter().any(|n| n.contains("wrap_policy`: how FSDP wraps")), "{notes:?}");
        assert!(notes.iter().any(|n| n.contains("dtype`: Trinity-RFT's value")), "{notes:?}");
    }
}
