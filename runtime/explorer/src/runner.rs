//! Running a batch of tasks: `runner_per_model` workflows in flight, a timeout per task, retries.
//!
//! A task that fails (workflow error, reward error, timeout) is retried up to `max_retry_times` times with a
//! fresh sampler seed; after that it is reported in [`RunReport::failures`] (with the task itself, so the run can
//! record which row failed and why) and the batch goes on. A workflow that panics costs its task the same way.
//! Results come back in task order whatever order the workflows finish in.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use trinity_buffer::{Experience, Task};

use crate::error::ExplorerError;
use crate::external_model::{external_model_workflows, runs_on_external_model};
use crate::math_workflow::describe;
use crate::rollout_model::RolloutModel;
use crate::workflow::{WorkflowContext, build_workflow, is_plugin_workflow, workflow_names};

/// Concurrency and failure handling of one batch.
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    /// Workflows running at once (`explorer.runner_per_model`).
    pub concurrency: usize,
    /// Longest one attempt of a task may take (`explorer.max_timeout`).
    pub timeout: Duration,
    /// Extra attempts after a failure (`explorer.max_retry_times`).
    pub max_retries: u32,
    /// Workflow of tasks that name none.
    pub default_workflow: String,
}

/// A task that failed every attempt.
#[derive(Debug)]
pub struct TaskFailure {
    /// `taskset#index`.
    pub task: String,
    /// The workflow that ran it (the task's own, else the default).
    pub workflow: String,
    /// Attempts that ran (0 when the workflow could not even be built).
    pub attempts: u32,
    /// The last attempt's error.
    pub error: ExplorerError,
    /// The task as it was drawn (taskset, row index, the row), so that a run can record what failed.
    pub source: Task,
}

/// What a batch produced.
#[derive(Debug, Default)]
pub struct RunReport {
    /// Experiences of every successful task, grouped by task, in task order.
    pub groups: Vec<Vec<Experience>>,
    /// Tasks that failed for good.
    pub failures: Vec<TaskFailure>,
    /// Attempts that failed but were retried.
    pub retries: u32,
}

impl RunReport {
    /// All experiences, in task order.
    pub fn experiences(&self) -> impl Iterator<Item = &Experience> {
        self.groups.iter().flatten()
    }
}

/// Runs every task of a batch; `repeat_times` comes from each task.
pub async fn run_tasks(model: Arc<RolloutModel>, tasks: Vec<Task>, options: &RunnerOptions) -> RunReport {
    let semaphore = Arc::new(Semaphore::new(options.concurrency.max(1)));
    let mut set = JoinSet::new();
    // Each task's position and a copy, by tokio task id: a workflow that panics takes its task down with it.
    let mut spawned = HashMap::new();
    for (position, task) in tasks.into_iter().enumerate() {
        let model = Arc::clone(&model);
        let semaphore = Arc::clone(&semaphore);
        let options = options.clone();
        let copy = task.clone();
        let handle = set.spawn(async move {
            // The semaphore is never closed, so acquiring only fails if it were; run unthrottled then.
            let _permit = semaphore.acquire_owned().await.ok();
            let (result, attempts) = run_with_retries(&model, &task, &options).await;
            (position, task, result, attempts)
        });
        spawned.insert(handle.id(), (position, copy));
    }
    let mut results = Vec::new();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(result) => results.push(result),
            // A panicking workflow loses its task, not the batch.
            Err(error) => {
                tracing::error!("a workflow task panicked or was cancelled: {error}");
                if let Some((position, task)) = spawned.remove(&error.id()) {
                    let message = format!("the workflow panicked or was cancelled: {error}");
                    let error = ExplorerError::Task { task: describe(&task), message };
                    results.push((position, task, Err(error), 1));
                }
            }
        }
    }
    results.sort_by_key(|(position, ..)| *position);
    let mut report = RunReport::default();
    for (_, task, result, attempts) in results {
        report.retries += attempts.saturating_sub(1);
        match result {
            Ok(group) => report.groups.push(group),
            Err(error) => {
                tracing::warn!("{error}");
                let workflow = workflow_name(&task, options).to_owned();
                report.failures.push(TaskFailure { task: describe(&task), workflow, attempts, error, source: task });
            }
        }
    }
    report
}

fn workflow_name<'a>(task: &'a Task, options: &'a RunnerOptions) -> &'a str {
    task.workflow.as_deref().unwrap_or(&options.default_workflow)
}

/// Records which taskset row each experience came from (`info.task_index`, Trinity's field), whatever workflow
/// made it: operators such as `pass_rate_calculator` report per row.
fn stamp_task_index(task: &Task, group: &mut [Experience]) {
    for experience in group {
        let index = serde_json::json!({"taskset_id": task.taskset_id, "index": task.index});
        experience.info.insert("task_index".to_owned(), index);
    }
}

/// Runs `task` until an attempt succeeds, fails for good or the retries are spent; returns the outcome with the
/// number of attempts that ran.
async fn run_with_retries(
    model: &Arc<RolloutModel>,
    task: &Task,
    options: &RunnerOptions,
) -> (Result<Vec<Experience>, ExplorerError>, u32) {
    let name = workflow_name(task, options);
    if let Some(endpoint) = model.external_model()
        && (!runs_on_external_model(name) || is_plugin_workflow(name))
    {
        let message = format!(
            "workflow `{name}` cannot run on the external model at {}: it reads the model's tokens (token ids, \
             logprobs, a tokenizer or a chat template), calls another model, or is plugin code that may, and the \
             endpoint returns text only; the built-in workflows that run on it: {}",
            endpoint.url(),
            external_model_workflows().join(", ")
        );
        return (Err(ExplorerError::Task { task: describe(task), message }), 0);
    }
    let Some(workflow) = build_workflow(name) else {
        let error = ExplorerError::UnknownWorkflow {
            task: describe(task),
            workflow: name.to_owned(),
            registered: workflow_names().join(", "),
        };
        return (Err(error), 0);
    };
    let mut last_error = None;
    for attempt in 0..=options.max_retries {
        let ctx = WorkflowContext { model: Arc::clone(model), repeat_times: task.repeat_times, attempt };
        let error = match tokio::time::timeout(options.timeout, workflow.run(task, &ctx)).await {
            Ok(Ok(mut group)) => {
                stamp_task_index(task, &mut group);
                return (Ok(group), attempt + 1);
            }
            Ok(Err(error)) => error,
            Err(_) => ExplorerError::Timeout { task: describe(task), seconds: options.timeout.as_secs() },
        };
        if !error.is_retryable() {
            return (Err(error), attempt + 1);
        }
        if attempt < options.max_retries {
            tracing::info!("retrying after: {error}");
        }
        last_error = Some(error);
    }
    let error =
        last_error.unwrap_or_else(|| ExplorerError::Task { task: describe(task), message: "no attempt ran".into() });
    (Err(error), options.max_retries + 1)
}
