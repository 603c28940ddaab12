//! What the studio asks of the binary that serves it.
//!
//! Config validation must be exactly `trinity run --dry-run` (the same registered names, plugins and runnability
//! checks), the plugins page exactly `trinity plugins list`, and a response's tokens must be decoded by the
//! tokenizer the run used (HF directory or GGUF file). All three live in crates that link libtorch and wasmtime;
//! the studio stays free of them, so the binary implements [`Host`] and hands it over, and the studio's own tests
//! run on a small host of their own.

use std::path::Path;

use serde::Serialize;
use trinity_config::{ConfigError, Origin};

/// A problem with a config, placed at its line when it has one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Problem {
    pub message: String,
    /// 1-based line in the validated text; `None` for a problem with the whole file or a `--set`.
    pub line: Option<usize>,
    pub column: Option<usize>,
}

impl Problem {
    /// A problem without a position.
    pub fn general(message: impl Into<String>) -> Problem {
        Problem { message: message.into(), line: None, column: None }
    }

    /// A config error, at the position it names.
    pub fn from_config_error(error: &ConfigError) -> Problem {
        let position = match error.origin() {
            Some(Origin::File { position: Some(position), .. }) => Some(*position),
            _ => None,
        };
        Problem { message: error.to_string(), line: position.map(|p| p.line), column: position.map(|p| p.column) }
    }
}

/// The result of validating a config.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Validation {
    /// Empty when the config would run.
    pub problems: Vec<Problem>,
    /// Remarks that are not errors (placement keys mapped, values corrected), as the run logs them.
    pub notes: Vec<String>,
    /// The resolved config with every default, as `--dry-run` prints it; `None` when it did not resolve.
    pub resolved: Option<String>,
}

/// One row of `trinity plugins list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PluginRow {
    pub kind: String,
    pub name: String,
    pub version: String,
    pub origin: String,
}

/// The binary's side of the studio. Calls may block (they read files, load tokenizers): the server runs them on
/// blocking threads.
pub trait Host: Send + Sync + 'static {
    /// Validates `text` as `trinity run --config <path> --dry-run` would (relative paths resolve against the
    /// studio's working directory; `path` names the file in messages).
    fn validate(&self, text: &str, path: &Path) -> Validation;

    /// What `trinity plugins list` shows.
    fn plugins(&self) -> Vec<PluginRow>;

    /// The text of each token id under the tokenizer of `model_path` (an HF directory or a GGUF file).
    fn token_texts(&self, model_path: &Path, ids: &[u32]) -> Result<Vec<String>, String>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use trinity_config::yaml::Position;

    #[test]
    fn problems_carry_the_line_of_their_error() {
        let origin = Origin::File { path: "c.yaml".into(), position: Some(Position { line: 4, column: 3 }) };
        let error =
            ConfigError::UnknownKey { origin, key: "algorithm.algoritm_type".into(), suggestion: Some("x".into()) };
        let problem = Problem::from_config_error(&error);
        assert_eq!((problem.line, problem.column), (Some(4), Some(3)));
        assert!(problem.message.contains("did you mean"), "{}", problem.message);
        let error = ConfigError::Override { arg: "a".into(), message: "no `=`".into() };
        assert_eq!(Problem::from_config_error(&error).line, None);
    }
}
