//! The Python workflow host: Trinity-RFT users' workflow classes, unchanged, on trinity's rollout model.
//!
//! A workflow name that no built-in or plugin has and that is a dotted path (`pkg.mod.Class`) is resolved in
//! Python by the user's own Trinity-RFT install (its `WORKFLOWS` registry, which also takes dotted paths).
//! [`install`] makes the explorer build such names as [`PythonWorkflow`]s. Each task runs in a worker process
//! (`python/worker.py`, shipped in this crate and passed to the interpreter with `-c`) that imports the class,
//! builds Trinity's `Task`, gives the workflow a `self.model` with `ModelWrapper`'s interface whose calls come
//! back over the worker's pipes to trinity's [`trinity_explorer::RolloutModel`], and returns the workflow's
//! `Experience`s, which become trinity experiences like a built-in workflow's.
//!
//! Invariants: workers are reused across tasks (an idle pool, at most as many as tasks ran at once, which the
//! runner bounds by `explorer.runner_per_model`); a worker is returned to the pool only after a task ended
//! cleanly on the protocol (done, or a Python exception reported with its traceback). A worker whose task
//! timed out (the runner drops the task's future at `explorer.max_timeout`), that exited or that broke the
//! protocol is killed and dropped, so it costs only its task and the next task starts a fresh one.

mod error;
mod worker;
mod workflow;

pub use error::PyWorkflowError;
pub use workflow::PythonWorkflow;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// `model.model_path`, what `self.model.model_path` returns.
static MODEL_PATH: OnceLock<String> = OnceLock::new();

/// Makes the explorer resolve dotted-path workflow names as Python workflows (see the crate documentation);
/// `model_path` is what their `self.model.model_path` says. Only the first call counts.
pub fn install(model_path: &str) {
    let _ = MODEL_PATH.set(model_path.to_owned());
    trinity_explorer::set_workflow_fallback(|name| {
        is_python_workflow_name(name).then(|| Arc::new(PythonWorkflow::new(name)) as _)
    });
}

/// Whether `name` is a dotted path to a Python class (`pkg.mod.Class`): at least two dot-separated Python
/// identifiers.
pub fn is_python_workflow_name(name: &str) -> bool {
    let identifier = |part: &str| {
        let mut chars = part.chars();
        chars.next().is_some_and(|c| c == '_' || c.is_alphabetic()) && chars.all(|c| c == '_' || c.is_alphanumeric())
    };
    name.contains('.') && name.split('.').all(identifier)
}

/// The interpreter that runs workers: `TRINITY_PYTHON` if set, else `python3` on `PATH`.
pub fn interpreter() -> PathBuf {
    std::env::var_os("TRINITY_PYTHON").filter(|p| !p.is_empty()).map_or_else(|| PathBuf::from("python3"), PathBuf::from)
}

/// Checks that `workflow` imports in the interpreter: for `--dry-run` and before a run starts, so that a missing
/// interpreter, Trinity-RFT install or environment package is reported with the import that failed and the
/// `pip install` line instead of failing every task.
pub fn check(workflow: &str) -> Result<(), PyWorkflowError> {
    worker::check(&interpreter(), workflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_paths_are_python_workflow_names() {
        assert!(is_python_workflow_name("examples.bots.workflow.BOTSMathBoxedWorkflow"));
        assert!(is_python_workflow_name("my_wf.Class_2"));
        assert!(!is_python_workflow_name("math_workflow"));
        assert!(!is_python_workflow_name("a..b"));
        assert!(!is_python_workflow_name("a.b-c"));
        assert!(!is_python_workflow_name(".a"));
    }
}
