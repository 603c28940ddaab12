//! When the trainer recomputes layer activations in the backward instead of keeping them from the forward
//! (veRL's `enable_gradient_checkpointing`; [`trinity_model::Decoder::set_recompute_activations`]).
//!
//! veRL turns recomputation on by default because an accelerator's memory is what bounds its micro-batches. On
//! the CPU the trainer knows the memory it has, and recomputation costs one more forward of the layers: measured
//! with `bench_train --batch 4 --seq 512` (SmolLM2-135M, 2 cores of an EPYC Zen 4), 12.0 → 14.0 s an iteration in
//! fp32 and 7.0 → 8.5 s in bf16, for a peak of 3.08 → 1.64 GB and 1.77 → 0.98 GB. So by default
//! ([`ActivationRecompute::WhenShort`], what `enable_gradient_checkpointing: true` maps to) a pass recomputes only
//! when the activations it would keep do not fit in memory, and the configured micro-batches then keep their size
//! instead of being cut to what fits, which would weight the token-mean loss differently from Trinity-RFT.

use tch::Device;

use crate::micro_batch::{kept_activations_token_cap, recomputed_activations_token_cap};

/// When layer activations are recomputed in the backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationRecompute {
    /// Never: activations are kept, and on the CPU micro-batches are cut to what fits in memory
    /// (`enable_gradient_checkpointing: false`).
    Never,
    /// In a pass whose kept activations would not fit in memory (`enable_gradient_checkpointing: true`, veRL's
    /// default); on an accelerator, whose memory the trainer does not measure, always, as veRL does.
    WhenShort,
    /// In every pass with autograd.
    Always,
}

impl ActivationRecompute {
    /// The mode `enable_gradient_checkpointing` asks for.
    pub fn from_gradient_checkpointing(enabled: bool) -> Self {
        if enabled { ActivationRecompute::WhenShort } else { ActivationRecompute::Never }
    }
}

/// One model's decision per pass, with the memory figures it was sized by.
#[derive(Debug, Clone)]
pub(crate) struct RecomputePlan {
    mode: ActivationRecompute,
    /// The most tokens a pass may run with its activations kept; `None` when unknown.
    kept_cap: Option<usize>,
    /// The most tokens a pass may run with its layers recomputed; `None` when unknown.
    recomputed_cap: Option<usize>,
    on_cpu: bool,
    /// Whether the first pass recomputed for want of memory was logged.
    announced: bool,
}

impl RecomputePlan {
    /// The plan for a model of `layers` layers of width `hidden` and MLP width `intermediate` on `device`, with
    /// `available` bytes of memory for passes (the CPU's, less the training state the trainer allocates,
    /// [`crate::memory`]; unknown: `None`). A build that cannot recompute
    /// ([`trinity_model::activation_recompute_available`]) keeps activations under `WhenShort`, saying so, and is
    /// refused under `Always` by the decoder when the first pass asks.
    pub(crate) fn new(
        mode: ActivationRecompute,
        device: Device,
        (layers, hidden, intermediate): (i64, i64, i64),
        available: Option<u64>,
    ) -> Self {
        let mode = if mode == ActivationRecompute::WhenShort && !trinity_model::activation_recompute_available() {
            tracing::info!(
                "enable_gradient_checkpointing: this build cannot recompute activations (it was built without \
                 libtorch's headers), so they are kept and micro-batches are sized to fit in memory"
            );
            ActivationRecompute::Never
        } else {
            mode
        };
        RecomputePlan {
            mode,
            kept_cap: kept_activations_token_cap(layers, hidden, intermediate, available),
            recomputed_cap: recomputed_activations_token_cap(layers, hidden, intermediate, available),
            on_cpu: device == Device::Cpu,
            announced: false,
        }
    }

    /// The most tokens a micro-batch may take on the CPU: what fits with activations kept, or with them
    /// recomputed when this plan may recompute; `None` when unknown or not on the CPU.
    pub(crate) fn micro_batch_cap(&self) -> Option<usize> {
        if !self.on_cpu {
            return None;
        }
        match self.mode {
            ActivationRecompute::Never => self.kept_cap,
            ActivationRecompute::WhenShort | ActivationRecompute::Always => self.recomputed_cap,
        }
    }

    /// The most tokens consecutive micro-batches may run together in one pass on the CPU: joining them never
    /// makes a pass recompute that would not have alone.
    pub(crate) fn pass_cap(&self) -> Option<usize> {
        if !self.on_cpu {
            return None;
        }
        match self.mode {
            ActivationRecompute::Never | ActivationRecompute::WhenShort => self.kept_cap,
            ActivationRecompute::Always => self.recomputed_cap,
        }
    }

    /// Whether the pass of `tokens` layout tokens recomputes (logged the first time memory decides it).
    pub(crate) fn recompute(&mut self, tokens: usize, model: &str) -> bool {
        match self.mode {
            ActivationRecompute::Never => false,
            ActivationRecompute::Always => true,
            ActivationRecompute::WhenShort if !self.on_cpu => true,
            ActivationRecompute::WhenShort => {
                let short = self.kept_cap.is_some_and(|cap| tokens > cap);
                if short && !std::mem::replace(&mut self.announced, true) {
                    tracing::info!(
                        "{model}: a pass of {tokens} tokens would keep more activations than half the memory \
                         available holds ({} tokens), so its layers are recomputed in the backward \
                         (enable_gradient_checkpointing): one more forward of the layers, the same gradients",
                        self.kept_cap.unwrap_or(0)
                    );
                }
                short
            }
        }
    }

    pub(crate) fn mode(&self) -> ActivationRecompute {
        self.mode
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2: (i64, i64, i64) = (30, 576, 1536);

    #[test]
    fn when_short_recomputes_only_passes_over_the_kept_cap() {
        let mut plan = RecomputePlan::new(ActivationRecompute::WhenShort, Device::Cpu, SMOLLM2, Some(8 << 30));
        let kept = plan.kept_cap.unwrap();
        let recomputed = plan.recomputed_cap.unwrap();
        assert!(recomputed > 5 * kept, "recomputation must fit many times the tokens: {kept} vs {recomputed}");
        assert!(!plan.recompute(kept, "policy"));
        assert!(plan.recompute(kept + 1, "policy"));
        assert_eq!(plan.pass_cap(), Some(kept));
        assert_eq!(plan.micro_batch_cap(), Some(recomputed));
    }

    #[test]
    fn never_keeps_and_caps_micro_batches_at_what_fits_kept() {
        let mut plan = RecomputePlan::new(ActivationRecompute::Never, Device::Cpu, SMOLLM2, Some(8 << 30));
        assert!(!plan.recompute(usize::MAX, "policy"));
        assert_eq!(plan.micro_batch_cap(), plan.kept_cap);
        let mut always = RecomputePlan::new(ActivationRecompute::Always, Device::Cpu, SMOLLM2, Some(8 << 30));
        assert!(always.recompute(1, "policy"));
        assert_eq!(always.pass_cap(), always.recomputed_cap);
    }

    #[test]
    fn unknown_memory_recomputes_only_off_the_cpu() {
        let mut cpu = RecomputePlan::new(ActivationRecompute::WhenShort, Device::Cpu, SMOLLM2, None);
        assert!(!cpu.recompute(1 << 20, "policy"));
        let mut gpu = RecomputePlan::new(ActivationRecompute::WhenShort, Device::Cuda(0), SMOLLM2, Some(8 << 30));
        assert!(gpu.recompute(1, "policy"));
        assert_eq!((gpu.micro_batch_cap(), gpu.pass_cap()), (None, None));
    }
}

#[cfg(test)]
mod config_tests {
    use trinity_algorithm::BuiltinCatalog;
    use trinity_config::LoadOptions;

    use super::ActivationRecompute::{Never, WhenShort};
    use crate::TrainerOptions;

    fn options(verl: &str) -> TrainerOptions {
        let text = format!(
            "project: t\nname: n\nmodel:\n  model_path: /m\n  max_model_len: 64\nbuffer:\n  explorer_input:\n    taskset:\n      path: /t\nalgorithm:\n  algorithm_type: ppo\ntrainer:\n  \
             trainer_config:\n{verl}"
        );
        let env = |_: &str| None;
        let dir = std::env::temp_dir();
        let load = LoadOptions { overrides: &[], env: &env, catalog: &BuiltinCatalog, cwd: &dir };
        let config = trinity_config::load_str(&text, &dir.join("config.yaml"), load).unwrap_or_else(|e| panic!("{e}"));
        TrainerOptions::from_config(&config.config)
    }

    /// veRL's default (true) recomputes when memory is short; each model follows its own key.
    #[test]
    fn enable_gradient_checkpointing_sets_each_models_recomputation() {
        let o = options("    algorithm:\n      gamma: 1.0\n");
        assert_eq!((o.activation_recompute, o.critic_activation_recompute), (WhenShort, WhenShort));
        let o = options(
            "    actor_rollout_ref:\n      model:\n        enable_gradient_checkpointing: false\n    critic:\n      \
             model:\n        enable_gradient_checkpointing: true\n",
        );
        assert_eq!((o.activation_recompute, o.critic_activation_recompute), (Never, WhenShort));
        let o = options("    critic:\n      model:\n        enable_gradient_checkpointing: false\n");
        assert_eq!((o.activation_recompute, o.critic_activation_recompute), (WhenShort, Never));
    }
}
