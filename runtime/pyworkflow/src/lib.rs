//! The Python workflow host: Trinity-RFT users' workflow classes, unchanged, on trinity's rollout model.
//!
//! A workflow name that no built-in or plugin has and that is a dotted path (`pkg.mod.Class`) or a name in
//! Trinity-RFT's own `WORKFLOWS` registry (with what `TRINITY_PLUGIN_DIRS` registers there; see `registry.rs`)
//! is resolved in Python by the user's own Trinity-RFT install. Built-in names always win. [`install`] makes
//! the explorer build such names as [`PythonWorkflow`]s. Each task runs in a worker process
//! (`python/worker.py`, shipped in this crate and passed to the interpreter with `-c`) that imports the class,
//! builds Trinity's `Task`, gives the workflow a `self.model` with `ModelWrapper`'s interface whose calls come
//! back over the worker's pipes to trinity's [`trinity_explorer::RolloutModel`], and returns the workflow's
//! `Experience`s, which become trinity experiences like a built-in workflow's.
//!
//! `self.model` is Trinity-RFT 0.6.0's `ModelWrapper` as its runner hands it out (see `calls.rs` for what each
//! call does here): generation, `logprobs`, `convert_messages_to_experience`, OpenAI clients of the rollout
//! model's OpenAI API with their recorded history, the workflow-state calls and `clone_with_isolated_history`;
//! the auxiliary models are wrappers (`self.auxiliary_model_wrappers`) and OpenAI clients
//! (`self.auxiliary_models`). The worker keeps its wrappers and its last workflow instance across tasks, so a
//! `can_reset` workflow is reset rather than rebuilt, as in Trinity-RFT's runner; [`configure`] gives it the
//! run's model settings (`model_config`, `generate_kwargs`, `explorer.concurrent_mode`). Model calls carry ids:
//! a workflow may have any number in flight and they are answered concurrently, so an `asyncio.gather` of
//! calls batches in the engine.
//!
//! Invariants: workers are reused across tasks (an idle pool, at most as many as tasks ran at once, which the
//! runner bounds by `explorer.runner_per_model`); a worker is returned to the pool only after a task ended
//! cleanly on the protocol (done, or a Python exception reported with its traceback). A worker whose task
//! timed out (the runner drops the task's future at `explorer.max_timeout`), that exited or that broke the
//! protocol is killed and dropped, so it costs only its task and the next task starts a fresh one.
//!
//! Each task attempt's generation calls, over all its model wrappers, are budgeted by `explorer.python_workflows`
//! (`max_model_calls`, `max_model_tokens`, a WASM plugin's defaults): the call past a limit raises
//! `ModelBudgetExceeded` in the workflow, so do the calls after it, and the task fails. A class that cannot
//! repeat runs once per repeat; the runs that completed are kept when another raises (with
//! `explorer.over_rollout.return_partial_tasks` false, Trinity-RFT's default, the runs after the failed one are
//! skipped), and a task fails only when none completed.

mod calls;
mod error;
mod registry;
mod settings;
mod worker;
mod workflow;

pub use error::PyWorkflowError;
pub use settings::configure;
pub use workflow::PythonWorkflow;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// `model.model_path`, what `self.model.model_path` returns.
static MODEL_PATH: OnceLock<String> = OnceLock::new();

/// Makes the explorer resolve Python workflow names ([`is_python_workflow_name`]) as Python workflows;
/// `model_path` is what their `self.model.model_path` says. Only the first call counts.
pub fn install(model_path: &str) {
    let _ = MODEL_PATH.set(model_path.to_owned());
    trinity_explorer::set_workflow_fallback(|name| {
        is_python_workflow_name(name).then(|| Arc::new(PythonWorkflow::new(name)) as _)
    });
}

/// Whether the workflow `name` runs in Python: no built-in or plugin has it, and it is a dotted path to a class
/// or a name in Trinity-RFT's `WORKFLOWS` registry in the interpreter, which is asked (once per name and
/// process) only for a name that is neither native nor dotted.
pub fn is_python_workflow_name(name: &str) -> bool {
    if trinity_explorer::lookup_workflow(name).is_some() || trinity_explorer::is_plugin_workflow(name) {
        return false;
    }
    is_dotted_path(name) || (is_registry_name(name) && registry::is_registered(&interpreter(), name))
}

/// Whether `name` could be a registry key: one Python identifier (Trinity-RFT's names are), so that a name
/// with spaces or dashes is refused without starting an interpreter.
fn is_registry_name(name: &str) -> bool {
    !name.contains('.') && is_dotted_path(&format!("m.{name}"))
}

/// Whether `name` is a dotted path to a Python class (`pkg.mod.Class`): at least two dot-separated Python
/// identifiers.
pub fn is_dotted_path(name: &str) -> bool {
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
    if is_dotted_path(workflow) {
        worker::check(&interpreter(), workflow).map_err(own_module_missing)
    } else {
        registry::check(&interpreter(), workflow)
    }
}

/// An import error whose missing module is the dotted path's own module or package as
/// [`PyWorkflowError::ModuleNotFound`]: the user's code is off the path, not a package to pip install (except
/// Trinity-RFT's own classes, whose package is `trinity-rft`).
fn own_module_missing(error: PyWorkflowError) -> PyWorkflowError {
    match error {
        PyWorkflowError::Import { workflow, interpreter, import, .. }
            if workflow.starts_with(&format!("{import}.")) && import.split('.').next() != Some("trinity") =>
        {
            let top = import.split('.').next().unwrap_or(&import).to_owned();
            PyWorkflowError::ModuleNotFound { workflow, interpreter, module: import, top }
        }
        other => other,
    }
}

/// What Python said about a workflow name that is neither trinity's nor in Trinity-RFT's registry (or why it
/// could not be asked), for the config's unknown-workflow error; `None` when Python was not asked about it.
pub fn unknown_workflow_note(name: &str) -> Option<String> {
    registry::unknown_note(&interpreter(), name, &trinity_explorer::workflow_names())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_paths_are_python_workflow_names() {
        assert!(is_dotted_path("examples.bots.workflow.BOTSMathBoxedWorkflow"));
        assert!(is_dotted_path("my_wf.Class_2"));
        assert!(!is_dotted_path("math_workflow"));
        assert!(!is_dotted_path("a..b"));
        assert!(!is_dotted_path("a.b-c"));
        assert!(!is_dotted_path(".a"));
    }

    #[test]
    fn a_missing_own_module_is_told_from_a_missing_package() {
        let import = |workflow: &str, import: &str| PyWorkflowError::Import {
            workflow: workflow.into(),
            interpreter: "python3".into(),
            import: import.into(),
            pip: format!("pip install {import}"),
            detail: String::new(),
        };
        let own = own_module_missing(import("examples.bots.workflow.BOTSWorkflow", "examples"));
        assert!(own.to_string().contains("finds no module `examples`"), "{own}");
        assert!(own.to_string().contains("holds `examples/`"), "{own}");
        let package = own_module_missing(import("examples.bots.workflow.BOTSWorkflow", "gymnasium"));
        assert!(package.to_string().contains("pip install gymnasium"), "{package}");
        let trinity = own_module_missing(import("trinity.common.workflows.envs.sudoku.X", "trinity"));
        assert!(trinity.to_string().contains("pip install trinity"), "{trinity}");
    }

    #[test]
    fn only_single_identifiers_are_looked_up_in_the_registry() {
        assert!(is_registry_name("sudoku_workflow"));
        assert!(is_registry_name("RAFT_alfworld_workflow"));
        assert!(!is_registry_name("a.b"));
        assert!(!is_registry_name("my workflow"));
        assert!(!is_registry_name("my-workflow"));
        assert!(!is_registry_name(""));
    }
}
