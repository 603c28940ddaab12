//! `math_boxed_workflow` (and Trinity's `async_math_boxed_workflow` name): math with the answer in `\boxed{}`,
//! as Trinity-RFT's `MathBoxedWorkflow` runs it.
//!
//! `workflow_args` (Trinity's): `use_base` (false) sends a base model's raw-text prompt
//! `System:<system>\nUser:\n<question>\nAssistant:\n` (without the `System:` part when there is no system
//! prompt), tokenized with the tokenizer's special tokens as vLLM's `generate` does, instead of the chat
//! template; `with_think` (false) switches the default system prompt to the think-then-box one and asks the
//! reward for one `<think>…</think>`; `format_score_coef` (0.1) is that format penalty. Both are passed to the
//! reward on top of `reward_fn_args`, as Trinity passes them to the reward call. The system prompt is the
//! taskset's, else the default. The reward is the task's (`math_boxed_reward` by default). A response cut at the
//! length limit keeps its reward but trains no token (action mask all false), as in Trinity.

use serde_json::{Map, Value};
use trinity_buffer::{Task, TruncateStatus};
use trinity_model::ChatMessage;

use crate::error::ExplorerError;
use crate::math_workflow::{describe, sample_group, sample_prompt, sampling_params, score};
use crate::workflow::{Workflow, WorkflowContext, WorkflowEntry, WorkflowFuture};

const BOXED_PROMPT: &str = "Please reason step by step, and put your final answer within \\boxed{}.";

const BOXED_THINK_PROMPT: &str = "You are a helpful assistant that solves MATH problems. You should first thinks \
about the reasoning process in mind and then provides the user with the answer. You should present your reasoning \
process using the format: <think>\n ...your reasoning process here... </think>\n first. You should always include \
your final answer in \\boxed{} as closed-form results.";

/// The workflow's arguments.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BoxedArgs {
    use_base: bool,
    with_think: bool,
    format_score_coef: f64,
}

impl BoxedArgs {
    pub(crate) fn from_args(args: &Map<String, Value>) -> Result<BoxedArgs, String> {
        let flag = |key: &str| match args.get(key) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(format!("workflow_args.{key} must be true or false, found {other}")),
        };
        let format_score_coef = match args.get("format_score_coef") {
            None | Some(Value::Null) => 0.1,
            Some(v) => v.as_f64().ok_or(format!("workflow_args.format_score_coef must be a number, found {v}"))?,
        };
        Ok(BoxedArgs { use_base: flag("use_base")?, with_think: flag("with_think")?, format_score_coef })
    }
}

/// Trinity's raw-text prompt for a base model.
pub(crate) fn base_prompt(system: Option<&str>, question: &str) -> String {
    match system.filter(|s| !s.is_empty()) {
        Some(system) => format!("System:{system}\nUser:\n{question}\nAssistant:\n"),
        None => format!("User:\n{question}\nAssistant:\n"),
    }
}

#[derive(Debug, Clone, Copy)]
struct MathBoxed;

impl Workflow for MathBoxed {
    fn run<'a>(&'a self, task: &'a Task, ctx: &'a WorkflowContext) -> WorkflowFuture<'a> {
        Box::pin(async move {
            let fail = |message: String| ExplorerError::Task { task: describe(task), message };
            let args = BoxedArgs::from_args(&task.workflow_args).map_err(fail)?;
            let question = task
                .prompt()
                .ok_or_else(|| fail(format!("the row has no prompt field `{}`", task.format.prompt_key)))?;
            let default = if args.with_think { BOXED_THINK_PROMPT } else { BOXED_PROMPT };
            let system = task.system_prompt().unwrap_or_else(|| default.to_owned());
            let params = sampling_params(task, ctx);
            let mut experiences = if args.use_base {
                if ctx.model.external_model().is_some() {
                    return Err(fail(
                        "workflow_args.use_base sends a raw-text prompt through the model's tokenizer, and the \
                         external model's chat endpoint takes messages only; remove it"
                            .into(),
                    ));
                }
                let text = base_prompt(Some(&system), &question);
                let tokens = ctx
                    .model
                    .encode_prompt(&text, true)
                    .map_err(|source| ExplorerError::Model { task: describe(task), source })?;
                sample_prompt(task, ctx, tokens, params).await?
            } else {
                let messages = [ChatMessage::new("system", system), ChatMessage::new("user", question.clone())];
                sample_group(task, ctx, &messages, params).await?
            };
            if experiences.iter().all(|e| e.truncate_status == Some(TruncateStatus::PromptTruncated)) {
                return Ok(experiences);
            }
            let mut reward_args = task.reward_fn_args.clone();
            reward_args.insert("with_think".to_owned(), args.with_think.into());
            reward_args.insert("format_score_coef".to_owned(), args.format_score_coef.into());
            let reward = task.reward_fn.as_deref().unwrap_or("math_boxed_reward");
            let truth = task.truth();
            score(task, &mut experiences, reward, &reward_args, truth.as_deref(), Some(&question)).await?;
            for experience in &mut experiences {
                if experience.truncate_status == Some(TruncateStatus::ResponseTruncated) {
                    experience.action_mask.iter_mut().for_each(|m| *m = false);
                }
            }
            Ok(experiences)
        })
    }
}

fn math_boxed() -> Box<dyn Workflow> {
    Box::new(MathBoxed)
}

inventory::submit! {
    WorkflowEntry {
        name: "math_boxed_workflow",
        description: "math question, answer in \\boxed{}; math_boxed_reward; use_base / with_think args",
        build: math_boxed,
    }
}
inventory::submit! {
    WorkflowEntry {
        name: "async_math_boxed_workflow",
        description: "Trinity's async name of math_boxed_workflow (the same workflow)",
        build: math_boxed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn args_and_base_prompts_follow_trinity() {
        let args = BoxedArgs::from_args(json!({"use_base": true}).as_object().unwrap()).unwrap();
        assert_eq!(args, BoxedArgs { use_base: true, with_think: false, format_score_coef: 0.1 });
        let err = BoxedArgs::from_args(json!({"with_think": "yes"}).as_object().unwrap()).unwrap_err();
        assert!(err.contains("with_think"));
        assert_eq!(base_prompt(Some("Be brief."), "1+1?"), "System:Be brief.\nUser:\n1+1?\nAssistant:\n");
        assert_eq!(base_prompt(None, "1+1?"), "User:\n1+1?\nAssistant:\n");
    }
}
