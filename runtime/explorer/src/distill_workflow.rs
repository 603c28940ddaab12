//! On-policy distillation (Trinity-RFT's `OnPolicyDistillWorkflow`): `on_policy_distill_workflow` and
//! `on_policy_distill_math_workflow`.
//!
//! The student (the rollout model) samples the group; the teacher — the first auxiliary model — scores every
//! sampled sequence, and its logprobs of the response tokens become the experience's `teacher_logprobs`, from
//! which the `on_policy_distill` and `jsd` algorithms compute advantages in the trainer. The teacher scores at
//! `workflow_args.temperature` (default 1.0). The reward is not trained on: 0 for the plain workflow; the math
//! one prompts Qwen2.5-Math's way (system "You are a helpful assistant.", the question followed by the `\boxed{}`
//! instruction) and reports Qwen2.5-Math accuracy as its reward and `accuracy` metric. Every experience also
//! carries `kl_divergence`, the sum over its response of student minus teacher logprobs.

use trinity_buffer::{Experience, Task, TruncateStatus};
use trinity_model::ChatMessage;

use crate::error::ExplorerError;
use crate::math_eval_workflow::{eval_accuracy, eval_user_prompt};
use crate::math_workflow::{describe, sample_group, sampling_params};
use crate::workflow::{Workflow, WorkflowContext, WorkflowEntry, WorkflowFuture};

#[derive(Debug, Clone, Copy)]
struct OnPolicyDistill {
    /// Qwen2.5-Math prompts and accuracy reward (`on_policy_distill_math_workflow`).
    math: bool,
}

impl OnPolicyDistill {
    fn messages(&self, task: &Task) -> Result<Vec<ChatMessage>, ExplorerError> {
        let prompt = task.prompt().ok_or_else(|| ExplorerError::Task {
            task: describe(task),
            message: format!("the row has no prompt field `{}`", task.format.prompt_key),
        })?;
        if self.math {
            return Ok(vec![
                ChatMessage::new("system", "You are a helpful assistant."),
                ChatMessage::new("user", eval_user_prompt(&prompt)),
            ]);
        }
        let mut messages = Vec::new();
        if let Some(system) = task.system_prompt() {
            messages.push(ChatMessage::new("system", system));
        }
        messages.push(ChatMessage::new("user", prompt));
        Ok(messages)
    }

    fn workflow_name(&self) -> &'static str {
        if self.math { "on_policy_distill_math_workflow" } else { "on_policy_distill_workflow" }
    }
}

impl Workflow for OnPolicyDistill {
    fn run<'a>(&'a self, task: &'a Task, ctx: &'a WorkflowContext) -> WorkflowFuture<'a> {
        Box::pin(async move {
            let teacher = ctx.model.auxiliary_models().first().ok_or_else(|| ExplorerError::Task {
                task: describe(task),
                message: format!(
                    "{} needs a teacher model: list it under explorer.auxiliary_models",
                    self.workflow_name()
                ),
            })?;
            let temperature = task.workflow_args.get("temperature").and_then(serde_json::Value::as_f64).unwrap_or(1.0);
            let messages = self.messages(task)?;
            let mut experiences = sample_group(task, ctx, &messages, sampling_params(task, ctx)).await?;
            let truth = task.truth();
            for experience in &mut experiences {
                if experience.truncate_status == Some(TruncateStatus::PromptTruncated) {
                    // A placeholder trains nothing; it still needs the field every row of the batch has.
                    experience.teacher_logprobs = Some(vec![0.0; experience.logprobs.len()]);
                    continue;
                }
                let scored = teacher
                    .logprobs(&experience.tokens, temperature)
                    .await
                    .map_err(|source| ExplorerError::Auxiliary { task: describe(task), source: Box::new(source) })?;
                set_teacher_logprobs(experience, &scored)
                    .map_err(|message| ExplorerError::Task { task: describe(task), message })?;
                experience.reward = 0.0;
                if self.math
                    && let (Some(response), Some(truth)) = (experience.response_text.as_deref(), truth.as_deref())
                {
                    let accuracy = eval_accuracy(response, truth);
                    experience.metrics.insert("accuracy".to_owned(), accuracy);
                    experience.reward = accuracy;
                }
            }
            Ok(experiences)
        })
    }
}

/// Keeps the teacher's logprobs of the response tokens (`scored` covers `tokens[1..]`) and records the summed
/// student − teacher logprob gap as `kl_divergence`.
fn set_teacher_logprobs(experience: &mut Experience, scored: &[f32]) -> Result<(), String> {
    let start = experience.prompt_length.saturating_sub(1);
    let teacher = scored.get(start..).unwrap_or_default().to_vec();
    if teacher.len() != experience.logprobs.len() {
        return Err(format!(
            "the teacher scored {} response tokens, the student sampled {}",
            teacher.len(),
            experience.logprobs.len()
        ));
    }
    let kl: f64 = experience.logprobs.iter().zip(&teacher).map(|(s, t)| f64::from(s - t)).sum();
    experience.metrics.insert("kl_divergence".to_owned(), kl);
    experience.teacher_logprobs = Some(teacher);
    Ok(())
}

inventory::submit! {
    WorkflowEntry {
        name: "on_policy_distill_workflow",
        description: "on-policy distillation: the student samples, the first auxiliary model scores its tokens as teacher",
        build: || Box::new(OnPolicyDistill { math: false }),
    }
}

inventory::submit! {
    WorkflowEntry {
        name: "on_policy_distill_math_workflow",
        description: "on-policy distillation with Qwen2.5-Math prompts; accuracy reported as the reward",
        build: || Box::new(OnPolicyDistill { math: true }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trinity_buffer::Eid;

    #[test]
    fn teacher_logprobs_cover_exactly_the_response() {
        let mut e = Experience::single_turn(Eid::default(), vec![1, 2, 3, 4, 5], 3, vec![-1.0, -2.0]);
        // Scores of tokens 1..5: positions 2 and 3 (tokens 4 and 5) are the response.
        set_teacher_logprobs(&mut e, &[-9.0, -9.0, -0.5, -1.0]).unwrap();
        assert_eq!(e.teacher_logprobs, Some(vec![-0.5, -1.0]));
        assert_eq!(e.metrics["kl_divergence"], -1.5);
        assert!(set_teacher_logprobs(&mut e, &[-1.0]).unwrap_err().contains("scored 0"));
    }
}
