//! Rewards from an LLM judge, the first auxiliary model: `math_ruler_workflow` and its `async_math_ruler_workflow`
//! twin (Trinity-RFT's `MathRULERWorkflow`, after OpenPipe ART's RULER) and `rubric_judge_workflow`
//! (`RubricJudgeWorkflow`, after the RaR-Implicit method of arXiv 2507.17746); `rubric_judge_openai_workflow` is the
//! rubric judge over an OpenAI-compatible endpoint (`judge_endpoint.rs`) and `math_trainable_ruler_workflow` the
//! RULER judge played by the policy itself (`trainable_ruler_workflow.rs`), both on the code here.
//!
//! - `math_ruler_workflow` samples the group as `math_workflow` does (the task's reward, `math_reward` by default
//!   with its think/answer system prompt, is the "gold reward", kept as metrics), then shows the judge the
//!   question and every candidate at once and asks for a list of scores in [0, 1]: the last `[...]` in its reply,
//!   clipped to [0, 1], are the rewards. A reply without such a list (or with a different count) gives every
//!   candidate 0 and `judge_success` 0.
//! - `rubric_judge_workflow` asks the judge, per response, for a 1–10 rating against the row's `rubric` list
//!   (`{description, weight}` entries) in a fenced JSON block; the reward is `rating × 0.1` (Trinity-RFT 0.6.0's
//!   normalisation: 1 → 0.1, 10 → 1), 0 when the reply has no valid rating. `judge_success` is the group's share
//!   of valid ratings. The judge samples greedily.
//!
//! The prompts are Trinity-RFT 0.6.0's, word for word, so a judge sees what it would see there. The judge's reply
//! is capped by its own `max_response_tokens`.

use trinity_buffer::{Experience, Task, TruncateStatus};
use trinity_engine::SamplingParams;
use trinity_model::ChatMessage;

use crate::auxiliary::AuxiliaryModel;
use crate::error::ExplorerError;
use crate::judge_endpoint::JudgeEndpoint;
use crate::math_workflow::{describe, mix, sample_group, sampling_params, score};
use crate::workflow::{Workflow, WorkflowContext, WorkflowEntry, WorkflowFuture};

/// The first auxiliary model, or an error naming what the workflow needs.
pub(crate) fn judge<'a>(
    task: &Task,
    ctx: &'a WorkflowContext,
    workflow: &str,
) -> Result<&'a AuxiliaryModel, ExplorerError> {
    ctx.model.auxiliary_models().first().ok_or_else(|| ExplorerError::Task {
        task: describe(task),
        message: format!("{workflow} needs a judge model: list it under explorer.auxiliary_models"),
    })
}

pub(crate) fn prompt_of(task: &Task) -> Result<String, ExplorerError> {
    task.prompt().ok_or_else(|| ExplorerError::Task {
        task: describe(task),
        message: format!("the row has no prompt field `{}`", task.format.prompt_key),
    })
}

/// The judge's sampling: its own limits, seeded from its configured seed, the task and the attempt, so a run is
/// reproducible.
fn judge_params(judge: &AuxiliaryModel, task: &Task, ctx: &WorkflowContext, temperature: f32) -> SamplingParams {
    let seed = mix(&[judge.seed(), task.batch_id, task.taskset_id as u64, task.index as u64, u64::from(ctx.attempt)]);
    SamplingParams { n: 1, temperature, seed: Some(seed), ..SamplingParams::default() }
}

pub(crate) fn answered(experiences: &[Experience]) -> bool {
    !experiences.iter().all(|e| e.truncate_status == Some(TruncateStatus::PromptTruncated))
}

/// The task's messages for the RULER workflows: the task's system prompt, else Trinity-RFT's think/answer one when
/// the reward is `math_reward` (its default), then the question. Returns the messages, the question and the
/// reward's name.
pub(crate) fn ruler_messages(task: &Task) -> Result<(Vec<ChatMessage>, String, String), ExplorerError> {
    let prompt = prompt_of(task)?;
    let reward = task.reward_fn.clone().unwrap_or_else(|| "math_reward".to_owned());
    let system = task.system_prompt().or_else(|| (reward == "math_reward").then(|| RULER_MATH_SYSTEM.to_owned()));
    let mut messages = Vec::new();
    if let Some(system) = system {
        messages.push(ChatMessage::new("system", system));
    }
    messages.push(ChatMessage::new("user", prompt.clone()));
    Ok((messages, prompt, reward))
}

/// Scores the group with the task's reward as the "gold reward": its components and their sum (`gold_reward`)
/// become metrics; the caller decides the reward.
pub(crate) async fn gold_rewards(
    task: &Task,
    experiences: &mut [Experience],
    reward: &str,
    prompt: &str,
) -> Result<(), ExplorerError> {
    let truth = task.truth();
    score(task, experiences, reward, &task.reward_fn_args, truth.as_deref(), Some(prompt)).await?;
    for e in experiences.iter_mut() {
        e.metrics.insert("gold_reward".to_owned(), e.reward);
    }
    Ok(())
}

/// The two messages that ask a judge to score `responses` to `question` (Trinity-RFT's RULER prompt; `layout`
/// says which of its two spellings).
pub(crate) fn ruler_judge_messages(question: &str, responses: &[&str], layout: RulerLayout) -> [ChatMessage; 2] {
    [
        ChatMessage::new("system", ruler_system_prompt(responses.len())),
        ChatMessage::new("user", ruler_user_prompt(question, responses, layout)),
    ]
}

#[derive(Debug, Clone, Copy)]
struct MathRuler;

impl Workflow for MathRuler {
    fn run<'a>(&'a self, task: &'a Task, ctx: &'a WorkflowContext) -> WorkflowFuture<'a> {
        Box::pin(async move {
            let judge = judge(task, ctx, "math_ruler_workflow")?;
            let (messages, prompt, reward) = ruler_messages(task)?;
            let mut experiences = sample_group(task, ctx, &messages, sampling_params(task, ctx)).await?;
            if !answered(&experiences) {
                return Ok(experiences);
            }
            gold_rewards(task, &mut experiences, &reward, &prompt).await?;
            let responses: Vec<&str> = experiences.iter().map(|e| e.response_text.as_deref().unwrap_or("")).collect();
            let judge_messages = ruler_judge_messages(&prompt, &responses, RulerLayout::Spaced);
            // Trinity-RFT asks without a temperature: the judge server's default, 1.
            let reply = judge
                .chat(&judge_messages, judge_params(judge, task, ctx, 1.0))
                .await
                .map_err(|source| ExplorerError::Auxiliary { task: describe(task), source: Box::new(source) })?;
            let scores = ruler_scores(&reply, experiences.len());
            if scores.is_none() {
                tracing::warn!("task {}: no list of {} scores in the judge's reply", describe(task), experiences.len());
            }
            let success = if scores.is_some() { 1.0 } else { 0.0 };
            for (i, e) in experiences.iter_mut().enumerate() {
                e.reward = scores.as_ref().map_or(0.0, |s| s[i]);
                e.metrics.insert("judge_success".to_owned(), success);
            }
            Ok(experiences)
        })
    }
}

/// Trinity-RFT's system prompt for the RULER workflows with `math_reward` (its own line breaks).
pub(crate) const RULER_MATH_SYSTEM: &str = "A conversation between User and Assistant. The user asks a question, and \
the Assistant solves it. The assistant first thinks about the reasoning process in the mind and then provides the \
user with the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> \
tags, respectively, i.e.,\n<think> reasoning process here </think>\n<answer> answer here </answer>.\n";

/// The two spellings of Trinity-RFT 0.6.0's RULER user prompt: `math_ruler_workflow` puts a blank line between
/// its parts, `math_trainable_ruler_workflow` a line break.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RulerLayout {
    Spaced,
    Compact,
}

fn ruler_system_prompt(n: usize) -> String {
    format!(
        "You are a fair judge. The user will provide a question and {n} candidate solutions to it. Your task is to \
         compare the solutions, see how well they resolve the question, and assign a score within the range [0, 1] \
         for each solution."
    )
}

fn ruler_user_prompt(question: &str, responses: &[&str], layout: RulerLayout) -> String {
    let solutions: Vec<String> =
        responses.iter().enumerate().map(|(i, r)| format!("Candidate solution {}: {r}", i + 1)).collect();
    let gap = match layout {
        RulerLayout::Spaced => "\n\n",
        RulerLayout::Compact => "\n",
    };
    let n = responses.len();
    format!(
        "\nBelow is a question and several candidate solutions.{gap}Question: {question}\n\nSolution format \
         requirement: first think about the reasoning process in the mind and then provides the final answer. The \
         reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, \
         respectively, i.e.,\n<think> reasoning process here </think>\n<answer> answer here </answer>.{gap}{}{gap}\
         Please assign a score within the range [0, 1] for each of them, reflecting how well they solve the \
         question.\nYou may compare them against each other and think step by step before returning your final \
         scores, but keep your reasoning process brief and concise when possible.{gap}Conclude your response with \
         a list of scores, in the following format: [score for solution 1, score for solution 2, ..., score for \
         solution {n}]\n",
        solutions.join("\n\n"),
    )
}

/// The last `[...]` of the judge's reply as `n` scores clipped to [0, 1]; `None` when there is none, it does not
/// parse as a list of numbers (a trailing comma is fine, as for Python's `literal_eval`), or it holds another
/// count.
pub(crate) fn ruler_scores(reply: &str, n: usize) -> Option<Vec<f64>> {
    let (open, close) = (reply.rfind('[')?, reply.rfind(']')?);
    if open > close {
        return None;
    }
    let inner = reply[open + 1..close].trim();
    let inner = inner.strip_suffix(',').unwrap_or(inner);
    if inner.trim().is_empty() {
        return (n == 0).then(Vec::new);
    }
    let scores: Vec<f64> = inner
        .split(',')
        .map(|s| s.trim().parse::<f64>().ok().filter(|v| v.is_finite()).map(|v| v.clamp(0.0, 1.0)))
        .collect::<Option<_>>()?;
    (scores.len() == n).then_some(scores)
}

/// Who rates the answers of the rubric judge.
#[derive(Debug, Clone, Copy)]
enum RubricJudgeSource {
    /// The first auxiliary model (`rubric_judge_workflow`).
    Auxiliary,
    /// An OpenAI-compatible endpoint named by environment variables (`rubric_judge_openai_workflow`).
    Endpoint,
}

/// The judge of one task of the rubric judge.
enum Rater<'a> {
    Auxiliary(&'a AuxiliaryModel),
    Endpoint(JudgeEndpoint),
}

#[derive(Debug, Clone, Copy)]
struct RubricJudge {
    source: RubricJudgeSource,
}

/// Trinity-RFT's default system prompt for `rubric_judge_workflow` (with the indentation its source leaves in).
const RUBRIC_DEFAULT_SYSTEM: &str = "A conversation between User and Assistant. The user asks a question, and the \
Assistant solves it. The assistant first thinks about the reasoning process in the mind and then provides the user \
with the answer.\n    ";

const RUBRIC_JUDGE_SYSTEM: &str = "You are an expert evaluator. Given a user prompt, a generated response, and a \
list of quality rubrics, please rate the overall quality of the response on a scale of 1 to 10 based on how well it \
satisfies the rubrics.\nConsider all rubrics holistically when determining your score. A response that violates \
multiple rubrics should receive a lower score, while a response that satisfies all rubrics should receive a higher \
score.\nStart your response with a valid JSON object that starts with \"```json\" and ends with \"```\". The JSON \
object should contain\na single key \"rating\" and the value should be an integer between 1 and 10.\nExample \
response:\n```json\n{\n\"rating\": 7\n}```";

impl Workflow for RubricJudge {
    fn run<'a>(&'a self, task: &'a Task, ctx: &'a WorkflowContext) -> WorkflowFuture<'a> {
        Box::pin(async move {
            // The endpoint is checked before sampling, as Trinity-RFT builds its client when the workflow starts.
            let rater = match self.source {
                RubricJudgeSource::Auxiliary => Rater::Auxiliary(judge(task, ctx, "rubric_judge_workflow")?),
                RubricJudgeSource::Endpoint => Rater::Endpoint(JudgeEndpoint::from_task(task)?),
            };
            let prompt = prompt_of(task)?;
            let system = task.system_prompt().unwrap_or_else(|| RUBRIC_DEFAULT_SYSTEM.to_owned());
            let messages = [ChatMessage::new("system", system), ChatMessage::new("user", prompt.clone())];
            let mut experiences = sample_group(task, ctx, &messages, sampling_params(task, ctx)).await?;
            if !answered(&experiences) {
                return Ok(experiences);
            }
            let rubrics = rubric_list(task);
            let mut valid = 0usize;
            for e in &mut experiences {
                let response = e.response_text.as_deref().unwrap_or("");
                let judge_messages = [
                    ChatMessage::new("system", RUBRIC_JUDGE_SYSTEM),
                    ChatMessage::new("user", rubric_user_prompt(&prompt, response, &rubrics)),
                ];
                let reply = match &rater {
                    Rater::Endpoint(endpoint) => endpoint.chat(task, &judge_messages).await?,
                    Rater::Auxiliary(judge) => {
                        judge.chat(&judge_messages, judge_params(judge, task, ctx, 0.0)).await.map_err(|source| {
                            ExplorerError::Auxiliary { task: describe(task), source: Box::new(source) }
                        })?
                    }
                };
                let rating = rubric_rating(&reply);
                valid += usize::from(rating.is_some());
                e.reward = rating.map_or(0.0, |r| r * 0.1);
            }
            let success = valid as f64 / experiences.len() as f64;
            for e in &mut experiences {
                e.metrics.insert("judge_success".to_owned(), success);
            }
            Ok(experiences)
        })
    }
}

/// The row's `rubric` entries as Trinity-RFT lists them, or its note that there are none.
fn rubric_list(task: &Task) -> String {
    let entries = task.raw.get("rubric").and_then(serde_json::Value::as_array).cloned().unwrap_or_default();
    if entries.is_empty() {
        tracing::warn!("task {}: no rubric is provided", describe(task));
        return "Rubrics are not provided.".to_owned();
    }
    let text = |v: Option<&serde_json::Value>| match v {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => "None".to_owned(),
    };
    entries
        .iter()
        .enumerate()
        .map(|(i, r)| format!("Rubric {i} (weight: {}): {}", text(r.get("weight")), text(r.get("description"))))
        .collect::<Vec<_>>()
        .join("\n")
}

fn rubric_user_prompt(question: &str, response: &str, rubrics: &str) -> String {
    format!(
        "Given the following prompt, response, and rubrics, please rate the overall quality of the response on a \
         scale of 1 to 10 based\non how well it satisfies the rubrics.\n<prompt>\n{question}\n</prompt>\n<response>\n\
         {response}\n</response>\n<rubrics>\n{rubrics}\n</rubrics>\nYour JSON Evaluation:"
    )
}

/// The `rating` (1 to 10) of the first fenced JSON block of the judge's reply.
fn rubric_rating(reply: &str) -> Option<f64> {
    let start = reply.find("```json").or_else(|| reply.find("```"))?;
    let end = start + 3 + reply.get(start + 3..)?.find("```")?;
    let block = &reply[start..end];
    let body = block.strip_prefix("```json").or_else(|| block.strip_prefix("```"))?.trim();
    let parsed: serde_json::Value = serde_json::from_str(body).ok()?;
    parsed.get("rating")?.as_f64().filter(|r| (1.0..=10.0).contains(r))
}

inventory::submit! {
    WorkflowEntry {
        name: "math_ruler_workflow",
        description: "math answers rewarded by an auxiliary judge comparing the whole group (RULER); math_reward kept as gold_reward",
        build: || Box::new(MathRuler),
    }
}

// Trinity-RFT's async twin runs the same code through its async model API; every workflow here is async.
inventory::submit! {
    WorkflowEntry {
        name: "async_math_ruler_workflow",
        description: "Trinity's async name of math_ruler_workflow (the same workflow)",
        build: || Box::new(MathRuler),
    }
}

inventory::submit! {
    WorkflowEntry {
        name: "rubric_judge_workflow",
        description: "answers rated 1-10 against the row's rubric by an auxiliary judge, reward rating × 0.1",
        build: || Box::new(RubricJudge { source: RubricJudgeSource::Auxiliary }),
    }
}

inventory::submit! {
    WorkflowEntry {
        name: "rubric_judge_openai_workflow",
        description: "rubric_judge_workflow with the judge an OpenAI-compatible endpoint (workflow_args judge_model_name, OPENAI_BASE_URL / OPENAI_API_KEY)",
        build: || Box::new(RubricJudge { source: RubricJudgeSource::Endpoint }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ruler_scores_come_from_the_last_list_clipped() {
        assert_eq!(ruler_scores("think [9] ... final: [0.5, 1.2, -1]", 3), Some(vec![0.5, 1.0, 0.0]));
        assert_eq!(ruler_scores("[0.5, 0.25]", 3), None, "another count");
        assert_eq!(ruler_scores("no list", 1), None);
        assert_eq!(ruler_scores("] then [", 1), None);
        assert_eq!(ruler_scores("[a, b]", 2), None);
        assert_eq!(ruler_scores("[0.5, 1,]", 2), Some(vec![0.5, 1.0]), "Python's literal_eval takes a trailing comma");
        assert_eq!(ruler_scores("[]", 1), None);
    }

    #[test]
    fn rubric_ratings_come_from_the_json_block() {
        assert_eq!(rubric_rating("```json\n{\"rating\": 7}\n``` because"), Some(7.0));
        assert_eq!(rubric_rating("``` {\"rating\": 10} ```"), Some(10.0));
        assert_eq!(rubric_rating("```json {\"rating\": 11} ```"), None, "out of range");
        assert_eq!(rubric_rating("{\"rating\": 7}"), None, "no block");
        assert_eq!(rubric_rating("```json {rating: 7} ```"), None);
    }

    #[test]
    fn the_ruler_prompt_asks_for_one_score_per_candidate() {
        let text = ruler_user_prompt("1+1?", &["<answer>2</answer>", "3"], RulerLayout::Spaced);
        assert!(text.contains("Candidate solution 1: <answer>2</answer>\n\nCandidate solution 2: 3\n\nPlease"));
        assert!(text.starts_with("\nBelow is a question and several candidate solutions.\n\nQuestion: 1+1?\n\n"));
        assert!(text.contains("first think about") && text.ends_with("score for solution 2]\n"), "{text}");
        let compact = ruler_user_prompt("1+1?", &["a"], RulerLayout::Compact);
        assert!(compact.contains("solutions.\nQuestion: 1+1?\n\nSolution format"), "{compact}");
        assert!(compact.contains("</answer>.\nCandidate solution 1: a\nPlease assign"), "{compact}");
        assert!(compact.contains("possible.\nConclude") && compact.ends_with("score for solution 1]\n"), "{compact}");
    }
}
