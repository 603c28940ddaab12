//! `math_eval_workflow` (and Trinity's `async_math_eval_workflow` name): math evaluation the way Qwen2.5-Math
//! evaluates (Trinity-RFT's `MathEvalWorkflow`).
//!
//! Messages: system "You are a helpful assistant.", user `<question>\nPlease reason step by step, and put your
//! final answer within \boxed{}.`, where the question is the row's `question` field (Trinity requires it; a row
//! without one falls back to the taskset's `prompt_key`). Sampling is fixed, as in Trinity: one answer per task
//! (n = 1 whatever `repeat_times`), temperature 0.6, top-p 0.8; only the response length limit and the seed
//! come from the taskset's `rollout_args`. The task's reward function is not used: `accuracy` (1 or 0) compares
//! the answer's final answer (the last `\boxed{}`, else "answer is", else the last number) with the
//! reference's, numerically ([`trinity_reward::answer`]); it is both the metric and the reward.

use trinity_buffer::Task;
use trinity_engine::SamplingParams;
use trinity_model::ChatMessage;
use trinity_reward::answer::{equivalent, final_answer};

use crate::error::ExplorerError;
use crate::math_workflow::{describe, sample_group, sampling_params};
use crate::workflow::{Workflow, WorkflowContext, WorkflowEntry, WorkflowFuture};

const SYSTEM_PROMPT: &str = "You are a helpful assistant.";

/// The user message of Qwen2.5-Math's `qwen_boxed` prompt.
pub(crate) fn eval_user_prompt(question: &str) -> String {
    format!("{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}.")
}

/// Whether `response` answers `truth` by Qwen2.5-Math's extraction, compared numerically.
pub(crate) fn eval_accuracy(response: &str, truth: &str) -> f64 {
    if equivalent(&final_answer(response), &final_answer(truth)) { 1.0 } else { 0.0 }
}

#[derive(Debug, Clone, Copy)]
struct MathEval;

impl Workflow for MathEval {
    fn run<'a>(&'a self, task: &'a Task, ctx: &'a WorkflowContext) -> WorkflowFuture<'a> {
        Box::pin(async move {
            let question = task
                .raw
                .get("question")
                .and_then(|q| q.as_str().map(str::to_owned))
                .or_else(|| task.prompt())
                .ok_or_else(|| ExplorerError::Task {
                    task: describe(task),
                    message: format!(
                        "math_eval_workflow needs a `question` field (or the prompt field `{}`)",
                        task.format.prompt_key
                    ),
                })?;
            let truth = task.truth().ok_or_else(|| ExplorerError::Task {
                task: describe(task),
                message: format!("the row has no reference answer `{}`", task.format.response_key),
            })?;
            let messages =
                [ChatMessage::new("system", SYSTEM_PROMPT), ChatMessage::new("user", eval_user_prompt(&question))];
            let defaults = sampling_params(task, ctx);
            let params = SamplingParams { n: 1, temperature: 0.6, top_p: 0.8, top_k: 0, min_p: 0.0, ..defaults };
            let mut experiences = sample_group(task, ctx, &messages, params).await?;
            for experience in &mut experiences {
                let accuracy = eval_accuracy(experience.response_text.as_deref().unwrap_or(""), &truth);
                experience.reward = accuracy;
                experience.metrics.insert("accuracy".to_owned(), accuracy);
            }
            Ok(experiences)
        })
    }
}

fn math_eval() -> Box<dyn Workflow> {
    Box::new(MathEval)
}

inventory::submit! {
    WorkflowEntry {
        name: "math_eval_workflow",
        description: "Qwen2.5-Math style eval: boxed prompt, one sample at T=0.6, accuracy metric",
        build: math_eval,
    }
}
inventory::submit! {
    WorkflowEntry {
        name: "async_math_eval_workflow",
        description: "Trinity's async name of math_eval_workflow (the same workflow)",
        build: math_eval,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_and_accuracy_follow_qwen_math_eval() {
        assert_eq!(
            eval_user_prompt("1+1?"),
            "1+1?\nPlease reason step by step, and put your final answer within \\boxed{}."
        );
        assert_eq!(eval_accuracy("so \\boxed{\\frac{1}{2}}", "0.5"), 1.0);
        assert_eq!(eval_accuracy("The answer is 72.", "#### 72"), 1.0);
        assert_eq!(eval_accuracy("first 3 then 4", "4"), 1.0, "the last number when nothing marks the answer");
        assert_eq!(eval_accuracy("\\boxed{5} not 4", "4"), 0.0);
    }
}
