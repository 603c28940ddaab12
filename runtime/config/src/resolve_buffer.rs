//! Resolution of `buffer:` (Trinity-RFT's `BufferConfigValidator` and the SFT / DPO `check_config`): one list of
//! training tasksets with complete rollout arguments, eval tasksets, the experience buffer or SFT / DPO dataset,
//! and the auxiliary buffers, each checked for what the mode reads.

use crate::algorithm::SampleStrategy;
use crate::buffer::{ExperienceBufferConfig, StorageType, TasksetConfig, is_database_url};
use crate::catalog::{ComponentKind, ExperienceSchema};
use crate::config::{Config, Mode};
use crate::error::ConfigError;
use crate::resolve::Resolver;

impl Resolver<'_> {
    pub(crate) fn resolve_buffer(&mut self, config: &mut Config, schema: ExperienceSchema) -> Result<(), ConfigError> {
        let repeat_times = config.algorithm.resolved.repeat_times;
        let buffer = &mut config.buffer;
        self.require(buffer.batch_size >= 1, "buffer.batch_size", "must be at least 1")?;
        self.check(buffer.total_epochs >= 1, "buffer.total_epochs", "must be at least 1");
        if let Some(steps) = buffer.total_steps {
            self.check(steps >= 1, "buffer.total_steps", "must be at least 1");
        }
        if buffer.train_batch_size == 0 {
            // Trinity-RFT raises here instead of deriving: a trainer that reads a buffer other processes fill, or a
            // dataset, has no explore step to take its batch from.
            let why = if schema != ExperienceSchema::Experience {
                Some(format!("algorithm `{}` trains on a dataset", config.algorithm.algorithm_type))
            } else if config.mode == Mode::Train {
                Some(
                    "mode `train` reads batches from the buffer the explorers fill, with no explore step to size them"
                        .to_owned(),
                )
            } else {
                None
            };
            if let Some(why) = why {
                return Err(self.invalid(
                    "buffer.train_batch_size",
                    format!(
                        "{why}; set train_batch_size (experiences per train step) explicitly, as Trinity-RFT requires"
                    ),
                ));
            }
            // Both factors come from the user's file: a product past u32 is refused by the keys that make it,
            // instead of wrapping to a value that fails later under a key the user never set.
            match buffer.batch_size.checked_mul(repeat_times) {
                Some(product) => buffer.train_batch_size = product,
                None => {
                    return Err(self.invalid(
                        "buffer.batch_size",
                        format!(
                            "batch_size {} × algorithm.repeat_times {repeat_times} (the derived train_batch_size) \
                             exceeds {}",
                            buffer.batch_size,
                            u32::MAX
                        ),
                    ));
                }
            }
        }
        self.resolve_explorer_input(config, schema, repeat_times)?;
        // Trinity-RFT skips the trainer's inputs in mode bench: nothing trains.
        if config.mode != Mode::Bench {
            self.resolve_trainer_input(config, schema);
        }
        Ok(())
    }

    /// The training and eval tasksets. Mode `train` reads the training tasksets only to count its steps
    /// ([`crate::steps`]) and explores nothing, so their component names are not checked there (Trinity-RFT skips
    /// the explorer's inputs in that mode).
    fn resolve_explorer_input(
        &mut self,
        config: &mut Config,
        schema: ExperienceSchema,
        repeat_times: u32,
    ) -> Result<(), ConfigError> {
        let input = &mut config.buffer.explorer_input;
        if input.taskset.is_some() && !input.tasksets.is_empty() {
            return Err(self.invalid("buffer.explorer_input.tasksets", "set either `taskset` or `tasksets`, not both"));
        }
        let from_single = input.taskset.is_some();
        if let Some(taskset) = input.taskset.take() {
            input.tasksets.push(taskset);
        }
        let needs_tasks = matches!(config.mode, Mode::Both | Mode::Explore | Mode::Colocate)
            && schema == ExperienceSchema::Experience;
        self.check(
            !(needs_tasks && input.tasksets.is_empty()),
            "buffer.explorer_input.taskset",
            format!(
                "mode `{}` explores tasks and none are configured; add buffer.explorer_input.taskset (or tasksets)",
                config.mode.name()
            ),
        );
        self.check(
            !(config.mode == Mode::Bench && input.eval_tasksets.is_empty()),
            "buffer.explorer_input.eval_tasksets",
            "mode `bench` evaluates the model (the base model and every checkpoint, or model.external_model) on the \
             eval tasksets, and none are configured; add at least one under buffer.explorer_input.eval_tasksets",
        );
        let train_steps_only = config.mode == Mode::Train && schema == ExperienceSchema::Experience;
        if train_steps_only && !input.tasksets.is_empty() {
            let use_ = match (config.trainer.total_steps, config.buffer.total_steps) {
                (Some(_), _) => "not read: trainer.total_steps decides the train steps".to_owned(),
                (None, Some(_)) => "not read: buffer.total_steps decides the train steps".to_owned(),
                (None, None) => "read only to count the train steps (rows × total_epochs × repeat_times / \
                                 train_batch_size)"
                    .to_owned(),
            };
            let key = if from_single { "buffer.explorer_input.taskset" } else { "buffer.explorer_input.tasksets" };
            self.notes
                .push(format!("{key} in mode `train`: {use_}; workflows and rollout settings are the explorer's"));
        }

        let defaults = TasksetDefaults {
            workflow: input.default_workflow_type.clone(),
            eval_workflow: input.default_eval_workflow_type.clone().or_else(|| input.default_workflow_type.clone()),
            reward: input.default_reward_fn_type.clone(),
            system_prompt: input.system_prompt.clone(),
            reply_prefix: input.reply_prefix.clone(),
            check_training_components: config.mode != Mode::Train,
        };
        let mut tasksets = std::mem::take(&mut input.tasksets);
        for (i, taskset) in tasksets.iter_mut().enumerate() {
            let key = if from_single {
                "buffer.explorer_input.taskset".to_owned()
            } else {
                format!("buffer.explorer_input.tasksets[{i}]")
            };
            self.resolve_taskset(taskset, &key, format!("taskset_{i}"), Some(repeat_times), &defaults, config);
        }
        let mut eval_tasksets = std::mem::take(&mut config.buffer.explorer_input.eval_tasksets);
        for (i, taskset) in eval_tasksets.iter_mut().enumerate() {
            let key = format!("buffer.explorer_input.eval_tasksets[{i}]");
            self.resolve_taskset(taskset, &key, format!("eval_taskset_{i}"), None, &defaults, config);
        }
        // Names label metrics (`eval/<name>/...`) and selector state, so they must be unique within each list;
        // a training and an eval taskset may share one, as in Trinity-RFT's own configs.
        for (list, key) in
            [(&tasksets, "buffer.explorer_input.tasksets"), (&eval_tasksets, "buffer.explorer_input.eval_tasksets")]
        {
            let mut names: Vec<&str> = list.iter().map(|t| t.name.as_str()).collect();
            names.sort_unstable();
            if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
                let error = self.invalid(key, format!("two tasksets are named `{}`; names must be unique", pair[0]));
                self.record(Err(error));
            }
        }
        config.buffer.explorer_input.tasksets = tasksets;
        config.buffer.explorer_input.eval_tasksets = eval_tasksets;
        Ok(())
    }

    /// The experience buffer (or the SFT / DPO dataset) and the auxiliary buffers.
    fn resolve_trainer_input(&mut self, config: &mut Config, schema: ExperienceSchema) {
        let key = "buffer.trainer_input.experience_buffer";
        let mut experience = config.buffer.trainer_input.experience_buffer.take().unwrap_or_default();
        // A dataset without a path gets no further rules: the file buffer's own would only say the same again.
        let mut has_path = true;
        if schema != ExperienceSchema::Experience {
            // Trinity-RFT's SFT / DPO `check_config` requires the path; rows come from a file, never a queue.
            let algorithm = &config.algorithm.algorithm_type;
            has_path = self.check(
                experience.path.as_deref().is_some_and(|p| !p.trim().is_empty()),
                &format!("{key}.path"),
                format!(
                    "algorithm `{algorithm}` trains on a dataset; set the path of its rows (a JSONL, JSON or Parquet \
                     file, or a dataset directory) with storage_type: file"
                ),
            );
            self.check(
                experience.storage_type == StorageType::File,
                &format!("{key}.storage_type"),
                format!(
                    "algorithm `{algorithm}` reads its dataset from a file, and a `{}` buffer holds explored \
                     experiences; set storage_type: file",
                    storage_name(experience.storage_type)
                ),
            );
        }
        if config.mode == Mode::Train {
            // Trinity-RFT copies it in mode train: the trainer's passes over its input are buffer.total_epochs.
            let epochs = config.buffer.total_epochs;
            if experience.total_epochs.is_some_and(|e| e != epochs) {
                self.notes.push(format!(
                    "{key}.total_epochs is replaced by buffer.total_epochs ({epochs}) in mode `train` (as Trinity-RFT does)"
                ));
            }
            experience.total_epochs = Some(epochs);
        }
        experience.schema_type = Some(schema.name().to_owned());
        if schema == ExperienceSchema::Cpt {
            self.check_cpt_format(&experience.format, key);
        }
        if has_path {
            self.resolve_experience_buffer(&mut experience, key, config.mode, schema);
        }
        config.buffer.trainer_input.experience_buffer = Some(experience);
        let mut auxiliary = std::mem::take(&mut config.buffer.trainer_input.auxiliary_buffers);
        for (name, buffer) in auxiliary.iter_mut() {
            let key = format!("buffer.trainer_input.auxiliary_buffers.{name}");
            if buffer.name == ExperienceBufferConfig::default().name {
                buffer.name = name.clone();
            }
            buffer.schema_type = Some(ExperienceSchema::Sft.name().to_owned());
            if self.check(buffer.path.is_some(), &key, "an auxiliary buffer needs a `path`") {
                self.resolve_experience_buffer(buffer, &key, config.mode, ExperienceSchema::Sft);
            }
        }
        config.buffer.trainer_input.auxiliary_buffers = auxiliary;
        // Sample strategy `mix` trains expert rows from a named auxiliary buffer; a missing one would only fail
        // once the run has loaded its models.
        if let SampleStrategy::Mix { sft_dataset_name: name, .. } = &config.algorithm.resolved.sample_strategy {
            self.check(
                config.buffer.trainer_input.auxiliary_buffers.contains_key(name),
                "buffer.trainer_input.auxiliary_buffers",
                format!("sample strategy `mix` reads expert rows from auxiliary buffer `{name}` (sample_strategy_args.sft_dataset_name), which is not configured"),
            );
        }
    }

    /// Trinity-RFT 0.6.0's CPT formatter reads one plain-text field (`prompt_key`) and refuses any other
    /// `prompt_type`. The SFT / DPO layout keys would shape nothing here, so one set to a non-default value is
    /// refused rather than ignored: a config that names a response or a chat template expects it to be trained.
    fn check_cpt_format(&mut self, format: &crate::buffer::FormatConfig, key: &str) {
        self.check(
            format.prompt_type == crate::buffer::PromptType::Plaintext,
            &format!("{key}.format.prompt_type"),
            "algorithm `cpt` trains on plain text (Trinity-RFT's CPT formatter reads no other layout); set \
             prompt_type: plaintext and prompt_key to the field holding the text",
        );
        let plain = crate::buffer::FormatConfig::default();
        for (field, set) in [
            ("response_key", format.response_key != plain.response_key),
            ("system_prompt_key", format.system_prompt_key.is_some()),
            ("system_prompt", format.system_prompt.is_some()),
            ("messages_key", format.messages_key != plain.messages_key),
            ("tools_key", format.tools_key != plain.tools_key),
            ("chosen_key", format.chosen_key != plain.chosen_key),
            ("rejected_key", format.rejected_key != plain.rejected_key),
            ("enable_concatenated_multi_turn", format.enable_concatenated_multi_turn),
            ("chat_template", format.chat_template.is_some()),
            ("enable_thinking", format.enable_thinking.is_some()),
        ] {
            self.check(
                !set,
                &format!("{key}.format.{field}"),
                format!(
                    "algorithm `cpt` trains on the text of prompt_key (`{}`) as it is, with no chat template, so \
                     it does not read {field}; remove it (or use algorithm `sft` for prompt/response rows)",
                    format.prompt_key
                ),
            );
        }
    }

    fn resolve_taskset(
        &mut self,
        taskset: &mut TasksetConfig,
        key: &str,
        default_name: String,
        train_repeat_times: Option<u32>,
        defaults: &TasksetDefaults,
        config: &Config,
    ) {
        if taskset.name.is_empty() {
            taskset.name = default_name;
        }
        self.check(!taskset.path.trim().is_empty(), &format!("{key}.path"), "a taskset needs a `path`");
        // These format keys describe SFT and DPO rows; the explorer's workflows read prompts with prompt_key and
        // friends, so on a taskset they would be silently ignored.
        let format = &taskset.format;
        let plain = crate::buffer::FormatConfig::default();
        for (field, set) in [
            ("prompt_type", format.prompt_type != plain.prompt_type),
            ("messages_key", format.messages_key != plain.messages_key),
            ("tools_key", format.tools_key != plain.tools_key),
            ("chosen_key", format.chosen_key != plain.chosen_key),
            ("rejected_key", format.rejected_key != plain.rejected_key),
        ] {
            self.check(
                !set,
                &format!("{key}.format.{field}"),
                "it describes SFT / DPO rows (buffer.trainer_input), and the explorer's workflows do not read it; \
                 remove it from the taskset (workflows read prompt_key, response_key and system_prompt_key)",
            );
        }
        self.one_of(&format!("{key}.storage_type"), storage_name(taskset.storage_type), &["file", "sql"]);
        if taskset.storage_type == StorageType::Sql {
            self.check(
                taskset.path.starts_with("sqlite:///"),
                &format!("{key}.path"),
                "an sql taskset path is a `sqlite:///` URL",
            );
        }
        let (old, new) = (taskset.task_selector.take(), taskset.data_selector.take());
        self.check(
            old.is_none() || new.is_none(),
            &format!("{key}.data_selector"),
            "set `data_selector` or its old name `task_selector`, not both",
        );
        taskset.data_selector = Some(new.or(old).unwrap_or_default());
        if let Some(selector) = &taskset.data_selector {
            self.one_of(
                &format!("{key}.data_selector.selector_type"),
                &selector.selector_type,
                &["sequential", "shuffle", "random", "difficulty_based", "offline_easy2hard"],
            );
        }
        let is_eval = train_repeat_times.is_none();
        let workflow = if is_eval { &defaults.eval_workflow } else { &defaults.workflow };
        if taskset.default_workflow_type.is_none() {
            taskset.default_workflow_type = workflow.clone();
        }
        if taskset.default_reward_fn_type.is_none() {
            taskset.default_reward_fn_type = defaults.reward.clone();
        }
        let check_components = defaults.check_training_components || is_eval;
        if let Some(name) = taskset.default_workflow_type.as_ref().filter(|_| check_components) {
            let known = self.registered(&format!("{key}.default_workflow_type"), ComponentKind::Workflow, name);
            self.record(known);
        }
        if let Some(name) = taskset.default_reward_fn_type.as_ref().filter(|_| check_components) {
            let known = self.registered(&format!("{key}.default_reward_fn_type"), ComponentKind::RewardFn, name);
            self.record(known);
        }
        if taskset.format.system_prompt.is_none() {
            taskset.format.system_prompt = defaults.system_prompt.clone();
        }
        if taskset.format.reply_prefix.is_none() {
            taskset.format.reply_prefix = defaults.reply_prefix.clone();
        }

        let repeat_times = match train_repeat_times {
            Some(n) => {
                if taskset.repeat_times.is_some_and(|r| r != n) {
                    self.notes.push(format!(
                        "{key}.repeat_times is replaced by algorithm.repeat_times ({n}) for training tasksets"
                    ));
                }
                n
            }
            None => taskset.repeat_times.unwrap_or(1),
        };
        self.check(repeat_times >= 1, &format!("{key}.repeat_times"), "must be at least 1");
        taskset.repeat_times = Some(repeat_times);
        let model = &config.model;
        // What the taskset writes itself is checked here; what it inherits from `model` was checked there.
        let own = taskset.rollout_args.clone();
        let args = &mut taskset.rollout_args;
        if args.n.is_some_and(|n| n != repeat_times) {
            self.notes.push(format!("{key}.rollout_args.n is set from repeat_times ({repeat_times})"));
        }
        args.n = Some(repeat_times);
        args.temperature = Some(args.temperature.unwrap_or(model.temperature));
        args.top_p = Some(args.top_p.unwrap_or(model.top_p));
        args.top_k = Some(args.top_k.unwrap_or(model.top_k));
        args.min_p = Some(args.min_p.unwrap_or(0.0));
        args.logprobs = Some(args.logprobs.unwrap_or(model.logprobs));
        let max_response = model.resolved.max_response_tokens;
        args.max_tokens = Some(args.max_tokens.unwrap_or(max_response));
        args.min_tokens = Some(args.min_tokens.unwrap_or(model.min_response_tokens));
        args.seed = Some(args.seed.unwrap_or(config.explorer.rollout_model.seed));
        let args = &taskset.rollout_args;
        let at = format!("{key}.rollout_args");
        self.check_sampling(
            &at,
            own.temperature.unwrap_or(1.0),
            own.top_p.unwrap_or(1.0),
            own.top_k.unwrap_or(-1),
            args.min_p,
        );
        // Trinity-RFT's vLLM path asks for the top-k but keeps only the sampled token's logprob in each experience
        // (the first entry of each position's dict), so for the workflows that only train on their experiences the
        // key changes nothing; trinity always returns that logprob and never the top-k.
        if let Some(k) = own.logprobs.filter(|&k| k > 0) {
            self.notes.push(format!(
                "{at}.logprobs {k}: experiences keep the sampled token's logprob only, as Trinity-RFT's keep it; \
                 the top-{k} alternatives are not computed"
            ));
        }
        let max_tokens = args.max_tokens.unwrap_or(1);
        self.check(max_tokens >= 1, &format!("{at}.max_tokens"), "must be at least 1");
        self.check(
            max_tokens <= max_response,
            &format!("{at}.max_tokens"),
            format!("{max_tokens} exceeds model.max_response_tokens ({max_response})"),
        );
        self.check(
            args.min_tokens.unwrap_or(0) <= max_tokens,
            &format!("{at}.min_tokens"),
            "must not exceed max_tokens",
        );
        self.check(args.stop.iter().all(|s| !s.is_empty()), &format!("{at}.stop"), "stop strings must not be empty");
    }

    fn resolve_experience_buffer(
        &mut self,
        buffer: &mut ExperienceBufferConfig,
        key: &str,
        mode: Mode,
        schema: ExperienceSchema,
    ) {
        self.check(buffer.capacity >= 1, &format!("{key}.capacity"), "must be at least 1");
        self.check(buffer.max_read_timeout > 0.0, &format!("{key}.max_read_timeout"), "must be positive");
        if buffer.storage_type == StorageType::File
            && matches!(mode, Mode::Both | Mode::Colocate)
            && schema == ExperienceSchema::Experience
        {
            // Trinity-RFT turns a file experience buffer into a queue in these modes; so does trinity.
            buffer.storage_type = StorageType::Queue;
            self.notes.push(format!("{key}.storage_type `file` is a queue in mode `{}`", mode.name()));
        }
        let path = buffer.path.clone().unwrap_or_default();
        let path = path.as_str();
        match buffer.storage_type {
            StorageType::Queue => {
                let kept =
                    path.is_empty() || is_database_url(path) || path.ends_with(".jsonl") || path.ends_with(".json");
                if !kept {
                    // In mode both the path of a queue only names a write-only copy; one trinity cannot write changes
                    // nothing that trains, so it is dropped with a note rather than refused. (Modes explore and train
                    // need a database here; `check_runnable` says so.)
                    self.notes.push(format!(
                        "{key}.path `{path}` is neither a database (`sqlite:///`, `postgresql://`) nor a `.jsonl` file, so no copy of the queue is kept"
                    ));
                    buffer.path = None;
                }
            }
            StorageType::Sql => {
                self.check(
                    is_database_url(path),
                    &format!("{key}.path"),
                    format!(
                        "an sql buffer path is a `sqlite:///file.db` or `postgresql://user:password@host/db` URL, got `{path}`"
                    ),
                );
            }
            StorageType::File => {
                self.check(!path.is_empty(), &format!("{key}.path"), "a file buffer needs a `path`");
            }
        }
    }
}

struct TasksetDefaults {
    workflow: Option<String>,
    eval_workflow: Option<String>,
    reward: Option<String>,
    system_prompt: Option<String>,
    reply_prefix: Option<String>,
    /// Whether the training tasksets' workflow and reward names are checked (not in mode `train`, which explores
    /// nothing); eval tasksets' always are.
    check_training_components: bool,
}

pub(crate) fn storage_name(storage: StorageType) -> &'static str {
    match storage {
        StorageType::File => "file",
        StorageType::Sql => "sql",
        StorageType::Queue => "queue",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, Value};

    use crate::catalog::{Catalog, ComponentKind, Preset};
    use crate::testing::{assert_names, load, loaded, refusal};

    const MODEL: &str = "model:\n  model_path: /m\n  max_model_len: 64\n";
    const TASKSET: &str = "  explorer_input:\n    taskset:\n      path: /t.jsonl\n";
    const SHARED: &str = "  trainer_input:\n    experience_buffer:\n      path: sqlite:///x.db\n";

    #[test]
    fn mode_train_needs_an_explicit_train_batch_size() {
        let text = |batch: &str| format!("mode: train\nalgorithm:\n  repeat_times: 4\n{MODEL}buffer:\n{batch}{SHARED}");
        let error = refusal(&text(""));
        assert_names(&error, "buffer.train_batch_size", &["mode `train`", "explicitly"]);
        assert_eq!(loaded(&text("  train_batch_size: 6\n")).config.buffer.train_batch_size, 6);
        // Mode both still derives it from one explore step.
        let both = loaded(&format!("algorithm:\n  repeat_times: 4\n{MODEL}buffer:\n  batch_size: 3\n{TASKSET}"));
        assert_eq!(both.config.buffer.train_batch_size, 12);
    }

    #[test]
    fn a_derived_train_batch_size_past_u32_is_refused_by_the_keys_that_make_it() {
        let text = format!("algorithm:\n  repeat_times: 2\n{MODEL}buffer:\n  batch_size: 2147483648\n{TASKSET}");
        let error = refusal(&text);
        assert_names(&error, "buffer.batch_size", &["2147483648", "repeat_times 2", "exceeds 4294967295"]);
        assert!(!error.to_string().contains("train_batch_size`"), "{error}");
    }

    #[test]
    fn sft_and_dpo_run_in_mode_train_from_a_dataset_file() {
        let dataset = "  train_batch_size: 4\n  trainer_input:\n    experience_buffer:\n      storage_type: file\n      \
                       path: /rows.jsonl\n";
        for algorithm in ["sft", "dpo"] {
            let text = |mode: &str, buffer: &str| {
                format!("mode: {mode}\nalgorithm:\n  algorithm_type: {algorithm}\n{MODEL}buffer:\n{buffer}")
            };
            for mode in ["both", "explore"] {
                assert_names(&refusal(&text(mode, dataset)), "mode", &["runs in mode `train` only"]);
            }
            let no_batch = refusal(&text("train", &dataset.replace("  train_batch_size: 4\n", "")));
            assert_names(&no_batch, "buffer.train_batch_size", &["trains on a dataset"]);
            let no_path = refusal(&text("train", "  train_batch_size: 4\n"));
            assert_names(&no_path, "buffer.trainer_input.experience_buffer.path", &["trains on a dataset"]);
            let queue = refusal(&text("train", &dataset.replace("storage_type: file", "storage_type: queue")));
            assert_names(&queue, "buffer.trainer_input.experience_buffer.storage_type", &["set storage_type: file"]);
            let ok = loaded(&text("train", dataset));
            let buffer = ok.config.buffer.trainer_input.experience_buffer.as_ref().unwrap();
            assert_eq!((buffer.total_epochs, buffer.schema_type.as_deref()), (Some(1), Some(algorithm)));
        }
    }

    #[test]
    fn cpt_trains_in_mode_train_on_one_plain_text_field() {
        let text = |mode: &str, format: &str| {
            format!(
                "mode: {mode}\nalgorithm:\n  algorithm_type: cpt\n{MODEL}buffer:\n  train_batch_size: 4\n  \
                 trainer_input:\n    experience_buffer:\n      storage_type: file\n      path: /corpus.jsonl\n      \
                 format:\n        prompt_type: plaintext\n        prompt_key: text\n{format}"
            )
        };
        let ok = loaded(&text("train", ""));
        ok.check_runnable().unwrap();
        let buffer = ok.config.buffer.trainer_input.experience_buffer.as_ref().unwrap();
        assert_eq!((buffer.schema_type.as_deref(), buffer.format.prompt_key.as_str()), (Some("cpt"), "text"));
        assert_names(&refusal(&text("both", "")), "mode", &["algorithm `cpt`", "runs in mode `train` only"]);
        // 0.6.0's formatter refuses the default `messages` layout.
        let messages = refusal(&text("train", "").replace("prompt_type: plaintext", "prompt_type: messages"));
        assert_names(&messages, "buffer.trainer_input.experience_buffer.format.prompt_type", &["plaintext"]);
        let unset = refusal(&text("train", "").replace("        prompt_type: plaintext\n", ""));
        assert_names(&unset, "buffer.trainer_input.experience_buffer.format.prompt_type", &["plain text"]);
        // Keys of the SFT / DPO layouts would change nothing: refused, naming the key and the field that trains.
        for (line, field) in [
            ("        response_key: answer\n", "response_key"),
            ("        system_prompt: be brief\n", "system_prompt"),
            ("        chat_template: \"{{ messages }}\"\n", "chat_template"),
        ] {
            let error = refusal(&text("train", line));
            let key = format!("buffer.trainer_input.experience_buffer.format.{field}");
            assert_names(&error, &key, &["prompt_key (`text`)", "does not read"]);
        }
        // SFT still reads them.
        let sft = text("train", "        response_key: answer\n").replace("algorithm_type: cpt", "algorithm_type: sft");
        loaded(&sft).check_runnable().unwrap();
    }

    #[test]
    fn bench_needs_eval_tasksets_but_no_training_taskset_and_continues_from_checkpoints() {
        let error = refusal(&format!("mode: bench\n{MODEL}{}", "buffer:\n  batch_size: 2\n"));
        assert_names(&error, "buffer.explorer_input.eval_tasksets", &["mode `bench`", "add at least one"]);
        let bench = loaded(&format!(
            "mode: bench\ncontinue_from_checkpoint: false\n{MODEL}buffer:\n  explorer_input:\n    eval_tasksets:\n      \
             - path: /e.jsonl\n"
        ));
        assert!(bench.config.continue_from_checkpoint);
        assert!(bench.notes.iter().any(|n| n.contains("continue_from_checkpoint is set to true")), "{:?}", bench.notes);
    }

    #[test]
    fn train_reads_its_tasksets_only_to_count_steps() {
        let without = loaded(&format!("mode: train\n{MODEL}buffer:\n  train_batch_size: 4\n{SHARED}"));
        assert!(without.config.buffer.explorer_input.tasksets.is_empty());
        let with = loaded(&format!("mode: train\n{MODEL}buffer:\n  train_batch_size: 4\n{TASKSET}{SHARED}"));
        assert_eq!(with.config.buffer.explorer_input.tasksets[0].repeat_times, Some(1));
        assert!(
            with.notes.iter().any(|n| n.contains("buffer.explorer_input.taskset in mode `train`: read only to count")),
            "{:?}",
            with.notes
        );
        let fixed = loaded(&format!(
            "mode: train\n{MODEL}buffer:\n  train_batch_size: 4\n{TASKSET}{SHARED}trainer:\n  total_steps: 5\n"
        ));
        assert!(fixed.notes.iter().any(|n| n.contains("not read: trainer.total_steps decides")), "{:?}", fixed.notes);
    }

    /// A catalog that knows one workflow, so names are checked.
    struct OneWorkflow;

    impl Catalog for OneWorkflow {
        fn names(&self, kind: ComponentKind) -> Vec<String> {
            match kind {
                ComponentKind::Workflow => vec!["math_workflow".to_owned()],
                _ => Vec::new(),
            }
        }
        fn preset(&self, _algorithm_type: &str) -> Option<Preset> {
            Some(Preset::default())
        }
        fn default_args(&self, _kind: ComponentKind, _name: &str) -> Option<Map<String, Value>> {
            None
        }
    }

    #[test]
    fn train_does_not_check_the_workflows_it_never_runs() {
        let text = |mode: &str| {
            format!(
                "mode: {mode}\n{MODEL}buffer:\n  train_batch_size: 4\n  explorer_input:\n    taskset:\n      path: /t.jsonl\n      \
                 default_workflow_type: alfworld_workflow\n{SHARED}"
            )
        };
        let env = |_: &str| None;
        let options =
            crate::LoadOptions { overrides: &[], env: &env, catalog: &OneWorkflow, cwd: std::path::Path::new("/work") };
        let path = std::path::Path::new("c.yaml");
        assert!(crate::load_str(&text("train"), path, options).is_ok());
        let error = crate::load_str(&text("explore"), path, options).unwrap_err();
        assert!(error.to_string().contains("alfworld_workflow"), "{error}");
    }

    #[test]
    fn postgres_urls_are_databases_for_queues_and_sql_buffers() {
        for storage in ["queue", "sql"] {
            let text = format!(
                "{MODEL}buffer:\n{TASKSET}  trainer_input:\n    experience_buffer:\n      storage_type: {storage}\n      \
                 path: postgresql://u:p@db/trinity\n"
            );
            let both = loaded(&text);
            let buffer = both.config.buffer.trainer_input.experience_buffer.as_ref().unwrap();
            assert_eq!(buffer.path.as_deref(), Some("postgresql://u:p@db/trinity"), "{storage}: kept");
            assert!(!both.notes.iter().any(|n| n.contains("no copy of the queue")), "{:?}", both.notes);
        }
        let mysql = format!(
            "{MODEL}buffer:\n{TASKSET}  trainer_input:\n    experience_buffer:\n      storage_type: sql\n      \
             path: mysql://u@db/x\n"
        );
        assert!(load(&mysql).unwrap_err().to_string().contains("`postgresql://"));
    }
}
