//! Plugin errors: each names the plugin (its name once known, else its file) and what went wrong.

use std::path::PathBuf;

/// Why a plugin could not be loaded, registered or called.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("plugin {path}: cannot read the file: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error(
        "plugin {path}: not a WebAssembly component (build it with `cargo build --target wasm32-wasip2`): {message}"
    )]
    NotAComponent { path: PathBuf, message: String },
    #[error(
        "plugin {path}: built against trinity:plugin@{found}, but this trinity hosts trinity:plugin@{hosted} \
         (compatible: {compatible}); rebuild the plugin with a trinity-plugin-sdk for {compatible}"
    )]
    IncompatibleVersion { path: PathBuf, found: String, hosted: &'static str, compatible: &'static str },
    #[error(
        "plugin {path}: not a trinity plugin: it exports none of trinity:plugin/reward, trinity:plugin/workflow, \
         trinity:plugin/operator (exports: {exports})"
    )]
    NotAPlugin { path: PathBuf, exports: String },
    #[error("plugin {path}: cannot be linked: {message}")]
    Link { path: PathBuf, message: String },
    #[error("plugin {path}: declares kind {declared} but exports the {exported} interface")]
    KindMismatch { path: PathBuf, declared: &'static str, exported: &'static str },
    #[error("plugin {path}: invalid metadata: {message}")]
    BadInfo { path: PathBuf, message: String },
    #[error("plugin {path}: cannot grant directory {dir}: {message}")]
    Grant { path: PathBuf, dir: PathBuf, message: String },
    #[error("plugin `{plugin}`: {kind} `{plugin}` cannot be registered: {message}")]
    Register { plugin: String, kind: &'static str, message: String },
    #[error("plugin `{plugin}`: ran past its {seconds} s deadline and was stopped")]
    Deadline { plugin: String, seconds: f64 },
    #[error("plugin `{plugin}`: exceeded its memory limit of {limit_mib} MiB: {message}")]
    Memory { plugin: String, limit_mib: u64, message: String },
    #[error("plugin `{plugin}`: exceeded its model budget: {message}")]
    ModelBudget { plugin: String, message: String },
    #[error(
        "plugin `{plugin}`: returned {returned} experiences, but made {turns} model turn(s) for repeat_times \
         {repeat_times}: at most {limit} are accepted (one per turn, or per rollout)"
    )]
    TooManyExperiences { plugin: String, returned: usize, turns: usize, repeat_times: u32, limit: usize },
    #[error("plugin `{plugin}`: trapped: {message}")]
    Trap { plugin: String, message: String },
    #[error("plugin `{plugin}`: returned an error: {message}")]
    Guest { plugin: String, message: String },
    #[error("plugin `{plugin}`: invalid output: {message}")]
    Output { plugin: String, message: String },
    #[error("the plugin engine cannot start: {message}")]
    Engine { message: String },
}
