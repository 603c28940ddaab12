//! `agent_process_workflow`: a task played by an agent program in any language, over the OpenAI API.
//!
//! Agents written for an OpenAI endpoint (an `openai` client script, an agent framework) cannot run as WASM, but
//! they can run as programs: for each rollout the workflow starts `workflow_args.command` with the run's own base
//! URL of the rollout model (`explorer.rollout_model.enable_openai_api`) in `OPENAI_BASE_URL`. Every reply the
//! program receives there is recorded (`enable_history`) with the exact sampled tokens and logprobs, and becomes
//! one experience of the rollout, as Trinity-RFT's agent workflows turn `extract_experience_from_history()` into
//! their experiences. The program reports its reward on the last line of its standard output.
//!
//! The program's environment: trinity's own, the config's `explorer.env_vars`, then `OPENAI_BASE_URL`, `OPENAI_API_KEY` (`EMPTY`; the server checks none),
//! `TRINITY_MODEL` (the name to put in `model`; auxiliary models answer under theirs), and `TRINITY_TASK`: the
//! task as a JSON object (`prompt`, `truth`, `system_prompt`, `raw` row, `workflow_args`, `rollout`: this
//! rollout's index, `repeat_times`). Its last non-empty line of output is `{"reward": r}` (optionally with
//! `"metrics": {name: number}` and `"info": {...}`) or a bare number. A program that exits with an error, prints
//! no reward, or made no model call fails its task, with its stderr in the message. Its rollouts run
//! concurrently (their requests batch together in the engine); a timeout or a failure kills the programs still
//! running.

use std::process::Stdio;
use std::sync::RwLock;

use serde_json::{Map, Value, json};
use trinity_buffer::{Eid, Experience, Task};

use crate::error::ExplorerError;
use crate::math_workflow::describe;
use crate::workflow::{Workflow, WorkflowContext, WorkflowEntry, WorkflowFuture};

/// The running config's `explorer.env_vars`, which Trinity-RFT sets in its workflow runners' environment: here the
/// programs' environment (built-in workflows and WASM plugins have none). Process-wide because a run has one
/// explorer config at a time (stages set theirs in turn); a workflow is built by name from the registry and sees
/// no config.
static ENVIRONMENT: RwLock<Vec<(String, String)>> = RwLock::new(Vec::new());

/// Sets the variables every agent program starts with (`explorer.env_vars`), replacing the previous ones. The
/// workflow's own variables (`OPENAI_BASE_URL`, ...) take precedence over them.
pub fn set_agent_environment(vars: Vec<(String, String)>) {
    *ENVIRONMENT.write().unwrap_or_else(std::sync::PoisonError::into_inner) = vars;
}

fn agent_environment() -> Vec<(String, String)> {
    ENVIRONMENT.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
}

/// Most bytes of a failed program's stderr quoted in the error.
const STDERR_TAIL: usize = 2000;

/// The workflow; all it needs is in the task's `workflow_args`.
#[derive(Debug)]
struct AgentProcess;

/// What the program reported.
#[derive(Debug, PartialEq)]
struct Outcome {
    reward: f64,
    metrics: Vec<(String, f64)>,
    info: Map<String, Value>,
}

impl Workflow for AgentProcess {
    fn run<'a>(&'a self, task: &'a Task, ctx: &'a WorkflowContext) -> WorkflowFuture<'a> {
        Box::pin(async move {
            let command = command(task)?;
            let rollouts = (0..ctx.repeat_times).map(|rollout| run_rollout(task, ctx, &command, rollout));
            let groups = futures_join_all(rollouts).await;
            let mut experiences = Vec::new();
            for group in groups {
                experiences.extend(group?);
            }
            Ok(experiences)
        })
    }
}

/// Runs the rollouts side by side; the first failure drops (and so kills) the others.
async fn futures_join_all<F: Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut set: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = set.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in set.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending { std::task::Poll::Pending } else { std::task::Poll::Ready(()) }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

fn task_error(task: &Task, message: impl Into<String>) -> ExplorerError {
    ExplorerError::Task { task: describe(task), message: message.into() }
}

/// `workflow_args.command`: the program and its arguments.
fn command(task: &Task) -> Result<Vec<String>, ExplorerError> {
    let malformed = || {
        task_error(
            task,
            "agent_process_workflow needs `workflow_args.command`: the agent program and its arguments as a list of strings",
        )
    };
    let list = task.workflow_args.get("command").and_then(Value::as_array).ok_or_else(malformed)?;
    let command: Vec<String> =
        list.iter().map(|v| v.as_str().map(str::to_owned)).collect::<Option<_>>().ok_or_else(malformed)?;
    if command.is_empty() {
        return Err(malformed());
    }
    Ok(command)
}

/// One rollout: the program runs against a session of its own; its recorded replies become the experiences.
async fn run_rollout(
    task: &Task,
    ctx: &WorkflowContext,
    command: &[String],
    rollout: u32,
) -> Result<Vec<Experience>, ExplorerError> {
    let session = ctx.model.openai_session().ok_or_else(|| {
        task_error(task, "agent_process_workflow needs `explorer.rollout_model.enable_openai_api: true`")
    })?;
    let task_json = json!({
        "prompt": task.prompt(),
        "truth": task.truth(),
        "system_prompt": task.system_prompt(),
        "raw": task.raw,
        "workflow_args": task.workflow_args,
        "rollout": rollout,
        "repeat_times": ctx.repeat_times,
    });
    let child = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .envs(agent_environment())
        .env("OPENAI_BASE_URL", session.base_url())
        .env("OPENAI_API_KEY", "EMPTY")
        .env("TRINITY_MODEL", session.model_name())
        .env("TRINITY_TASK", task_json.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A timed-out or failed task drops this future: the program must not outlive it.
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| task_error(task, format!("cannot start the agent program `{}`: {e}", command[0])))?;
    let output =
        child.wait_with_output().await.map_err(|e| task_error(task, format!("agent program `{}`: {e}", command[0])))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail = &stderr[stderr.floor_char_boundary(stderr.len().saturating_sub(STDERR_TAIL))..];
    if !output.status.success() {
        return Err(task_error(task, format!("agent program `{}` failed ({}): {tail}", command[0], output.status)));
    }
    let outcome = parse_outcome(&String::from_utf8_lossy(&output.stdout))
        .map_err(|e| task_error(task, format!("agent program `{}`: {e}; stderr: {tail}", command[0])))?;
    let recorded = session.extract_experience_from_history().ok_or_else(|| {
        task_error(
            task,
            "agent_process_workflow trains on the replies recorded through the OpenAI API; set \
             `explorer.rollout_model.enable_history: true`",
        )
    })?;
    if recorded.is_empty() {
        return Err(task_error(
            task,
            format!("agent program `{}` made no call to the rollout model through OPENAI_BASE_URL", command[0]),
        ));
    }
    Ok(experiences(task, rollout, recorded, &outcome))
}

/// The recorded replies as the rollout's experiences: one step each, in call order, all with the program's
/// reward (Trinity-RFT's reward propagation); the metrics go on the last, so they count once per rollout.
fn experiences(task: &Task, rollout: u32, recorded: Vec<Experience>, outcome: &Outcome) -> Vec<Experience> {
    let steps = recorded.len();
    recorded
        .into_iter()
        .enumerate()
        .map(|(step, mut experience)| {
            experience.eid =
                Eid { batch: task.batch_id, task: task.index as u64, run: u64::from(rollout), step: step as u64 };
            experience.group_id = experience.eid.tid();
            experience.reward = outcome.reward;
            experience.info.insert("taskset".to_owned(), task.taskset.clone().into());
            experience.info.extend(outcome.info.clone());
            if step + 1 == steps {
                experience.metrics.extend(outcome.metrics.iter().cloned());
                experience.metrics.insert("agent_steps".to_owned(), steps as f64);
            }
            experience
        })
        .collect()
}

/// The reward line: the last non-empty line of the program's output.
fn parse_outcome(stdout: &str) -> Result<Outcome, String> {
    let line = stdout.lines().rev().map(str::trim).find(|l| !l.is_empty()).ok_or("it printed no reward line")?;
    let value: Value = serde_json::from_str(line)
        .map_err(|_| format!("its last output line `{line}` is neither a number nor a JSON object with `reward`"))?;
    let (reward, object) = match &value {
        Value::Number(n) => (n.as_f64(), None),
        Value::Object(map) => (map.get("reward").and_then(Value::as_f64), Some(map)),
        _ => (None, None),
    };
    let reward = reward
        .filter(|r| r.is_finite())
        .ok_or_else(|| format!("its last output line `{line}` has no finite `reward`"))?;
    let mut outcome = Outcome { reward, metrics: Vec::new(), info: Map::new() };
    if let Some(map) = object {
        if let Some(metrics) = map.get("metrics") {
            let metrics = metrics.as_object().ok_or("`metrics` must be an object of numbers")?;
            for (name, value) in metrics {
                let value = value.as_f64().ok_or_else(|| format!("metric `{name}` is not a number"))?;
                outcome.metrics.push((name.clone(), value));
            }
        }
        if let Some(info) = map.get("info") {
            outcome.info = info.as_object().cloned().ok_or("`info` must be an object")?;
        }
    }
    Ok(outcome)
}

fn build() -> Box<dyn Workflow> {
    Box::new(AgentProcess)
}

inventory::submit! {
    WorkflowEntry {
        name: "agent_process_workflow",
        description: "an agent program (workflow_args.command) plays the task over the OpenAI API; its recorded replies are the experiences",
        build,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reward_line_is_the_last_line_a_number_or_an_object() {
        assert_eq!(parse_outcome("noise\n0.5\n\n").unwrap().reward, 0.5);
        let outcome = parse_outcome("{\"reward\": 1, \"metrics\": {\"turns\": 2}, \"info\": {\"won\": true}}").unwrap();
        assert_eq!(outcome.reward, 1.0);
        assert_eq!(outcome.metrics, [("turns".to_owned(), 2.0)]);
        assert_eq!(outcome.info["won"], json!(true));
        for bad in
            ["", "done", "{\"score\": 1}", "{\"reward\": \"high\"}", "{\"reward\": 1, \"metrics\": {\"a\": \"b\"}}"]
        {
            assert!(parse_outcome(bad).is_err(), "{bad}");
        }
    }
}
