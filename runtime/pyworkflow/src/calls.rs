//! The model calls of a Python workflow, answered the way Trinity-RFT 0.6.0's `ModelWrapper` answers them, on
//! trinity's rollout model or one of its auxiliary models (`params.model`: the auxiliary model's index, absent
//! for the rollout model).
//!
//! `get_openai_client` hands out base URLs of the rollout model's OpenAI-compatible server
//! (`explorer.rollout_model.enable_openai_api`): a wrapper's URL is an [`OpenAiSession`] of its own, kept in
//! [`Sessions`], so that with `enable_history` the server files the replies it sends there for the wrapper's
//! `extract_experience_from_history`. Auxiliary models answer on the worker's own session URL under their names,
//! never recorded, as Trinity-RFT serves them without history.
//!
//! Requests through those clients spend the task attempt's [`Budget`] as `self.model`'s calls do: each session is
//! under the running task's budget ([`Sessions::start_task`]), which the server consults for every request on
//! the session's URL. A chat completion of `n` choices is one call that needs room for `n` tokens, and a
//! completions request one call per prompt, as `chat(n=...)` and `generate([...])` count; its generated tokens
//! are spent when it ends. The request past a limit gets a 429 (`RateLimitError` in the `openai` client, not
//! retried) whose message names the key, and the task fails as for any refusal. Only requests on the URLs
//! trinity handed out are counted: a client the workflow points at the server's plain URL is not.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use trinity_buffer::{Eid, Experience, Task, TruncateStatus};
use trinity_engine::{FinishReason, SamplingParams};
use trinity_explorer::{
    AuxiliaryModel, Conversation, OpenAiSession, OpenAiView, RolloutModel, RunBudget, WorkflowContext, seed_mix,
};
use trinity_model::ChatMessage;

/// What the rollout model's OpenAI API needs, said where a workflow asks for it without it.
const NO_OPENAI_API: &str = "trinity serves the OpenAI clients of `self.model` and of the auxiliary models from the \
                             rollout model's OpenAI-compatible API, which is off: set \
                             `explorer.rollout_model.enable_openai_api: true`";

/// The OpenAI sessions of one worker's model wrappers: `0` is the worker's `self.model`, which lives as long as the
/// worker (Trinity-RFT's runner keeps one `ModelWrapper` across its tasks); the others belong to wrappers made by
/// `clone_with_isolated_history` and end with the task ([`Sessions::end_task`]).
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    open: Mutex<HashMap<u64, OpenAiSession>>,
    /// The running task's budget, which every session is under while the task runs.
    budget: Mutex<Option<Arc<Budget>>>,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, OpenAiSession>> {
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn budget(&self) -> Option<Arc<Budget>> {
        self.budget.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Puts the worker's sessions, and those its task opens, under the task attempt's `budget`.
    pub(crate) fn start_task(&self, budget: &Arc<Budget>) {
        *self.budget.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::clone(budget));
        for session in self.lock().values() {
            session.set_budget(Some(Arc::clone(budget) as _));
        }
    }

    /// The session `id`, opened on `view` (under the running task's budget) if it is not yet.
    fn session<R>(&self, id: u64, view: &Arc<OpenAiView>, then: impl FnOnce(&OpenAiSession) -> R) -> R {
        let budget = self.budget();
        let mut open = self.lock();
        let session = open.entry(id).or_insert_with(|| {
            let session = OpenAiSession::open(view);
            session.set_budget(budget.map(|b| b as _));
            session
        });
        then(session)
    }

    /// Closes the sessions of the task's cloned wrappers (their late requests are refused), forgets what the
    /// worker's own session recorded but the workflow never took, so it cannot leak into the next task, and takes
    /// the task's budget off the worker's session.
    pub(crate) fn end_task(&self) {
        *self.budget.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        let mut open = self.lock();
        open.retain(|id, _| *id == 0);
        if let Some(own) = open.get(&0) {
            own.extract_experience_from_history();
            own.set_budget(None);
        }
    }
}

/// Why a model call was not answered: an error the workflow sees as a `RuntimeError`, or the task's model budget,
/// which it sees as `ModelBudgetExceeded` and which fails the task.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Refusal {
    Error(String),
    Budget(String),
}

impl From<String> for Refusal {
    fn from(message: String) -> Self {
        Refusal::Error(message)
    }
}

impl From<&str> for Refusal {
    fn from(message: &str) -> Self {
        Refusal::Error(message.to_owned())
    }
}

/// One task attempt's model budget (`explorer.python_workflows`), shared by its concurrent calls over every model
/// wrapper, as a WASM workflow's is per task run. The first refusal sticks: every later call is refused with it,
/// so a workflow that catches the exception cannot go on asking.
#[derive(Debug)]
pub(crate) struct Budget {
    max_calls: u64,
    max_tokens: u64,
    spent: Mutex<Spent>,
}

#[derive(Debug, Default)]
struct Spent {
    calls: u64,
    generated: u64,
    exceeded: Option<String>,
}

impl Budget {
    pub(crate) fn new(max_calls: u64, max_tokens: u64) -> Self {
        Budget { max_calls, max_tokens, spent: Mutex::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Spent> {
        self.spent.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Admits one generation call of `n` samples (counted whether or not it then succeeds), or refuses it naming
    /// the limit it would break.
    fn admit(&self, n: u64) -> Result<(), Refusal> {
        let mut spent = self.lock();
        if let Some(exceeded) = &spent.exceeded {
            return Err(Refusal::Budget(exceeded.clone()));
        }
        let exceeded = if spent.calls >= self.max_calls {
            format!(
                "model call {} is past the limit of {} per task (explorer.python_workflows.max_model_calls)",
                spent.calls + 1,
                self.max_calls
            )
        } else if n.max(1) > self.max_tokens.saturating_sub(spent.generated) {
            format!(
                "{} tokens generated of the {} allowed per task (explorer.python_workflows.max_model_tokens); a \
                 call of n = {n} cannot fit",
                spent.generated, self.max_tokens
            )
        } else {
            spent.calls += 1;
            return Ok(());
        };
        spent.exceeded = Some(exceeded.clone());
        Err(Refusal::Budget(exceeded))
    }

    fn spend(&self, tokens: u64) {
        let mut spent = self.lock();
        spent.generated = spent.generated.saturating_add(tokens);
    }

    /// The refusal that ended the task's budget, if one did.
    pub(crate) fn exceeded(&self) -> Option<String> {
        self.lock().exceeded.clone()
    }
}

/// The budget as the OpenAI server sees it, for requests on the task's session URLs.
impl RunBudget for Budget {
    fn admit(&self, n: u64) -> Result<(), String> {
        Budget::admit(self, n).map_err(|refusal| match refusal {
            Refusal::Budget(message) | Refusal::Error(message) => message,
        })
    }

    fn spend(&self, tokens: u64) {
        Budget::spend(self, tokens);
    }
}

/// One model call of a task.
pub(crate) struct Call<'a> {
    pub(crate) task: &'a Task,
    pub(crate) ctx: &'a WorkflowContext,
    pub(crate) sessions: &'a Sessions,
    pub(crate) budget: &'a Budget,
    /// Its number in the task, which seeds its sampling.
    pub(crate) number: u64,
}

impl Call<'_> {
    /// The model `params.model` names.
    fn model(&self, params: &Value) -> Result<&Arc<RolloutModel>, String> {
        match &params["model"] {
            Value::Null => Ok(&self.ctx.model),
            index => {
                let index = index.as_u64().ok_or("`model` must be the index of an auxiliary model")? as usize;
                let auxiliary = self.ctx.model.auxiliary_models();
                auxiliary.get(index).map(AuxiliaryModel::model).ok_or_else(|| {
                    format!("there is no auxiliary model {index}: explorer.auxiliary_models has {}", auxiliary.len())
                })
            }
        }
    }

    /// Answers `method` the way Trinity-RFT's `ModelWrapper` would.
    pub(crate) async fn answer(&self, method: &str, params: &Value) -> Result<Value, Refusal> {
        let text = |e: &dyn std::fmt::Display| e.to_string();
        match method {
            "model_version" => Ok(self.model(params)?.model_version().into()),
            "message_token_len" => {
                let model = self.model(params)?;
                let text = model.render_chat(&chat_messages(params)?, false).map_err(|e| text(&e))?;
                Ok(model.encode_prompt(&text, false).map_err(|e| e.to_string())?.len().into())
            }
            "chat" => {
                let model = self.model(params)?;
                let messages = params["messages"].as_array().ok_or("messages must be a list")?;
                let tools = params["kwargs"].get("tools").filter(|tools| !tools.is_null());
                // A conversation ending in the assistant's turn is continued from that turn's text, as
                // Trinity-RFT renders it with `continue_final_message`.
                let (history, prefix) = match messages.split_last() {
                    Some((last, earlier)) if last["role"] == "assistant" => (earlier, last["content"].as_str()),
                    _ => (&messages[..], None),
                };
                let mut prompt = render(model, history, true, tools)?;
                prompt.push_str(prefix.unwrap_or_default());
                let prompt = model.encode_prompt(&prompt, false).map_err(|e| text(&e))?;
                self.generate(model, prompt, &params["kwargs"]).await
            }
            "generate" => {
                let model = self.model(params)?;
                let prompt = params["prompt"].as_str().ok_or("generate takes text prompts")?;
                let prompt = model.encode_prompt(prompt, true).map_err(|e| text(&e))?;
                self.generate(model, prompt, &params["kwargs"]).await
            }
            "logprobs" => {
                let tokens = token_ids(&params["tokens"]).ok_or("logprobs takes a list of token ids")?;
                let temperature = params["temperature"].as_f64().unwrap_or(1.0);
                Ok(json!(score(self.model(params)?, &tokens, temperature).await?))
            }
            "convert_messages" => {
                let temperature = params["temperature"].as_f64().unwrap_or(1.0);
                Ok(convert_messages(self.model(params)?, params, temperature).await?)
            }
            "openai" => Ok(self.openai(params)?),
            "history" => Ok(self.history(params)?),
            other => Err(format!("`{other}` is not a model call trinity serves").into()),
        }
    }

    /// Samples `n` completions of `prompt` with the call's keyword arguments over the taskset's rollout
    /// arguments, within the task's budget.
    async fn generate(&self, model: &RolloutModel, prompt: Vec<u32>, kwargs: &Value) -> Result<Value, Refusal> {
        let n = kwargs["n"].as_u64().unwrap_or(1).max(1);
        self.budget.admit(n)?;
        if let Some(limit) = model.prompt_over_limit(prompt.len()) {
            return placeholder_samples(model, &prompt, limit, n as usize);
        }
        let (task, args) = (self.task, &self.task.rollout_args);
        let float = |key: &str, default: Option<f64>| kwargs[key].as_f64().or(default);
        let seed = seed_mix(&[
            args.seed.unwrap_or(42),
            task.batch_id,
            task.taskset_id as u64,
            task.index as u64,
            u64::from(self.ctx.attempt),
            self.number,
        ]);
        let params = SamplingParams {
            n: n as usize,
            temperature: float("temperature", args.temperature).unwrap_or(1.0) as f32,
            top_p: float("top_p", args.top_p).unwrap_or(1.0) as f32,
            top_k: kwargs["top_k"].as_i64().or(args.top_k).filter(|k| *k > 0).map_or(0, |k| k as usize),
            min_p: float("min_p", args.min_p).unwrap_or(0.0) as f32,
            seed: Some(seed),
            max_tokens: kwargs["max_tokens"].as_u64().map(|t| t as usize).or(args.max_tokens.map(|t| t as usize)),
            min_tokens: kwargs["min_tokens"].as_u64().or(args.min_tokens.map(u64::from)).unwrap_or(0) as usize,
            stop: match kwargs["stop"].as_array() {
                Some(stop) => stop.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect(),
                None => args.stop.clone(),
            },
            ..SamplingParams::default()
        };
        let generation = model.generate(prompt.clone(), params).await.map_err(|e| e.to_string())?;
        self.budget.spend(generation.completions.iter().map(|c| c.tokens.len() as u64).sum());
        let prompt_text = model.decode(&prompt).map_err(|e| e.to_string())?;
        Ok(samples_json(&prompt, &prompt_text, generation.completions))
    }

    /// The base URL and model name of an OpenAI client: the wrapper's own session, under the rollout model's
    /// name or an auxiliary model's (the server answers a request by the model it names; the session's URL puts
    /// it under the task's budget).
    fn openai(&self, params: &Value) -> Result<Value, String> {
        let view = self.ctx.model.openai_view().ok_or(NO_OPENAI_API)?;
        let name = match &params["model"] {
            Value::Null => view.model_name().to_owned(),
            index => {
                self.model(params)?;
                let index = index.as_u64().unwrap_or_default() as usize;
                self.ctx.model.auxiliary_models()[index].name().to_owned()
            }
        };
        let id = params["session"].as_u64().unwrap_or(0);
        let base_url = self.sessions.session(id, view, OpenAiSession::base_url);
        Ok(json!({"base_url": base_url, "model_name": name}))
    }

    /// The replies recorded for a wrapper's session since the last call (none before it opened one).
    fn history(&self, params: &Value) -> Result<Value, String> {
        let view = self.ctx.model.openai_view().ok_or(NO_OPENAI_API)?;
        if !view.history_enabled() {
            return Err("history recording is off: set `explorer.rollout_model.enable_history: true`".to_owned());
        }
        let id = params["session"].as_u64().unwrap_or(0);
        let recorded = self.sessions.lock().get(&id).and_then(OpenAiSession::extract_experience_from_history);
        let recorded = recorded.unwrap_or_default();
        Ok(Value::Array(recorded.iter().map(experience_json).collect()))
    }
}

/// A generation as the worker reads it: the prompt's tokens and text once, then each sample's own tokens,
/// logprobs, text and truncation. The worker joins prompt and response into each sample's experience; sending
/// the prompt with every sample made a reply of `n` samples of a long prompt `n` times as long to write, send and
/// parse (8 samples of 100 tokens after 1000 prompt tokens: 113 kB, 6.8 ms to parse and build the tensors in the
/// worker; 37 kB and 3.2 ms once).
fn samples_json(prompt: &[u32], prompt_text: &str, completions: Vec<trinity_engine::Completion>) -> Value {
    let samples: Vec<Value> = completions
        .into_iter()
        .map(|completion| {
            let truncated = completion.finish_reason == FinishReason::Length;
            json!({
                "response": completion.tokens,
                "logprobs": completion.logprobs,
                "response_text": completion.text,
                "truncate_status": if truncated { Value::from("response_truncated") } else { Value::Null },
            })
        })
        .collect();
    json!({"prompt": prompt, "prompt_text": prompt_text, "samples": samples})
}

/// What Trinity-RFT's model wrapper returns for a prompt over `max_prompt_tokens` with
/// `enable_prompt_truncation`: `n` masked experiences of the prompt's first `limit + 1` tokens, the last one
/// standing as the response, with its placeholder text and `prompt_truncated`, so the workflow goes on and the
/// trainer learns nothing from them.
fn placeholder_samples(model: &RolloutModel, prompt: &[u32], limit: usize, n: usize) -> Result<Value, Refusal> {
    let head = &prompt[..limit];
    let prompt_text = model.decode(head).map_err(|e| e.to_string())?;
    let sample = json!({
        "response": [prompt[limit]],
        "logprobs": [0.0],
        "response_text": "[This experience is masked out due to overlong prompt]",
        "truncate_status": "prompt_truncated",
    });
    Ok(json!({"prompt": head, "prompt_text": prompt_text, "samples": vec![sample; n]}))
}

/// `params.messages` as role/content pairs (non-text content as its JSON text).
fn chat_messages(params: &Value) -> Result<Vec<ChatMessage>, String> {
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

fn token_ids(value: &Value) -> Option<Vec<u32>> {
    value.as_array()?.iter().map(|v| v.as_u64().and_then(|t| u32::try_from(t).ok())).collect()
}

/// The model's logprob of each of `tokens[1..]` given the tokens before it, at `temperature` (Trinity-RFT's
/// `logprobs`), computed between decode steps of the model's engine as a teacher's are.
async fn score(model: &Arc<RolloutModel>, tokens: &[u32], temperature: f64) -> Result<Vec<f32>, String> {
    let scorer = AuxiliaryModel::new("scoring", Arc::clone(model));
    scorer.logprobs(tokens, temperature).await.map_err(|e| format!("the logprobs of {} tokens: {e}", tokens.len()))
}

/// `messages` as the model sees them: the chat template with the messages as given (tool calls and `tools`
/// included, as Trinity-RFT's engine renders a chat), or plain role lines for a model without one.
fn render(
    model: &RolloutModel,
    messages: &[Value],
    generation_prompt: bool,
    tools: Option<&Value>,
) -> Result<String, String> {
    match model.chat_template() {
        Some(template) => template.render(messages, generation_prompt, tools).map_err(|e| e.to_string()),
        None => {
            let pairs = chat_messages(&json!({"messages": messages}))?;
            model.render_chat(&pairs, generation_prompt).map_err(|e| e.to_string())
        }
    }
}

/// Trinity-RFT's `convert_messages_to_experience`: the conversation as one experience whose action mask covers
/// the assistant turns (end-of-turn tokens included), scored by the model at `temperature`. Recorded turn by turn
/// like a built-in multi-turn workflow's conversation, so the tokens are those the model sees when asked for
/// each turn. A prompt over the model's limit gives Trinity-RFT's masked placeholder; a sequence over
/// `max_model_len` is cut there and marked `response_truncated`.
async fn convert_messages(model: &Arc<RolloutModel>, params: &Value, temperature: f64) -> Result<Value, String> {
    let messages = params["messages"].as_array().ok_or("messages must be a list")?;
    let tools = params.get("tools").filter(|tools| !tools.is_null());
    let mut conversation = Conversation::default();
    for (i, message) in messages.iter().enumerate() {
        if message["role"] != "assistant" {
            continue;
        }
        if i == 0 {
            return Err("the conversation starts with the assistant's turn: there is no prompt to train it on".into());
        }
        let turn = |e: trinity_explorer::TurnError| format!("message {i}: {e}");
        conversation.extend_text(model, render(model, &messages[..i], true, tools)?).map_err(turn)?;
        conversation.extend_reply_text(model, render(model, &messages[..=i], false, tools)?).map_err(turn)?;
    }
    let mut experience = conversation
        .into_experience(Eid::default(), model)
        .ok_or("the conversation has no assistant message: there is nothing to train")?;
    if let Some(limit) = model.prompt_over_limit(experience.prompt_length) {
        experience.tokens.truncate(limit + 1);
        experience.prompt_length = limit;
        experience.logprobs = vec![0.0];
        experience.action_mask = vec![false];
        experience.truncate_status = Some(TruncateStatus::PromptTruncated);
        return Ok(experience_json(&experience));
    }
    let most = model.engine().info().max_model_len.saturating_sub(1);
    if experience.prompt_length >= most {
        return Err(format!("the prompt of {} tokens leaves no room under max_model_len", experience.prompt_length));
    }
    if experience.tokens.len() > most {
        experience.tokens.truncate(most);
        let response = most - experience.prompt_length;
        experience.action_mask.truncate(response);
        experience.truncate_status = Some(TruncateStatus::ResponseTruncated);
    }
    let scored = score(model, &experience.tokens, temperature).await?;
    experience.logprobs = scored[experience.prompt_length - 1..].to_vec();
    experience.response_text = model.decode(&experience.tokens[experience.prompt_length..]).ok();
    Ok(experience_json(&experience))
}

/// An experience as the worker builds Trinity-RFT's `Experience` from it.
fn experience_json(experience: &Experience) -> Value {
    json!({
        "tokens": experience.tokens,
        "prompt_length": experience.prompt_length,
        "logprobs": experience.logprobs,
        "action_mask": experience.action_mask,
        "prompt_text": experience.prompt_text,
        "response_text": experience.response_text,
        "truncate_status": experience.truncate_status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use trinity_explorer::OpenAiView;

    #[test]
    fn a_task_end_closes_the_clones_sessions_and_empties_the_workers_own() {
        let view = Arc::new(OpenAiView::new("http://127.0.0.1:9", "m", true));
        let sessions = Sessions::default();
        let key = |id: u64| {
            let mut open = sessions.lock();
            open.entry(id).or_insert_with(|| OpenAiSession::open(&view)).key().to_owned()
        };
        let (own, clone) = (key(0), key(3));
        let reply = Experience::single_turn(Eid::default(), vec![1, 2], 1, vec![-0.5]);
        view.record(&own, vec![reply.clone()]).unwrap();
        view.record(&clone, vec![reply]).unwrap();
        sessions.end_task();
        assert!(view.is_open(&own) && !view.is_open(&clone));
        assert_eq!(key(0), own, "the worker keeps its session");
        let left = sessions.lock().get(&0).and_then(OpenAiSession::extract_experience_from_history).unwrap();
        assert!(left.is_empty(), "nothing recorded leaks into the next task");
    }

    #[test]
    fn a_generation_reply_carries_the_prompt_once() {
        let sample = |tokens: Vec<u32>, finish_reason| trinity_engine::Completion {
            text: "t".into(),
            logprobs: vec![-0.5; tokens.len()],
            tokens,
            finish_reason,
            routed_experts: None,
        };
        let reply = samples_json(
            &[1, 2, 3],
            "abc",
            vec![sample(vec![4], FinishReason::Eos), sample(vec![5, 6], FinishReason::Length)],
        );
        assert_eq!(reply["prompt"], json!([1, 2, 3]));
        assert_eq!(reply["prompt_text"], "abc");
        let samples = reply["samples"].as_array().unwrap();
        assert_eq!(samples.len(), 2);
        assert_eq!((samples[0]["response"].clone(), samples[0]["truncate_status"].clone()), (json!([4]), Value::Null));
        assert_eq!(
            (samples[1]["response"].clone(), samples[1]["truncate_status"].clone()),
            (json!([5, 6]), json!("response_truncated"))
        );
        assert!(samples.iter().all(|s| s.get("tokens").is_none() && s.get("prompt_text").is_none()));
    }

    #[test]
    fn a_tasks_budget_covers_its_sessions_requests_and_ends_with_it() {
        let view = Arc::new(OpenAiView::new("http://127.0.0.1:9", "m", false));
        let sessions = Sessions::default();
        let own = sessions.session(0, &view, |s| s.key().to_owned());
        let budget = Arc::new(Budget::new(2, 10));
        sessions.start_task(&budget);
        let clone = sessions.session(4, &view, |s| s.key().to_owned());
        let (a, b) = (view.budget(&own).unwrap(), view.budget(&clone).unwrap());
        // The server's view and the pipe's calls spend one budget.
        a.admit(3).unwrap();
        a.spend(8);
        let refused = b.admit(3).unwrap_err();
        assert!(refused.contains("max_model_tokens") && refused.contains("n = 3 cannot fit"), "{refused}");
        assert_eq!(budget.exceeded().as_deref(), Some(refused.as_str()), "the refusal sticks for the task");
        assert!(matches!(budget.admit(1), Err(Refusal::Budget(_))));
        sessions.end_task();
        assert!(view.budget(&own).is_none(), "the worker's session outlives the task's budget");
        let fresh = Arc::new(Budget::new(1, 10));
        sessions.start_task(&fresh);
        view.budget(&own).unwrap().admit(1).unwrap();
        let second = view.budget(&own).unwrap().admit(1).unwrap_err();
        assert!(second.contains("model call 2 is past the limit of 1"), "{second}");
    }
}
