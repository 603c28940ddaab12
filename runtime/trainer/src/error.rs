//! The crate's error type: every failure names the row, tensor, file or setting at fault.

use std::path::PathBuf;

/// What went wrong while building, stepping or checkpointing a trainer.
#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    /// A training row is malformed (lengths disagree, no prompt, ...).
    #[error("training row {row}: {problem}")]
    InvalidRow { row: usize, problem: String },

    /// The batch as a whole cannot be trained on.
    #[error("training batch: {0}")]
    InvalidBatch(String),

    /// A setting of the trainer is out of range or inconsistent with the algorithm.
    #[error("trainer setting `{key}`: {problem}")]
    InvalidSetting { key: String, problem: String },

    /// An optimizer checkpoint does not fit the parameters it is loaded into.
    #[error("optimizer state {}: {problem}", path.display())]
    OptimizerState { path: PathBuf, problem: String },

    /// Data-parallel ranks disagree or a collective failed.
    #[error("data parallel: {0}")]
    DataParallel(String),

    /// A collective between the trainer's ranks failed.
    #[error(transparent)]
    Collective(#[from] trinity_collective::CollectiveError),

    /// A libtorch operation failed.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),

    /// The model layer failed.
    #[error(transparent)]
    Model(#[from] trinity_model::ModelError),

    /// An algorithm component failed.
    #[error(transparent)]
    Algorithm(#[from] trinity_algorithm::AlgorithmError),
}

impl TrainerError {
    pub(crate) fn setting(key: impl Into<String>, problem: impl Into<String>) -> Self {
        TrainerError::InvalidSetting { key: key.into(), problem: problem.into() }
    }
}

/// Results of this crate.
pub type Result<T, E = TrainerError> = std::result::Result<T, E>;
