//! Explorer errors: each names the task or the component that failed.

/// Why a workflow run failed.
#[derive(Debug, thiserror::Error)]
pub enum ExplorerError {
    #[error("task {task}: {message}")]
    Task { task: String, message: String },
    #[error("task {task}: no workflow named `{workflow}` (registered: {registered})")]
    UnknownWorkflow { task: String, workflow: String, registered: String },
    #[error("task {task}: reward `{reward}`: {source}")]
    Reward { task: String, reward: String, source: trinity_reward::RewardError },
    #[error("task {task}: generation: {source}")]
    Engine { task: String, source: trinity_engine::EngineError },
    #[error("task {task}: model: {source}")]
    Model { task: String, source: trinity_model::ModelError },
    #[error("task {task}: timed out after {seconds} s")]
    Timeout { task: String, seconds: u64 },
}
