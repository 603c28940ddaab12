//! Trinity-RFT's validator corrections (`SynchronizerConfigValidator`, `IntervalConfigValidator`,
//! `MonitorConfigValidator`): values Trinity-RFT fixes instead of refusing are fixed the same way here, each with a
//! note, because users rely on them (a serve config without `sync_method`, an `eval_interval` that is not a
//! multiple of `sync_interval`), and the monitor's checks.

use crate::catalog::ExperienceSchema;
use crate::config::{Config, Mode};
use crate::error::ConfigError;
use crate::resolve::Resolver;
use crate::synchronizer::{SyncMethod, SyncStyle, SynchronizerConfig};

impl Resolver<'_> {
    /// Trinity-RFT 0.6.0's `explorer_sync_interval` and `trainer_sync_interval` (each unset means
    /// `sync_interval`): equal values are that one interval (with a note when it replaces `sync_interval`);
    /// different ones are kept, each side syncing at its own (`SyncSchedule` in trinity-rft). Where the explorer
    /// waits at its sync points for weights newer than its own (`fixed` between processes, and one process, where
    /// syncs happen as `fixed` has them), an explorer interval below the trainer's is refused: some of those syncs
    /// would wait for weights the trainer publishes only after steps the explorer has not explored, which
    /// Trinity-RFT 0.6.0 waits for until `sync_timeout`.
    fn resolve_sync_intervals(&mut self, config: &mut Config) -> Result<(), ConfigError> {
        let sync = &mut config.synchronizer;
        let (explorer, trainer) = (sync.explorer_interval(), sync.trainer_interval());
        self.require(explorer >= 1, "synchronizer.explorer_sync_interval", "must be at least 1")?;
        self.require(trainer >= 1, "synchronizer.trainer_sync_interval", "must be at least 1")?;
        if explorer == trainer {
            if explorer != sync.sync_interval {
                self.notes.push(format!(
                    "synchronizer.sync_interval is {explorer}, the explorer_sync_interval and trainer_sync_interval set"
                ));
                sync.sync_interval = explorer;
            }
            return Ok(());
        }
        let one_process = matches!(config.mode, Mode::Both | Mode::Colocate);
        // A fully asynchronous explorer never waits; it takes each version as it comes.
        let waits = match sync.sync_style {
            SyncStyle::FullyAsync => false,
            SyncStyle::Fixed => true,
            SyncStyle::DynamicByExplorer | SyncStyle::DynamicByTrainer => one_process,
        };
        self.require(
            !(waits && explorer < trainer),
            "synchronizer.explorer_sync_interval",
            format!(
                "{explorer} is below synchronizer.trainer_sync_interval {trainer}: {}, the explorer waits at each of \
                 its sync points for weights newer than its own, and the trainer publishes only every {trainer} \
                 steps, after steps the explorer has not explored yet (Trinity-RFT 0.6.0 waits until \
                 synchronizer.sync_timeout); set explorer_sync_interval to at least {trainer}{}",
                if one_process {
                    format!("in mode `{}` (explorer and trainer in one process)", config.mode.name())
                } else {
                    "with synchronizer.sync_style `fixed`".to_owned()
                },
                if one_process { "" } else { ", or sync_style to `trainer_driven`" }
            ),
        )
    }

    /// Trinity-RFT 0.6.0's rules for `explorer.over_rollout` (its `ExplorerConfigValidator`): the ratio is a
    /// fraction below 1, and a step that may end before its slowest tasks needs a sync style other than `fixed`.
    fn check_over_rollout(&mut self, config: &Config) {
        let over = &config.explorer.over_rollout;
        if over.ratio == 0.0 && !over.return_partial_tasks {
            return;
        }
        self.check(
            (0.0..1.0).contains(&over.ratio),
            "explorer.over_rollout.ratio",
            format!("{} must be in [0, 1): the fraction of a step's tasks it may leave unfinished", over.ratio),
        );
        self.check(
            over.wait_after_min >= 0.0 && over.wait_after_min.is_finite(),
            "explorer.over_rollout.wait_after_min",
            format!("{} must be a number of seconds, at least 0", over.wait_after_min),
        );
        self.check(
            config.synchronizer.sync_style != SyncStyle::Fixed,
            "explorer.over_rollout",
            "over-rollout is not compatible with synchronizer.sync_style `fixed` (Trinity-RFT 0.6.0 refuses it \
             too): set synchronizer.sync_style to `explorer_driven` or `trainer_driven`, or over_rollout.ratio to 0",
        );
    }

    /// `sync_style: fully_async` (Trinity-RFT 0.6.0): no eval tasksets (its buffer validator refuses them), at
    /// least one batch in flight; `sync_offset` and the explorer's interval have no effect there (its explorer
    /// has no sync points), and `max_inflight_batches` has none in the other styles.
    fn check_fully_async(&mut self, config: &Config) {
        let sync = &config.synchronizer;
        let inflight = config.explorer.max_inflight_batches;
        if sync.sync_style != SyncStyle::FullyAsync {
            if inflight != crate::explorer::ExplorerConfig::default().max_inflight_batches {
                self.notes.push(format!(
                    "explorer.max_inflight_batches ({inflight}) acts only with synchronizer.sync_style `fully_async`; \
                     no effect with `{}`",
                    sync.sync_style.name()
                ));
            }
            return;
        }
        self.check(
            config.buffer.explorer_input.eval_tasksets.is_empty(),
            "buffer.explorer_input.eval_tasksets",
            "eval tasksets are not supported with synchronizer.sync_style `fully_async` (Trinity-RFT 0.6.0 refuses \
             them too): remove them, or choose another sync_style",
        );
        self.check(inflight >= 1, "explorer.max_inflight_batches", "must be at least 1 with sync_style `fully_async`");
        if sync.sync_offset != 0 {
            self.notes.push(format!(
                "synchronizer.sync_offset ({}) has no effect with sync_style `fully_async`: the explorer never waits \
                 for weights, and explorer.max_inflight_batches ({inflight}) bounds how far it runs ahead",
                sync.sync_offset
            ));
        }
    }

    /// Trinity-RFT's `SynchronizerConfigValidator` and `IntervalConfigValidator`: values it corrects are
    /// corrected the same way here, each with a note.
    pub(crate) fn resolve_synchronizer(
        &mut self,
        config: &mut Config,
        schema: ExperienceSchema,
    ) -> Result<(), ConfigError> {
        self.resolve_sync_intervals(config)?;
        self.check_over_rollout(config);
        self.check_fully_async(config);
        let sync = &config.synchronizer;
        self.require(sync.sync_interval >= 1, "synchronizer.sync_interval", "must be at least 1")?;
        self.check(sync.sync_timeout >= 1, "synchronizer.sync_timeout", "must be at least 1 second");
        let separate = matches!(config.mode, Mode::Explore | Mode::Train | Mode::Bench | Mode::Serve);
        let dataset = schema != ExperienceSchema::Experience;
        // An explorer and a trainer in processes of their own (modes `explore` + `train`, RL) have a real `nccl`
        // path: a process group the trainer hosts (Gloo on CPU). Bench and serve only read published weights.
        let pair = matches!(config.mode, Mode::Explore | Mode::Train) && !dataset;
        if config.synchronizer.sync_method == SyncMethod::Nccl {
            if pair {
                self.notes.push(format!(
                    "synchronizer.sync_method `nccl` in mode `{}`: weights go from the trainer to the explorer over a \
                     process group the trainer hosts (Gloo on CPU; its address is in <job>/sync/nccl.json), and \
                     through checkpoint files in <job>/sync/ once that group fails",
                    config.mode.name()
                ));
            } else if separate {
                config.synchronizer.sync_method = SyncMethod::Checkpoint;
                self.notes.push(format!(
                    "synchronizer.sync_method `nccl` is set to `checkpoint`: mode `{}` reads published weights (as Trinity-RFT does)",
                    config.mode.name()
                ));
            } else if config.mode == Mode::Colocate {
                config.synchronizer.sync_method = SyncMethod::Memory;
                self.notes.push(
                    "synchronizer.sync_method `nccl` is set to `memory` in mode `colocate` (as Trinity-RFT does)"
                        .into(),
                );
            } else {
                self.notes.push("synchronizer.sync_method `nccl` on one device is an in-place `memory` sync".into());
            }
        }
        if dataset {
            // SFT and DPO have no explorer to feed: Trinity-RFT saves weights as checkpoints every save_interval.
            if config.synchronizer.sync_method != SyncMethod::Checkpoint {
                config.synchronizer.sync_method = SyncMethod::Checkpoint;
                self.notes.push(format!(
                    "synchronizer.sync_method is set to `checkpoint` for algorithm `{}` (as Trinity-RFT does)",
                    config.algorithm.algorithm_type
                ));
            }
            let save_interval = config.trainer.save_interval;
            if save_interval >= 1 && u64::from(config.synchronizer.sync_interval) != save_interval {
                config.synchronizer.sync_interval = u32::try_from(save_interval).unwrap_or(u32::MAX);
                self.notes.push(format!(
                    "synchronizer.sync_interval is set to trainer.save_interval ({save_interval}) for algorithm `{}`",
                    config.algorithm.algorithm_type
                ));
            }
        }
        let method = match config.synchronizer.sync_method {
            SyncMethod::Nccl => "nccl",
            SyncMethod::Memory => "memory",
            SyncMethod::Checkpoint => "checkpoint",
        };
        let between_processes = match config.synchronizer.sync_method {
            SyncMethod::Checkpoint => true,
            SyncMethod::Nccl => pair,
            SyncMethod::Memory => false,
        };
        self.check(
            !(separate && !between_processes && !dataset),
            "synchronizer.sync_method",
            format!(
                "`{method}` needs explorer and trainer in one process; mode `{}` syncs through `checkpoint`{}",
                config.mode.name(),
                if pair { " or `nccl`" } else { "" }
            ),
        );
        self.note_idle_sync_schedule(config, dataset);
        // Trinity-RFT 0.6.0 rounds to the explorer's interval, the one the explorer's steps follow.
        let interval = u64::from(config.synchronizer.explorer_interval());
        let eval_interval = config.explorer.eval_interval;
        // Trinity-RFT's IntervalConfigValidator exempts `sft` and `dpo` by name, not every dataset algorithm: CPT's
        // eval_interval is rounded to the save_interval its sync_interval became.
        let rounds = !dataset || schema == ExperienceSchema::Cpt;
        if config.mode != Mode::Bench && rounds && !eval_interval.is_multiple_of(interval) {
            let rounded = (eval_interval / interval).max(1) * interval;
            config.explorer.eval_interval = rounded;
            self.notes.push(format!(
                "explorer.eval_interval ({eval_interval}) is rounded to {rounded}, a multiple of the explorer's sync interval ({interval}), as Trinity-RFT does"
            ));
        }
        Ok(())
    }

    /// `sync_style` and `sync_timeout` act only where a trainer and an explorer run apart and one waits for the
    /// other (modes `explore` and `train` with RL); elsewhere a value other than the default is noted, never refused.
    fn note_idle_sync_schedule(&mut self, config: &Config, dataset: bool) {
        let sync = &config.synchronizer;
        let mode = config.mode.name();
        // In one process explorer and trainer alternate (`schedule.rs`): the trainer's weights are always ready
        // when the explorer reaches a sync point and nothing ever waits for them.
        let (style_why, timeout_why) = match config.mode {
            Mode::Both | Mode::Colocate => (
                format!(
                    "in mode `{mode}` explorer and trainer alternate in one process, so the trainer's weights are ready \
                     at every sync point and syncs happen where `fixed` has them"
                ),
                format!(
                    "in mode `{mode}` nothing waits for weights; it bounds only a wait for room in the experience \
                     buffer, which the capacity check makes impossible"
                ),
            ),
            Mode::Bench => (
                "mode `bench` evaluates saved checkpoints and syncs nothing".to_owned(),
                "mode `bench` evaluates saved checkpoints and waits for no weights".to_owned(),
            ),
            _ if dataset => {
                let algorithm = &config.algorithm.algorithm_type;
                (
                    format!("algorithm `{algorithm}` trains from a dataset with no explorer to sync with"),
                    format!("algorithm `{algorithm}` trains from a dataset, so nothing waits for weights"),
                )
            }
            _ => return,
        };
        let honoured_here =
            sync.sync_style == SyncStyle::FullyAsync && matches!(config.mode, Mode::Both | Mode::Colocate);
        if sync.sync_style != SyncStyle::Fixed && !honoured_here {
            self.notes.push(format!("synchronizer.sync_style `{}`: {style_why}", sync.sync_style.name()));
        }
        if sync.sync_timeout != SynchronizerConfig::default().sync_timeout {
            self.notes.push(format!("synchronizer.sync_timeout ({} s): {timeout_why}", sync.sync_timeout));
        }
    }

    /// Trinity-RFT's `MonitorConfigValidator`: the monitor must be one it registers (or one of trinity's local
    /// sinks), and a hosted monitor's `monitor_args` must be keys it reads, each of the type it takes.
    pub(crate) fn resolve_monitor(&mut self, config: &mut Config) {
        let monitor = config.monitor.monitor_type.clone();
        let allowed = ["tensorboard", "csv", "jsonl", "wandb", "mlflow", "swanlab"];
        if !self.one_of("monitor.monitor_type", &monitor, &allowed) {
            return;
        }
        let Some((_, keys)) = crate::monitor::MONITOR_ARGS.iter().find(|(name, _)| *name == monitor) else {
            if !config.monitor.monitor_args.is_empty() {
                self.notes.push(format!("monitor.monitor_args are ignored: monitor `{monitor}` takes none"));
            }
            return;
        };
        for (key, value) in &config.monitor.monitor_args {
            let key_path = format!("monitor.monitor_args.{key}");
            match keys.iter().find(|(name, _)| name == key) {
                Some((_, kind)) => {
                    self.check(kind.accepts(value), &key_path, format!("must be {}", kind.describe()));
                }
                None => {
                    let known: Vec<&str> = keys.iter().map(|(name, _)| *name).collect();
                    self.check(
                        false,
                        &key_path,
                        format!("monitor `{monitor}` does not read it; it reads {}", known.join(", ")),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::catalog::AnyName;
    use crate::synchronizer::{SyncMethod, SyncStyle};
    use crate::{LoadOptions, Loaded, load_str};

    fn load(text: &str) -> Loaded {
        let env = |_: &str| None;
        let options = LoadOptions { overrides: &[], env: &env, catalog: &AnyName, cwd: Path::new("/work") };
        load_str(text, Path::new("c.yaml"), options).unwrap_or_else(|e| panic!("{e}"))
    }

    const MODEL: &str = "model:\n  model_path: /m\n  max_model_len: 64\n";

    #[test]
    fn nccl_becomes_checkpoint_in_bench_and_serve_and_memory_in_colocate() {
        let serve = load(&format!("mode: serve\n{MODEL}"));
        assert_eq!(serve.config.synchronizer.sync_method, SyncMethod::Checkpoint);
        assert!(serve.notes.iter().any(|n| n.contains("mode `serve`")), "{:?}", serve.notes);
        // An explorer and a trainer apart keep `nccl`: the trainer hosts a process group for the explorer.
        let shared = "  trainer_input:\n    experience_buffer:\n      path: sqlite:///x.db\n";
        let explore = load(&format!(
            "mode: explore\n{MODEL}buffer:\n  explorer_input:\n    taskset:\n      path: /t.jsonl\n{shared}"
        ));
        assert_eq!(explore.config.synchronizer.sync_method, SyncMethod::Nccl);
        assert!(explore.notes.iter().any(|n| n.contains("process group the trainer hosts")), "{:?}", explore.notes);
        let colocate =
            load(&format!("mode: colocate\n{MODEL}buffer:\n  explorer_input:\n    taskset:\n      path: /t.jsonl\n"));
        assert_eq!(colocate.config.synchronizer.sync_method, SyncMethod::Memory);
    }

    #[test]
    fn separate_sync_intervals_are_kept_unless_the_explorer_would_wait_for_weights_that_come_later() {
        let tasks = "buffer:\n  explorer_input:\n    taskset:\n      path: /t.jsonl\n";
        let both =
            load(&format!("{MODEL}{tasks}synchronizer:\n  explorer_sync_interval: 2\n  trainer_sync_interval: 2\n"));
        assert_eq!(both.config.synchronizer.sync_interval, 2);
        assert!(both.notes.iter().any(|n| n.contains("sync_interval is 2")), "{:?}", both.notes);
        let one = load(&format!("{MODEL}{tasks}synchronizer:\n  sync_interval: 3\n  explorer_sync_interval: 3\n"));
        assert_eq!(one.config.synchronizer.sync_interval, 3);
        let apart = load(&format!(
            "{MODEL}{tasks}synchronizer:\n  explorer_sync_interval: 3\n  trainer_sync_interval: 2\nexplorer:\n  eval_interval: 10\n"
        ));
        let sync = &apart.config.synchronizer;
        assert_eq!((sync.explorer_interval(), sync.trainer_interval(), sync.sync_interval), (3, 2, 1));
        assert_eq!(apart.config.explorer.eval_interval, 9, "rounded to the explorer's interval, as 0.6.0 does");
        let error = crate::testing::refusal(&format!(
            "{MODEL}{tasks}synchronizer:\n  sync_interval: 1\n  trainer_sync_interval: 4\n"
        ));
        crate::testing::assert_names(
            &error,
            "synchronizer.explorer_sync_interval",
            &["1 is below synchronizer.trainer_sync_interval 4", "mode `both`"],
        );
        // Between processes only `fixed` waits; a trainer-driven explorer takes what is there at its sync points.
        let shared = "  trainer_input:\n    experience_buffer:\n      path: sqlite:///x.db\n";
        let pair = |style: &str| {
            format!(
                "mode: explore\n{MODEL}{tasks}{shared}synchronizer:\n  sync_style: {style}\n  sync_method: checkpoint\n  \
                 explorer_sync_interval: 1\n  trainer_sync_interval: 2\n"
            )
        };
        assert_eq!(load(&pair("trainer_driven")).config.synchronizer.trainer_interval(), 2);
        let error = crate::testing::refusal(&pair("fixed"));
        crate::testing::assert_names(
            &error,
            "synchronizer.explorer_sync_interval",
            &["sync_style `fixed`", "trainer_driven"],
        );
    }

    #[test]
    fn fully_async_refuses_eval_tasksets_and_notes_what_it_ignores() {
        let tasks = "buffer:\n  explorer_input:\n    taskset:\n      path: /t.jsonl\n";
        let text = |extra: &str| {
            format!(
                "{MODEL}{tasks}{extra}synchronizer:\n  sync_style: fully_async\n  sync_offset: 1\nexplorer:\n  max_inflight_batches: 3\n"
            )
        };
        let loaded = load(&text(""));
        assert_eq!(loaded.config.synchronizer.sync_style, SyncStyle::FullyAsync);
        assert_eq!(loaded.config.explorer.max_inflight_batches, 3);
        assert_eq!(loaded.config.synchronizer.steps_buffered(3), 3);
        let notes = loaded.notes.join("\n");
        assert!(notes.contains("sync_offset (1) has no effect with sync_style `fully_async`"), "{notes}");
        assert!(!notes.contains("sync_style `fully_async`: in mode"), "fully_async is honoured in mode both: {notes}");
        let error = crate::testing::refusal(&text("    eval_tasksets:\n      - name: e\n        path: /e.jsonl\n"));
        crate::testing::assert_names(&error, "buffer.explorer_input.eval_tasksets", &["`fully_async`", "remove them"]);
        let fixed = load(&format!("{MODEL}{tasks}explorer:\n  max_inflight_batches: 3\n"));
        assert!(fixed.notes.iter().any(|n| n.contains("max_inflight_batches (3) acts only with")), "{:?}", fixed.notes);
    }

    #[test]
    fn over_rollout_needs_a_ratio_below_one_and_a_sync_style_other_than_fixed() {
        let tasks = "buffer:\n  explorer_input:\n    taskset:\n      path: /t.jsonl\n";
        let over = |ratio: &str, style: &str| {
            format!(
                "{MODEL}{tasks}explorer:\n  over_rollout:\n    ratio: {ratio}\nsynchronizer:\n  sync_style: {style}\n"
            )
        };
        let loaded = load(&over("0.5", "trainer_driven"));
        assert_eq!(loaded.config.explorer.over_rollout.ratio, 0.5);
        let error = crate::testing::refusal(&over("0.5", "fixed"));
        crate::testing::assert_names(&error, "explorer.over_rollout", &["sync_style `fixed`", "trainer_driven"]);
        let error = crate::testing::refusal(&over("1.0", "explorer_driven"));
        crate::testing::assert_names(&error, "explorer.over_rollout.ratio", &["[0, 1)"]);
    }

    #[test]
    fn sft_syncs_by_checkpoint_at_the_save_interval() {
        let sft = load(&format!(
            "mode: train\nalgorithm:\n  algorithm_type: sft\n{MODEL}buffer:\n  train_batch_size: 4\n  trainer_input:\n    experience_buffer:\n      storage_type: file\n      path: /sft.jsonl\ntrainer:\n  save_interval: 5\nsynchronizer:\n  sync_method: memory\n"
        ));
        assert_eq!(sft.config.synchronizer.sync_method, SyncMethod::Checkpoint);
        assert_eq!(sft.config.synchronizer.sync_interval, 5);
        assert_eq!(sft.config.explorer.eval_interval, 100, "SFT keeps its eval_interval");
    }

    #[test]
    fn cpt_rounds_its_eval_interval_to_the_save_interval_where_sft_keeps_it() {
        let text = |algorithm: &str| {
            format!(
                "mode: train\nalgorithm:\n  algorithm_type: {algorithm}\n{MODEL}buffer:\n  train_batch_size: 4\n  \
                 trainer_input:\n    experience_buffer:\n      storage_type: file\n      path: /rows.jsonl\n      \
                 format:\n        prompt_type: plaintext\ntrainer:\n  save_interval: 4\nexplorer:\n  eval_interval: 10\n"
            )
        };
        let cpt = load(&text("cpt"));
        assert_eq!((cpt.config.synchronizer.sync_interval, cpt.config.explorer.eval_interval), (4, 8));
        assert!(cpt.notes.iter().any(|n| n.contains("eval_interval (10) is rounded to 8")), "{:?}", cpt.notes);
        assert_eq!(load(&text("sft")).config.explorer.eval_interval, 10);
    }

    #[test]
    fn eval_interval_rounds_down_to_a_multiple_of_sync_interval_but_not_below_one_interval() {
        let base = format!("{MODEL}buffer:\n  explorer_input:\n    taskset:\n      path: /t.jsonl\n");
        let rounded = load(&format!("{base}synchronizer:\n  sync_interval: 4\nexplorer:\n  eval_interval: 10\n"));
        assert_eq!(rounded.config.explorer.eval_interval, 8);
        let raised = load(&format!("{base}synchronizer:\n  sync_interval: 4\nexplorer:\n  eval_interval: 3\n"));
        assert_eq!(raised.config.explorer.eval_interval, 4);
        let kept = load(&format!("{base}synchronizer:\n  sync_interval: 4\nexplorer:\n  eval_interval: 12\n"));
        assert_eq!(kept.config.explorer.eval_interval, 12);
        assert!(!kept.notes.iter().any(|n| n.contains("eval_interval")), "{:?}", kept.notes);
    }

    #[test]
    fn lengths_are_derived_from_one_another_with_a_note() {
        let base = "buffer:\n  explorer_input:\n    taskset:\n      path: /t.jsonl\n";
        let half = load(&format!("model:\n  model_path: /m\n  max_model_len: 64\n  min_response_tokens: 40\n{base}"));
        let model = &half.config.model;
        assert_eq!((model.max_prompt_tokens, model.max_response_tokens), (Some(32), Some(32)));
        assert_eq!(model.min_response_tokens, 31, "one token below the maximum, as Trinity-RFT sets it");
        assert!(half.notes.iter().any(|n| n.contains("model lengths derived")), "{:?}", half.notes);
        let summed =
            load(&format!("model:\n  model_path: /m\n  max_prompt_tokens: 10\n  max_response_tokens: 6\n{base}"));
        assert_eq!(summed.config.model.max_model_len, Some(16));
    }

    #[test]
    fn hosted_monitors_take_the_monitor_args_trinity_reads_and_refuse_others() {
        let base = format!("{MODEL}buffer:\n  explorer_input:\n    taskset:\n      path: /t.jsonl\n");
        let loaded = load(&format!("{base}monitor:\n  monitor_type: mlflow\n  monitor_args:\n    uri: http://x\n"));
        assert_eq!(loaded.config.monitor.monitor_type, "mlflow");
        let yaml =
            format!("{base}monitor:\n  monitor_type: wandb\n  monitor_args:\n    uri: http://x\n    api_key: 3\n");
        let env = |_: &str| None;
        let options = LoadOptions { overrides: &[], env: &env, catalog: &AnyName, cwd: Path::new("/work") };
        let errors = load_str(&yaml, Path::new("c.yaml"), options).unwrap_err().to_string();
        assert!(errors.contains("monitor.monitor_args.uri") && errors.contains("base_url, api_key"), "{errors}");
        assert!(errors.contains("monitor.monitor_args.api_key") && errors.contains("a string"), "{errors}");
        let local = load(&format!("{base}monitor:\n  monitor_type: csv\n  monitor_args:\n    uri: http://x\n"));
        assert!(local.notes.iter().any(|n| n.contains("monitor_args are ignored")), "{:?}", local.notes);
    }

    #[test]
    fn dynamic_sync_styles_and_timeouts_are_noted_in_one_process() {
        let base = format!("{MODEL}buffer:\n  explorer_input:\n    taskset:\n      path: /t.jsonl\n");
        let driven = load(&format!("{base}synchronizer:\n  sync_style: explorer_driven\n  sync_timeout: 1200\n"));
        let notes = driven.notes.join("\n");
        assert!(notes.contains("sync_style `explorer_driven`") && notes.contains("where `fixed` has them"), "{notes}");
        assert!(notes.contains("sync_timeout (1200 s)"), "{notes}");
        let fixed = load(&base);
        assert!(
            !fixed.notes.iter().any(|n| n.contains("sync_style") || n.contains("sync_timeout")),
            "{:?}",
            fixed.notes
        );
    }

    #[test]
    fn sync_styles_timeouts_and_bench_keys_are_honoured_where_they_act() {
        let shared = "  trainer_input:\n    experience_buffer:\n      path: sqlite:///x.db\n";
        let sync = "synchronizer:\n  sync_style: explorer_driven\n  sync_timeout: 1200\n";
        let explore = load(&format!(
            "mode: explore\n{MODEL}buffer:\n  explorer_input:\n    taskset:\n      path: /t.jsonl\n{shared}{sync}"
        ));
        let train = load(&format!("mode: train\n{MODEL}buffer:\n  train_batch_size: 4\n{shared}{sync}"));
        for loaded in [&explore, &train] {
            assert!(
                !loaded.notes.iter().any(|n| n.contains("sync_style") || n.contains("sync_timeout")),
                "honoured apart, so no note: {:?}",
                loaded.notes
            );
        }
        let dpo = load(&format!(
            "mode: train\nalgorithm:\n  algorithm_type: dpo\n{MODEL}buffer:\n  train_batch_size: 4\n  trainer_input:\n    \
             experience_buffer:\n      storage_type: file\n      path: /pairs.jsonl\n{sync}"
        ));
        let notes = dpo.notes.join("\n");
        assert!(notes.contains("sync_style `explorer_driven`: algorithm `dpo` trains from a dataset"), "{notes}");
        assert!(notes.contains("sync_timeout (1200 s): algorithm `dpo` trains from a dataset"), "{notes}");
        let bench_key = "explorer:\n  bench_on_latest_checkpoint: true\n";
        let both = load(&format!("{MODEL}buffer:\n  explorer_input:\n    taskset:\n      path: /t.jsonl\n{bench_key}"));
        assert!(
            both.notes.iter().any(|n| n.contains("bench_on_latest_checkpoint: only mode `bench` reads it")),
            "{:?}",
            both.notes
        );
        let bench = load(&format!(
            "mode: bench\n{MODEL}buffer:\n  explorer_input:\n    eval_tasksets:\n      - path: /e.jsonl\n{bench_key}"
        ));
        assert!(!bench.notes.iter().any(|n| n.contains("bench_on_latest_checkpoint")), "{:?}", bench.notes);
    }
}
