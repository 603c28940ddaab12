//! Resolution: derived values filled in, Trinity-RFT's cross-field rules checked.
//!
//! After this step every consumer reads plain values: component names and their full argument maps, one list
//! of training tasksets with complete rollout arguments, concrete length limits, an absolute checkpoint root.
//! Nothing downstream has to know a default. Rules follow Trinity-RFT's validators; where trinity differs it
//! says so in the doc comment of the rule.
//!
//! A broken rule is recorded (`Resolver::check`, `Resolver::record`) and resolution goes on, so one run of
//! `--dry-run` lists every mistake. A rule stops resolution instead (an `Err`, the `?` operator) only where later
//! rules read the value it refused as valid, and going on would report their consequences as mistakes of their own:
//! the algorithm type (its preset decides components, schema and defaults), `repeat_times`, `batch_size`, the model
//! lengths (every taskset's limits derive from them), `train_batch_size` (mini-batches divide it), `sync_interval`
//! (the eval interval is rounded to it), both `taskset` and `tasksets`, and a veRL optimizer section that does not
//! parse. A rule that only makes sense once another held runs only then (the return value of `check`), and a
//! taskset's rollout arguments are checked where the taskset writes them, not where it inherits them from `model`.

use std::path::Path;

use serde_json::{Map, Value};

use crate::algorithm::{LossAggMode, ResolvedAlgorithm, SampleStrategy, fallback_component};
use crate::catalog::{Catalog, ComponentKind, ExperienceSchema};
use crate::config::{Config, Mode};
use crate::error::{ConfigError, ConfigErrors, closest};
use crate::model::ModelLengths;
use crate::source::Source;
use crate::stages::Scope;
/// Kept at its old path: it moved to [`crate::stages`] with the rest of the stage rules.
pub use crate::stages::stage_config;

/// A remark about the config that is not an error (a knob with no effect, a mapped value); logged at start.
pub type Note = String;

pub(crate) struct Resolver<'a> {
    pub(crate) source: &'a Source,
    pub(crate) catalog: &'a dyn Catalog,
    pub(crate) cwd: &'a Path,
    /// The top level or the stage being resolved, for messages.
    pub(crate) scope: Scope,
    pub(crate) notes: Vec<Note>,
    /// Broken rules so far, in the order met; resolution fails at its end when there is any.
    pub(crate) errors: Vec<ConfigError>,
}

impl<'a> Resolver<'a> {
    pub(crate) fn key(&self, key: &str) -> String {
        self.scope.key(key)
    }

    pub(crate) fn invalid(&self, key: &str, message: impl Into<String>) -> ConfigError {
        let message = self.scope.explain(key, message.into());
        let key = self.key(key);
        ConfigError::Invalid { origin: self.source.origin(&key), key, message }
    }

    /// A new resolver with no notes or errors yet.
    pub(crate) fn new(source: &'a Source, catalog: &'a dyn Catalog, cwd: &'a Path, scope: Scope) -> Resolver<'a> {
        Resolver { source, catalog, cwd, scope, notes: Vec::new(), errors: Vec::new() }
    }

    /// A rule whose value later rules read: it stops resolution when broken (see the module docs).
    pub(crate) fn require(&self, ok: bool, key: &str, message: impl Into<String>) -> Result<(), ConfigError> {
        if ok { Ok(()) } else { Err(self.invalid(key, message)) }
    }

    /// An independent rule: a broken one is recorded and resolution goes on. Returns whether it held, for the
    /// rules that only make sense after it.
    pub(crate) fn check(&mut self, ok: bool, key: &str, message: impl Into<String>) -> bool {
        let result = self.require(ok, key, message);
        self.record(result)
    }

    /// Records the error of an independent rule, if any; returns whether there was none.
    pub(crate) fn record(&mut self, result: Result<(), ConfigError>) -> bool {
        match result {
            Ok(()) => true,
            Err(error) => {
                self.errors.push(error);
                false
            }
        }
    }

    /// An independent rule: `value` must be one of `allowed`, with a did-you-mean when it is not.
    pub(crate) fn one_of(&mut self, key: &str, value: &str, allowed: &[&str]) -> bool {
        if allowed.contains(&value) {
            return true;
        }
        let suggestion =
            closest(value, allowed.iter().copied()).map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default();
        let error = self.invalid(key, format!("`{value}` is not one of {}{suggestion}", quoted_list(allowed)));
        self.record(Err(error))
    }

    pub(crate) fn registered(&self, key: &str, kind: ComponentKind, name: &str) -> Result<(), ConfigError> {
        let available = self.catalog.names(kind);
        // A kind with no registry in this build (an empty list) is checked when its feature lands.
        if available.is_empty() || available.iter().any(|n| n == name) || self.catalog.accepts(kind, name) {
            return Ok(());
        }
        let key = self.key(key);
        let note = self.catalog.unknown_note(kind, name);
        let needs = match kind {
            ComponentKind::Operator => crate::external::operator_needs(name),
            _ => crate::external::needs(name),
        };
        if let Some(needs) = needs {
            return Err(ConfigError::MissingComponent {
                origin: self.source.origin(&key),
                key,
                kind: kind.label(),
                name: name.to_owned(),
                needs,
                note,
            });
        }
        Err(ConfigError::UnknownName {
            origin: self.source.origin(&key),
            key,
            kind: kind.label(),
            suggestion: closest(name, available.iter().map(String::as_str)),
            name: name.to_owned(),
            available,
            note,
        })
    }

    /// Resolves and validates a whole config in place; the errors are every broken rule met before the end or
    /// before the first rule that stops resolution.
    pub(crate) fn resolve(&mut self, config: &mut Config) -> Result<(), ConfigErrors> {
        let result = self.resolve_sections(config);
        self.record(result);
        match ConfigErrors::new(std::mem::take(&mut self.errors)) {
            Some(errors) => Err(errors),
            None => Ok(()),
        }
    }

    fn resolve_sections(&mut self, config: &mut Config) -> Result<(), ConfigError> {
        self.resolve_global(config);
        self.check_external_model(config)?;
        self.map_trainer_config(config)?;
        let schema = self.resolve_algorithm(config)?;
        self.resolve_model(config)?;
        self.resolve_lora(config);
        self.resolve_buffer(config, schema)?;
        self.resolve_explorer(config);
        self.resolve_trainer(config);
        self.resolve_synchronizer(config, schema)?;
        self.resolve_monitor(config);
        self.resolve_external_model(config)?;
        self.note_changed_defaults(config);
        Ok(())
    }

    /// One note naming each key whose default Trinity-RFT 0.6.0 changed (its `CHANGED_DEFAULTS_060`) that this
    /// config leaves to its default, with the value used and 0.5.2's: a config written for 0.5.2 runs with 0.6.0's.
    fn note_changed_defaults(&mut self, config: &Config) {
        let defaulted: Vec<String> = crate::trainer::CHANGED_DEFAULTS_060
            .iter()
            .filter(|(key, _, _)| !self.source.writes(&self.scope.file_key(key)))
            // The veRL section can set the checkpoints to keep (`max_actor_ckpt_to_keep`); then it is no default.
            .filter(|(key, _, _)| {
                *key != "trainer.max_checkpoints_to_keep" || config.trainer.max_checkpoints_to_keep.is_none()
            })
            .map(|(key, new, old)| format!("{key} = {new} (0.5.2: {old})"))
            .collect();
        if !defaulted.is_empty() {
            self.notes.push(format!(
                "Trinity-RFT 0.6.0's defaults, changed since 0.5.2, apply to keys this config leaves out: {}",
                defaulted.join("; ")
            ));
        }
    }

    fn resolve_global(&mut self, config: &mut Config) {
        for (key, value) in [("project", &config.project), ("name", &config.name)] {
            if self.check(!value.trim().is_empty(), key, "must not be empty") {
                self.check(
                    !value.contains(['\\', '\0']) && value != "." && value != "..",
                    key,
                    "must be usable as a directory name",
                );
            }
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
        if config.mode == Mode::Bench && !config.continue_from_checkpoint {
            // Trinity-RFT does the same: a fresh (renamed) experiment would have no checkpoints to evaluate.
            config.continue_from_checkpoint = true;
            self.notes.push(
                "continue_from_checkpoint is set to true in mode `bench`, which evaluates this experiment's existing \
                 checkpoints (as Trinity-RFT does)"
                    .into(),
            );
        }
        self.one_of("log.level", &config.log.level.to_uppercase(), &["DEBUG", "INFO", "WARNING", "WARN", "ERROR"]);
    }

    fn resolve_algorithm(&mut self, config: &mut Config) -> Result<ExperienceSchema, ConfigError> {
        let algorithm = &mut config.algorithm;
        self.registered("algorithm.algorithm_type", ComponentKind::AlgorithmType, &algorithm.algorithm_type)?;
        let preset = self.catalog.preset(&algorithm.algorithm_type).unwrap_or_default();

        let repeat_times = algorithm.repeat_times.or(preset.repeat_times).unwrap_or(1);
        self.require(repeat_times >= 1, "algorithm.repeat_times", "must be at least 1")?;
        algorithm.repeat_times = Some(repeat_times);

        // The user's choice, else the preset's, else Trinity-RFT's fallback (the one table of them).
        let fill = |user: &mut Option<String>, preset: &Option<String>, key: &str| {
            if user.is_none() {
                let fallback = fallback_component(key).expect("every component has a fallback");
                *user = Some(preset.clone().unwrap_or_else(|| fallback.to_owned()));
            }
        };
        fill(&mut algorithm.advantage_fn, &preset.advantage_fn, "advantage_fn");
        fill(&mut algorithm.policy_loss_fn, &preset.policy_loss_fn, "policy_loss_fn");
        fill(&mut algorithm.kl_penalty_fn, &preset.kl_penalty_fn, "kl_penalty_fn");
        fill(&mut algorithm.kl_loss_fn, &preset.kl_loss_fn, "kl_loss_fn");
        fill(&mut algorithm.entropy_loss_fn, &preset.entropy_loss_fn, "entropy_loss_fn");
        fill(&mut algorithm.sample_strategy, &preset.sample_strategy, "sample_strategy");
        if algorithm.loss_agg_mode.is_none() {
            let name = preset.loss_agg_mode.as_deref().or(fallback_component("loss_agg_mode"));
            algorithm.loss_agg_mode = Some(match name {
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
        let mut strategy_known = false;
        for (key, kind, name, args, preset_args) in components {
            let name = name.as_deref().unwrap_or_default();
            let known = self.registered(&format!("algorithm.{key}"), kind, name);
            if kind == ComponentKind::SampleStrategy {
                strategy_known = known.is_ok();
            }
            self.record(known);
            let mut merged = self.catalog.default_args(kind, name).unwrap_or_default();
            if let Some(preset_args) = preset_args {
                merge_args(&mut merged, preset_args);
            }
            if let Some(user) = args.as_ref() {
                merge_args(&mut merged, user);
            }
            *args = Some(merged);
        }
        // Parsed once, here: the run reads the typed strategy, never its name. An unknown name was refused just
        // above with the registry's list; one the registry knows and this enum does not is a build mistake.
        let name = algorithm.sample_strategy.as_deref().unwrap_or_default();
        let sample_strategy = match SampleStrategy::parse(name, algorithm.sample_strategy_args.as_ref()) {
            Ok(strategy) => strategy,
            Err(fault) => {
                if let Some((key, message)) = fault {
                    self.check(false, &format!("algorithm.{key}"), message);
                } else if strategy_known {
                    let names = quoted_list(&SampleStrategy::NAMES);
                    self.check(false, "algorithm.sample_strategy", format!("`{name}` is not one of {names}"));
                }
                SampleStrategy::default()
            }
        };
        algorithm.resolved = ResolvedAlgorithm { repeat_times, sample_strategy };
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
        );
        self.check(
            (0.0..=1.0).contains(&optimizer.lr_warmup_steps_ratio),
            "algorithm.optimizer.lr_warmup_steps_ratio",
            "must be between 0 and 1",
        );
        self.check(
            (0.0..=1.0).contains(&optimizer.min_lr_ratio),
            "algorithm.optimizer.min_lr_ratio",
            "must be between 0 and 1",
        );
        self.check(
            optimizer.betas.iter().all(|b| (0.0..1.0).contains(b)),
            "algorithm.optimizer.betas",
            "both betas must be in [0, 1)",
        );
        self.check(optimizer.eps > 0.0, "algorithm.optimizer.eps", "must be positive");
        self.check(optimizer.weight_decay >= 0.0, "algorithm.optimizer.weight_decay", "must not be negative");
        self.check(optimizer.clip_grad > 0.0, "algorithm.optimizer.clip_grad", "must be positive");

        if matches!(preset.schema, ExperienceSchema::Sft | ExperienceSchema::Dpo | ExperienceSchema::Cpt) {
            // Trinity-RFT's SFT / DPO `check_config` (CPT inherits SFT's): no explorer feeds them, so no mode with
            // an explorer runs them.
            self.check(
                config.mode == Mode::Train,
                "mode",
                format!(
                    "algorithm `{}` trains on a dataset (buffer.trainer_input.experience_buffer) with no explorer, so \
                     it runs in mode `train` only, not `{}`; set `mode: train`",
                    config.algorithm.algorithm_type,
                    config.mode.name()
                ),
            );
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
        let lengths = |max_model_len, max_prompt_tokens, max_response_tokens| ModelLengths {
            max_model_len,
            max_prompt_tokens,
            max_response_tokens,
        };
        let lengths = match given {
            (Some(len), Some(prompt), Some(response)) => {
                if prompt + response > len {
                    return Err(self.invalid(
                        "model.max_model_len",
                        format!("max_prompt_tokens ({prompt}) + max_response_tokens ({response}) exceed max_model_len ({len})"),
                    ));
                }
                lengths(len, prompt, response)
            }
            (None, Some(prompt), Some(response)) => lengths(prompt + response, prompt, response),
            (Some(len), None, None) => lengths(len, len / 2, len - len / 2),
            (Some(len), Some(prompt), None) => {
                let prompt = prompt.min(len.saturating_sub(1));
                lengths(len, prompt, len - prompt)
            }
            (Some(len), None, Some(response)) => {
                let response = response.min(len.saturating_sub(1));
                lengths(len, len - response, response)
            }
            (None, _, _) => {
                return Err(self.invalid(
                    "model.max_model_len",
                    "set max_model_len, or both max_prompt_tokens and max_response_tokens",
                ));
            }
        };
        // The file's fields show the derived values in `--dry-run`'s dump; the run reads `resolved`.
        model.max_model_len = Some(lengths.max_model_len);
        model.max_prompt_tokens = Some(lengths.max_prompt_tokens);
        model.max_response_tokens = Some(lengths.max_response_tokens);
        let derived = (model.max_model_len, model.max_prompt_tokens, model.max_response_tokens);
        if derived != given {
            self.notes.push(format!(
                "model lengths derived as Trinity-RFT does: max_model_len {}, max_prompt_tokens {}, max_response_tokens {}",
                lengths.max_model_len, lengths.max_prompt_tokens, lengths.max_response_tokens
            ));
        }
        self.require(lengths.max_model_len >= 2, "model.max_model_len", "must be at least 2")?;
        self.require(lengths.max_response_tokens >= 1, "model.max_response_tokens", "must be at least 1")?;
        self.require(lengths.max_prompt_tokens >= 1, "model.max_prompt_tokens", "must be at least 1")?;
        config.model.resolved = lengths;
        let model = &config.model;
        // Trinity-RFT: a minimum at or above the maximum becomes one token below it.
        let max_response = lengths.max_response_tokens;
        if model.min_response_tokens >= max_response && model.min_response_tokens > 0 {
            let min = max_response.saturating_sub(1);
            self.notes.push(format!(
                "model.min_response_tokens ({}) is set to {min}, below max_response_tokens ({max_response})",
                model.min_response_tokens
            ));
            config.model.min_response_tokens = min;
        }
        let model = &config.model;
        self.check_sampling("model", model.temperature, model.top_p, model.top_k, None);
        self.check(
            model.logprobs == 0,
            "model.logprobs",
            "only 0 is supported: the sampled token's logprob is always returned",
        );
        self.check(
            model.repetition_penalty == 1.0,
            "model.repetition_penalty",
            "a repetition penalty changes what is sampled, and trinity's sampler has none; use 1.0",
        );
        self.check(
            !model.trust_remote_code,
            "model.trust_remote_code",
            "trinity never runs model code shipped with a checkpoint; use false",
        );
        Ok(())
    }

    /// Independent rules for sampling values.
    pub(crate) fn check_sampling(&mut self, at: &str, temperature: f64, top_p: f64, top_k: i64, min_p: Option<f64>) {
        self.check(
            temperature.is_finite() && temperature >= 0.0,
            &format!("{at}.temperature"),
            format!("must be 0 (greedy) or positive, got {temperature}"),
        );
        self.check(top_p > 0.0 && top_p <= 1.0, &format!("{at}.top_p"), format!("must be in (0, 1], got {top_p}"));
        self.check(
            top_k == -1 || top_k >= 1,
            &format!("{at}.top_k"),
            format!("must be -1 (off) or at least 1, got {top_k}"),
        );
        if let Some(min_p) = min_p {
            self.check((0.0..=1.0).contains(&min_p), &format!("{at}.min_p"), format!("must be in [0, 1], got {min_p}"));
        }
    }

    fn resolve_explorer(&mut self, config: &mut Config) {
        let explorer = &config.explorer;
        self.check(explorer.runner_per_model >= 1, "explorer.runner_per_model", "must be at least 1");
        self.check(explorer.max_timeout >= 1, "explorer.max_timeout", "must be at least 1 second");
        self.check(explorer.eval_interval >= 1, "explorer.eval_interval", "must be at least 1");
        // engine_type, engine_num, tensor_parallel_size, gpu_memory_utilization and the vLLM knobs are placement
        // keys: the key walk notes them, and nothing here may refuse them.
        for (name, value) in &explorer.env_vars {
            let key = format!("explorer.env_vars.{name}");
            self.check(
                value.is_string() || value.is_number() || value.is_boolean(),
                &key,
                "must be a string, number or boolean: it becomes an environment variable",
            );
            self.check(
                !name.is_empty() && !name.contains(['=', '\0']),
                &key,
                "is not a valid environment variable name",
            );
        }
        if !explorer.env_vars.is_empty() {
            self.notes.push(
                "explorer.env_vars: set in the environment of `agent_process_workflow` programs, the only workflows \
                 with a process environment; built-in workflows read none and WASM plugins run sandboxed without one"
                    .into(),
            );
        }
        if explorer.bench_on_latest_checkpoint && config.mode != Mode::Bench {
            self.notes.push(format!(
                "explorer.bench_on_latest_checkpoint: only mode `bench` reads it; no effect in mode `{}`",
                config.mode.name()
            ));
        }
        self.one_of(
            "explorer.rollout_model.dtype",
            &explorer.rollout_model.dtype,
            &["bfloat16", "float16", "float32", "bf16", "fp16", "fp32", "auto"],
        );
        self.resolve_auxiliary_models(config);
        for (i, operator) in config.data_processor.experience_pipeline.operators.iter().enumerate() {
            let key = format!("data_processor.experience_pipeline.operators[{i}].name");
            if self.check(!operator.name.is_empty(), &key, "an operator needs a name") {
                let known = self.registered(&key, ComponentKind::Operator, &operator.name);
                self.record(known);
            }
        }
    }

    /// Trinity-RFT's rule for auxiliary models: a model path is required, and the length limits it leaves unset
    /// are the policy's. Names must be unique, since workflows and the API reach the models by name.
    fn resolve_auxiliary_models(&mut self, config: &mut Config) {
        let model = &config.model;
        let mut names = std::collections::BTreeSet::new();
        for (i, aux) in config.explorer.auxiliary_models.iter_mut().enumerate() {
            let key = |field: &str| format!("explorer.auxiliary_models[{i}].{field}");
            self.check(
                !aux.model_path.is_empty(),
                &key("model_path"),
                "an auxiliary model needs model_path (the HF directory or GGUF file of the judge or teacher)",
            );
            aux.max_model_len = aux.max_model_len.or(model.max_model_len);
            aux.max_prompt_tokens = aux.max_prompt_tokens.or(model.max_prompt_tokens);
            aux.max_response_tokens = aux.max_response_tokens.or(model.max_response_tokens);
            // The policy's lengths are resolved (resolve_model runs first), so each is set now.
            aux.resolved = lengths_of(aux.max_model_len, aux.max_prompt_tokens, aux.max_response_tokens)
                .expect("the policy model's lengths are resolved");
            let aux = &*aux;
            self.one_of(&key("dtype"), &aux.dtype, &["bfloat16", "float16", "float32", "bf16", "fp16", "fp32", "auto"]);
            self.check(
                names.insert(aux.name().to_owned()),
                &key("name"),
                format!("another auxiliary model is already called `{}`; give each a distinct name", aux.name()),
            );
        }
    }

    fn resolve_trainer(&mut self, config: &mut Config) {
        let trainer = &mut config.trainer;
        let grad_clip_written = trainer.grad_clip.is_some();
        let grad_clip = trainer.grad_clip.unwrap_or(config.algorithm.optimizer.clip_grad);
        trainer.grad_clip = Some(grad_clip);
        config.algorithm.optimizer.clip_grad = grad_clip;
        let trainer = &config.trainer;
        // Without trainer.grad_clip the value is algorithm.optimizer.clip_grad, already checked there.
        if grad_clip_written {
            self.check(grad_clip > 0.0, "trainer.grad_clip", "must be positive");
        }
        self.one_of("trainer.save_hf_checkpoint", &trainer.save_hf_checkpoint, &["last", "always", "never"]);
        self.one_of("trainer.dtype", &trainer.dtype, &["auto", "bfloat16", "bf16", "float32", "fp32"]);
        if let Some(steps) = trainer.total_steps {
            self.check(steps >= 1, "trainer.total_steps", "must be at least 1");
        }
        // 0 keeps every checkpoint, as in Trinity-RFT 0.6.0 (its new default) and veRL.
        self.resolve_trainer_config(config);
        // Trinity-RFT's `_adjust_token_len_if_needed`: a budget below one full sequence is raised to it.
        let len = config.model.resolved.max_model_len;
        if let Some(budget) = config.trainer.max_token_len_per_gpu
            && budget < len
        {
            config.trainer.max_token_len_per_gpu = Some(len);
            self.notes.push(format!(
                "trainer.max_token_len_per_gpu ({budget}) is raised to model.max_model_len ({len}) so one sequence fits"
            ));
        }
    }
}

/// The typed lengths, when all three are set.
fn lengths_of(len: Option<u32>, prompt: Option<u32>, response: Option<u32>) -> Option<ModelLengths> {
    Some(ModelLengths { max_model_len: len?, max_prompt_tokens: prompt?, max_response_tokens: response? })
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

#[cfg(test)]
mod tests {
    use crate::algorithm::SampleStrategy;
    use crate::model::ModelLengths;
    use crate::testing::{assert_names, loaded, refusal};

    const TASKSET: &str = "buffer:\n  explorer_input:\n    taskset:\n      path: /t.jsonl\n";

    fn config(algorithm: &str, model: &str) -> String {
        format!("algorithm:\n  algorithm_type: grpo\n{algorithm}model:\n  model_path: /m\n{model}{TASKSET}")
    }

    #[test]
    fn the_resolved_views_hold_what_the_resolver_derived() {
        let derived = loaded(&config("", "  max_model_len: 64\n  max_response_tokens: 24\n"));
        let lengths = ModelLengths { max_model_len: 64, max_prompt_tokens: 40, max_response_tokens: 24 };
        assert_eq!(derived.config.model.resolved, lengths);
        // The file's fields show the same derived values (the dump), and nothing is left unset.
        let model = &derived.config.model;
        assert_eq!(
            (model.max_model_len, model.max_prompt_tokens, model.max_response_tokens),
            (Some(64), Some(40), Some(24))
        );
        // No repeat_times anywhere (AnyName's presets set none): 1; the preset names no strategy: Trinity's fallback.
        assert_eq!(derived.config.algorithm.resolved.repeat_times, 1);
        assert_eq!(derived.config.algorithm.resolved.sample_strategy, SampleStrategy::Warmup);
        assert_eq!(derived.config.algorithm.sample_strategy.as_deref(), Some("warmup"));

        let aux = "explorer:\n  auxiliary_models:\n    - model_path: /judge\n      max_response_tokens: 8\n";
        let judged = loaded(&format!("{}{aux}", config("  repeat_times: 3\n", "  max_model_len: 64\n")));
        assert_eq!(judged.config.algorithm.resolved.repeat_times, 3);
        let judge = judged.config.explorer.auxiliary_models[0].resolved;
        assert_eq!(judge, ModelLengths { max_model_len: 64, max_prompt_tokens: 32, max_response_tokens: 8 });
    }

    #[test]
    fn the_sample_strategy_is_parsed_once_with_its_arguments() {
        let staleness = "  sample_strategy: staleness_control\n  sample_strategy_args:\n    max_staleness: 2\n";
        let loaded = loaded(&config(staleness, "  max_model_len: 64\n"));
        assert_eq!(loaded.config.algorithm.resolved.sample_strategy.max_staleness(), Some(2));

        let negative = "  sample_strategy: staleness_control\n  sample_strategy_args:\n    max_staleness: -1\n";
        let error = refusal(&config(negative, "  max_model_len: 64\n"));
        assert_names(&error, "algorithm.sample_strategy_args.max_staleness", &["whole number"]);
        let ratio = "  sample_strategy: mix\n  sample_strategy_args:\n    expert_data_ratio: 1.5\n";
        let error = refusal(&config(ratio, "  max_model_len: 64\n"));
        assert_names(&error, "algorithm.sample_strategy_args.expert_data_ratio", &["between 0 and 1"]);
        // AnyName checks no names, so the enum is what refuses an unknown one, with every accepted name.
        let error = refusal(&config("  sample_strategy: mixed\n", "  max_model_len: 64\n"));
        assert_names(&error, "algorithm.sample_strategy", &["`mixed`", "`default`", "`staleness_control`", "`mix`"]);
    }

    #[test]
    fn one_note_names_the_0_6_0_defaults_a_config_leaves_out() {
        let changed = |text: &str| -> Vec<String> {
            let notes = loaded(text).notes;
            let found: Vec<&String> = notes.iter().filter(|n| n.contains("0.6.0's defaults")).collect();
            assert!(found.len() <= 1, "one line: {found:?}");
            found.first().map(|n| n.split("; ").map(str::to_owned).collect()).unwrap_or_default()
        };
        let all = changed(&config("", "  max_model_len: 64\n"));
        assert_eq!(all.len(), 3, "{all:?}");
        assert!(all[0].ends_with("trainer.trainer_strategy = fsdp2 (0.5.2: fsdp)"), "{all:?}");
        assert_eq!(all[2], "trainer.enable_preview = false (0.5.2: true)");

        let trainer = "trainer:\n  trainer_strategy: fsdp\n  enable_preview: true\n";
        let some = changed(&format!("{}{trainer}", config("", "  max_model_len: 64\n")));
        assert_eq!(some.len(), 1, "{some:?}");
        assert!(
            some[0].ends_with("trainer.max_checkpoints_to_keep = 0, keep all (0.5.2: unset, keep all)"),
            "{some:?}"
        );

        let every = "trainer:\n  trainer_strategy: fsdp2\n  enable_preview: false\n  max_checkpoints_to_keep: 3\n";
        assert!(changed(&format!("{}{every}", config("", "  max_model_len: 64\n"))).is_empty());
    }

    #[test]
    fn a_stage_that_sets_the_trainer_section_leaves_out_what_its_section_does_not_write() {
        let stages = "trainer:\n  trainer_strategy: fsdp\nstages:\n  - stage_name: own\n    trainer:\n      \
                      save_interval: 1\n  - stage_name: inherits\n";
        let loaded = loaded(&format!("{}{stages}", config("", "  max_model_len: 64\n")));
        let note = |i: usize| loaded.stages[i].notes.iter().find(|n| n.contains("0.6.0's defaults")).cloned();
        assert!(note(0).is_some_and(|n| n.contains("trainer_strategy = fsdp2")), "{:?}", note(0));
        assert!(note(1).is_some_and(|n| !n.contains("trainer_strategy")), "{:?}", note(1));
        assert_eq!(loaded.stages[0].config.trainer.trainer_strategy, "fsdp2");
        assert_eq!(loaded.stages[1].config.trainer.trainer_strategy, "fsdp");
    }
}
