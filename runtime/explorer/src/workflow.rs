//! The workflow interface and the registry of built-in workflows.
//!
//! A workflow turns one task into the experiences of its group: it talks to the model (any number of turns),
//! scores the answers with a reward function, and returns one experience per rollout. WASM workflows implement
//! the same trait through the plugin host and register at run time ([`register_workflow`]), so the explorer
//! never knows a workflow's origin.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, RwLock};

use trinity_buffer::{Experience, Task};

use crate::error::ExplorerError;
use crate::rollout_model::RolloutModel;

/// What a workflow run returns: the experiences of the task's group.
pub type WorkflowFuture<'a> = Pin<Box<dyn Future<Output = Result<Vec<Experience>, ExplorerError>> + Send + 'a>>;

/// Everything a workflow run may use besides its task.
#[derive(Debug, Clone)]
pub struct WorkflowContext {
    /// The rollout model.
    pub model: Arc<RolloutModel>,
    /// Rollouts to produce for this task (the group size).
    pub repeat_times: u32,
    /// Which attempt this is (0 first); retries reseed the sampler so they do not repeat a failure.
    pub attempt: u32,
}

/// One workflow: a task in, scored experiences out.
pub trait Workflow: Send + Sync {
    /// Runs `task` and returns `ctx.repeat_times` experiences (fewer only when rollouts were dropped).
    fn run<'a>(&'a self, task: &'a Task, ctx: &'a WorkflowContext) -> WorkflowFuture<'a>;
}

/// A built-in workflow, registered by name.
pub struct WorkflowEntry {
    /// The name configs use (`default_workflow_type`).
    pub name: &'static str,
    /// One line for `trinity plugins list`.
    pub description: &'static str,
    /// Builds the workflow.
    pub build: fn() -> Box<dyn Workflow>,
}

impl std::fmt::Debug for WorkflowEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkflowEntry").field("name", &self.name).finish_non_exhaustive()
    }
}

inventory::collect!(WorkflowEntry);

/// The built-in workflow called `name`.
pub fn lookup_workflow(name: &str) -> Option<&'static WorkflowEntry> {
    inventory::iter::<WorkflowEntry>().find(|entry| entry.name == name)
}

/// Workflows registered at run time (plugins), by name; consulted before the built-ins.
static DYNAMIC: RwLock<BTreeMap<String, Arc<dyn Workflow>>> = RwLock::new(BTreeMap::new());

/// A name that is already taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{kind} `{name}` is already registered by {by}; set `override_builtin: true` on the plugin to replace a built-in"
)]
pub struct NameTaken {
    pub kind: &'static str,
    pub name: String,
    pub by: &'static str,
}

/// Registers `workflow` under `name` for the rest of the process. A built-in of the same name is an error unless
/// `replace_builtin` (the plugin then wins); a second registration of one name is always an error.
pub fn register_workflow(name: &str, workflow: Arc<dyn Workflow>, replace_builtin: bool) -> Result<(), NameTaken> {
    let mut all = DYNAMIC.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    let taken = |by| NameTaken { kind: "workflow", name: name.to_owned(), by };
    if all.contains_key(name) {
        return Err(taken("another plugin"));
    }
    if lookup_workflow(name).is_some() && !replace_builtin {
        return Err(taken("a built-in workflow"));
    }
    all.insert(name.to_owned(), workflow);
    Ok(())
}

/// Builds the workflows of names that neither a plugin nor a built-in has (the Python workflow host,
/// `trinity-pyworkflow`, installed by the binary so that this crate need not know Python).
pub type WorkflowFallback = fn(&str) -> Option<Arc<dyn Workflow>>;

static FALLBACK: OnceLock<WorkflowFallback> = OnceLock::new();

/// Sets the fallback for names no plugin or built-in has; only the first call counts (false for later ones).
pub fn set_workflow_fallback(fallback: WorkflowFallback) -> bool {
    FALLBACK.set(fallback).is_ok()
}

/// The workflow called `name`: a registered plugin, else a built-in, else what the fallback makes of it.
pub fn build_workflow(name: &str) -> Option<Arc<dyn Workflow>> {
    if let Some(workflow) = DYNAMIC.read().unwrap_or_else(|poisoned| poisoned.into_inner()).get(name) {
        return Some(Arc::clone(workflow));
    }
    if let Some(entry) = lookup_workflow(name) {
        return Some(Arc::from((entry.build)()));
    }
    FALLBACK.get().and_then(|fallback| fallback(name))
}

/// Whether a plugin registered the workflow `name` (replacing a built-in of that name, if any).
pub fn is_plugin_workflow(name: &str) -> bool {
    DYNAMIC.read().unwrap_or_else(|poisoned| poisoned.into_inner()).contains_key(name)
}

/// Every workflow name, built-in or plugin, sorted.
pub fn workflow_names() -> Vec<String> {
    let mut names: Vec<String> = inventory::iter::<WorkflowEntry>().map(|entry| entry.name.to_owned()).collect();
    names.extend(DYNAMIC.read().unwrap_or_else(|poisoned| poisoned.into_inner()).keys().cloned());
    names.sort_unstable();
    names.dedup();
    names
}

/// Every built-in workflow, sorted by name.
pub fn builtin_workflows() -> Vec<&'static WorkflowEntry> {
    let mut all: Vec<&'static WorkflowEntry> = inventory::iter::<WorkflowEntry>().collect();
    all.sort_by_key(|entry| entry.name);
    all
}
