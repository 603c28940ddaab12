//! Monitor errors.

use std::path::PathBuf;

/// Why metrics could not be recorded.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("unknown monitor_type `{0}` (jsonl, csv, tensorboard, wandb, mlflow, swanlab)")]
    UnknownMonitor(String),
    #[error("monitor `{monitor}`: {message}")]
    Hosted { monitor: &'static str, message: String },
    #[error("{path}: existing metrics file is not valid: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

impl MonitorError {
    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> MonitorError + '_ {
        move |source| MonitorError::Io { path: path.to_owned(), source }
    }
}
