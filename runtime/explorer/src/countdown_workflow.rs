//! `countdown`: reach a target number with the given numbers (TinyZero's task), scored by `countdown_reward`.
//!
//! Rows are `{"numbers": [...], "target": N}` (what `trinity_reward::countdown_tasks` generates); the prompt is
//! the row's prompt field when it has one, else TinyZero's prompt rendered from the numbers and target.

use trinity_buffer::Task;
use trinity_model::ChatMessage;
use trinity_reward::countdown_tasks::{CountdownPuzzle, countdown_prompt};

use crate::error::ExplorerError;
use crate::math_workflow::{describe, rollout};
use crate::workflow::{Workflow, WorkflowContext, WorkflowEntry, WorkflowFuture};

#[derive(Debug, Clone, Copy)]
struct Countdown;

impl Workflow for Countdown {
    fn run<'a>(&'a self, task: &'a Task, ctx: &'a WorkflowContext) -> WorkflowFuture<'a> {
        Box::pin(async move {
            let puzzle = puzzle(task)?;
            let prompt = task.prompt().unwrap_or_else(|| countdown_prompt(&puzzle));
            let mut messages = Vec::new();
            if let Some(system) = task.system_prompt() {
                messages.push(ChatMessage::new("system", system));
            }
            messages.push(ChatMessage::new("user", prompt.clone()));
            let reward = task.reward_fn.as_deref().unwrap_or("countdown_reward");
            rollout(task, ctx, &messages, Some(&prompt), reward, Some(&puzzle.truth())).await
        })
    }
}

fn puzzle(task: &Task) -> Result<CountdownPuzzle, ExplorerError> {
    let fail = |message: &str| ExplorerError::Task { task: describe(task), message: message.to_owned() };
    let numbers = task
        .raw
        .get("numbers")
        .and_then(|n| n.as_array())
        .ok_or_else(|| fail("a countdown row needs `numbers`, a list of integers"))?
        .iter()
        .map(|n| n.as_i64().ok_or_else(|| fail("`numbers` must hold integers")))
        .collect::<Result<Vec<i64>, _>>()?;
    let target = task
        .raw
        .get("target")
        .and_then(|t| t.as_i64().or_else(|| t.as_str().and_then(|s| s.trim().parse().ok())))
        .ok_or_else(|| fail("a countdown row needs an integer `target`"))?;
    Ok(CountdownPuzzle { numbers, target })
}

fn countdown() -> Box<dyn Workflow> {
    Box::new(Countdown)
}

inventory::submit! {
    WorkflowEntry { name: "countdown", description: "reach a target with given numbers; countdown_reward", build: countdown }
}
