//! Errors: [`ServeError`] for starting and running the server, [`ApiError`] for one HTTP request.
//!
//! Every failed request gets an OpenAI-style body, `{"error": {"message", "type", "param", "code"}}`, with the
//! status the `openai` clients map to their exception classes (400 `BadRequestError`, 404 `NotFoundError`, 413,
//! 429 `RateLimitError`, 500, 503): a client sees what was wrong with its request, never a bare status line.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use trinity_engine::EngineError;

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listening socket could not be bound (address in use, no permission, bad address).
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address asked for.
        address: std::net::SocketAddr,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// Accepting or serving connections failed.
    #[error("the server stopped: {0}")]
    Io(#[from] std::io::Error),
    /// The server task ended abnormally (it panicked or was aborted).
    #[error("the server task failed: {0}")]
    Task(String),
}

/// A failed request as the client will see it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    /// OpenAI's `type`: `invalid_request_error`, `not_found_error`, `server_error`, ...
    pub(crate) kind: &'static str,
    /// The request field at fault, when one is.
    pub(crate) param: Option<String>,
    /// A stable machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
    pub(crate) code: Option<&'static str>,
}

impl ApiError {
    /// 400: the request is malformed or asks for something this server does not do.
    pub(crate) fn invalid(param: impl Into<Option<String>>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.into(),
            code: None,
        }
    }

    /// 400 naming the parameter, with a code.
    pub(crate) fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        ApiError { code: Some("invalid_value"), ..Self::invalid(Some(param.to_owned()), message) }
    }

    /// 400 for a parameter the server understands but cannot honour (for example penalties).
    pub(crate) fn unsupported(param: &str, message: impl Into<String>) -> Self {
        ApiError { code: Some("unsupported_parameter"), ..Self::invalid(Some(param.to_owned()), message) }
    }

    /// 404 for a `model` the server does not serve.
    pub(crate) fn model_not_found(model: &str, served: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("the model `{model}` does not exist (this server serves `{served}`)"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// 404 with a message (unknown route, unknown response ids).
    pub(crate) fn not_found(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "not_found_error",
            param: param.map(str::to_owned),
            code: Some("not_found"),
        }
    }

    /// 413: the body is larger than the server accepts.
    pub(crate) fn too_large(limit: usize) -> Self {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("the request body is larger than {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        }
    }

    /// 503 while the server shuts down.
    pub(crate) fn shutting_down() -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the server is shutting down".into(),
            kind: "service_unavailable_error",
            param: None,
            code: Some("shutting_down"),
        }
    }

    /// 429 for a request past its workflow run's model budget (`RunBudget`), with `x-should-retry: false`:
    /// the refusal is final for the task, so the `openai` client raises `RateLimitError` at once instead of
    /// retrying, as it does for OpenAI's own `insufficient_quota`.
    pub(crate) fn over_budget(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: message.into(),
            kind: "insufficient_quota",
            param: None,
            code: Some(OVER_BUDGET),
        }
    }

    /// 500 for a failure on the server's side.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The JSON body (also sent as the last event of a stream that fails half-way).
    pub(crate) fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        let message = error.to_string();
        match error {
            EngineError::PromptTooLong { .. } => ApiError {
                code: Some("context_length_exceeded"),
                ..ApiError::invalid(Some("messages".to_owned()), message)
            },
            EngineError::EmptyPrompt { .. } => ApiError::invalid_param("prompt", message),
            EngineError::TooManySamples { .. } => ApiError::invalid_param("n", message),
            EngineError::InvalidParams { param, .. } => ApiError::invalid_param(param, message),
            // The model's vocabulary cannot write what the constraint asks; the run names the parameter that set
            // it (`Job::constrained_by`).
            EngineError::ConstraintFailed { .. } => ApiError::invalid_param("tool_choice", message),
            EngineError::Stopped => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message,
                kind: "service_unavailable_error",
                param: None,
                code: Some("engine_stopped"),
            },
            _ => ApiError::internal(message),
        }
    }
}

/// The code of [`ApiError::over_budget`].
const OVER_BUDGET: &str = "model_budget_exceeded";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if self.code == Some(OVER_BUDGET) {
            response.headers_mut().insert("x-should-retry", axum::http::HeaderValue::from_static("false"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_budget_refusal_tells_the_client_not_to_retry() {
        let refused = ApiError::over_budget("model call 9 is past the limit of 8").into_response();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.headers().get("x-should-retry").map(|v| v.to_str().unwrap()), Some("false"));
        let busy = ApiError { code: Some("recorder_full"), ..ApiError::over_budget("busy") }.into_response();
        assert!(busy.headers().get("x-should-retry").is_none(), "another 429 may be retried");
    }
}
