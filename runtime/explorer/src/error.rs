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
    #[error("task {task}: {source}")]
    Auxiliary { task: String, source: Box<crate::auxiliary::AuxiliaryError> },
    #[error("task {task}: timed out after {seconds} s")]
    Timeout { task: String, seconds: u64 },
    #[error("task {task}: {message}")]
    Plugin { task: String, message: String },
    #[error("task {task}: external model: {source}")]
    External { task: String, source: crate::external_model::ExternalModelError },
}

impl ExplorerError {
    /// Whether another attempt could succeed: timeouts and engine failures mid-step may be transient, while a
    /// malformed row, an unknown workflow, a reward that rejects its reference answer or a prompt that does not
    /// fit will fail the same way every time.
    pub fn is_retryable(&self) -> bool {
        match self {
            ExplorerError::Timeout { .. } => true,
            // A connection that failed, a rate limit or a server error may pass; a refused request will not.
            ExplorerError::External { source, .. } => source.is_retryable(),
            ExplorerError::Engine { source, .. } => !matches!(
                source,
                trinity_engine::EngineError::PromptTooLong { .. }
                    | trinity_engine::EngineError::EmptyPrompt { .. }
                    | trinity_engine::EngineError::TooManySamples { .. }
                    | trinity_engine::EngineError::InvalidParams { .. }
            ),
            // A plugin that trapped, ran out of time or memory, or returned bad output does so again.
            ExplorerError::Task { .. }
            | ExplorerError::Plugin { .. }
            | ExplorerError::UnknownWorkflow { .. }
            | ExplorerError::Reward { .. }
            | ExplorerError::Model { .. } => false,
            // A judge or teacher fails the same way again (a prompt over its limit, a foreign vocabulary), unless
            // its engine failed mid-step.
            ExplorerError::Auxiliary { source, .. } => matches!(
                **source,
                crate::auxiliary::AuxiliaryError::Engine { source: trinity_engine::EngineError::Stopped, .. }
            ),
        }
    }
}
