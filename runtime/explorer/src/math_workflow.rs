//! Single-turn question → answer workflows: `simple_workflow`, `math_workflow` (and their `async_*` names).
//!
//! As in Trinity-RFT's `SimpleWorkflow`: messages are `[system?, user: task prompt]` (plus the reply prefix
//! as the start of the assistant turn), the group's `repeat_times` samples come from one request (one prefill),
//! each answer is scored by the task's reward function, and the reward components become experience metrics.

use std::sync::Arc;

use trinity_buffer::{Eid, Experience, RoutedExperts, Task, TruncateStatus};
use trinity_engine::{FinishReason, SamplingParams};
use trinity_model::ChatMessage;
use trinity_reward::RewardInput;

use crate::error::ExplorerError;
use crate::external_model::{ExternalModel, ExternalModelError, response_tokens};
use crate::workflow::{Workflow, WorkflowContext, WorkflowEntry, WorkflowFuture};

/// Trinity-RFT's `math_workflow` system prompt (DeepSeek-R1 style), used when the taskset gives none.
pub(crate) const THINK_ANSWER_PROMPT: &str = "A conversation between User and Assistant. The user asks a question, \
and the Assistant solves it. The assistant first thinks about the reasoning process in the mind and then provides \
the user with the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> \
</answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>.";

/// A single-turn workflow with its defaults.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SingleTurn {
    pub(crate) default_system_prompt: Option<&'static str>,
    /// The reward of a taskset that names none; `None`: the taskset must name one (its task fails otherwise).
    pub(crate) default_reward: Option<&'static str>,
    /// The workflow's name, for errors.
    pub(crate) name: &'static str,
}

impl Workflow for SingleTurn {
    fn run<'a>(&'a self, task: &'a Task, ctx: &'a WorkflowContext) -> WorkflowFuture<'a> {
        Box::pin(async move {
            let prompt = task.prompt().ok_or_else(|| ExplorerError::Task {
                task: describe(task),
                message: format!("the row has no prompt field `{}`", task.format.prompt_key),
            })?;
            let mut messages = Vec::new();
            if let Some(system) = task.system_prompt().or(self.default_system_prompt.map(str::to_owned)) {
                messages.push(ChatMessage::new("system", system));
            }
            messages.push(ChatMessage::new("user", prompt.clone()));
            let reward = task.reward_fn.as_deref().or(self.default_reward).ok_or_else(|| ExplorerError::Task {
                task: describe(task),
                message: format!(
                    "{} has no default reward function: set the taskset's default_reward_fn_type",
                    self.name
                ),
            })?;
            let truth = task.truth();
            rollout(task, ctx, &messages, Some(&prompt), reward, truth.as_deref()).await
        })
    }
}

/// Samples the group for one prompt and scores every answer with the reward called `reward`.
pub(crate) async fn rollout(
    task: &Task,
    ctx: &WorkflowContext,
    messages: &[ChatMessage],
    prompt_text: Option<&str>,
    reward: &str,
    truth: Option<&str>,
) -> Result<Vec<Experience>, ExplorerError> {
    let mut experiences = sample_group(task, ctx, messages, sampling_params(task, ctx)).await?;
    // Placeholders of a prompt over the limit keep reward 0: nothing was answered to score.
    if experiences.iter().all(|e| e.truncate_status == Some(TruncateStatus::PromptTruncated)) {
        return Ok(experiences);
    }
    score(task, &mut experiences, reward, &task.reward_fn_args, truth, prompt_text).await?;
    Ok(experiences)
}

/// Scores a group with the reward called `reward` and `args`: the components become the experiences' metrics,
/// their sum the reward. The whole group is scored in one call: a reward plugin pays its call overhead once
/// per task. The reward runs on a blocking thread (a reward plugin's call goes on to the plugin's own worker from
/// there) while this workflow awaits it, so a reward that loops until its deadline stalls only its own task;
/// every other workflow keeps generating and scoring meanwhile.
pub(crate) async fn score(
    task: &Task,
    experiences: &mut [Experience],
    reward: &str,
    args: &serde_json::Map<String, serde_json::Value>,
    truth: Option<&str>,
    prompt_text: Option<&str>,
) -> Result<(), ExplorerError> {
    let responses = responses(experiences);
    let (name, row, args) = (reward.to_owned(), task.raw.clone(), args.clone());
    let (truth, prompt_text) = (truth.map(str::to_owned), prompt_text.map(str::to_owned));
    let scored = tokio::task::spawn_blocking(move || {
        score_responses(&name, &row, &responses, &args, truth.as_deref(), prompt_text.as_deref())
    })
    .await
    .map_err(|error| ExplorerError::Task {
        task: describe(task),
        message: format!("reward `{reward}` panicked or was cancelled: {error}"),
    })?;
    let scores =
        scored.map_err(|source| ExplorerError::Reward { task: describe(task), reward: reward.to_owned(), source })?;
    apply_scores(experiences, scores);
    Ok(())
}

/// Each experience's response text and length, as a reward sees them (an external model's counts come from its
/// reply's usage).
fn responses(experiences: &[Experience]) -> Vec<(String, usize)> {
    experiences
        .iter()
        .map(|experience| {
            let tokens = response_tokens(experience).round() as usize;
            (experience.response_text.clone().unwrap_or_default(), tokens)
        })
        .collect()
}

fn score_responses(
    reward: &str,
    row: &serde_json::Map<String, serde_json::Value>,
    responses: &[(String, usize)],
    args: &serde_json::Map<String, serde_json::Value>,
    truth: Option<&str>,
    prompt: Option<&str>,
) -> Result<Vec<trinity_reward::RewardComponents>, trinity_reward::RewardError> {
    let inputs: Vec<RewardInput<'_>> = responses
        .iter()
        .map(|(response, tokens)| RewardInput { response, truth, prompt, args, response_tokens: Some(*tokens) })
        .collect();
    trinity_reward::score_group(reward, Some(row), &inputs)
}

fn apply_scores(experiences: &mut [Experience], scores: Vec<trinity_reward::RewardComponents>) {
    for (experience, components) in experiences.iter_mut().zip(scores) {
        experience.reward = trinity_reward::total(&components);
        experience.metrics = components;
    }
}

/// Samples `params.n` answers to one chat prompt (one request, one prefill) and builds their experiences:
/// tokens, logprobs, texts, model version and truncation status, reward not yet set.
pub(crate) async fn sample_group(
    task: &Task,
    ctx: &WorkflowContext,
    messages: &[ChatMessage],
    params: SamplingParams,
) -> Result<Vec<Experience>, ExplorerError> {
    if let Some(endpoint) = ctx.model.external_model() {
        return sample_external(task, ctx, endpoint, messages, params).await;
    }
    let prompt_tokens = ctx
        .model
        .chat_prompt(messages, task.reply_prefix())
        .map_err(|source| ExplorerError::Model { task: describe(task), source })?;
    sample_prompt(task, ctx, prompt_tokens, params).await
}

/// [`sample_group`] for a prompt already tokenized (a base model's raw-text prompt).
pub(crate) async fn sample_prompt(
    task: &Task,
    ctx: &WorkflowContext,
    prompt_tokens: Vec<u32>,
    params: SamplingParams,
) -> Result<Vec<Experience>, ExplorerError> {
    let model = &ctx.model;
    let model_error = |source| ExplorerError::Model { task: describe(task), source };
    if let Some(limit) = model.prompt_over_limit(prompt_tokens.len()) {
        return Ok(prompt_truncated(task, ctx, &prompt_tokens, limit));
    }
    let version = model.model_version();
    let generation = model
        .generate(prompt_tokens.clone(), params)
        .await
        .map_err(|source| ExplorerError::Engine { task: describe(task), source })?;
    let rendered_prompt = model.decode(&prompt_tokens).map_err(model_error)?;
    let mut experiences = Vec::with_capacity(generation.completions.len());
    for (run, completion) in generation.completions.into_iter().enumerate() {
        let eid = Eid { batch: task.batch_id, task: task.index as u64, run: run as u64, step: 0 };
        let mut tokens = prompt_tokens.clone();
        tokens.extend_from_slice(&completion.tokens);
        let mut experience = Experience::single_turn(eid, tokens, prompt_tokens.len(), completion.logprobs);
        // The engine's routing, when it records it, for the trainer's routing replay.
        experience.routed_experts =
            completion.routed_experts.map(|r| RoutedExperts { layers: r.layers, top_k: r.top_k, ids: r.ids });
        experience.model_version = version;
        experience.prompt_text = Some(rendered_prompt.clone());
        experience.response_text = Some(completion.text);
        if completion.finish_reason == FinishReason::Length {
            experience.truncate_status = Some(TruncateStatus::ResponseTruncated);
        }
        experience.info.insert("finish_reason".to_owned(), format!("{:?}", completion.finish_reason).into());
        experience.info.insert("taskset".to_owned(), task.taskset.clone().into());
        experiences.push(experience);
    }
    Ok(experiences)
}

/// [`sample_group`] on an external model: one chat completion request for the group. The experiences hold the
/// messages (as JSON, in `prompt_text`) and the reply texts, no tokens; the reply's token counts go into `info`
/// (see `external_model`).
async fn sample_external(
    task: &Task,
    ctx: &WorkflowContext,
    endpoint: &Arc<ExternalModel>,
    messages: &[ChatMessage],
    params: SamplingParams,
) -> Result<Vec<Experience>, ExplorerError> {
    if task.reply_prefix().is_some() {
        return Err(ExplorerError::Task {
            task: describe(task),
            message: "a reply prefix pre-fills the start of the assistant's turn, which the external model's chat \
                      endpoint cannot continue; remove format.reply_prefix"
                .into(),
        });
    }
    let n = params.n;
    let external = |source| ExplorerError::External { task: describe(task), source };
    let reply = endpoint.chat(messages, &params).await.map_err(external)?;
    if reply.choices.len() != n {
        let message = format!("{} choices for n = {n}", reply.choices.len());
        return Err(external(ExternalModelError::Reply { url: endpoint.url().to_owned(), message }));
    }
    let prompt: Vec<serde_json::Value> =
        messages.iter().map(|m| serde_json::json!({"role": m.role, "content": m.content})).collect();
    let prompt_text = serde_json::Value::from(prompt).to_string();
    let version = ctx.model.model_version();
    let mut experiences = Vec::with_capacity(n);
    for (run, choice) in reply.choices.into_iter().enumerate() {
        let eid = Eid { batch: task.batch_id, task: task.index as u64, run: run as u64, step: 0 };
        let mut experience = Experience::single_turn(eid, Vec::new(), 0, Vec::new());
        experience.model_version = version;
        experience.prompt_text = Some(prompt_text.clone());
        experience.response_text = Some(choice.text);
        if choice.finish_reason.as_deref() == Some("length") {
            experience.truncate_status = Some(TruncateStatus::ResponseTruncated);
        }
        let finish_reason = choice.finish_reason.unwrap_or_else(|| "unknown".to_owned());
        experience.info.insert("finish_reason".to_owned(), finish_reason.into());
        experience.info.insert("taskset".to_owned(), task.taskset.clone().into());
        if let Some(tokens) = reply.prompt_tokens {
            experience.info.insert("prompt_tokens".to_owned(), tokens.into());
        }
        if let Some(tokens) = reply.completion_tokens {
            experience.info.insert("response_tokens".to_owned(), (tokens as f64 / n.max(1) as f64).into());
        }
        experiences.push(experience);
    }
    Ok(experiences)
}

/// The group of a task whose prompt is longer than the engine accepts, with `model.enable_prompt_truncation`:
/// as Trinity-RFT does, one placeholder per rollout with reward 0, `truncate_status: prompt_truncated` and no
/// trained token, so the task costs nothing and fails nothing. A placeholder holds the prompt's first
/// `limit - 1` tokens and one masked response token (the trainer needs a response position to exist).
pub(crate) fn prompt_truncated(task: &Task, ctx: &WorkflowContext, prompt: &[u32], limit: usize) -> Vec<Experience> {
    tracing::warn!(
        "task {}: prompt of at least {} tokens exceeds {limit} (model.max_prompt_tokens); its {} rollouts are masked placeholders",
        describe(task),
        prompt.len(),
        ctx.repeat_times
    );
    let kept = limit.saturating_sub(1).max(1).min(prompt.len());
    let filler = ctx.model.tokenizer().eos_token_id().unwrap_or(0);
    (0..ctx.repeat_times)
        .map(|run| {
            let eid = Eid { batch: task.batch_id, task: task.index as u64, run: u64::from(run), step: 0 };
            let mut tokens = prompt[..kept].to_vec();
            tokens.push(filler);
            let mut experience = Experience::single_turn(eid, tokens, kept, vec![0.0]);
            experience.action_mask = vec![false];
            experience.truncate_status = Some(TruncateStatus::PromptTruncated);
            experience.model_version = ctx.model.model_version();
            experience.response_text = Some(String::new());
            experience.info.insert("finish_reason".to_owned(), "prompt_truncated".into());
            experience.info.insert("taskset".to_owned(), task.taskset.clone().into());
            experience.routed_experts = placeholder_routing(ctx, experience.tokens.len() - 1);
            experience
        })
        .collect()
}

/// Routing for a placeholder's `read` tokens when the engine records routing: nothing is trained on it, but the
/// replayed forward still runs it, so every id must be valid; as Trinity-RFT's dummy routing, the experts in
/// turn (`i mod experts` over the flat `[tokens, layers, k]` ids, distinct within a token's `k`).
fn placeholder_routing(ctx: &WorkflowContext, read: usize) -> Option<RoutedExperts> {
    let info = ctx.model.engine().info();
    let layout = info.routing.filter(|_| info.returns_routed_experts)?;
    let n = read * layout.layers * layout.top_k;
    let ids = (0..n).map(|i| (i % layout.num_experts) as u16).collect();
    Some(RoutedExperts { layers: layout.layers, top_k: layout.top_k, ids })
}

/// The task's rollout arguments as engine sampling parameters.
///
/// Every request gets its own seed, derived from the configured seed, the task and the attempt, so that a run
/// is reproducible while different tasks (and retries) do not share one random stream.
pub(crate) fn sampling_params(task: &Task, ctx: &WorkflowContext) -> SamplingParams {
    let args = &task.rollout_args;
    let base_seed = args.seed.unwrap_or(42);
    let seed = mix(&[base_seed, task.batch_id, task.taskset_id as u64, task.index as u64, u64::from(ctx.attempt)]);
    SamplingParams {
        n: ctx.repeat_times as usize,
        temperature: args.temperature.unwrap_or(1.0) as f32,
        top_p: args.top_p.unwrap_or(1.0) as f32,
        top_k: args.top_k.filter(|k| *k > 0).map_or(0, |k| k as usize),
        min_p: args.min_p.unwrap_or(0.0) as f32,
        seed: Some(seed),
        max_tokens: args.max_tokens.map(|t| t as usize),
        min_tokens: args.min_tokens.unwrap_or(0) as usize,
        stop: args.stop.clone(),
        ..SamplingParams::default()
    }
}

/// The per-rollout seed derivation ([`trinity_rng::mix_all`] over the parts), shared with plugin and Python
/// workflows so every workflow derives seeds the same way.
pub use trinity_rng::mix_all as mix;

/// A short name of a task for messages: `taskset#index`.
pub(crate) fn describe(task: &Task) -> String {
    format!("{}#{}", task.taskset, task.index)
}

fn simple() -> Box<dyn Workflow> {
    Box::new(SingleTurn { default_system_prompt: None, default_reward: Some("math_reward"), name: "simple_workflow" })
}

fn math() -> Box<dyn Workflow> {
    Box::new(SingleTurn {
        default_system_prompt: Some(THINK_ANSWER_PROMPT),
        default_reward: Some("math_reward"),
        name: "math_workflow",
    })
}

inventory::submit! {
    WorkflowEntry { name: "simple_workflow", description: "one question, one answer, scored by the task's reward", build: simple }
}
inventory::submit! {
    WorkflowEntry { name: "math_workflow", description: "math question with a think/answer system prompt; math_reward", build: math }
}
// Trinity-RFT registers an `async_` twin of these workflows (the same workflow run through its async model
// API); every workflow here is async, so the twins are the same workflows under Trinity's names.
inventory::submit! {
    WorkflowEntry { name: "async_simple_workflow", description: "Trinity's async name of simple_workflow (the same workflow)", build: simple }
}
inventory::submit! {
    WorkflowEntry { name: "async_math_workflow", description: "Trinity's async name of math_workflow (the same workflow)", build: math }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_differ_by_task_and_attempt_but_repeat() {
        assert_eq!(mix(&[42, 1, 0, 3, 0]), mix(&[42, 1, 0, 3, 0]));
        assert_ne!(mix(&[42, 1, 0, 3, 0]), mix(&[42, 1, 0, 4, 0]));
        assert_ne!(mix(&[42, 1, 0, 3, 0]), mix(&[42, 1, 0, 3, 1]));
        // Seeded rollouts depend on these values: the derivation must not move.
        assert_eq!(mix(&[42, 1, 0, 3, 0]), 13_540_509_141_172_807_170);
        assert_eq!(mix(&[7]), 309_689_372_594_955_804);
    }
}
