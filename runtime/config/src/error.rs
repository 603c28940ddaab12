//! Configuration errors. Each names the file, the position where known, and the key path; loading returns all
//! the independent ones it finds at once ([`ConfigErrors`]), so a config is fixed in one edit, not one per run.

use std::fmt;
use std::path::PathBuf;

use crate::yaml::Position;

/// Where a value came from: a file (with a position when known) or a `--set` override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A config file.
    File { path: PathBuf, position: Option<Position> },
    /// A `--set KEY=VALUE` override on the command line.
    Override(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { path, position: Some(p) } => write!(f, "{}:{}:{}", path.display(), p.line, p.column),
            Origin::File { path, position: None } => write!(f, "{}", path.display()),
            Origin::Override(arg) => write!(f, "--set {arg}"),
        }
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{origin}: invalid YAML: {message}")]
    Syntax { origin: Origin, message: String },
    #[error("{origin}: the config is empty; it needs at least `model.model_path` and a taskset")]
    Empty { origin: Origin },
    #[error("{origin}: the top level of a config must be a mapping of keys, found {found}")]
    NotAMapping { origin: Origin, found: &'static str },
    #[error("{origin}: unknown key `{key}`{}", suggestion_text(.suggestion))]
    UnknownKey { origin: Origin, key: String, suggestion: Option<String> },
    #[error("{origin}: `{key}` cannot be honoured by trinity: {reason}")]
    Unsupported { origin: Origin, key: String, reason: String },
    #[error("{origin}: `{key}`: {message}")]
    Type { origin: Origin, key: String, message: String },
    #[error("{origin}: `{key}`: environment variable `{var}` is not set and the interpolation gives no default")]
    MissingEnv { origin: Origin, key: String, var: String },
    #[error("{origin}: `{key}`: {message}")]
    Interpolation { origin: Origin, key: String, message: String },
    #[error("--set {arg}: {message}")]
    Override { arg: String, message: String },
    #[error("{origin}: `{key}`: {message}")]
    Invalid { origin: Origin, key: String, message: String },
    #[error(
        "{origin}: `{key}`: unknown {kind} `{name}`{}; registered: {}{}",
        suggestion_text(.suggestion),
        available.join(", "),
        note_text(.note)
    )]
    UnknownName {
        origin: Origin,
        key: String,
        kind: &'static str,
        name: String,
        suggestion: Option<String>,
        available: Vec<String>,
        /// What else was asked about the name (see `Catalog::unknown_note`).
        note: Option<String>,
    },
    #[error(
        "{origin}: `{key}`: {kind} `{name}` is a Trinity-RFT {kind} that needs {needs}; trinity cannot run it — {}{}",
        bring_text(kind),
        note_text(.note)
    )]
    MissingComponent {
        origin: Origin,
        key: String,
        kind: &'static str,
        name: String,
        needs: String,
        /// What else was asked about the name (see `Catalog::unknown_note`).
        note: Option<String>,
    },
    #[error("{origin}: `{key}`: {message}")]
    NotRunnable { origin: Origin, key: String, message: String },
}

impl ConfigError {
    /// Where the error points (file and position, or a `--set` argument); `None` for errors about the whole file
    /// (it cannot be read) or a malformed `--set` argument. Editors use it to mark the line.
    pub fn origin(&self) -> Option<&Origin> {
        match self {
            ConfigError::Read { .. } | ConfigError::Override { .. } => None,
            ConfigError::Syntax { origin, .. }
            | ConfigError::Empty { origin }
            | ConfigError::NotAMapping { origin, .. }
            | ConfigError::UnknownKey { origin, .. }
            | ConfigError::Unsupported { origin, .. }
            | ConfigError::Type { origin, .. }
            | ConfigError::MissingEnv { origin, .. }
            | ConfigError::Interpolation { origin, .. }
            | ConfigError::Invalid { origin, .. }
            | ConfigError::UnknownName { origin, .. }
            | ConfigError::MissingComponent { origin, .. }
            | ConfigError::NotRunnable { origin, .. } => Some(origin),
        }
    }
    /// The key path the error is about; `None` for errors about the whole file or a malformed `--set`.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::UnknownKey { key, .. }
            | ConfigError::Unsupported { key, .. }
            | ConfigError::Type { key, .. }
            | ConfigError::MissingEnv { key, .. }
            | ConfigError::Interpolation { key, .. }
            | ConfigError::Invalid { key, .. }
            | ConfigError::UnknownName { key, .. }
            | ConfigError::MissingComponent { key, .. }
            | ConfigError::NotRunnable { key, .. } => Some(key),
            ConfigError::Read { .. }
            | ConfigError::Syntax { .. }
            | ConfigError::Empty { .. }
            | ConfigError::NotAMapping { .. }
            | ConfigError::Override { .. } => None,
        }
    }
}

/// Every error loading found in one config, in the order the pipeline met them (keys, types, resolution rules);
/// never empty. Displayed one error per line, each with its file, line and key.
#[derive(Debug)]
pub struct ConfigErrors(Vec<ConfigError>);

impl ConfigErrors {
    /// `None` for an empty list: a load with no errors is not a failure.
    pub fn new(errors: Vec<ConfigError>) -> Option<ConfigErrors> {
        (!errors.is_empty()).then_some(ConfigErrors(errors))
    }

    /// The first error met, the one a loader that stopped at the first would have given.
    pub fn first(&self) -> &ConfigError {
        // The constructor refuses an empty list, so there is always a first error.
        &self.0[0]
    }

    pub fn as_slice(&self) -> &[ConfigError] {
        &self.0
    }

    pub fn iter(&self) -> std::slice::Iter<'_, ConfigError> {
        self.0.iter()
    }

    pub fn into_vec(self) -> Vec<ConfigError> {
        self.0
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(error: ConfigError) -> ConfigErrors {
        ConfigErrors(vec![error])
    }
}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl IntoIterator for ConfigErrors {
    type Item = ConfigError;
    type IntoIter = std::vec::IntoIter<ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

fn bring_text(kind: &str) -> String {
    match kind {
        "workflow" => crate::external::HOW_TO_BRING.to_owned(),
        "reward function" => "bring it as a WASM reward plugin (`cargo xtask new-plugin --kind reward`, then list it \
                               under `plugins:`)"
            .to_owned(),
        "operator" => {
            "bring it as a WASM operator plugin (`cargo xtask new-plugin --kind operator`, then list it under \
             `plugins:`)"
                .to_owned()
        }
        _ => "bring it as an algorithm library (`cargo xtask new-algorithm NAME`, then list it under `plugins:`)"
            .to_owned(),
    }
}

fn note_text(note: &Option<String>) -> String {
    note.as_ref().map(|note| format!("; {note}")).unwrap_or_default()
}

fn suggestion_text(suggestion: &Option<String>) -> String {
    match suggestion {
        Some(s) => format!(" (did you mean `{s}`?)"),
        None => String::new(),
    }
}

/// The closest candidate to `wanted`, if one is close enough to be a likely typo.
pub fn closest<'a>(wanted: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(wanted, c), c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let keys = ["algorithm_type", "repeat_times", "optimizer"];
        assert_eq!(closest("algoritm_type", keys).as_deref(), Some("algorithm_type"));
        assert_eq!(closest("repeat_time", keys).as_deref(), Some("repeat_times"));
        assert_eq!(closest("zzz", keys), None);
    }

    #[test]
    fn origin_shows_file_line_and_column() {
        let origin = Origin::File { path: "x.yaml".into(), position: Some(Position { line: 3, column: 5 }) };
        assert_eq!(origin.to_string(), "x.yaml:3:5");
        assert_eq!(Origin::Override("a.b=1".into()).to_string(), "--set a.b=1");
    }

    #[test]
    fn a_list_of_errors_shows_one_per_line_and_is_never_empty() {
        assert!(ConfigErrors::new(Vec::new()).is_none());
        let at = |line| Origin::File { path: "x.yaml".into(), position: Some(Position { line, column: 1 }) };
        let errors = ConfigErrors::new(vec![
            ConfigError::UnknownKey { origin: at(2), key: "a".into(), suggestion: None },
            ConfigError::Invalid { origin: at(9), key: "b.c".into(), message: "must be at least 1".into() },
        ])
        .unwrap();
        assert_eq!(errors.to_string(), "x.yaml:2:1: unknown key `a`\nx.yaml:9:1: `b.c`: must be at least 1");
        assert_eq!(errors.first().key(), Some("a"));
        assert_eq!(errors.iter().filter_map(ConfigError::key).collect::<Vec<_>>(), ["a", "b.c"]);
    }

    #[test]
    fn errors_give_their_origin_except_whole_file_ones() {
        let origin = Origin::File { path: "x.yaml".into(), position: Some(Position { line: 7, column: 3 }) };
        let error = ConfigError::UnknownKey { origin: origin.clone(), key: "a".into(), suggestion: None };
        assert_eq!(error.origin(), Some(&origin));
        let error = ConfigError::Override { arg: "a=1".into(), message: "bad".into() };
        assert_eq!(error.origin(), None);
    }
}
