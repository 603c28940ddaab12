//! The workflow interface and the registry of built-in workflows.
//!
//! A workflow turns one task into the experiences of its group: it talks to the model (any number of turns),
//! scores the answers with a reward function, and returns one experience per rollout. WASM workflows will
//! implement the same trait through the plugin host, so the explorer never knows a workflow's origin.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

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

/// Every built-in workflow name, sorted.
pub fn workflow_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = inventory::iter::<WorkflowEntry>().map(|entry| entry.name).collect();
    names.sort_unstable();
    names
}
