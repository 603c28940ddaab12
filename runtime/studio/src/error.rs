//! Why a studio request or the server failed. Every error names the run, file or parameter it is about; the API
//! answers it as `{"error": "..."}` with a status code that says whose fault it was.

use std::path::PathBuf;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

#[derive(Debug, thiserror::Error)]
pub enum StudioError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The run is not (or no longer) under the root: deleted while viewed, or a mistyped id.
    #[error("no run `{id}` under {root}")]
    UnknownRun { id: String, root: PathBuf },
    /// The run exists but has no file of this kind yet.
    #[error("run `{id}` has no {what} yet")]
    Missing { id: String, what: String },
    #[error("query parameter `{key}`: {message}")]
    BadQuery { key: String, message: String },
    #[error("request body: {0}")]
    BadBody(String),
    #[error("cannot save {path}: {message}")]
    Save { path: String, message: String },
    /// The request's `Host` is not a name the studio listens as: a DNS-rebinding page, or a mistyped address.
    #[error("the studio does not answer for host `{host}`: open it at the address it listens on ({listen})")]
    ForeignHost { host: String, listen: String },
    /// A request that would change something did not come from the studio's own page.
    #[error("request refused: {0}")]
    Refused(String),
    #[error("cannot listen on {address}: {source}")]
    Bind { address: String, source: std::io::Error },
    #[error("the studio server stopped: {0}")]
    Serve(std::io::Error),
    #[error("{0}")]
    Host(String),
}

impl StudioError {
    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> StudioError + '_ {
        move |source| StudioError::Io { path: path.to_owned(), source }
    }

    pub(crate) fn query(key: &str, message: impl Into<String>) -> StudioError {
        StudioError::BadQuery { key: key.to_owned(), message: message.into() }
    }

    fn status(&self) -> StatusCode {
        match self {
            StudioError::UnknownRun { .. } | StudioError::Missing { .. } => StatusCode::NOT_FOUND,
            StudioError::BadQuery { .. } | StudioError::BadBody(_) | StudioError::Save { .. } => {
                StatusCode::BAD_REQUEST
            }
            StudioError::ForeignHost { .. } => StatusCode::MISDIRECTED_REQUEST,
            StudioError::Refused(_) => StatusCode::FORBIDDEN,
            StudioError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => StatusCode::NOT_FOUND,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for StudioError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!("studio: {self}");
        }
        (status, axum::Json(serde_json::json!({ "error": self.to_string() }))).into_response()
    }
}
