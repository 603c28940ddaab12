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
pub use crate::error::{ConfigError, Origin};
pub use crate::interpolate::EnvLookup;
pub use crate::resolve::Note;
pub use crate::source::Source;
pub use crate::stages::Stage;
pub use crate::steps::{RowsOf, TrainSteps};

use crate::interpolate::{InterpolationError, interpolate_tree};
use crate::keys::KeyProblem;
use crate::overrides::Override;
use crate::resolve::Resolver;

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
pub fn load_file(path: &Path, options: LoadOptions<'_>) -> Result<Loaded, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
    load_str(&text, path, options)
}

/// As [`load_file`], with the text already read; `path` is only used in messages.
pub fn load_str(text: &str, path: &Path, options: LoadOptions<'_>) -> Result<Loaded, ConfigError> {
    let file_origin = || Origin::File { path: path.to_owned(), position: None };
    let (mut tree, positions) = yaml::parse(text).map_err(|error| ConfigError::Syntax {
        origin: Origin::File { path: path.to_owned(), position: error.position },
        message: error.message,
    })?;
    let mut source = Source { path: path.to_owned(), positions, overrides: Vec::new() };
    if tree.is_null() && options.overrides.is_empty() {
        return Err(ConfigError::Empty { origin: file_origin() });
    }
    if !tree.is_object() && !tree.is_null() {
        return Err(ConfigError::NotAMapping { origin: file_origin(), found: json_kind(&tree) });
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
    let key_notes = match keys::check(&schema::json_schema(), &tree) {
        Err(KeyProblem::Unknown { key, suggestion }) => {
            return Err(ConfigError::UnknownKey { origin: source.origin(&key), key, suggestion });
        }
        Err(KeyProblem::Unsupported { key, reason }) => {
            return Err(ConfigError::Unsupported { origin: source.origin(&key), key, reason });
        }
        Ok(notes) => notes,
    };
    let mut config: Config = serde_path_to_error::deserialize(tree).map_err(|error| {
        let key = error.path().to_string();
        ConfigError::Type { origin: source.origin(&key), message: error.into_inner().to_string(), key }
    })?;
    let raw = config.clone();
    let mut resolver = Resolver {
        source: &source,
        catalog: options.catalog,
        cwd: options.cwd,
        scope: stages::Scope::top(),
        notes: key_notes.iter().map(ToString::to_string).collect(),
    };
    resolver.resolve(&mut config)?;
    let notes = resolver.notes;
    let stages = stages::resolve_stages(&raw, &source, options.catalog, options.cwd)?;
    Ok(Loaded { config, notes, source, stages, raw, cwd: options.cwd.to_owned() })
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
