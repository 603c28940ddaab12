//! Helpers for the unit tests of resolution and runnability rules.

use std::path::Path;

use crate::catalog::AnyName;
use crate::error::{ConfigError, ConfigErrors};
use crate::{LoadOptions, Loaded, load_str};

/// Loads `text` as `c.yaml` in `/work`, with every component name registered.
pub(crate) fn load(text: &str) -> Result<Loaded, ConfigErrors> {
    let env = |_: &str| None;
    let options = LoadOptions { overrides: &[], env: &env, catalog: &AnyName, cwd: Path::new("/work") };
    load_str(text, Path::new("c.yaml"), options)
}

/// As [`loaded`], with `env` as the environment.
pub(crate) fn loaded_with_env(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Loaded {
    let options = LoadOptions { overrides: &[], env, catalog: &AnyName, cwd: Path::new("/work") };
    load_str(text, Path::new("c.yaml"), options).unwrap_or_else(|e| panic!("{e}"))
}

/// As [`load`], for configs that must load.
pub(crate) fn loaded(text: &str) -> Loaded {
    load(text).unwrap_or_else(|e| panic!("{e}"))
}

/// The first error of loading `text`, or that of its `check_runnable`, for configs that must fail.
pub(crate) fn refusal(text: &str) -> ConfigError {
    match load(text) {
        Err(errors) => errors.into_vec().remove(0),
        Ok(loaded) => match loaded.check_runnable() {
            Err(error) => error,
            Ok(()) => panic!("accepted:\n{text}"),
        },
    }
}

/// Asserts that `error` names `key` and says each of `words`.
#[track_caller]
pub(crate) fn assert_names(error: &ConfigError, key: &str, words: &[&str]) {
    let text = error.to_string();
    assert!(text.contains(&format!("`{key}`")), "expected key `{key}` in: {text}");
    for word in words {
        assert!(text.contains(word), "expected `{word}` in: {text}");
    }
}
