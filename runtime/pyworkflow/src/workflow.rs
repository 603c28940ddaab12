//! A Python workflow as a trinity [`Workflow`]: one task, one worker, the model calls answered here.

use std::path::PathBuf;

use serde_json::{Map, Value, json};
use trinity_buffer::{Eid, Experience, Task, TruncateStatus};
use trinity_engine::{FinishReason, SamplingParams};
use trinity_explorer::{ExplorerError, RolloutModel, Workflow, WorkflowContext, WorkflowFuture, seed_mix};
use trinity_model::ChatMessage;

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
                Outcome::Done(experiences) => {
                    worker::check_in(worker);
                    convert(task, ctx, experiences).map_err(failed)
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
    Done(Vec<Value>),
    Raised(String),
    Broken(String),
}

/// Sends the task and answers the worker's model calls until it reports the task's end.
async fn drive(worker: &mut Worker, workflow: &PythonWorkflow, task: &Task, ctx: &WorkflowContext) -> Outcome {
    let message = json!({
        "type": "run",
        "workflow": workflow.name,
        "task": task_message(task, ctx),
        "model": {"model_path": crate::MODEL_PATH.get()},
    });
    if let Err(error) = worker.send(&message).await {
        return Outcome::Broken(format!("did not take the task: {error}"));
    }
    let mut calls = 0u64;
    loop {
        let message = match worker.receive().await {
            Ok(Some(message)) => message,
            Ok(None) => return Outcome::Broken("exited during the task".to_owned()),
            Err(error) => return Outcome::Broken(format!("broke the protocol: {error}")),
        };
        match message["type"].as_str() {
            Some("done") => {
                return Outcome::Done(message["experiences"].as_array().cloned().unwrap_or_default());
            }
            Some("failed") => return Outcome::Raised(message["traceback"].as_str().unwrap_or_default().to_owned()),
            Some("call") => {
                calls += 1;
                let id = message["id"].clone();
                let method = message["method"].as_str().unwrap_or_default();
                let reply = match answer(task, ctx, method, &message["params"], calls).await {
                    Ok(result) => json!({"type": "reply", "id": id, "result": result}),
                    Err(error) => json!({"type": "reply", "id": id, "error": error}),
                };
                if let Err(error) = worker.send(&reply).await {
                    return Outcome::Broken(format!("did not take a model reply: {error}"));
                }
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

/// Answers one model call the way Trinity-RFT's `ModelWrapper` would.
async fn answer(task: &Task, ctx: &WorkflowContext, method: &str, params: &Value, call: u64) -> Result<Value, String> {
    let model = &ctx.model;
    match method {
        "model_version" => Ok(model.model_version().into()),
        "message_token_len" => {
            let text = model.render_chat(&messages(params)?, false).map_err(|e| e.to_string())?;
            Ok(model.encode_prompt(&text, false).map_err(|e| e.to_string())?.len().into())
        }
        "chat" => {
            let prompt = model.chat_prompt(&messages(params)?, None).map_err(|e| e.to_string())?;
            generate(task, ctx, model, prompt, &params["kwargs"], call).await
        }
        "generate" => {
            let text = params["prompt"].as_str().ok_or("generate takes text prompts")?;
            let prompt = model.encode_prompt(text, true).map_err(|e| e.to_string())?;
            generate(task, ctx, model, prompt, &params["kwargs"], call).await
        }
        other => Err(format!("`{other}` is not served by trinity yet")),
    }
}

fn messages(params: &Value) -> Result<Vec<ChatMessage>, String> {
    let list = params["messages"].as_array().ok_or("messages must be a list")?;
    list.iter()
        .map(|m| {
            let role = m["role"].as_str().ok_or("a message without a role")?;
            let content = match &m["content"] {
                Value::String(text) => text.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            Ok(ChatMessage::new(role, content))
        })
        .collect()
}

/// Samples `n` completions of `prompt` with the call's keyword arguments over the taskset's rollout arguments.
async fn generate(
    task: &Task,
    ctx: &WorkflowContext,
    model: &RolloutModel,
    prompt: Vec<u32>,
    kwargs: &Value,
    call: u64,
) -> Result<Value, String> {
    if let Some(limit) = model.prompt_over_limit(prompt.len()) {
        return Err(format!("the prompt of {} tokens is over the model's limit of {limit}", prompt.len()));
    }
    let args = &task.rollout_args;
    let float = |key: &str, default: Option<f64>| kwargs[key].as_f64().or(default);
    let seed = seed_mix(&[
        args.seed.unwrap_or(42),
        task.batch_id,
        task.taskset_id as u64,
        task.index as u64,
        u64::from(ctx.attempt),
        call,
    ]);
    let params = SamplingParams {
        n: kwargs["n"].as_u64().unwrap_or(1).max(1) as usize,
        temperature: float("temperature", args.temperature).unwrap_or(1.0) as f32,
        top_p: float("top_p", args.top_p).unwrap_or(1.0) as f32,
        top_k: kwargs["top_k"].as_i64().or(args.top_k).filter(|k| *k > 0).map_or(0, |k| k as usize),
        min_p: float("min_p", args.min_p).unwrap_or(0.0) as f32,
        seed: Some(seed),
        max_tokens: kwargs["max_tokens"].as_u64().map(|t| t as usize).or(args.max_tokens.map(|t| t as usize)),
        stop: match kwargs["stop"].as_array() {
            Some(stop) => stop.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect(),
            None => args.stop.clone(),
        },
        ..SamplingParams::default()
    };
    let generation = model.generate(prompt.clone(), params).await.map_err(|e| e.to_string())?;
    let prompt_text = model.decode(&prompt).map_err(|e| e.to_string())?;
    let completions = generation.completions.into_iter().map(|completion| {
        let mut tokens = prompt.clone();
        tokens.extend_from_slice(&completion.tokens);
        let truncated = completion.finish_reason == FinishReason::Length;
        json!({
            "tokens": tokens,
            "prompt_length": prompt.len(),
            "logprobs": completion.logprobs,
            "prompt_text": prompt_text,
            "response_text": completion.text,
            "truncate_status": if truncated { Value::from("response_truncated") } else { Value::Null },
        })
    });
    Ok(Value::Array(completions.collect()))
}

/// The worker's experiences as trinity experiences, checked for what the trainer reads.
fn convert(task: &Task, ctx: &WorkflowContext, experiences: Vec<Value>) -> Result<Vec<Experience>, String> {
    if experiences.is_empty() {
        return Err("the python workflow returned no experience".to_owned());
    }
    let version = ctx.model.model_version();
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
            let eid = Eid {
                batch: task.batch_id,
                task: task.index as u64,
                run: e["run"].as_u64().unwrap_or(0),
                step: e["step"].as_u64().unwrap_or(0),
            };
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
