//! Running a batch of tasks: `runner_per_model` workflows in flight, a timeout per task, retries.
//!
//! A task that fails (workflow error, reward error, timeout) is retried up to `max_retry_times` times with a
//! fresh sampler seed; after that it is reported in [`RunReport::failures`] (with the task itself, so the run can
//! record which row failed and why) and the batch goes on. A workflow that panics costs its task the same way.
//! Results come back in task order whatever order the workflows finish in.
//!
//! A train step may end early ([`BatchControl`], Trinity-RFT 0.6.0's `explorer.over_rollout`): once
//! `min_tasks` of its tasks are done (succeeded or failed for good), the batch waits `wait_after_min` more
//! seconds, then cancels the tasks still running (dropping a task's future kills what it started, e.g. an agent
//! program) and reports them in [`RunReport::cancelled`]. The per-task timeout can follow the observed task time
//! ([`DynamicTimeout`], `explorer.dynamic_timeout`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::{JoinError, JoinSet};
// tokio's clock, so that the over-rollout waits can be tested on paused time.
use tokio::time::Instant;
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

/// How a batch may end before every task is done, and how long an attempt may take: what the explorer decides
/// per batch beyond [`RunnerOptions`] (train steps get over-rollout, evaluations do not).
#[derive(Debug, Clone, Default)]
pub struct BatchControl {
    /// `explorer.over_rollout` with `ratio > 0`.
    pub over_rollout: Option<OverRollout>,
    /// `explorer.dynamic_timeout.enable`.
    pub dynamic_timeout: Option<DynamicTimeout>,
    /// Whether the tasks' times feed the dynamic timeout (train steps do; evaluations only read it, as in
    /// Trinity-RFT's scheduler).
    pub observe: bool,
    /// Whether the batch stops waiting `max_timeout × (max_retry_times + 1)` after it started, cancelling the
    /// tasks not done by then and keeping what the others made: Trinity-RFT 0.6.0's scheduler bounds the wait for
    /// an evaluation so (`default_timeout`), and over-rollout implies it. Without it a batch waits for every task,
    /// each bounded by its own timeout.
    pub batch_limit: bool,
}

/// Trinity-RFT 0.6.0's over-rollout of a train step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverRollout {
    /// Tasks that must be done before the step may end: `ceil(batch_size × (1 − ratio))`, at most the batch.
    pub min_tasks: usize,
    /// How long the step still waits for the others once `min_tasks` are done.
    pub wait_after_min: Duration,
}

impl OverRollout {
    /// Trinity-RFT's `min_wait_num` for `batch_size` tasks a step and `ratio` in (0, 1).
    pub fn new(batch_size: usize, ratio: f64, wait_after_min: Duration) -> OverRollout {
        // The same float expression as Trinity-RFT's `math.ceil(batch_size * (1 - ratio))`, so both round alike.
        let min_tasks = (batch_size as f64 * (1.0 - ratio)).ceil().max(0.0) as usize;
        OverRollout { min_tasks, wait_after_min }
    }
}

/// Trinity-RFT 0.6.0's dynamic timeout: once `warmup_min_steps` train steps finished with every task done, an
/// attempt may take `min(max_timeout, ratio × mean task time)`, the mean over every train task done so far
/// (retries included in a task's time), read when the task starts. Shared by the explorer's batches.
#[derive(Debug, Clone)]
pub struct DynamicTimeout {
    ratio: f64,
    warmup_min_steps: u64,
    observed: Arc<Mutex<Observed>>,
}

#[derive(Debug, Default)]
struct Observed {
    seconds: f64,
    tasks: u64,
    full_steps: u64,
}

impl DynamicTimeout {
    pub fn new(ratio: f64, warmup_min_steps: u32) -> DynamicTimeout {
        DynamicTimeout { ratio, warmup_min_steps: u64::from(warmup_min_steps), observed: Arc::default() }
    }

    fn observed(&self) -> std::sync::MutexGuard<'_, Observed> {
        // The counters stay consistent whatever panicked while holding them (plain additions).
        self.observed.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The timeout of an attempt starting now, `max` until the warm-up is over.
    pub fn timeout(&self, max: Duration) -> Duration {
        let observed = self.observed();
        if observed.full_steps < self.warmup_min_steps || observed.tasks == 0 {
            return max;
        }
        let mean = observed.seconds / observed.tasks as f64;
        Duration::try_from_secs_f64(mean * self.ratio).map_or(max, |dynamic| dynamic.min(max))
    }

    fn record_task(&self, seconds: f64) {
        let mut observed = self.observed();
        observed.seconds += seconds;
        observed.tasks += 1;
    }

    /// Counts a train step that ended; only one whose every task was done (none cancelled) ends the warm-up.
    pub fn record_step(&self, report: &RunReport) {
        if report.cancelled.is_empty() {
            self.observed().full_steps += 1;
        }
    }
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
    /// Tasks over-rollout cancelled before they were done (`taskset#index`, in task order).
    pub cancelled: Vec<String>,
}

impl RunReport {
    /// All experiences, in task order.
    pub fn experiences(&self) -> impl Iterator<Item = &Experience> {
        self.groups.iter().flatten()
    }

    /// Tasks that are done: succeeded or failed for good (Trinity-RFT's `finished_task_count`).
    pub fn finished_tasks(&self) -> usize {
        self.groups.len() + self.failures.len()
    }
}

/// Runs every task of a batch; `repeat_times` comes from each task.
pub async fn run_tasks(model: Arc<RolloutModel>, tasks: Vec<Task>, options: &RunnerOptions) -> RunReport {
    run_batch(model, tasks, options, &BatchControl::default()).await
}

/// One task's outcome: its position, the task, the result and the attempts that ran.
type Outcome = (usize, Task, Result<Vec<Experience>, ExplorerError>, u32);

/// [`run_tasks`] under `control`: over-rollout may end the batch early, the dynamic timeout bounds attempts.
pub async fn run_batch(
    model: Arc<RolloutModel>,
    tasks: Vec<Task>,
    options: &RunnerOptions,
    control: &BatchControl,
) -> RunReport {
    let started = Instant::now();
    let total = tasks.len();
    let semaphore = Arc::new(Semaphore::new(options.concurrency.max(1)));
    let mut set = JoinSet::new();
    // Each task's position and a copy, by tokio task id: a workflow that panics takes its task down with it.
    let mut spawned = HashMap::new();
    for (position, task) in tasks.into_iter().enumerate() {
        let model = Arc::clone(&model);
        let semaphore = Arc::clone(&semaphore);
        let mut options = options.clone();
        let control = control.clone();
        let copy = task.clone();
        let handle = set.spawn(async move {
            // The semaphore is never closed, so acquiring only fails if it were; run unthrottled then.
            let _permit = semaphore.acquire_owned().await.ok();
            // Read when the task starts, as Trinity-RFT's scheduler does when it hands a task to a runner.
            if let Some(dynamic) = &control.dynamic_timeout {
                options.timeout = dynamic.timeout(options.timeout);
            }
            let began = Instant::now();
            let (result, attempts) = run_with_retries(&model, &task, &options).await;
            if let (true, Some(dynamic)) = (control.observe, &control.dynamic_timeout) {
                dynamic.record_task(began.elapsed().as_secs_f64());
            }
            (position, task, result, attempts)
        });
        spawned.insert(handle.id(), (position, copy));
    }
    // Trinity-RFT bounds the wait for an over-rolled step or an evaluation by `max_timeout × (max_retry_times +
    // 1)`, after which it keeps what is done even below `min_tasks`.
    let step_limit = options.timeout.saturating_mul(options.max_retries.saturating_add(1));
    let limit = match (control.over_rollout, control.batch_limit) {
        (Some(over), _) => Some((OverRollout { min_tasks: over.min_tasks.min(total), ..over }, started + step_limit)),
        // Every task is awaited until the limit.
        (None, true) => Some((OverRollout { min_tasks: total, wait_after_min: Duration::ZERO }, started + step_limit)),
        (None, false) => None,
    };
    let (joined, stopped_early) = gather(&mut set, limit).await;
    let mut results: Vec<Outcome> = Vec::new();
    for joined in joined {
        match joined {
            Ok(result) => {
                spawned.retain(|_, (position, _)| *position != result.0);
                results.push(result);
            }
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
    let mut report = RunReport::default();
    if stopped_early {
        // What is left in `spawned` never finished: over-rollout cancelled it.
        let mut cancelled: Vec<(usize, Task)> = spawned.into_values().collect();
        cancelled.sort_by_key(|(position, _)| *position);
        report.cancelled = cancelled.iter().map(|(_, task)| describe(task)).collect();
        if control.over_rollout.is_some() {
            tracing::info!(
                "over-rollout: {} of {total} tasks done after {:.1} s; cancelled {}",
                results.len(),
                started.elapsed().as_secs_f64(),
                report.cancelled.join(", ")
            );
        } else {
            tracing::warn!(
                "{} of {total} tasks done within the batch's limit of {:.0} s (explorer.max_timeout × \
                 (max_retry_times + 1)); cancelled {}: the metrics are those of the tasks done",
                results.len(),
                step_limit.as_secs_f64(),
                report.cancelled.join(", ")
            );
        }
    }
    results.sort_by_key(|(position, ..)| *position);
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

/// Joins the tasks of `set` until all are done or, under over-rollout (`limit`: the policy and the step's
/// deadline), until `wait_after_min` passed after `min_tasks` were done or the deadline passed; then aborts the
/// rest and waits for them to be dropped, so nothing they started outlives the batch. Returns what was joined and
/// whether tasks were cancelled.
async fn gather<T: 'static>(
    set: &mut JoinSet<T>,
    limit: Option<(OverRollout, Instant)>,
) -> (Vec<Result<T, JoinError>>, bool) {
    let mut joined = Vec::new();
    // When the batch stops waiting: the step's deadline, then also `wait_after_min` after `min_tasks` are done.
    let mut cutoff = limit.map(|(_, deadline)| deadline);
    let mut min_reached = false;
    loop {
        if let Some((over, deadline)) = limit
            && !min_reached
            && joined.len() >= over.min_tasks
        {
            min_reached = true;
            cutoff = Some(deadline.min(Instant::now() + over.wait_after_min));
        }
        let next = match cutoff {
            Some(at) => tokio::select! {
                next = set.join_next() => next,
                () = tokio::time::sleep_until(at) => break,
            },
            None => set.join_next().await,
        };
        match next {
            Some(result) => joined.push(result),
            None => return (joined, false),
        }
    }
    set.abort_all();
    // Aborted tasks come back as cancelled; one that finished just before the abort keeps its result.
    let mut cancelled = 0;
    while let Some(result) = set.join_next().await {
        match result {
            Err(error) if error.is_cancelled() => cancelled += 1,
            other => joined.push(other),
        }
    }
    (joined, cancelled > 0)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Tasks that finish after the given seconds (`None`: never), each returning its index.
    fn tasks(seconds: &[Option<u64>]) -> JoinSet<usize> {
        let mut set = JoinSet::new();
        for (i, s) in seconds.iter().copied().enumerate() {
            set.spawn(async move {
                match s {
                    Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
                    None => std::future::pending::<()>().await,
                }
                i
            });
        }
        set
    }

    fn done(joined: &[Result<usize, JoinError>]) -> Vec<usize> {
        let mut done: Vec<usize> = joined.iter().map(|r| *r.as_ref().unwrap()).collect();
        done.sort_unstable();
        done
    }

    #[test]
    fn the_minimum_is_trinity_rfts_ceiling() {
        let over = |batch, ratio| OverRollout::new(batch, ratio, Duration::ZERO).min_tasks;
        assert_eq!(over(4, 0.25), 3);
        assert_eq!(over(4, 0.3), 3);
        assert_eq!(over(10, 0.3), 7);
        assert_eq!(over(3, 0.5), 2);
        assert_eq!(over(1, 0.9), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn without_over_rollout_every_task_is_awaited() {
        let mut set = tasks(&[Some(1), Some(500)]);
        let (joined, early) = gather(&mut set, None).await;
        assert!(!early);
        assert_eq!(done(&joined), [0, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_task_is_cancelled_wait_after_min_after_the_minimum() {
        let started = Instant::now();
        let over = OverRollout { min_tasks: 2, wait_after_min: Duration::from_secs(5) };
        let mut set = tasks(&[Some(1), None, Some(3), Some(6)]);
        let (joined, early) = gather(&mut set, Some((over, started + Duration::from_secs(1000)))).await;
        assert!(early);
        // The minimum is reached at 3 s; the task done at 6 s still counts, the hanging one is cancelled at 8 s.
        assert_eq!(done(&joined), [0, 2, 3]);
        assert_eq!(started.elapsed().as_secs(), 8);
        assert!(set.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_step_whose_tasks_all_finish_in_time_cancels_nothing() {
        let started = Instant::now();
        let over = OverRollout { min_tasks: 1, wait_after_min: Duration::from_secs(30) };
        let mut set = tasks(&[Some(1), Some(20)]);
        let (joined, early) = gather(&mut set, Some((over, started + Duration::from_secs(1000)))).await;
        assert!(!early);
        assert_eq!(done(&joined), [0, 1]);
        assert_eq!(started.elapsed().as_secs(), 20, "the batch ends when its last task does");
    }

    #[tokio::test(start_paused = true)]
    async fn the_step_deadline_ends_the_wait_below_the_minimum() {
        let started = Instant::now();
        let over = OverRollout { min_tasks: 3, wait_after_min: Duration::from_secs(30) };
        let mut set = tasks(&[Some(1), None, None]);
        let (joined, early) = gather(&mut set, Some((over, started + Duration::from_secs(50)))).await;
        assert!(early);
        assert_eq!(done(&joined), [0]);
        assert_eq!(started.elapsed().as_secs(), 50);
    }

    #[test]
    fn the_dynamic_timeout_follows_the_mean_task_time_after_the_warm_up() {
        let max = Duration::from_secs(100);
        let dynamic = DynamicTimeout::new(3.0, 1);
        assert_eq!(dynamic.timeout(max), max, "no step observed yet");
        dynamic.record_task(2.0);
        dynamic.record_task(4.0);
        assert_eq!(dynamic.timeout(max), max, "the warm-up step has not ended");
        let cut = RunReport { cancelled: vec!["t#1".into()], ..RunReport::default() };
        dynamic.record_step(&cut);
        assert_eq!(dynamic.timeout(max), max, "a step with cancelled tasks is not fully observed");
        dynamic.record_step(&RunReport::default());
        assert_eq!(dynamic.timeout(max), Duration::from_secs(9), "3 × the mean of 2 s and 4 s");
        dynamic.record_task(300.0);
        assert_eq!(dynamic.timeout(max), max, "never above max_timeout");
    }
}
