//! What can go wrong before a Python workflow runs.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PyWorkflowError {
    /// The interpreter could not be started.
    #[error(
        "workflow `{workflow}` is a Python workflow, but the interpreter `{}` cannot be started: {source}; set \
         TRINITY_PYTHON to a Python with Trinity-RFT installed (`pip install trinity-rft==0.6.0`), or activate \
         its venv",
        interpreter.display()
    )]
    Interpreter { workflow: String, interpreter: PathBuf, source: std::io::Error },
    /// The workflow's module or one of its imports is missing.
    #[error(
        "workflow `{workflow}` cannot be imported by `{}`: the import of `{import}` failed; install it with \
         `{pip}`\n{detail}",
        interpreter.display()
    )]
    Import { workflow: String, interpreter: PathBuf, import: String, pip: String, detail: String },
    /// The workflow's own module (or its package) is not on the interpreter's path: user code, not a package
    /// to install.
    #[error(
        "workflow `{workflow}`: `{}` finds no module `{module}` on its path (the directory trinity runs in, then \
         PYTHONPATH); run trinity from the directory that holds `{top}/` (for Trinity-RFT's own examples, a \
         Trinity-RFT checkout), or add that directory to PYTHONPATH",
        interpreter.display()
    )]
    ModuleNotFound { workflow: String, interpreter: PathBuf, module: String, top: String },
    /// A setting of the Python workflow host that cannot be honoured.
    #[error("{key}: {message}")]
    Setting { key: String, message: String },
    /// The check answered something other than its one JSON line.
    #[error("workflow `{workflow}`: the Python check by `{}` answered {answer:?}", interpreter.display())]
    Check { workflow: String, interpreter: PathBuf, answer: String },
}
