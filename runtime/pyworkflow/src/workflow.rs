//! A Python workflow as a trinity [`Workflow`]: one task, one worker, the model calls answered here.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use serde_json::{Map, Value, json};
use trinity_buffer::{Eid, Experience, Task, TruncateStatus};
use trinity_explorer::{ExplorerError, Workflow, WorkflowContext, WorkflowFuture};

use crate::calls::{Budget, Call, Refusal};
use crate::worker::{self, Worker};

/// The Python workflow class `name` (a dotted path, or a name in Trinity-RFT's `WORKFLOWS`).
#[derive(Debug)]
pub struct PythonWorkflow {
    name: String,
    interpreter: PathBuf,
}

impl PythonWorkflow {
    pub fn new(name: &str) -> Self {
        PythonWorkflow { name: name.to_owned(), interpreter: crate::interpreter() }
    }
}

impl Workflow for PythonWorkflow {
    fn run<'a>(&'a self, task: &'a Task, ctx: &'a WorkflowContext) -> WorkflowFuture<'a> {
        Box::pin(async move {
            let failed = |message: String| ExplorerError::Task { task: describe(task), message };
            let mut worker = worker::checkout(&self.interpreter, &self.name, &ctx.model).map_err(|error| {
                failed(format!(
                    "python workflow `{}`: cannot start `{}`: {error}",
                    self.name,
                    self.interpreter.display()
                ))
            })?;
            // Dropped here unless checked in: a timed-out (cancelled) or broken task kills its worker.
            let outcome = drive(&mut worker, self, task, ctx).await;
            match outcome {
                Outcome::Done(done) => {
                    worker::check_in(worker);
                    if let Some((run, traceback)) = done.failed_runs.first() {
                        tracing::warn!(
                            "task {}: python workflow `{}`: {} of {} runs completed and are kept, {} raised, {} \
                             skipped after the first failure; run {} raised first:\n{traceback}",
                            describe(task),
                            self.name,
                            done.completed_runs,
                            done.total_runs,
                            done.failed_runs.len(),
                            done.total_runs.saturating_sub(done.completed_runs + done.failed_runs.len() as u64),
                            run + 1,
                        );
                    }
                    convert(task, ctx, done.experiences).map_err(failed)
                }
                Outcome::OverBudget(message) => {
                    worker::check_in(worker);
                    Err(failed(format!("python workflow `{}` went past its model budget: {message}", self.name)))
                }
                Outcome::Raised(traceback) => {
                    worker::check_in(worker);
                    Err(failed(format!("python workflow `{}` raised:\n{traceback}", self.name)))
                }
                Outcome::Broken(message) => {
                    let pid = worker.pid();
                    let status = worker.exit_status().await;
                    Err(failed(format!("python workflow `{}`: worker {pid} {message} (exit: {status})", self.name)))
                }
            }
        })
    }
}

enum Outcome {
    Done(Done),
    /// The task's model budget refused a call (the message says which limit), whether or not the workflow
    /// then raised.
    OverBudget(String),
    Raised(String),
    Broken(String),
}

/// A task the worker finished: the experiences of the runs that completed, and the runs that raised (a workflow
/// that cannot repeat runs once per repeat, and Trinity-RFT's runner keeps the runs that completed).
struct Done {
    experiences: Vec<Value>,
    /// (run index, traceback) of each run that raised.
    failed_runs: Vec<(u64, String)>,
    completed_runs: u64,
    total_runs: u64,
}

impl Done {
    /// The task's end from the worker's `done` message: a task none of whose runs completed raised, with the
    /// first run's traceback.
    fn from_message(message: &Value) -> Outcome {
        let failed_runs: Vec<(u64, String)> = message["failed_runs"]
            .as_array()
            .map(|runs| {
                runs.iter()
                    .map(|r| (r["run"].as_u64().unwrap_or(0), r["traceback"].as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let experiences = message["experiences"].as_array().cloned().unwrap_or_default();
        let total_runs = message["total_runs"].as_u64().unwrap_or(1);
        let completed_runs = message["completed_runs"].as_u64().unwrap_or(total_runs);
        match failed_runs.first() {
            Some((_, traceback)) if completed_runs == 0 => Outcome::Raised(traceback.clone()),
            _ => Outcome::Done(Done { experiences, failed_runs, completed_runs, total_runs }),
        }
    }
}

/// A model call being answered: the call's id and its result.
type Answering<'a> = Pin<Box<dyn Future<Output = (Value, Result<Value, Refusal>)> + Send + 'a>>;

/// Sends the task and answers the worker's model calls until it reports the task's end. Calls are answered
/// concurrently, each replied to as soon as it is done, so a workflow that gathers several async calls has
/// them batched together in the engine.
async fn drive(worker: &mut Worker, workflow: &PythonWorkflow, task: &Task, ctx: &WorkflowContext) -> Outcome {
    let settings = crate::settings::current();
    let message = json!({
        "type": "run",
        "workflow": workflow.name,
        "task": task_message(task, ctx),
        "model": settings.rollout,
        "auxiliary_models": settings.auxiliary,
        "concurrent_mode": settings.concurrent_mode,
        "collect_partial_runs": settings.collect_partial_runs,
    });
    let limits = &settings.limits;
    let budget = std::sync::Arc::new(Budget::new(u64::from(limits.max_model_calls), limits.max_model_tokens));
    let sessions = worker.sessions();
    // Requests through the workflow's OpenAI clients spend the same budget.
    sessions.start_task(&budget);
    if let Err(error) = worker.send(&message).await {
        return Outcome::Broken(format!("did not take the task: {error}"));
    }
    let mut calls = 0u64;
    let mut answering: FuturesUnordered<Answering<'_>> = FuturesUnordered::new();
    loop {
        let message = tokio::select! {
            received = worker.receive() => match received {
                Ok(Some(message)) => message,
                Ok(None) => return Outcome::Broken("exited during the task".to_owned()),
                Err(error) => return Outcome::Broken(format!("broke the protocol: {error}")),
            },
            Some((id, result)) = answering.next(), if !answering.is_empty() => {
                let reply = match result {
                    Ok(result) => json!({"type": "reply", "id": id, "result": result}),
                    Err(Refusal::Error(error)) => json!({"type": "reply", "id": id, "error": error}),
                    Err(Refusal::Budget(error)) => json!({"type": "reply", "id": id, "error": error, "budget": true}),
                };
                if let Err(error) = worker.send(&reply).await {
                    return Outcome::Broken(format!("did not take a model reply: {error}"));
                }
                continue;
            }
        };
        match message["type"].as_str() {
            Some("done") => {
                sessions.end_task();
                return match budget.exceeded() {
                    Some(exceeded) => Outcome::OverBudget(exceeded),
                    None => Done::from_message(&message),
                };
            }
            Some("failed") => {
                sessions.end_task();
                return match budget.exceeded() {
                    Some(exceeded) => Outcome::OverBudget(exceeded),
                    None => Outcome::Raised(message["traceback"].as_str().unwrap_or_default().to_owned()),
                };
            }
            Some("call") => {
                calls += 1;
                let call = Call { task, ctx, sessions: &sessions, budget: &budget, number: calls };
                answering.push(Box::pin(async move {
                    let method = message["method"].as_str().unwrap_or_default();
                    let result = call.answer(method, &message["params"]).await;
                    (message["id"].clone(), result)
                }));
            }
            _ => return Outcome::Broken(format!("sent an unknown message {message}")),
        }
    }
}

/// Trinity-RFT's `Task` fields, as the worker builds the `Task` from them.
fn task_message(task: &Task, ctx: &WorkflowContext) -> Value {
    json!({
        "raw_task": Value::Object(task.raw.clone()),
        "repeat_times": ctx.repeat_times,
        "format_args": serde_json::to_value(&task.format).unwrap_or_default(),
        "rollout_args": serde_json::to_value(&task.rollout_args).unwrap_or_default(),
        "workflow_args": Value::Object(task.workflow_args.clone()),
        "reward_fn_args": Value::Object(task.reward_fn_args.clone()),
        "reward_fn": task.reward_fn,
        "is_eval": task.is_eval,
        "batch_id": task.batch_id,
        "task_id": task.index,
        "index": {"taskset_id": task.taskset_id, "index": task.index},
    })
}

/// The worker's experiences as trinity experiences, checked for what the trainer reads.
fn convert(task: &Task, ctx: &WorkflowContext, experiences: Vec<Value>) -> Result<Vec<Experience>, String> {
    if experiences.is_empty() {
        return Err("the python workflow returned no experience".to_owned());
    }
    let version = ctx.model.model_version();
    // Trinity-RFT tells apart experiences of one run that the workflow left at step 0 (an agent's recorded
    // replies) by a unique suffix of their ids; trinity's ids have none, so they are numbered in order instead.
    let mut unnumbered: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    experiences
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let bad = |what: &str| format!("experience {i} of the python workflow: {what}");
            let tokens: Vec<u32> = numbers(&e["tokens"]).ok_or_else(|| bad("no tokens"))?;
            let prompt_length = e["prompt_length"].as_u64().ok_or_else(|| bad("no prompt_length"))? as usize;
            if prompt_length == 0 || prompt_length >= tokens.len() {
                return Err(bad(&format!("prompt_length {prompt_length} for {} tokens", tokens.len())));
            }
            let response = tokens.len() - prompt_length;
            let logprobs: Vec<f32> = numbers(&e["logprobs"]).unwrap_or_else(|| vec![0.0; response]);
            if logprobs.len() != response {
                return Err(bad(&format!("{} logprobs for {response} response tokens", logprobs.len())));
            }
            let run = e["run"].as_u64().unwrap_or(0);
            let step = match e["step"].as_u64().unwrap_or(0) {
                0 => {
                    let next = unnumbered.entry(run).or_default();
                    *next += 1;
                    *next - 1
                }
                step => step,
            };
            let eid = Eid { batch: task.batch_id, task: task.index as u64, run, step };
            let mut experience = Experience::single_turn(eid, tokens, prompt_length, logprobs);
            if let Some(mask) = e["action_mask"].as_array() {
                let mask: Vec<bool> = mask.iter().map(|m| m.as_bool().unwrap_or(false)).collect();
                if mask.len() != response {
                    return Err(bad(&format!("an action mask of {} for {response} response tokens", mask.len())));
                }
                experience.action_mask = mask;
            }
            experience.reward = e["reward"].as_f64().unwrap_or(0.0);
            experience.token_level_rewards = numbers(&e["token_level_reward"]);
            experience.truncate_status = match e["truncate_status"].as_str() {
                Some("prompt_truncated") => Some(TruncateStatus::PromptTruncated),
                Some("response_truncated") => Some(TruncateStatus::ResponseTruncated),
                _ => None,
            };
            let info: Map<String, Value> = e["info"].as_object().cloned().unwrap_or_default();
            experience.info = info;
            experience.info.insert("taskset".to_owned(), task.taskset.clone().into());
            if let Some(metrics) = e["metrics"].as_object() {
                experience.metrics = metrics.iter().filter_map(|(k, v)| Some((k.clone(), v.as_f64()?))).collect();
            }
            experience.prompt_text = e["prompt_text"].as_str().map(str::to_owned);
            experience.response_text = e["response_text"].as_str().map(str::to_owned);
            experience.model_version = version;
            Ok(experience)
        })
        .collect()
}

fn numbers<T: FromF64>(value: &Value) -> Option<Vec<T>> {
    value.as_array()?.iter().map(|v| v.as_f64().map(T::from_f64)).collect()
}

trait FromF64 {
    fn from_f64(value: f64) -> Self;
}

impl FromF64 for u32 {
    fn from_f64(value: f64) -> Self {
        value as u32
    }
}

impl FromF64 for f32 {
    fn from_f64(value: f64) -> Self {
        value as f32
    }
}

fn describe(task: &Task) -> String {
    format!("{}#{}", task.taskset, task.index)
}
