//! The crate's error type: every failure names the operation, the key, the rank or the variable at fault.

use std::time::Duration;

/// What went wrong in a store, a process group, the launch environment or a weight transfer.
#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    /// c10d or Gloo raised an error (a peer closed its connection, a tensor was rejected, ...).
    #[error("{op}: {message}")]
    Backend { op: &'static str, message: String },

    /// An operation did not finish within its timeout.
    #[error("{op} timed out after {:.1} s{}", timeout.as_secs_f64(), detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    Timeout { op: &'static str, timeout: Duration, detail: Option<String> },

    /// The processes that meet to form a group disagree (world size, duplicate rank, an aborted peer).
    #[error("rendezvous of rank {rank}: {problem}")]
    Rendezvous { rank: usize, problem: String },

    /// An earlier collective of this group failed; the group cannot be trusted and must be rebuilt.
    #[error("the process group failed earlier ({0}); build a new group")]
    Failed(String),

    /// An argument is out of range or a tensor is unsuitable.
    #[error("{0}")]
    InvalidArgument(String),

    /// torchrun's environment is set partially or wrongly.
    #[error("environment variable {variable}: {problem}")]
    Environment { variable: &'static str, problem: String },

    /// A launched child process failed or could not be started.
    #[error("launch: {0}")]
    Launch(String),

    /// Tensors on a CUDA device need NCCL, and this build has none (see `transport`).
    #[error(
        "{what} holds CUDA tensors, and this trinity was built without NCCL: run `cargo xtask setup --cuda`, then \
         rebuild with `--features cuda` (`cargo build --release -p trinity --features cuda`; docs/cuda.md). CUDA \
         tensors are not sent through host memory instead, which would copy every bucket twice"
    )]
    NeedsCudaBuild { what: String },

    /// A weight transfer's peers disagree on what is sent.
    #[error("weight sync: {0}")]
    WeightSync(String),

    /// A libtorch operation on the Rust side failed.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),

    /// An operating-system call failed.
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
}

impl CollectiveError {
    /// A backend error, or a timeout when the message says c10d or Gloo gave up waiting.
    pub(crate) fn from_backend(op: &'static str, message: String, timeout: Duration) -> Self {
        let lower = message.to_ascii_lowercase();
        if lower.contains("timed out") || lower.contains("timeout") {
            CollectiveError::Timeout { op, timeout, detail: Some(message) }
        } else {
            CollectiveError::Backend { op, message }
        }
    }

    /// Whether this is a timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self, CollectiveError::Timeout { .. })
    }
}

/// Results of this crate.
pub type Result<T, E = CollectiveError> = std::result::Result<T, E>;
