//! The one error type of the crate: every failure names the component, argument or batch field at fault.

use crate::registry::Kind;

/// What went wrong while resolving or running an algorithm component.
#[derive(Debug, thiserror::Error)]
pub enum AlgorithmError {
    /// No component of this kind is registered under the name.
    #[error("unknown {kind} `{name}`; registered: {}", known.join(", "))]
    UnknownComponent { kind: Kind, name: String, known: Vec<String> },

    /// An argument the component does not accept.
    #[error("{kind} `{component}` has no argument `{arg}`; accepted: {}", accepted.join(", "))]
    UnknownArg { kind: Kind, component: String, arg: String, accepted: Vec<String> },

    /// An argument of the wrong type or out of its range.
    #[error("{kind} `{component}`: argument `{arg}` {problem}")]
    InvalidArg { kind: Kind, component: String, arg: String, problem: String },

    /// A batch field the component needs is absent.
    #[error("{component} needs batch field `{field}`")]
    MissingField { component: String, field: &'static str },

    /// A batch field has the wrong shape or content.
    #[error("batch field `{field}`: {problem}")]
    InvalidField { field: String, problem: String },

    /// The evaluation input is not the JSON document `trinity algorithm eval` expects.
    #[error("invalid eval input: {0}")]
    InvalidInput(String),

    /// An external component (from an algorithm library) failed or returned something malformed. Loading a
    /// library has its own errors, in `trinity-algorithm-library`, so this crate never names the plugin ABI.
    #[error("{kind} `{name}` (algorithm library `{library}`): {message}")]
    Library { kind: Kind, name: String, library: String, message: String },
}

impl AlgorithmError {
    /// A shape or content problem with one batch field.
    pub(crate) fn field(field: impl Into<String>, problem: impl Into<String>) -> Self {
        AlgorithmError::InvalidField { field: field.into(), problem: problem.into() }
    }
}
