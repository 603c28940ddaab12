//! Trinity-RFT compatible configuration for trinity.
//!
//! Loading is a pipeline over one JSON tree, each stage with positions for its errors:
//! YAML text → tree with key positions ([`yaml`]) → `--set` overrides ([`overrides`]) → `${oc.env:...}`
//! ([`interpolate`]) → unknown and unsupported keys against the generated JSON Schema ([`keys`]) → typed
//! [`Config`] (serde, with the key path of any type error) → resolution ([`resolve`]): defaults derived,
//! presets applied through a [`Catalog`], cross-field rules checked; each of `stages` resolved on its own
//! ([`stages`]). [`Loaded::check_runnable`] then refuses what the run cannot do, and [`steps`] says what decides
//! the train steps of mode `train`.
//!
//! Loading reports every independent mistake at once ([`ConfigErrors`]): YAML syntax, an empty file, `--set`
//! arguments and interpolations stop it at the first error (nothing after them has a tree to read), but every
//! refused key and every value of the wrong type is reported; each is then dropped from the tree, so its default
//! applies and resolution still runs to report the rules the rest of the config breaks. A rule error about a key
//! already reported (or one above or below it) is a consequence of that default and is not repeated. Resolution's
//! own rules are collected the same way ([`resolve`] says which stop it).
//!
//! This crate has no heavy dependencies on purpose: the CLI, the engines and the tests of this crate all
//! build without libtorch or wasmtime.

// Config errors carry the file, position, key and suggestions users need; they are built once per run, so
// their size never matters and boxing them would only add noise.
#![allow(clippy::result_large_err)]

pub mod algorithm;
pub mod buffer;
pub mod catalog;
pub mod category;
pub mod config;
mod corrections;
pub mod error;
pub mod explorer;
pub mod external;
pub mod interpolate;
pub mod keys;
pub mod model;
pub mod monitor;
pub mod overrides;
pub mod resolve;
mod resolve_buffer;
mod resolve_external;
mod resolve_fsdp;
mod resolve_lora;
mod runnable;
pub mod schema;
pub mod source;
pub mod stages;
pub mod steps;
pub mod synchronizer;
#[cfg(test)]
mod testing;
pub mod trainer;
pub mod verl;
pub mod verl_category;
mod verl_resolve;
pub mod yaml;

use std::path::{Path, PathBuf};

use serde_json::Value;

pub use crate::catalog::{Catalog, ComponentKind, ExperienceSchema, Preset};
pub use crate::config::{Config, Mode};
pub use crate::error::{ConfigError, ConfigErrors, Origin};
pub use crate::interpolate::EnvLookup;
pub use crate::resolve::Note;
pub use crate::runnable::fixed_size_train_batch;
pub use crate::source::Source;
pub use crate::stages::Stage;
pub use crate::steps::{RowsOf, TrainSteps};

use crate::interpolate::{InterpolationError, interpolate_tree};
use crate::keys::KeyProblem;
use crate::overrides::Override;
use crate::resolve::Resolver;
use crate::source::covers;

/// A resolved configuration and what is worth telling the user about it.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The top level, resolved. With `stages`, only the stages run (see [`Loaded::stages`]).
    pub config: Config,
    /// Remarks that are not errors (vLLM knobs with no effect, mapped values); log them at start.
    pub notes: Vec<Note>,
    pub source: Source,
    /// Each stage of `stages`, in order, resolved on its own; empty without `stages`.
    pub stages: Vec<Stage>,
    /// The config as written (overrides and interpolations applied, nothing derived): stages are built from it.
    raw: Config,
    /// The directory relative paths were resolved against.
    cwd: PathBuf,
}

/// Everything loading needs besides the text.
#[derive(Clone, Copy)]
pub struct LoadOptions<'a> {
    /// `--set KEY.PATH=VALUE` arguments, applied in order.
    pub overrides: &'a [String],
    /// Environment lookup for `${oc.env:VAR}`.
    pub env: EnvLookup<'a>,
    /// Registered components, for presets, default arguments and name checks.
    pub catalog: &'a dyn Catalog,
    /// Directory relative paths are resolved against.
    pub cwd: &'a Path,
}

impl std::fmt::Debug for LoadOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions")
            .field("overrides", &self.overrides)
            .field("cwd", &self.cwd)
            .finish_non_exhaustive()
    }
}

/// Reads, interpolates, checks and resolves a config file.
pub fn load_file(path: &Path, options: LoadOptions<'_>) -> Result<Loaded, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
    load_str(&text, path, options)
}

/// As [`load_file`], with the text already read; `path` is only used in messages.
pub fn load_str(text: &str, path: &Path, options: LoadOptions<'_>) -> Result<Loaded, ConfigErrors> {
    let file_origin = || Origin::File { path: path.to_owned(), position: None };
    let (mut tree, positions) = yaml::parse(text).map_err(|error| ConfigError::Syntax {
        origin: Origin::File { path: path.to_owned(), position: error.position },
        message: error.message,
    })?;
    let mut source = Source { path: path.to_owned(), positions, overrides: Vec::new() };
    if tree.is_null() && options.overrides.is_empty() {
        return Err(ConfigError::Empty { origin: file_origin() }.into());
    }
    if !tree.is_object() && !tree.is_null() {
        return Err(ConfigError::NotAMapping { origin: file_origin(), found: json_kind(&tree) }.into());
    }
    for arg in options.overrides {
        let set = Override::parse(arg)?;
        set.apply(&mut tree)?;
        source.overrides.push((set.key.clone(), set.arg.clone()));
    }
    interpolate_tree(&mut tree, options.env).map_err(|error| match error {
        InterpolationError::MissingEnv { key, var } => {
            ConfigError::MissingEnv { origin: source.origin(&key), key, var }
        }
        InterpolationError::Invalid { key, message } => {
            ConfigError::Interpolation { origin: source.origin(&key), key, message }
        }
    })?;
    let mut errors = Vec::new();
    let key_notes = match keys::check(&schema::json_schema(), &tree) {
        Ok(notes) => notes,
        Err(problems) => {
            for problem in problems {
                let error = match problem {
                    KeyProblem::Unknown { key, suggestion } => {
                        ConfigError::UnknownKey { origin: source.origin(&key), key, suggestion }
                    }
                    KeyProblem::Unsupported { key, reason } => {
                        ConfigError::Unsupported { origin: source.origin(&key), key, reason }
                    }
                };
                if let Some(key) = error.key() {
                    yaml::remove(&mut tree, key);
                }
                errors.push(error);
            }
            Vec::new()
        }
    };
    let Some(mut config) = typed(tree, &source, &mut errors) else {
        // `typed` gives up only after recording the error it could not get past, so the list is not empty.
        return Err(ConfigErrors::new(errors).expect("a tree that does not deserialize has a type error"));
    };
    let raw = config.clone();
    let mut resolver = Resolver::new(&source, options.catalog, options.cwd, stages::Scope::top());
    resolver.notes = key_notes.iter().map(ToString::to_string).collect();
    let resolved = resolver.resolve(&mut config);
    let notes = resolver.notes;
    if let Err(rule_errors) = resolved {
        // What the removed keys' defaults break is not the user's mistake; the removal already has its error.
        let reported: Vec<String> = errors.iter().filter_map(|e| e.key().map(str::to_owned)).collect();
        let independent = |error: &ConfigError| {
            error.key().is_none_or(|key| !reported.iter().any(|r| covers(r, key) || covers(key, r)))
        };
        errors.extend(rule_errors.into_iter().filter(independent));
    }
    if let Some(errors) = ConfigErrors::new(errors) {
        return Err(errors);
    }
    Resolver::new(&source, options.catalog, options.cwd, stages::Scope::top())
        .check_external_env(&config, options.env)?;
    let stages = stages::resolve_stages(&raw, &source, options.catalog, options.cwd)?;
    for stage in &stages {
        let resolver = Resolver::new(&source, options.catalog, options.cwd, stage.scope.clone());
        resolver.check_external_env(&stage.config, options.env)?;
    }
    Ok(Loaded { config, notes, source, stages, raw, cwd: options.cwd.to_owned() })
}

/// The typed config of `tree`. A value of the wrong type is reported, removed (so its default applies) and the
/// rest deserialized again, until the tree deserializes; `None` when a removal cannot make progress (an error at
/// the top level, at a list item, or at a key already reported), by which point its error is in `errors`.
fn typed(mut tree: Value, source: &Source, errors: &mut Vec<ConfigError>) -> Option<Config> {
    loop {
        let error = match serde_path_to_error::deserialize::<_, Config>(tree.clone()) {
            Ok(config) => return Some(config),
            Err(error) => error,
        };
        let key = error.path().to_string();
        if errors.iter().any(|reported| reported.key() == Some(key.as_str())) {
            return None;
        }
        let message = error.into_inner().to_string();
        errors.push(ConfigError::Type { origin: source.origin(&key), message, key: key.clone() });
        if key == "." || !yaml::remove(&mut tree, &key) {
            return None;
        }
    }
}

/// The `plugins:` list of a config file, read before the config is resolved: plugins register the names that
/// resolution then checks (`default_workflow_type`, `default_reward_fn_type`, pipeline operators). `--set` and
/// `${oc.env:...}` apply as for [`load_file`].
pub fn plugin_entries(path: &Path, options: LoadOptions<'_>) -> Result<Vec<config::PluginSpec>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
    let (mut tree, positions) = yaml::parse(&text).map_err(|error| ConfigError::Syntax {
        origin: Origin::File { path: path.to_owned(), position: error.position },
        message: error.message,
    })?;
    let mut source = Source { path: path.to_owned(), positions, overrides: Vec::new() };
    for arg in options.overrides {
        let set = Override::parse(arg)?;
        set.apply(&mut tree)?;
        source.overrides.push((set.key.clone(), set.arg.clone()));
    }
    let Some(plugins) = tree.get_mut("plugins").map(Value::take) else {
        return Ok(Vec::new());
    };
    let mut plugins = serde_json::json!({ "plugins": plugins });
    interpolate_tree(&mut plugins, options.env).map_err(|error| match error {
        InterpolationError::MissingEnv { key, var } => {
            ConfigError::MissingEnv { origin: source.origin(&key), key, var }
        }
        InterpolationError::Invalid { key, message } => {
            ConfigError::Interpolation { origin: source.origin(&key), key, message }
        }
    })?;
    #[derive(serde::Deserialize)]
    struct Plugins {
        plugins: Vec<config::PluginEntry>,
    }
    let parsed: Plugins = serde_path_to_error::deserialize(plugins).map_err(|error| {
        let key = error.path().to_string();
        ConfigError::Type { origin: source.origin(&key), message: error.into_inner().to_string(), key }
    })?;
    Ok(parsed
        .plugins
        .iter()
        .map(|entry| {
            let mut spec = entry.spec();
            for path in std::iter::once(&mut spec.path).chain(spec.allow_dir.as_mut()) {
                let absolute = options.cwd.join(&*path);
                *path = absolute.display().to_string();
            }
            spec
        })
        .collect())
}

impl Config {
    /// The resolved config as YAML, for `--dry-run`.
    pub fn to_yaml(&self) -> String {
        let tree = serde_json::to_value(self).unwrap_or(Value::Null);
        yaml::to_yaml(&tree)
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use crate::ConfigError;
    use crate::testing::load;

    /// (line, key) of each error of loading `text`.
    fn errors_at(text: &str) -> Vec<(usize, String)> {
        let errors = load(text).err().unwrap_or_else(|| panic!("accepted:\n{text}"));
        errors
            .iter()
            .map(|error| {
                let line = match error.origin() {
                    Some(crate::Origin::File { position: Some(p), .. }) => p.line,
                    other => panic!("{error}: no line ({other:?})"),
                };
                (line, error.key().unwrap_or_default().to_owned())
            })
            .collect()
    }

    #[test]
    fn three_unrelated_mistakes_give_three_errors_at_their_lines() {
        let text = "project: p\n\
                    algoritm:\n\
                    \x20 algorithm_type: grpo\n\
                    model:\n\
                    \x20 model_path: /m\n\
                    \x20 max_model_len: 64\n\
                    buffer:\n\
                    \x20 batch_size: two\n\
                    \x20 explorer_input:\n\
                    \x20   taskset:\n\
                    \x20     path: /t.jsonl\n\
                    synchronizer:\n\
                    \x20 sync_timeout: 0\n";
        assert_eq!(
            errors_at(text),
            [
                (2, "algoritm".to_owned()),
                (8, "buffer.batch_size".to_owned()),
                (13, "synchronizer.sync_timeout".to_owned())
            ]
        );
        let errors = load(text).unwrap_err();
        assert!(
            matches!(&errors.as_slice()[0], ConfigError::UnknownKey { suggestion: Some(s), .. } if s == "algorithm")
        );
        assert!(matches!(errors.as_slice()[1], ConfigError::Type { .. }), "{errors}");
        let shown = errors.to_string();
        assert_eq!(shown.lines().count(), 3, "one line per error:\n{shown}");
        assert!(shown.lines().all(|line| line.starts_with("c.yaml:")), "{shown}");
    }

    #[test]
    fn every_wrong_type_and_every_broken_rule_is_reported() {
        let text = "model:\n  model_path: /m\n  max_model_len: 64\n  temperature: hot\n  top_p: 2\n\
                    buffer:\n  total_epochs: 0\n  explorer_input:\n    taskset:\n      path: /t.jsonl\n\
                    \x20     repeat_times: many\n      rollout_args:\n        top_k: 0\n\
                    explorer:\n  eval_interval: 0\n";
        let keys: Vec<String> = errors_at(text).into_iter().map(|(_, key)| key).collect();
        assert_eq!(
            keys,
            [
                "model.temperature",
                "buffer.explorer_input.taskset.repeat_times",
                "model.top_p",
                "buffer.total_epochs",
                "buffer.explorer_input.taskset.rollout_args.top_k",
                "explorer.eval_interval",
            ]
        );
    }

    #[test]
    fn what_a_removed_value_breaks_is_not_reported_again() {
        // `max_model_len` of the wrong type is dropped; resolution then misses it, which is the same mistake.
        let text = "model:\n  model_path: /m\n  max_model_len: long\nbuffer:\n  explorer_input:\n    taskset:\n      \
                    path: /t.jsonl\n";
        assert_eq!(errors_at(text), [(3, "model.max_model_len".to_owned())]);
        // A rule later rules read stops resolution: a zero repeat_times is one error, not one per taskset.
        let text = "algorithm:\n  repeat_times: 0\nmodel:\n  model_path: /m\n  max_model_len: 64\nbuffer:\n  \
                    explorer_input:\n    taskset:\n      path: /t.jsonl\n";
        assert_eq!(errors_at(text), [(2, "algorithm.repeat_times".to_owned())]);
    }
}
