//! Resolution: derived values filled in, Trinity-RFT's cross-field rules checked.
//!
//! After this step every consumer reads plain values: component names and their full argument maps, one list
//! of training tasksets with complete rollout arguments, concrete length limits, an absolute checkpoint root.
//! Nothing downstream has to know a default. Rules follow Trinity-RFT's validators; where trinity differs it
//! says so in the doc comment of the rule.

use std::path::Path;

use serde_json::{Map, Value};

use crate::algorithm::LossAggMode;
use crate::buffer::{ExperienceBufferConfig, StorageType, TasksetConfig};
use crate::catalog::{Catalog, ComponentKind, ExperienceSchema};
use crate::config::{Config, Mode};
use crate::error::{ConfigError, closest};
use crate::source::Source;

/// A remark about the config that is not an error (a knob with no effect, a mapped value); logged at start.
pub type Note = String;

/// The fallback components used when neither the user nor the preset chooses one (Trinity-RFT's
/// `AlgorithmConfigValidator`).
const FALLBACK_COMPONENTS: [(ComponentKind, &str); 5] = [
    (ComponentKind::AdvantageFn, "ppo"),
    (ComponentKind::PolicyLossFn, "ppo"),
    (ComponentKind::KlFn, "none"),
    (ComponentKind::KlFn, "k2"),
    (ComponentKind::EntropyLossFn, "default"),
];

pub(crate) struct Resolver<'a> {
    pub(crate) source: &'a Source,
    pub(crate) catalog: &'a dyn Catalog,
    pub(crate) cwd: &'a Path,
    /// Key prefix of the section being resolved (`stages[1].` for a stage), for messages.
    pub(crate) prefix: String,
    pub(crate) notes: Vec<Note>,
}

impl Resolver<'_> {
    pub(crate) fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    pub(crate) fn invalid(&self, key: &str, message: impl Into<String>) -> ConfigError {
        let key = self.key(key);
        ConfigError::Invalid { origin: self.source.origin(&key), key, message: message.into() }
    }

    pub(crate) fn check(&self, ok: bool, key: &str, message: impl Into<String>) -> Result<(), ConfigError> {
        if ok { Ok(()) } else { Err(self.invalid(key, message)) }
    }

    pub(crate) fn one_of(&self, key: &str, value: &str, allowed: &[&str]) -> Result<(), ConfigError> {
        if allowed.contains(&value) {
            return Ok(());
        }
        let suggestion =
            closest(value, allowed.iter().copied()).map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default();
        Err(self.invalid(key, format!("`{value}` is not one of {}{suggestion}", quoted_list(allowed))))
    }

    fn registered(&self, key: &str, kind: ComponentKind, name: &str) -> Result<(), ConfigError> {
        let available = self.catalog.names(kind);
        // A kind with no registry in this build (an empty list) is checked when its feature lands.
        if available.is_empty() || available.iter().any(|n| n == name) {
            return Ok(());
        }
        let key = self.key(key);
        if kind != ComponentKind::Operator
            && let Some(needs) = crate::external::needs(name)
        {
            return Err(ConfigError::MissingComponent {
                origin: self.source.origin(&key),
                key,
                kind: kind.label(),
                name: name.to_owned(),
                needs,
            });
        }
        Err(ConfigError::UnknownName {
            origin: self.source.origin(&key),
            key,
            kind: kind.label(),
            suggestion: closest(name, available.iter().map(String::as_str)),
            name: name.to_owned(),
            available,
        })
    }

    /// Resolves and validates a whole config in place.
    pub(crate) fn resolve(&mut self, config: &mut Config) -> Result<(), ConfigError> {
        self.resolve_global(config)?;
        self.map_trainer_config(config)?;
        let schema = self.resolve_algorithm(config)?;
        self.resolve_model(config)?;
        self.resolve_buffer(config, schema)?;
        self.resolve_explorer(config)?;
        self.resolve_trainer(config)?;
        self.resolve_synchronizer(config, schema)?;
        self.resolve_monitor(config)?;
        self.resolve_stages(config)?;
        Ok(())
    }

    fn resolve_global(&mut self, config: &mut Config) -> Result<(), ConfigError> {
        for (key, value) in [("project", &config.project), ("name", &config.name)] {
            self.check(!value.trim().is_empty(), key, "must not be empty")?;
            self.check(
                !value.contains(['\\', '\0']) && value != "." && value != "..",
                key,
                "must be usable as a directory name",
            )?;
        }
        if config.checkpoint_root_dir.trim().is_empty() {
            config.checkpoint_root_dir = "checkpoints".to_owned();
        }
        let root = Path::new(&config.checkpoint_root_dir);
        let absolute = if root.is_relative() { self.cwd.join(root) } else { root.to_owned() };
        // Lexically drop `.` components so printed paths read cleanly; `..` is kept (symlinks make it
        // impossible to fold without touching the file system).
        let cleaned: std::path::PathBuf =
            absolute.components().filter(|c| !matches!(c, std::path::Component::CurDir)).collect();
        config.checkpoint_root_dir = cleaned.display().to_string();
        self.one_of("log.level", &config.log.level.to_uppercase(), &["DEBUG", "INFO", "WARNING", "WARN", "ERROR"])?;
        Ok(())
    }

    fn resolve_algorithm(&mut self, config: &mut Config) -> Result<ExperienceSchema, ConfigError> {
        let algorithm = &mut config.algorithm;
        self.registered("algorithm.algorithm_type", ComponentKind::AlgorithmType, &algorithm.algorithm_type)?;
        let preset = self.catalog.preset(&algorithm.algorithm_type).unwrap_or_default();

        let repeat_times = algorithm.repeat_times.or(preset.repeat_times).unwrap_or(1);
        self.check(repeat_times >= 1, "algorithm.repeat_times", "must be at least 1")?;
        algorithm.repeat_times = Some(repeat_times);

        let fill = |user: &mut Option<String>, preset: &Option<String>, fallback: &str| {
            if user.is_none() {
                *user = Some(preset.clone().unwrap_or_else(|| fallback.to_owned()));
            }
        };
        fill(&mut algorithm.advantage_fn, &preset.advantage_fn, FALLBACK_COMPONENTS[0].1);
        fill(&mut algorithm.policy_loss_fn, &preset.policy_loss_fn, FALLBACK_COMPONENTS[1].1);
        fill(&mut algorithm.kl_penalty_fn, &preset.kl_penalty_fn, FALLBACK_COMPONENTS[2].1);
        fill(&mut algorithm.kl_loss_fn, &preset.kl_loss_fn, FALLBACK_COMPONENTS[3].1);
        fill(&mut algorithm.entropy_loss_fn, &preset.entropy_loss_fn, FALLBACK_COMPONENTS[4].1);
        fill(&mut algorithm.sample_strategy, &preset.sample_strategy, "default");
        if algorithm.loss_agg_mode.is_none() {
            algorithm.loss_agg_mode = Some(match preset.loss_agg_mode.as_deref() {
                Some("seq-mean-token-sum") => LossAggMode::SeqMeanTokenSum,
                Some("seq-mean-token-mean") => LossAggMode::SeqMeanTokenMean,
                Some("seq-mean-token-sum-norm") => LossAggMode::SeqMeanTokenSumNorm,
                _ => LossAggMode::TokenMean,
            });
        }

        // Trinity-RFT replaces a component's default arguments with a user's partial map, so a missing key
        // silently takes the class constructor's (sometimes different) default. trinity merges the user's map
        // over the registered defaults instead: what you do not write is the documented default.
        let components = [
            (
                "advantage_fn",
                ComponentKind::AdvantageFn,
                &algorithm.advantage_fn,
                &mut algorithm.advantage_fn_args,
                &preset.advantage_fn_args,
            ),
            (
                "policy_loss_fn",
                ComponentKind::PolicyLossFn,
                &algorithm.policy_loss_fn,
                &mut algorithm.policy_loss_fn_args,
                &preset.policy_loss_fn_args,
            ),
            ("kl_penalty_fn", ComponentKind::KlFn, &algorithm.kl_penalty_fn, &mut algorithm.kl_penalty_fn_args, &None),
            ("kl_loss_fn", ComponentKind::KlFn, &algorithm.kl_loss_fn, &mut algorithm.kl_loss_fn_args, &None),
            (
                "entropy_loss_fn",
                ComponentKind::EntropyLossFn,
                &algorithm.entropy_loss_fn,
                &mut algorithm.entropy_loss_fn_args,
                &None,
            ),
            (
                "sample_strategy",
                ComponentKind::SampleStrategy,
                &algorithm.sample_strategy,
                &mut algorithm.sample_strategy_args,
                &None,
            ),
        ];
        for (key, kind, name, args, preset_args) in components {
            let name = name.as_deref().unwrap_or_default();
            self.registered(&format!("algorithm.{key}"), kind, name)?;
            let mut merged = self.catalog.default_args(kind, name).unwrap_or_default();
            if let Some(preset_args) = preset_args {
                merge_args(&mut merged, preset_args);
            }
            if let Some(user) = args.as_ref() {
                merge_args(&mut merged, user);
            }
            *args = Some(merged);
        }
        if algorithm.sample_strategy.as_deref() == Some("staleness_control") {
            let max = algorithm.sample_strategy_args.as_ref().and_then(|a| a.get("max_staleness"));
            self.check(
                max.is_none_or(|v| v.is_null() || v.as_u64().is_some()),
                "algorithm.sample_strategy_args.max_staleness",
                "must be a whole number of model versions (null: no limit)",
            )?;
        }
        // Like Trinity-RFT: a policy loss that aggregates reads the algorithm's aggregation mode.
        if let (Some(args), Some(mode)) = (algorithm.policy_loss_fn_args.as_mut(), algorithm.loss_agg_mode)
            && args.contains_key("loss_agg_mode")
        {
            args.insert("loss_agg_mode".to_owned(), Value::from(mode.name()));
        }

        let optimizer = &mut algorithm.optimizer;
        if let Some(style) = optimizer.warmup_style.take() {
            optimizer.lr_scheduler_type = style;
            self.notes.push("algorithm.optimizer.warmup_style is deprecated; copied into lr_scheduler_type".into());
        }
        let optimizer = &config.algorithm.optimizer;
        self.check(
            optimizer.lr.is_finite() && optimizer.lr > 0.0,
            "algorithm.optimizer.lr",
            format!("must be a positive number, got {}", optimizer.lr),
        )?;
        self.check(
            (0.0..=1.0).contains(&optimizer.lr_warmup_steps_ratio),
            "algorithm.optimizer.lr_warmup_steps_ratio",
            "must be between 0 and 1",
        )?;
        self.check(
            (0.0..=1.0).contains(&optimizer.min_lr_ratio),
            "algorithm.optimizer.min_lr_ratio",
            "must be between 0 and 1",
        )?;
        self.check(
            optimizer.betas.iter().all(|b| (0.0..1.0).contains(b)),
            "algorithm.optimizer.betas",
            "both betas must be in [0, 1)",
        )?;
        self.check(optimizer.eps > 0.0, "algorithm.optimizer.eps", "must be positive")?;
        self.check(optimizer.weight_decay >= 0.0, "algorithm.optimizer.weight_decay", "must not be negative")?;
        self.check(optimizer.clip_grad > 0.0, "algorithm.optimizer.clip_grad", "must be positive")?;

        if matches!(preset.schema, ExperienceSchema::Sft | ExperienceSchema::Dpo) {
            self.check(
                config.mode == Mode::Train,
                "mode",
                format!("algorithm `{}` trains on a dataset and needs `mode: train`", config.algorithm.algorithm_type),
            )?;
        }
        Ok(preset.schema)
    }

    /// Trinity-RFT's `_check_model_len`: any two of the three limits determine the third.
    fn resolve_model(&mut self, config: &mut Config) -> Result<(), ConfigError> {
        let model = &mut config.model;
        if model.critic_model_path.is_empty() {
            model.critic_model_path = model.model_path.clone();
        }
        let given = (model.max_model_len, model.max_prompt_tokens, model.max_response_tokens);
        match given {
            (Some(len), Some(prompt), Some(response)) => {
                if prompt + response > len {
                    return Err(self.invalid(
                        "model.max_model_len",
                        format!("max_prompt_tokens ({prompt}) + max_response_tokens ({response}) exceed max_model_len ({len})"),
                    ));
                }
            }
            (None, Some(prompt), Some(response)) => model.max_model_len = Some(prompt + response),
            (Some(len), None, None) => {
                model.max_prompt_tokens = Some(len / 2);
                model.max_response_tokens = Some(len - len / 2);
            }
            (Some(len), Some(prompt), None) => {
                let prompt = prompt.min(len.saturating_sub(1));
                model.max_prompt_tokens = Some(prompt);
                model.max_response_tokens = Some(len - prompt);
            }
            (Some(len), None, Some(response)) => {
                let response = response.min(len.saturating_sub(1));
                model.max_response_tokens = Some(response);
                model.max_prompt_tokens = Some(len - response);
            }
            (None, _, _) => {
                return Err(self.invalid(
                    "model.max_model_len",
                    "set max_model_len, or both max_prompt_tokens and max_response_tokens",
                ));
            }
        }
        let model = &config.model;
        let derived = (model.max_model_len, model.max_prompt_tokens, model.max_response_tokens);
        if derived != given {
            self.notes.push(format!(
                "model lengths derived as Trinity-RFT does: max_model_len {}, max_prompt_tokens {}, max_response_tokens {}",
                derived.0.unwrap_or(0),
                derived.1.unwrap_or(0),
                derived.2.unwrap_or(0)
            ));
        }
        self.check(model.max_model_len.unwrap_or(0) >= 2, "model.max_model_len", "must be at least 2")?;
        self.check(model.max_response_tokens.unwrap_or(0) >= 1, "model.max_response_tokens", "must be at least 1")?;
        self.check(model.max_prompt_tokens.unwrap_or(0) >= 1, "model.max_prompt_tokens", "must be at least 1")?;
        // Trinity-RFT: a minimum at or above the maximum becomes one token below it.
        let max_response = model.max_response_tokens.unwrap_or(0);
        if model.min_response_tokens >= max_response && model.min_response_tokens > 0 {
            let min = max_response.saturating_sub(1);
            self.notes.push(format!(
                "model.min_response_tokens ({}) is set to {min}, below max_response_tokens ({max_response})",
                model.min_response_tokens
            ));
            config.model.min_response_tokens = min;
        }
        let model = &config.model;
        self.check_sampling("model", model.temperature, model.top_p, model.top_k, None)?;
        self.check(
            model.logprobs == 0,
            "model.logprobs",
            "only 0 is supported: the sampled token's logprob is always returned",
        )?;
        self.check(
            model.repetition_penalty == 1.0,
            "model.repetition_penalty",
            "a repetition penalty changes what is sampled, and trinity's sampler has none; use 1.0",
        )?;
        self.check(
            !model.trust_remote_code,
            "model.trust_remote_code",
            "trinity never runs model code shipped with a checkpoint; use false",
        )?;
        Ok(())
    }

    fn check_sampling(
        &self,
        at: &str,
        temperature: f64,
        top_p: f64,
        top_k: i64,
        min_p: Option<f64>,
    ) -> Result<(), ConfigError> {
        self.check(
            temperature.is_finite() && temperature >= 0.0,
            &format!("{at}.temperature"),
            format!("must be 0 (greedy) or positive, got {temperature}"),
        )?;
        self.check(top_p > 0.0 && top_p <= 1.0, &format!("{at}.top_p"), format!("must be in (0, 1], got {top_p}"))?;
        self.check(
            top_k == -1 || top_k >= 1,
            &format!("{at}.top_k"),
            format!("must be -1 (off) or at least 1, got {top_k}"),
        )?;
        if let Some(min_p) = min_p {
            self.check(
                (0.0..=1.0).contains(&min_p),
                &format!("{at}.min_p"),
                format!("must be in [0, 1], got {min_p}"),
            )?;
        }
        Ok(())
    }

    fn resolve_buffer(&mut self, config: &mut Config, schema: ExperienceSchema) -> Result<(), ConfigError> {
        let repeat_times = config.algorithm.repeat_times.unwrap_or(1);
        let buffer = &mut config.buffer;
        self.check(buffer.batch_size >= 1, "buffer.batch_size", "must be at least 1")?;
        self.check(buffer.total_epochs >= 1, "buffer.total_epochs", "must be at least 1")?;
        if let Some(steps) = buffer.total_steps {
            self.check(steps >= 1, "buffer.total_steps", "must be at least 1")?;
        }
        if buffer.train_batch_size == 0 {
            if schema != ExperienceSchema::Experience {
                return Err(self.invalid(
                    "buffer.train_batch_size",
                    format!("algorithm `{}` needs an explicit train_batch_size", config.algorithm.algorithm_type),
                ));
            }
            buffer.train_batch_size = buffer.batch_size * repeat_times;
        }

        let input = &mut buffer.explorer_input;
        if input.taskset.is_some() && !input.tasksets.is_empty() {
            return Err(self.invalid("buffer.explorer_input.tasksets", "set either `taskset` or `tasksets`, not both"));
        }
        let from_single = input.taskset.is_some();
        if let Some(taskset) = input.taskset.take() {
            input.tasksets.push(taskset);
        }
        let needs_tasks = matches!(config.mode, Mode::Both | Mode::Explore | Mode::Colocate)
            && schema == ExperienceSchema::Experience;
        if needs_tasks && input.tasksets.is_empty() {
            return Err(self.invalid(
                "buffer.explorer_input.taskset",
                format!("mode `{}` needs a taskset to explore", config.mode.name()),
            ));
        }
        if config.mode == Mode::Bench && input.eval_tasksets.is_empty() {
            return Err(
                self.invalid("buffer.explorer_input.eval_tasksets", "mode `bench` needs at least one eval taskset")
            );
        }

        let defaults = TasksetDefaults {
            workflow: input.default_workflow_type.clone(),
            eval_workflow: input.default_eval_workflow_type.clone().or_else(|| input.default_workflow_type.clone()),
            reward: input.default_reward_fn_type.clone(),
            system_prompt: input.system_prompt.clone(),
            reply_prefix: input.reply_prefix.clone(),
        };
        let mut tasksets = std::mem::take(&mut input.tasksets);
        for (i, taskset) in tasksets.iter_mut().enumerate() {
            let key = if from_single {
                "buffer.explorer_input.taskset".to_owned()
            } else {
                format!("buffer.explorer_input.tasksets[{i}]")
            };
            self.resolve_taskset(taskset, &key, format!("taskset_{i}"), Some(repeat_times), &defaults, config)?;
        }
        let mut eval_tasksets = std::mem::take(&mut config.buffer.explorer_input.eval_tasksets);
        for (i, taskset) in eval_tasksets.iter_mut().enumerate() {
            let key = format!("buffer.explorer_input.eval_tasksets[{i}]");
            self.resolve_taskset(taskset, &key, format!("eval_taskset_{i}"), None, &defaults, config)?;
        }
        // Names label metrics (`eval/<name>/...`) and selector state, so they must be unique within each list;
        // a training and an eval taskset may share one, as in Trinity-RFT's own configs.
        for (list, key) in
            [(&tasksets, "buffer.explorer_input.tasksets"), (&eval_tasksets, "buffer.explorer_input.eval_tasksets")]
        {
            let mut names: Vec<&str> = list.iter().map(|t| t.name.as_str()).collect();
            names.sort_unstable();
            if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
                return Err(self.invalid(key, format!("two tasksets are named `{}`; names must be unique", pair[0])));
            }
        }
        config.buffer.explorer_input.tasksets = tasksets;
        config.buffer.explorer_input.eval_tasksets = eval_tasksets;

        let trainer_input = &mut config.buffer.trainer_input;
        let mut experience = trainer_input.experience_buffer.take().unwrap_or_default();
        self.resolve_experience_buffer(&mut experience, "buffer.trainer_input.experience_buffer", config.mode, schema)?;
        config.buffer.trainer_input.experience_buffer = Some(experience);
        let mut auxiliary = std::mem::take(&mut config.buffer.trainer_input.auxiliary_buffers);
        for (name, buffer) in auxiliary.iter_mut() {
            let key = format!("buffer.trainer_input.auxiliary_buffers.{name}");
            if buffer.name == ExperienceBufferConfig::default().name {
                buffer.name = name.clone();
            }
            self.check(buffer.path.is_some(), &key, "an auxiliary buffer needs a `path`")?;
            self.resolve_experience_buffer(buffer, &key, config.mode, ExperienceSchema::Sft)?;
        }
        config.buffer.trainer_input.auxiliary_buffers = auxiliary;
        // Sample strategy `mix` trains expert rows from a named auxiliary buffer; a missing one would only fail
        // once the run has loaded its models.
        if config.algorithm.sample_strategy.as_deref() == Some("mix") {
            let args = config.algorithm.sample_strategy_args.clone().unwrap_or_default();
            let name = args.get("sft_dataset_name").and_then(Value::as_str).unwrap_or("sft_dataset").to_owned();
            self.check(
                config.buffer.trainer_input.auxiliary_buffers.contains_key(&name),
                "buffer.trainer_input.auxiliary_buffers",
                format!("sample strategy `mix` reads expert rows from auxiliary buffer `{name}` (sample_strategy_args.sft_dataset_name), which is not configured"),
            )?;
        }
        Ok(())
    }

    fn resolve_taskset(
        &mut self,
        taskset: &mut TasksetConfig,
        key: &str,
        default_name: String,
        train_repeat_times: Option<u32>,
        defaults: &TasksetDefaults,
        config: &Config,
    ) -> Result<(), ConfigError> {
        if taskset.name.is_empty() {
            taskset.name = default_name;
        }
        self.check(!taskset.path.trim().is_empty(), &format!("{key}.path"), "a taskset needs a `path`")?;
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
            )?;
        }
        self.one_of(&format!("{key}.storage_type"), storage_name(taskset.storage_type), &["file", "sql"])?;
        if taskset.storage_type == StorageType::Sql {
            self.check(
                taskset.path.starts_with("sqlite:///"),
                &format!("{key}.path"),
                "an sql taskset path is a `sqlite:///` URL",
            )?;
        }
        match (taskset.task_selector.take(), taskset.data_selector.take()) {
            (Some(_), Some(_)) => {
                return Err(self.invalid(
                    &format!("{key}.data_selector"),
                    "set `data_selector` or its old name `task_selector`, not both",
                ));
            }
            (a, b) => taskset.data_selector = Some(a.or(b).unwrap_or_default()),
        }
        if let Some(selector) = &taskset.data_selector {
            self.one_of(
                &format!("{key}.data_selector.selector_type"),
                &selector.selector_type,
                &["sequential", "shuffle", "random", "difficulty_based", "offline_easy2hard"],
            )?;
        }
        let is_eval = train_repeat_times.is_none();
        let workflow = if is_eval { &defaults.eval_workflow } else { &defaults.workflow };
        if taskset.default_workflow_type.is_none() {
            taskset.default_workflow_type = workflow.clone();
        }
        if taskset.default_reward_fn_type.is_none() {
            taskset.default_reward_fn_type = defaults.reward.clone();
        }
        if let Some(name) = &taskset.default_workflow_type {
            self.registered(&format!("{key}.default_workflow_type"), ComponentKind::Workflow, name)?;
        }
        if let Some(name) = &taskset.default_reward_fn_type {
            self.registered(&format!("{key}.default_reward_fn_type"), ComponentKind::RewardFn, name)?;
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
        self.check(repeat_times >= 1, &format!("{key}.repeat_times"), "must be at least 1")?;
        taskset.repeat_times = Some(repeat_times);
        let model = &config.model;
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
        let max_response = model.max_response_tokens.unwrap_or(1);
        args.max_tokens = Some(args.max_tokens.unwrap_or(max_response));
        args.min_tokens = Some(args.min_tokens.unwrap_or(model.min_response_tokens));
        args.seed = Some(args.seed.unwrap_or(config.explorer.rollout_model.seed));
        let args = &taskset.rollout_args;
        let at = format!("{key}.rollout_args");
        self.check_sampling(
            &at,
            args.temperature.unwrap_or(1.0),
            args.top_p.unwrap_or(1.0),
            args.top_k.unwrap_or(-1),
            args.min_p,
        )?;
        self.check(
            args.logprobs == Some(0),
            &format!("{at}.logprobs"),
            "only 0 is supported: the sampled token's logprob is always returned",
        )?;
        let max_tokens = args.max_tokens.unwrap_or(1);
        self.check(max_tokens >= 1, &format!("{at}.max_tokens"), "must be at least 1")?;
        self.check(
            max_tokens <= max_response,
            &format!("{at}.max_tokens"),
            format!("{max_tokens} exceeds model.max_response_tokens ({max_response})"),
        )?;
        self.check(
            args.min_tokens.unwrap_or(0) <= max_tokens,
            &format!("{at}.min_tokens"),
            "must not exceed max_tokens",
        )?;
        self.check(args.stop.iter().all(|s| !s.is_empty()), &format!("{at}.stop"), "stop strings must not be empty")?;
        Ok(())
    }

    fn resolve_experience_buffer(
        &mut self,
        buffer: &mut ExperienceBufferConfig,
        key: &str,
        mode: Mode,
        schema: ExperienceSchema,
    ) -> Result<(), ConfigError> {
        self.check(buffer.capacity >= 1, &format!("{key}.capacity"), "must be at least 1")?;
        self.check(buffer.max_read_timeout > 0.0, &format!("{key}.max_read_timeout"), "must be positive")?;
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
                let persisted = path.is_empty()
                    || path.starts_with("sqlite:///")
                    || path.ends_with(".jsonl")
                    || path.ends_with(".json");
                if !persisted {
                    // The path of a queue only names a write-only copy; one trinity cannot write changes nothing
                    // that trains, so it is dropped with a note rather than refused.
                    self.notes.push(format!(
                        "{key}.path `{path}` is neither a `sqlite:///` database nor a `.jsonl` file, so no copy of the queue is kept"
                    ));
                    buffer.path = None;
                }
            }
            StorageType::Sql => {
                self.check(
                    path.starts_with("sqlite:///"),
                    &format!("{key}.path"),
                    format!("an sql buffer path is a `sqlite:///` URL, got `{path}`"),
                )?;
            }
            StorageType::File => {
                self.check(!path.is_empty(), &format!("{key}.path"), "a file buffer needs a `path`")?;
            }
        }
        if matches!(mode, Mode::Explore | Mode::Train) && schema == ExperienceSchema::Experience {
            let shared = buffer.storage_type == StorageType::Sql
                || (buffer.storage_type == StorageType::Queue && path.starts_with("sqlite:///"));
            self.check(shared, &format!("{key}.path"), format!("mode `{}` runs explorer and trainer in separate processes; they share experiences through a `sqlite:///` buffer", mode.name()))?;
        }
        Ok(())
    }

    fn resolve_explorer(&mut self, config: &mut Config) -> Result<(), ConfigError> {
        let explorer = &config.explorer;
        self.check(explorer.runner_per_model >= 1, "explorer.runner_per_model", "must be at least 1")?;
        self.check(explorer.max_timeout >= 1, "explorer.max_timeout", "must be at least 1 second")?;
        self.check(explorer.eval_interval >= 1, "explorer.eval_interval", "must be at least 1")?;
        // engine_type, engine_num, tensor_parallel_size, gpu_memory_utilization and the vLLM knobs are placement
        // keys: the key walk notes them, and nothing here may refuse them.
        self.one_of(
            "explorer.rollout_model.dtype",
            &explorer.rollout_model.dtype,
            &["bfloat16", "float16", "float32", "bf16", "fp16", "fp32", "auto"],
        )?;
        for (i, operator) in config.data_processor.experience_pipeline.operators.iter().enumerate() {
            let key = format!("data_processor.experience_pipeline.operators[{i}].name");
            self.check(!operator.name.is_empty(), &key, "an operator needs a name")?;
            self.registered(&key, ComponentKind::Operator, &operator.name)?;
        }
        Ok(())
    }

    fn resolve_trainer(&mut self, config: &mut Config) -> Result<(), ConfigError> {
        let trainer = &mut config.trainer;
        let grad_clip = trainer.grad_clip.unwrap_or(config.algorithm.optimizer.clip_grad);
        trainer.grad_clip = Some(grad_clip);
        config.algorithm.optimizer.clip_grad = grad_clip;
        let trainer = &config.trainer;
        self.check(grad_clip > 0.0, "trainer.grad_clip", "must be positive")?;
        self.one_of("trainer.save_hf_checkpoint", &trainer.save_hf_checkpoint, &["last", "always", "never"])?;
        self.one_of("trainer.dtype", &trainer.dtype, &["auto", "bfloat16", "bf16", "float32", "fp32"])?;
        if let Some(steps) = trainer.total_steps {
            self.check(steps >= 1, "trainer.total_steps", "must be at least 1")?;
        }
        if let Some(keep) = trainer.max_checkpoints_to_keep {
            self.check(keep >= 1, "trainer.max_checkpoints_to_keep", "must be at least 1")?;
        }
        self.resolve_trainer_config(config)?;
        // Trinity-RFT's `_adjust_token_len_if_needed`: a budget below one full sequence is raised to it.
        let len = config.model.max_model_len.unwrap_or(0);
        if let Some(budget) = config.trainer.max_token_len_per_gpu
            && budget < len
        {
            config.trainer.max_token_len_per_gpu = Some(len);
            self.notes.push(format!(
                "trainer.max_token_len_per_gpu ({budget}) is raised to model.max_model_len ({len}) so one sequence fits"
            ));
        }
        Ok(())
    }

    /// Stages: each given section replaces the whole global section (Trinity-RFT's rule, not a deep merge),
    /// and the result must resolve on its own.
    fn resolve_stages(&mut self, config: &mut Config) -> Result<(), ConfigError> {
        let mut names = Vec::new();
        for (i, stage) in config.stages.iter().enumerate() {
            let key = format!("stages[{i}].stage_name");
            self.check(!stage.stage_name.trim().is_empty(), &key, "a stage needs a name")?;
            self.check(
                !names.contains(&stage.stage_name),
                &key,
                format!("stage `{}` appears twice", stage.stage_name),
            )?;
            names.push(stage.stage_name.clone());
            let mut staged = stage_config(config, i);
            let mut resolver = Resolver {
                source: self.source,
                catalog: self.catalog,
                cwd: self.cwd,
                prefix: format!("stages[{i}]."),
                notes: Vec::new(),
            };
            resolver.resolve(&mut staged)?;
        }
        Ok(())
    }
}

/// The config stage `index` runs with: global sections replaced by the stage's.
pub fn stage_config(config: &Config, index: usize) -> Config {
    let mut staged = config.clone();
    staged.stages = Vec::new();
    let Some(stage) = config.stages.get(index) else {
        return staged;
    };
    staged.name = format!("{}/{}", config.name, stage.stage_name);
    staged.trainer.save_hf_checkpoint = "last".to_owned();
    if let Some(mode) = stage.mode {
        staged.mode = mode;
    }
    if let Some(algorithm) = &stage.algorithm {
        staged.algorithm = algorithm.clone();
    }
    if let Some(buffer) = &stage.buffer {
        staged.buffer = buffer.clone();
    }
    if let Some(data_processor) = &stage.data_processor {
        staged.data_processor = data_processor.clone();
    }
    if let Some(explorer) = &stage.explorer {
        staged.explorer = explorer.clone();
    }
    if let Some(trainer) = &stage.trainer {
        staged.trainer = trainer.clone();
    }
    staged
}

struct TasksetDefaults {
    workflow: Option<String>,
    eval_workflow: Option<String>,
    reward: Option<String>,
    system_prompt: Option<String>,
    reply_prefix: Option<String>,
}

fn storage_name(storage: StorageType) -> &'static str {
    match storage {
        StorageType::File => "file",
        StorageType::Sql => "sql",
        StorageType::Queue => "queue",
    }
}

/// Merges `over` into `base`; a null in `over` keeps the default (as `trinity algorithm eval` documents).
fn merge_args(base: &mut Map<String, Value>, over: &Map<String, Value>) {
    for (key, value) in over {
        if !value.is_null() {
            base.insert(key.clone(), value.clone());
        }
    }
}

fn quoted_list(items: &[&str]) -> String {
    items.iter().map(|i| format!("`{i}`")).collect::<Vec<_>>().join(", ")
}
