//! What `trinity run` cannot run although the config is valid.
//!
//! One function, called by the run and by `--dry-run` alike, so a dry run refuses exactly what the run would
//! refuse, with the same message. Work that brings a mode or feature relaxes the matching check here and nowhere
//! else. A staged config is checked stage by stage (only the stages run), each error naming `stages[i].…`.

use crate::Loaded;
use crate::buffer::{StorageType, is_database_url};
use crate::catalog::ExperienceSchema;
use crate::config::{Config, Mode};
use crate::error::ConfigError;
use crate::source::Source;
use crate::stages::Scope;
use crate::synchronizer::SyncStyle;

/// The reasoning parsers trinity's OpenAI-compatible API has (trinity-serve's `ReasoningParser`), under vLLM's names.
pub const REASONING_PARSERS: [&str; 2] = ["deepseek_r1", "qwen3"];

impl Loaded {
    /// Refuses what the run cannot do, naming the key, why, and what to do instead.
    pub fn check_runnable(&self) -> Result<(), ConfigError> {
        if self.stages.is_empty() {
            return Check { config: &self.config, source: &self.source, scope: &Scope::top() }.run();
        }
        for stage in &self.stages {
            Check { config: &stage.config, source: &self.source, scope: &stage.scope }.run()?;
        }
        Ok(())
    }
}

/// The checks of one config: the top level, or one stage.
struct Check<'a> {
    config: &'a Config,
    source: &'a Source,
    scope: &'a Scope,
}

impl Check<'_> {
    fn refuse(&self, key: &str, message: String) -> ConfigError {
        let message = self.scope.explain(key, message);
        let key = self.scope.key(key);
        ConfigError::NotRunnable { origin: self.source.origin(&key), key, message }
    }

    fn run(&self) -> Result<(), ConfigError> {
        let config = self.config;
        let rollout = &config.explorer.rollout_model;
        if rollout.enable_history && !rollout.enable_openai_api {
            return Err(self.refuse(
                "explorer.rollout_model.enable_history",
                "it records the replies workflows receive over the OpenAI-compatible API, which is off; set \
                 `explorer.rollout_model.enable_openai_api: true` as well, or remove `enable_history`"
                    .to_owned(),
            ));
        }
        match rollout.tool_call_parser.as_deref() {
            None | Some("hermes") => {}
            Some(other) => {
                return Err(self.refuse(
                    "explorer.rollout_model.tool_call_parser",
                    format!(
                        "trinity parses tool calls in the `hermes` format (`<tool_call>{{json}}</tool_call>`, Qwen's) \
                         only, not `{other}`; set `tool_call_parser: hermes` for a model that writes that format"
                    ),
                ));
            }
        }
        if let Some(parser) = rollout.reasoning_parser.as_deref()
            && !REASONING_PARSERS.contains(&parser)
        {
            return Err(self.refuse(
                "explorer.rollout_model.reasoning_parser",
                format!(
                    "trinity splits reasoning text the way vLLM's `deepseek_r1` and `qwen3` parsers do, not `{parser}`; \
                     use one of those for a model that writes `<think>...</think>`, or remove the key"
                ),
            ));
        }
        if rollout.enable_auto_tool_choice && rollout.tool_call_parser.is_none() {
            return Err(self.refuse(
                "explorer.rollout_model.enable_auto_tool_choice",
                "it needs a parser of the model's tool calls, as vLLM's does; set `tool_call_parser: hermes`"
                    .to_owned(),
            ));
        }
        self.check_shared_buffer()?;
        self.check_train_batch_size()?;
        self.check_back_pressure()?;
        let input = &config.buffer.explorer_input;
        let tasksets = input
            .tasksets
            .iter()
            .map(|t| ("tasksets", t))
            .chain(input.eval_tasksets.iter().map(|t| ("eval_tasksets", t)));
        for (i, (list, taskset)) in tasksets.enumerate() {
            let index = if list == "tasksets" { i } else { i - input.tasksets.len() };
            let key = format!("buffer.explorer_input.{list}[{index}]");
            let workflow = taskset.default_workflow_type.as_deref().unwrap_or_default();
            if config.explorer.auxiliary_models.is_empty() && crate::external::needs_auxiliary_model(workflow) {
                return Err(self.refuse(
                    &format!("{key}.default_workflow_type"),
                    format!(
                        "taskset `{}`: `{workflow}` calls a judge or teacher model; list it under \
                         explorer.auxiliary_models (the first one is the workflow's)",
                        taskset.name
                    ),
                ));
            }
            if crate::external::needs_reward_fn(workflow) && taskset.default_reward_fn_type.is_none() {
                return Err(self.refuse(
                    &format!("{key}.default_reward_fn_type"),
                    format!(
                        "taskset `{}`: `{workflow}` rewards each answer with the taskset's reward function and has \
                         no default (as in Trinity-RFT 0.6.0); name one, a built-in or a WASM reward plugin",
                        taskset.name
                    ),
                ));
            }
            if crate::external::needs_openai_history(workflow) && !(rollout.enable_openai_api && rollout.enable_history)
            {
                return Err(self.refuse(
                    &format!("{key}.default_workflow_type"),
                    format!(
                        "taskset `{}`: `{workflow}` trains on the replies its agent receives over the OpenAI API; \
                         set `explorer.rollout_model.enable_openai_api: true` and `enable_history: true`",
                        taskset.name
                    ),
                ));
            }
            if taskset.storage_type == StorageType::Sql {
                return Err(self.refuse(
                    &format!("{key}.storage_type"),
                    format!(
                        "taskset `{}`: `sql` tasksets are not read yet; export the rows to a JSONL file and use `file`",
                        taskset.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Modes `explore`, `serve` and `train` run explorer and trainer as separate processes (possibly on separate machines)
    /// that hand experiences over through the experience buffer, so it must be a database both can open: an
    /// in-memory queue lives in one process, and a `.jsonl` copy is written, never read.
    fn check_shared_buffer(&self) -> Result<(), ConfigError> {
        let config = self.config;
        if !matches!(config.mode, Mode::Explore | Mode::Train | Mode::Serve) {
            return Ok(());
        }
        let Some(buffer) = &config.buffer.trainer_input.experience_buffer else {
            return Ok(());
        };
        // SFT and DPO read a dataset (resolution requires a file); only explored experiences are shared.
        if buffer.schema_type.as_deref() != Some(ExperienceSchema::Experience.name()) {
            return Ok(());
        }
        let key = "buffer.trainer_input.experience_buffer";
        let other = match config.mode {
            Mode::Train => "the `mode: explore` explorers",
            _ => "a `mode: train` trainer",
        };
        let fix = "set `path: sqlite:///<file>.db` (processes on one machine) or \
                   `postgresql://user:password@host:port/database` (several machines), the same in the explorers' and \
                   the trainer's configs";
        if buffer.storage_type == StorageType::File {
            return Err(self.refuse(
                &format!("{key}.storage_type"),
                format!(
                    "mode `{}` hands experiences to {other} through this buffer, and a `file` buffer holds SFT / DPO \
                     rows; use storage_type `queue` (or `sql`) and {fix}",
                    config.mode.name()
                ),
            ));
        }
        let path = buffer.path.as_deref().unwrap_or_default();
        if is_database_url(path) {
            return Ok(());
        }
        let what = if path.is_empty() {
            "without a `path` the queue lives in this process's memory".to_owned()
        } else {
            format!("`{path}` is a copy this process writes, not a store another process reads")
        };
        Err(self.refuse(
            &format!("{key}.path"),
            format!(
                "mode `{}` hands experiences to {other} in another process through this buffer, and {what}; {fix}",
                config.mode.name()
            ),
        ))
    }

    /// In modes `both` and `colocate` explorer and trainer take turns in one process, and the explorer runs up to
    /// `sync_offset` steps ahead of the train step that publishes the weights it needs (`schedule.rs` in
    /// trinity-rft, `SyncSchedule::steps_buffered`), so the experience buffer must hold `sync_offset + 1` steps'
    /// experiences: otherwise storing the last one waits for room that only the trainer, on the same thread,
    /// could make, and the step fails after `synchronizer.sync_timeout`. An in-memory queue admits a step when it
    /// fits under `capacity` (or the queue is empty); a database admits it while fewer than `capacity` rows wait.
    fn check_back_pressure(&self) -> Result<(), ConfigError> {
        let config = self.config;
        if !matches!(config.mode, Mode::Both | Mode::Colocate) {
            return Ok(());
        }
        let Some(buffer) = &config.buffer.trainer_input.experience_buffer else {
            return Ok(());
        };
        if buffer.schema_type.as_deref() != Some(ExperienceSchema::Experience.name()) {
            return Ok(());
        }
        // Fixed-size batches train as soon as one is there; check_train_batch_size checks their capacity.
        if fixed_size_train_batch(config).is_some() {
            return Ok(());
        }
        let offset = u64::from(config.synchronizer.sync_offset);
        let buffered = config.synchronizer.steps_buffered(config.explorer.max_inflight_batches);
        if buffered < 2 {
            return Ok(());
        }
        let per_step = u64::from(config.buffer.batch_size) * u64::from(config.algorithm.resolved.repeat_times);
        let capacity = u64::from(buffer.capacity);
        let persistent = is_database_url(buffer.path.as_deref().unwrap_or_default());
        // The smallest capacity that admits the last of `buffered` steps.
        let needed = if persistent { (buffered - 1) * per_step + 1 } else { buffered * per_step };
        if capacity >= needed {
            return Ok(());
        }
        Err(self.refuse(
            "buffer.trainer_input.experience_buffer.capacity",
            format!(
                "{capacity} experiences, but in mode `{}` the buffer holds {buffered} explore steps at once \
                 (synchronizer.sync_offset {offset} steps run ahead, plus the one being stored{}) of {per_step} \
                 experiences each (batch_size {} × repeat_times {}), and the trainer that would make room runs in \
                 the same process: the step would fail after synchronizer.sync_timeout; set capacity to at least \
                 {needed}, or lower sync_offset",
                config.mode.name(),
                match buffered.saturating_sub(offset + 1) {
                    _ if config.synchronizer.sync_style == SyncStyle::FullyAsync => format!(
                        "; with sync_style `fully_async`, explorer.max_inflight_batches {} in flight instead",
                        config.explorer.max_inflight_batches
                    ),
                    0 => String::new(),
                    waits => format!(
                        ", plus {waits} a sync point waits for with explorer_sync_interval {} and \
                         trainer_sync_interval {}",
                        config.synchronizer.explorer_interval(),
                        config.synchronizer.trainer_interval()
                    ),
                },
                config.buffer.batch_size,
                config.algorithm.resolved.repeat_times,
            ),
        ))
    }

    /// In modes `both` and `colocate` train step `s` trains explore step `s`'s experiences (plus the expert rows of
    /// sample strategy `mix`) when `buffer.train_batch_size` is what that makes. Any other size reads fixed-size
    /// batches in arrival order, as Trinity-RFT's trainer reads its queue ([`fixed_size_train_batch`]); that
    /// schedule takes the trainer's newest weights at each of the explorer's sync points, so it needs one sync
    /// interval for both sides and no `fully_async`. Modes `explore` and `train` are free of this rule: their
    /// trainer reads batches of `train_batch_size` whatever the explore steps made.
    fn check_train_batch_size(&self) -> Result<(), ConfigError> {
        let config = self.config;
        let Some(per_batch) = fixed_size_train_batch(config) else {
            return Ok(());
        };
        let buffer = &config.buffer;
        let explored = u64::from(buffer.batch_size) * u64::from(config.algorithm.resolved.repeat_times);
        let why = format!(
            "train_batch_size {} differs from one explore step's experiences (batch_size {} × repeat_times {} = \
             {explored}), so in mode `{}` each train step reads {per_batch} of them in arrival order, as Trinity-RFT's \
             trainer reads its queue",
            buffer.train_batch_size,
            buffer.batch_size,
            config.algorithm.resolved.repeat_times,
            config.mode.name()
        );
        let synchronizer = &config.synchronizer;
        if synchronizer.sync_style == SyncStyle::FullyAsync {
            return Err(self.refuse(
                "synchronizer.sync_style",
                format!(
                    "{why}; in one process that schedule syncs at the explorer's sync points, which `fully_async` \
                     does not have: use another sync_style, or set train_batch_size to {explored}"
                ),
            ));
        }
        if synchronizer.explorer_interval() != synchronizer.trainer_interval() {
            return Err(self.refuse(
                "synchronizer.trainer_sync_interval",
                format!(
                    "{why}; then the explorer takes the trainer's newest weights at each of its sync points, so \
                     explorer_sync_interval {} and trainer_sync_interval {} must be one `sync_interval`, or set \
                     train_batch_size to {explored}",
                    synchronizer.explorer_interval(),
                    synchronizer.trainer_interval()
                ),
            ));
        }
        // A train step runs as soon as a batch is there, so at most `per_batch − 1` experiences wait when a step is
        // stored. An in-memory queue admits a step when it fits under `capacity` (or is empty).
        let Some(experience) = &buffer.trainer_input.experience_buffer else {
            return Ok(());
        };
        let needed = per_batch - 1 + explored;
        let persistent = is_database_url(experience.path.as_deref().unwrap_or_default());
        let needed = if persistent { per_batch } else { needed };
        if u64::from(experience.capacity) < needed {
            return Err(self.refuse(
                "buffer.trainer_input.experience_buffer.capacity",
                format!(
                    "{} experiences, but {why}: up to {} wait while the next explore step's {explored} are stored, \
                     and the trainer that would make room runs in the same process; set capacity to at least {needed}",
                    experience.capacity,
                    per_batch - 1
                ),
            ));
        }
        Ok(())
    }
}

/// In modes `both` and `colocate`, the experiences each train step reads from the buffer in arrival order when
/// `buffer.train_batch_size` is not one explore step's output (`batch_size × repeat_times`, plus the expert rows of
/// sample strategy `mix`): Trinity-RFT's trainer reads `train_batch_size` experiences from its queue whatever
/// explore step they came from, leaving the rest for the next step (`QueueStorage.get_batch`). `None` when a train
/// step trains one explore step, or in the other modes.
pub fn fixed_size_train_batch(config: &Config) -> Option<u64> {
    if !matches!(config.mode, Mode::Both | Mode::Colocate) {
        return None;
    }
    let schema = config.buffer.trainer_input.experience_buffer.as_ref().and_then(|b| b.schema_type.as_deref());
    if schema.is_some_and(|s| s != ExperienceSchema::Experience.name()) {
        return None;
    }
    let buffer = &config.buffer;
    let explored = u64::from(buffer.batch_size) * u64::from(config.algorithm.resolved.repeat_times);
    let expert = config.algorithm.resolved.sample_strategy.expert_rows(buffer.train_batch_size).map_or(0, |(e, _)| e);
    let usual = u64::from(buffer.train_batch_size).saturating_sub(expert).max(1);
    (usual != explored).then_some(usual)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::catalog::AnyName;
    use crate::error::ConfigError;
    use crate::{LoadOptions, Loaded, load_str};

    fn load(extra: &str) -> Loaded {
        load_with(extra, "")
    }

    /// A mode-both config with two tasks of four rollouts per step; `algorithm` and `buffer` get extra lines.
    fn load_with(algorithm: &str, buffer: &str) -> Loaded {
        let text = format!(
            "algorithm:\n  repeat_times: 4\n{algorithm}model:\n  model_path: /m\n  max_model_len: 64\nbuffer:\n  \
             batch_size: 2\n{buffer}  explorer_input:\n    taskset:\n      path: /t.jsonl\n"
        );
        let env = |_: &str| None;
        let options = LoadOptions { overrides: &[], env: &env, catalog: &AnyName, cwd: Path::new("/work") };
        load_str(&text, Path::new("c.yaml"), options).unwrap_or_else(|e| panic!("{e}"))
    }

    fn with_train_batch(loaded: Loaded, size: u32) -> Loaded {
        let mut loaded = loaded;
        loaded.config.buffer.train_batch_size = size;
        loaded
    }

    #[test]
    fn reasoning_parsers_are_the_ones_the_api_has() {
        let parser = |name: &str| {
            let mut loaded = load("");
            loaded.config.explorer.rollout_model.reasoning_parser = Some(name.to_owned());
            loaded.check_runnable()
        };
        assert!(parser("deepseek_r1").is_ok() && parser("qwen3").is_ok());
        let error = parser("granite").unwrap_err();
        assert!(
            matches!(&error, ConfigError::NotRunnable { key, message, .. }
                if key == "explorer.rollout_model.reasoning_parser" && message.contains("`granite`")),
            "{error}"
        );
    }

    #[test]
    fn a_train_batch_of_another_size_reads_fixed_size_batches_with_one_sync_interval() {
        assert!(with_train_batch(load(""), 8).check_runnable().is_ok());
        assert_eq!(crate::fixed_size_train_batch(&with_train_batch(load(""), 8).config), None);
        // 10 is no explore step's output (2 tasks × 4 rollouts = 8): read 10 at a time in arrival order.
        let ten = with_train_batch(load(""), 10);
        assert_eq!(crate::fixed_size_train_batch(&ten.config), Some(10));
        assert!(ten.check_runnable().is_ok());
        let refused = |loaded: Loaded, key: &str, words: &[&str]| {
            let error = loaded.check_runnable().unwrap_err();
            assert!(
                matches!(&error, ConfigError::NotRunnable { key: k, message, .. }
                    if k == key && words.iter().all(|w| message.contains(w))),
                "{error}"
            );
        };
        let mut split = with_train_batch(load(""), 10);
        split.config.synchronizer.trainer_sync_interval = Some(2);
        refused(
            split,
            "synchronizer.trainer_sync_interval",
            &["batch_size 2 × repeat_times 4 = 8", "one `sync_interval`"],
        );
        let mut fully_async = with_train_batch(load(""), 10);
        fully_async.config.synchronizer.sync_style = crate::synchronizer::SyncStyle::FullyAsync;
        refused(fully_async, "synchronizer.sync_style", &["fully_async", "set train_batch_size to 8"]);
        // Up to 9 wait while the next step's 8 are stored in memory: 17 at least.
        let capacity = |c: u32| {
            let buffer = format!("  trainer_input:\n    experience_buffer:\n      capacity: {c}\n");
            with_train_batch(load_with("", &buffer), 10)
        };
        assert!(capacity(17).check_runnable().is_ok());
        refused(capacity(16), "buffer.trainer_input.experience_buffer.capacity", &["at least 17"]);
    }

    #[test]
    fn a_buffer_too_small_for_the_steps_run_ahead_is_refused() {
        // Two tasks × four rollouts a step; offset 1 keeps two steps in the buffer at once.
        let offset = |capacity: u32, path: &str, interval: u32| {
            let buffer = format!("  trainer_input:\n    experience_buffer:\n      capacity: {capacity}\n{path}");
            let mut loaded = load_with("", &buffer);
            loaded.config.synchronizer.sync_offset = 1;
            loaded.config.synchronizer.sync_interval = interval;
            loaded.check_runnable()
        };
        assert!(offset(16, "", 1).is_ok());
        let error = offset(15, "", 1).unwrap_err();
        assert!(
            matches!(&error, ConfigError::NotRunnable { key, message, .. }
                if key == "buffer.trainer_input.experience_buffer.capacity"
                    && message.contains("holds 2 explore steps") && message.contains("at least 16")),
            "{error}"
        );
        // A sparse sync plan does not grow the buffer: train steps that publish nothing run as their batch arrives.
        assert!(offset(16, "", 20).is_ok());
        // A database admits a step while fewer than `capacity` rows wait.
        let sqlite = "      path: sqlite:///b.db\n";
        assert!(offset(9, sqlite, 1).is_ok());
        assert!(offset(8, sqlite, 1).unwrap_err().to_string().contains("at least 9"));
        // Without an offset one step at a time is always admitted, whatever the interval.
        let mut loaded = load_with("", "  trainer_input:\n    experience_buffer:\n      capacity: 1\n");
        loaded.config.synchronizer.sync_offset = 0;
        loaded.config.synchronizer.sync_interval = 20;
        assert!(loaded.check_runnable().is_ok());
    }

    #[test]
    fn mix_adds_its_expert_rows_to_the_explore_step() {
        let mix = "  sample_strategy: mix\n  sample_strategy_args:\n    expert_data_ratio: 0.2\n";
        let sft = "  trainer_input:\n    auxiliary_buffers:\n      sft_dataset:\n        storage_type: file\n        \
                   path: /sft.jsonl\n";
        let load = |extra: &str| load_with(extra, sft);
        // ceil(0.2 · 10) = 2 expert rows beside the 8 rollouts.
        assert!(with_train_batch(load(mix), 10).check_runnable().is_ok());
        assert_eq!(crate::fixed_size_train_batch(&with_train_batch(load(mix), 10).config), None);
        // ceil(0.2 · 8) = 2 expert rows and 6 read in arrival order.
        assert_eq!(crate::fixed_size_train_batch(&with_train_batch(load(mix), 8).config), Some(6));
    }
}

#[cfg(test)]
mod mode_tests {
    use crate::testing::{assert_names, loaded, refusal};

    const MODEL: &str = "model:\n  model_path: /m\n  max_model_len: 64\n";

    /// An RL config in `mode` with four rollouts of two tasks per explore step; `buffer` goes under `buffer:` and
    /// `experience` under `buffer.trainer_input.experience_buffer:`.
    fn rl(mode: &str, buffer: &str, experience: &str) -> String {
        format!(
            "mode: {mode}\nalgorithm:\n  repeat_times: 4\n{MODEL}buffer:\n  batch_size: 2\n{buffer}  explorer_input:\n    \
             taskset:\n      path: /t.jsonl\n  trainer_input:\n    experience_buffer:\n      name: shared\n{experience}"
        )
    }

    const SQLITE: &str = "      path: sqlite:///shared.db\n";

    #[test]
    fn explore_train_and_bench_run() {
        loaded(&rl("explore", "", SQLITE)).check_runnable().unwrap();
        loaded(&rl("train", "  train_batch_size: 8\n", SQLITE)).check_runnable().unwrap();
        let bench = format!(
            "mode: bench\n{MODEL}buffer:\n  explorer_input:\n    eval_tasksets:\n      - name: test\n        path: /e.jsonl\n"
        );
        loaded(&bench).check_runnable().unwrap();
    }

    #[test]
    fn serve_runs_with_a_buffer_a_trainer_can_read() {
        let serve = |experience: &str| {
            format!(
                "mode: serve\n{MODEL}buffer:\n  trainer_input:\n    experience_buffer:\n      name: shared\n{experience}"
            )
        };
        loaded(&serve(SQLITE)).check_runnable().unwrap();
        let in_memory = refusal(&serve(""));
        assert_names(
            &in_memory,
            "buffer.trainer_input.experience_buffer.path",
            &["mode `serve`", "a `mode: train` trainer"],
        );
    }

    #[test]
    fn explore_and_train_share_experiences_through_a_database() {
        for mode in ["explore", "train"] {
            let batch = "  train_batch_size: 8\n";
            let in_memory = refusal(&rl(mode, batch, ""));
            assert_names(
                &in_memory,
                "buffer.trainer_input.experience_buffer.path",
                &["in this process's memory", "sqlite:///", "postgresql://"],
            );
            let jsonl = refusal(&rl(mode, batch, "      path: experiences.jsonl\n"));
            assert_names(&jsonl, "buffer.trainer_input.experience_buffer.path", &["`experiences.jsonl` is a copy"]);
            let file = refusal(&rl(mode, batch, "      storage_type: file\n      path: /x.jsonl\n"));
            assert_names(&file, "buffer.trainer_input.experience_buffer.storage_type", &["SFT / DPO rows"]);
            for url in [
                "sqlite:///shared.db",
                "postgresql://u:p@db:5432/trinity",
                "postgres://u@db/trinity",
                "postgresql+psycopg2://u:p@db/trinity",
            ] {
                for storage in ["queue", "sql"] {
                    let text = rl(mode, batch, &format!("      storage_type: {storage}\n      path: {url}\n"));
                    let loaded = loaded(&text);
                    loaded.check_runnable().unwrap_or_else(|e| panic!("{mode} {storage} {url}: {e}"));
                    let path = loaded.config.buffer.trainer_input.experience_buffer.as_ref().unwrap().path.clone();
                    assert_eq!(path.as_deref(), Some(url), "the URL is kept");
                }
            }
        }
    }

    #[test]
    fn separate_trainers_read_batches_of_any_size() {
        // 7 is no explore step's output (2 tasks × 4 rollouts = 8): read 7 at a time in mode both too.
        loaded(&rl("both", "  train_batch_size: 7\n", SQLITE)).check_runnable().unwrap();
        loaded(&rl("explore", "  train_batch_size: 7\n", SQLITE)).check_runnable().unwrap();
        loaded(&rl("train", "  train_batch_size: 7\n", SQLITE)).check_runnable().unwrap();
    }

    #[test]
    fn sft_and_dpo_train_from_their_dataset_file() {
        for algorithm in ["sft", "dpo"] {
            let text = format!(
                "mode: train\nalgorithm:\n  algorithm_type: {algorithm}\n{MODEL}buffer:\n  train_batch_size: 4\n  \
                 trainer_input:\n    experience_buffer:\n      storage_type: file\n      path: /rows.jsonl\n      \
                 format:\n        chosen_key: better\n        rejected_key: worse\n"
            );
            let loaded = loaded(&text);
            loaded.check_runnable().unwrap();
            let buffer = loaded.config.buffer.trainer_input.experience_buffer.as_ref().unwrap();
            assert_eq!(buffer.schema_type.as_deref(), Some(algorithm));
            assert_eq!(buffer.format.chosen_key, "better");
            assert!(!loaded.notes.iter().any(|n| n.contains("chosen_key")), "honoured, no note: {:?}", loaded.notes);
        }
    }

    #[test]
    fn stages_are_checked_one_by_one_naming_the_stage() {
        // The second stage explores in its own process but keeps the top-level in-memory queue.
        let text = format!(
            "algorithm:\n  repeat_times: 4\n{MODEL}buffer:\n  batch_size: 2\n  explorer_input:\n    taskset:\n      \
             path: /t.jsonl\nstages:\n  - stage_name: warmup\n  - stage_name: apart\n    mode: explore\n"
        );
        let error = refusal(&text);
        assert_names(
            &error,
            "stages[1].buffer.trainer_input.experience_buffer.path",
            &["stage `apart` does not set `buffer`, so it uses the top-level one"],
        );
        assert!(error.to_string().starts_with("c.yaml:"), "points into the file: {error}");
    }
}
