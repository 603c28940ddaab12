//! Errors of the RFT loop; each names the phase and what failed.

#[derive(Debug, thiserror::Error)]
pub enum RftError {
    #[error("model {path}: {source}")]
    Model { path: String, source: trinity_model::ModelError },
    #[error("generation engine: {0}")]
    Engine(#[from] trinity_engine::EngineError),
    #[error("trainer: {0}")]
    Trainer(#[from] trinity_trainer::TrainerError),
    #[error("algorithm: {0}")]
    Algorithm(#[from] trinity_algorithm::AlgorithmError),
    #[error("buffer: {0}")]
    Buffer(#[from] trinity_buffer::BufferError),
    #[error("{0}")]
    Replay(#[from] trinity_buffer::ReplayConfigError),
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] trinity_checkpoint::CheckpointError),
    #[error("monitor: {0}")]
    Monitor(#[from] trinity_monitor::MonitorError),
    #[error("experience pipeline: {0}")]
    Pipeline(String),
    #[error("explore step {step}: every task failed; first failure: {first}")]
    AllTasksFailed { step: u64, first: String },
    #[error(
        "bench: every task of eval taskset `{taskset}` failed, so nothing is recorded for it; first failure: {first}"
    )]
    EvalFailed { taskset: String, first: String },
    #[error("{path}: {source}")]
    Io { path: std::path::PathBuf, source: std::io::Error },
    #[error("{0}")]
    Unsupported(String),
    /// A process waited `sync_timeout` for the other side of the run (weights, an answer to a sync request).
    #[error("synchronizer: {0}")]
    SyncTimeout(String),
    /// A data-parallel run's ranks could not work together (a rank died, the store's host is gone).
    #[error("data parallel: {0}")]
    DataParallel(String),
    #[error("collectives: {0}")]
    Collective(#[from] trinity_collective::CollectiveError),
    /// A config value the run cannot use, found only once models or data are open.
    #[error("{key}: {message}")]
    Setting { key: &'static str, message: String },
}
