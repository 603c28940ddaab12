//! The engine's error type.
//!
//! Every variant names the request (its engine-assigned id) and the limit it ran into, so a workflow that logs
//! the error tells the user what to change (`max_model_len`, the KV-cache budget, `n`, a sampling parameter).
//! A request-level error never stops the engine: the scheduler answers that request and keeps serving others.

use trinity_model::ModelError;

/// Everything that can go wrong while starting the engine or serving a request.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The prompt leaves no room for even one generated token under `max_model_len` (or is over
    /// `max_prompt_tokens`), so generation cannot start.
    #[error("request {request}: prompt of {prompt_tokens} tokens is too long (limit {limit} tokens: {limit_name})")]
    PromptTooLong {
        /// The request id.
        request: u64,
        /// How many tokens the prompt has.
        prompt_tokens: usize,
        /// The most prompt tokens that can be served.
        limit: usize,
        /// Which setting imposes the limit (`max_model_len - 1` or `max_prompt_tokens`).
        limit_name: &'static str,
    },
    /// A request with an empty prompt has no position to predict the first token from.
    #[error("request {request}: the prompt is empty")]
    EmptyPrompt {
        /// The request id.
        request: u64,
    },
    /// A request asks for more samples than the KV cache has slots; its samples share one prefill and run
    /// together, so it could never be scheduled.
    #[error(
        "request {request}: n = {n} samples need {n} KV-cache slots but the cache has {slots} (raise the batch size or the KV-cache budget)"
    )]
    TooManySamples {
        /// The request id.
        request: u64,
        /// Samples asked for.
        n: usize,
        /// Slots the cache has.
        slots: usize,
    },
    /// A sampling parameter is out of range or inconsistent.
    #[error("request {request}: invalid sampling parameter `{param}`: {reason}")]
    InvalidParams {
        /// The request id.
        request: u64,
        /// The parameter's name as configs spell it.
        param: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The KV-cache memory budget does not hold one sequence of `max_model_len` tokens.
    #[error(
        "KV-cache budget of {budget_bytes} bytes cannot hold one sequence of max_model_len = {max_model_len} tokens ({per_slot_bytes} bytes per slot)"
    )]
    KvBudgetTooSmall {
        /// The configured budget.
        budget_bytes: u64,
        /// Bytes one slot needs.
        per_slot_bytes: u64,
        /// The configured sequence length.
        max_model_len: usize,
    },
    /// An engine setting is out of range.
    #[error("invalid engine config `{key}`: {reason}")]
    InvalidConfig {
        /// The setting.
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A request's output constraint could not go on (its state failed, or allowed no token); only that
    /// request fails.
    #[error("request {request}: constrained sampling failed: {reason}")]
    ConstraintFailed {
        /// The request id.
        request: u64,
        /// What the constraint reported.
        reason: String,
    },
    /// The model failed while running a batch this request was part of (for example out of memory); the
    /// request is dropped and the engine goes on with the next batch.
    #[error("request {request}: the model failed during {phase}: {reason}")]
    StepFailed {
        /// The request id.
        request: u64,
        /// `prefill` or `decode`.
        phase: &'static str,
        /// libtorch's or the model layer's message.
        reason: String,
    },
    /// The engine has shut down (or its scheduler thread is gone), so the request cannot be served.
    #[error("the generation engine has stopped")]
    Stopped,
    /// The model layer failed outside a request (allocating the KV cache, syncing weights).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// libtorch failed outside a request.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

/// Shorthand used across the crate.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
