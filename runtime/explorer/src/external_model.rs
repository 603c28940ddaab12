//! An OpenAI-compatible endpoint as the evaluated model (`model.external_model`, mode `bench`).
//!
//! Workflows that only send chat messages and read the reply's text (the single-turn math and Q&A workflows,
//! countdown, sudoku: [`runs_on_external_model`]) run unchanged against it: their group is one
//! `POST <base URL>/chat/completions` with the taskset's rollout arguments, scored by the same reward. The
//! endpoint returns text, not token ids, so such an experience holds no tokens (`tokens`, `logprobs` and
//! `action_mask` are empty, `prompt_length` 0) and records the reply's `usage` instead:
//! `info.prompt_tokens`, and `info.response_tokens` (the reply's completion tokens shared evenly by its choices,
//! exact for one choice), which the run's response-length statistics read.
//!
//! The API key is held here only: it goes into the `Authorization` header and nowhere else (the `Debug` output
//! and every error text leave it out, and a reply body that echoes it is redacted).

use std::time::Duration;

use serde_json::{Map, Value, json};
use trinity_buffer::Experience;
use trinity_engine::SamplingParams;
use trinity_model::ChatMessage;

/// Workflows that only need "messages in, text out" from the model, and so run on an external model.
/// Everything else (multi-turn token sequences, a tokenizer, logprobs of given tokens, an auxiliary model,
/// WASM plugins, which may call any of these) is refused.
const CHAT_WORKFLOWS: &[&str] = &[
    "simple_workflow",
    "async_simple_workflow",
    "math_workflow",
    "async_math_workflow",
    "math_boxed_workflow",
    "async_math_boxed_workflow",
    "math_eval_workflow",
    "async_math_eval_workflow",
    "math_rm_workflow",
    "async_math_rm_workflow",
    "countdown",
    "sudoku_workflow",
];

/// Whether the built-in workflow `name` runs on an external model (see [`CHAT_WORKFLOWS`]).
pub fn runs_on_external_model(name: &str) -> bool {
    CHAT_WORKFLOWS.contains(&name)
}

/// The names of [`runs_on_external_model`], for messages.
pub fn external_model_workflows() -> &'static [&'static str] {
    CHAT_WORKFLOWS
}

/// An experience's response length in tokens: its response tokens, or for an external model's experience
/// (which has none) the share of its reply's completion tokens (`info.response_tokens`).
pub fn response_tokens(experience: &Experience) -> f64 {
    match experience.info.get("response_tokens").and_then(Value::as_f64) {
        Some(tokens) if experience.tokens.is_empty() => tokens,
        _ => experience.response_length() as f64,
    }
}

/// Longest excerpt of an error reply body kept in an error.
const BODY_EXCERPT: usize = 400;

/// Why a request to the endpoint failed. Every variant names the URL; none holds the API key.
#[derive(Debug, thiserror::Error)]
pub enum ExternalModelError {
    #[error("POST {url}: {message}")]
    Transport { url: String, message: String },
    #[error("POST {url}: HTTP {status}: {body}")]
    Status { url: String, status: u16, body: String },
    #[error("POST {url}: the reply is not an OpenAI chat completion: {message}")]
    Reply { url: String, message: String },
}

impl ExternalModelError {
    /// Whether another attempt could succeed: a connection that failed, a timeout, a rate limit or a server
    /// error; not a request the endpoint refused (400, 401, 404, ...) or a reply it cannot help sending.
    pub fn is_retryable(&self) -> bool {
        match self {
            ExternalModelError::Transport { .. } => true,
            ExternalModelError::Status { status, .. } => *status == 429 || *status >= 500,
            ExternalModelError::Reply { .. } => false,
        }
    }
}

/// One choice of a chat completion.
#[derive(Debug, Clone, PartialEq)]
pub struct ExternalChoice {
    pub text: String,
    /// `stop`, `length`, ... as the endpoint reports it.
    pub finish_reason: Option<String>,
}

/// A chat completion: the choices and the reply's token counts (`usage`), when the endpoint reports them.
#[derive(Debug, Clone, PartialEq)]
pub struct ExternalReply {
    pub choices: Vec<ExternalChoice>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
}

/// An OpenAI-compatible chat endpoint and the model it is asked for.
pub struct ExternalModel {
    /// `<base URL>/chat/completions`.
    url: String,
    model_name: String,
    api_key: String,
    /// Response limit of requests whose rollout arguments set none (`model.max_response_tokens`).
    default_max_tokens: Option<usize>,
    agent: ureq::Agent,
}

impl std::fmt::Debug for ExternalModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalModel")
            .field("url", &self.url)
            .field("model_name", &self.model_name)
            .finish_non_exhaustive()
    }
}

impl ExternalModel {
    /// The endpoint at `base_url` (as the `openai` client takes it, e.g. `https://api.openai.com/v1`), asked for
    /// `model_name` with `api_key`; each request may take `timeout` (the explorer's `max_timeout`).
    pub fn new(
        base_url: &str,
        model_name: impl Into<String>,
        api_key: impl Into<String>,
        default_max_tokens: Option<usize>,
        timeout: Duration,
    ) -> Self {
        let config = ureq::Agent::config_builder()
            // Error replies are read for their body, which says why.
            .http_status_as_error(false)
            // A redirect is reported, not followed: following it would hand the key to wherever it points.
            .max_redirects(0)
            .timeout_global(Some(timeout))
            .user_agent(concat!("trinity/", env!("CARGO_PKG_VERSION")))
            .build();
        ExternalModel {
            url: format!("{}/chat/completions", base_url.trim_end_matches('/')),
            model_name: model_name.into(),
            api_key: api_key.into(),
            default_max_tokens,
            agent: config.into(),
        }
    }

    /// `<base URL>/chat/completions`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    /// The request body for `messages` sampled with `params`: OpenAI's fields, plus vLLM's `top_k`, `min_p` and
    /// `min_tokens` when they are set (an endpoint without them refuses the request, naming the field, rather
    /// than sampling differently from what the taskset asks).
    pub fn request_body(&self, messages: &[ChatMessage], params: &SamplingParams) -> Value {
        let messages: Vec<Value> = messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect();
        let mut body = Map::new();
        body.insert("model".into(), self.model_name.clone().into());
        body.insert("messages".into(), messages.into());
        body.insert("n".into(), params.n.into());
        body.insert("temperature".into(), decimal(params.temperature).into());
        body.insert("top_p".into(), decimal(params.top_p).into());
        if let Some(max_tokens) = params.max_tokens.or(self.default_max_tokens) {
            // Trinity-RFT's name (OpenAI's current one; `max_tokens` is deprecated there).
            body.insert("max_completion_tokens".into(), max_tokens.into());
        }
        if !params.stop.is_empty() {
            body.insert("stop".into(), params.stop.clone().into());
        }
        if let Some(seed) = params.seed {
            // OpenAI's seed is a signed 64-bit integer.
            body.insert("seed".into(), (seed >> 1).into());
        }
        if params.top_k > 0 {
            body.insert("top_k".into(), params.top_k.into());
        }
        if params.min_p > 0.0 {
            body.insert("min_p".into(), decimal(params.min_p).into());
        }
        if params.min_tokens > 0 {
            body.insert("min_tokens".into(), params.min_tokens.into());
        }
        Value::Object(body)
    }

    /// Sends one chat completion request and waits for the whole reply (blocking: run it off the async runtime).
    pub fn chat_blocking(&self, body: &Value) -> Result<ExternalReply, ExternalModelError> {
        let transport = |message: String| ExternalModelError::Transport { url: self.url.clone(), message };
        let mut response = self
            .agent
            .post(&self.url)
            .header("Authorization", format!("Bearer {}", self.api_key))
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .map_err(|e| transport(self.redact(&e.to_string())))?;
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().map_err(|e| transport(format!("the reply broke off: {e}")))?;
        if !(200..300).contains(&status) {
            return Err(ExternalModelError::Status { url: self.url.clone(), status, body: self.excerpt(&text) });
        }
        parse_reply(&text).map_err(|message| ExternalModelError::Reply { url: self.url.clone(), message })
    }

    /// [`ExternalModel::chat_blocking`] on the runtime's blocking pool, so concurrent workflows' requests run in
    /// parallel while the runtime's thread stays free.
    pub async fn chat(
        self: &std::sync::Arc<Self>,
        messages: &[ChatMessage],
        params: &SamplingParams,
    ) -> Result<ExternalReply, ExternalModelError> {
        let body = self.request_body(messages, params);
        let model = std::sync::Arc::clone(self);
        tokio::task::spawn_blocking(move || model.chat_blocking(&body)).await.unwrap_or_else(|error| {
            Err(ExternalModelError::Transport {
                url: self.url.clone(),
                message: format!("the request task failed: {error}"),
            })
        })
    }

    /// The start of an error body, on one line, with the API key removed should the endpoint echo it.
    fn excerpt(&self, body: &str) -> String {
        let line = body.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut excerpt: String = line.chars().take(BODY_EXCERPT).collect();
        if excerpt.len() < line.len() {
            excerpt.push('…');
        }
        self.redact(&excerpt)
    }

    fn redact(&self, text: &str) -> String {
        if self.api_key.is_empty() { text.to_owned() } else { text.replace(&self.api_key, "<api key>") }
    }
}

/// The decimal a sampling parameter was written as: the engine keeps them as `f32`, whose widening to `f64`
/// would send 0.7 as 0.699999988079071; the shortest text that reads back as the same `f32` is the config's.
fn decimal(value: f32) -> f64 {
    value.to_string().parse().unwrap_or(f64::from(value))
}

/// The choices and usage of a chat completion body.
fn parse_reply(text: &str) -> Result<ExternalReply, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("invalid JSON ({e})"))?;
    let choices = value.get("choices").and_then(Value::as_array).ok_or("it has no `choices` list")?;
    let mut indexed = Vec::with_capacity(choices.len());
    for (position, choice) in choices.iter().enumerate() {
        let index = choice.get("index").and_then(Value::as_u64).unwrap_or(position as u64);
        let message = choice.get("message").ok_or_else(|| format!("choice {index} has no `message`"))?;
        // A reply that is only tool calls or a refusal has no content: its text is empty.
        let text = message.get("content").and_then(Value::as_str).unwrap_or_default().to_owned();
        let finish_reason = choice.get("finish_reason").and_then(Value::as_str).map(str::to_owned);
        indexed.push((index, ExternalChoice { text, finish_reason }));
    }
    indexed.sort_by_key(|(index, _)| *index);
    let usage = value.get("usage");
    let count = |key: &str| usage.and_then(|u| u.get(key)).and_then(Value::as_u64);
    Ok(ExternalReply {
        choices: indexed.into_iter().map(|(_, choice)| choice).collect(),
        prompt_tokens: count("prompt_tokens"),
        completion_tokens: count("completion_tokens"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model_at(port: u16) -> ExternalModel {
        let base = format!("http://127.0.0.1:{port}/v1/");
        ExternalModel::new(&base, "gpt-x", "sk-secret", Some(64), Duration::from_secs(5))
    }

    fn model() -> ExternalModel {
        model_at(9)
    }

    #[test]
    fn requests_carry_the_rollout_arguments() {
        let model = model();
        assert_eq!(model.url(), "http://127.0.0.1:9/v1/chat/completions");
        let params = SamplingParams {
            n: 2,
            temperature: 0.7,
            max_tokens: Some(7),
            stop: vec!["\n".into()],
            seed: Some(u64::MAX),
            ..SamplingParams::default()
        };
        let body = model.request_body(&[ChatMessage::new("user", "1+1?")], &params);
        assert_eq!(body["model"], "gpt-x");
        assert_eq!(body["messages"], json!([{"role": "user", "content": "1+1?"}]));
        assert_eq!((body["n"].as_u64(), body["temperature"].as_f64()), (Some(2), Some(0.7)), "sent as written");
        assert_eq!(body["max_completion_tokens"], 7);
        assert_eq!(body["stop"], json!(["\n"]));
        assert_eq!(body["seed"].as_i64(), Some(i64::MAX), "the seed fits OpenAI's signed integer");
        assert!(body.get("top_k").is_none() && body.get("min_p").is_none(), "vLLM extras only when set: {body}");
        let defaults = model.request_body(&[], &SamplingParams { top_k: 5, ..SamplingParams::default() });
        assert_eq!(defaults["max_completion_tokens"], 64, "model.max_response_tokens when the taskset sets none");
        assert_eq!(defaults["top_k"], 5);
        assert!(defaults.get("seed").is_none() && defaults.get("stop").is_none());
    }

    #[test]
    fn replies_are_read_in_choice_order_with_usage() {
        let reply = parse_reply(
            r#"{"choices": [{"index": 1, "message": {"content": "b"}, "finish_reason": "length"},
                            {"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}"#,
        )
        .unwrap();
        let texts: Vec<&str> = reply.choices.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(texts, ["a", "b"]);
        assert_eq!(reply.choices[1].finish_reason.as_deref(), Some("length"));
        assert_eq!((reply.prompt_tokens, reply.completion_tokens), (Some(9), Some(4)));
        assert!(parse_reply("{}").unwrap_err().contains("choices"));
        assert!(parse_reply("<html>").unwrap_err().contains("invalid JSON"));
    }

    #[test]
    fn the_key_stays_out_of_debug_output_and_errors() {
        let model = model();
        assert!(!format!("{model:?}").contains("sk-secret"));
        let excerpt = model.excerpt(&format!("{{\"error\": \"bad key sk-secret\"}}{}", "x".repeat(1000)));
        assert!(!excerpt.contains("sk-secret") && excerpt.contains("<api key>") && excerpt.ends_with('…'), "{excerpt}");
        // Nothing listens on a port just released: the error names the URL and is worth retrying.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let error = model_at(port).chat_blocking(&json!({})).unwrap_err();
        let url = format!("POST http://127.0.0.1:{port}/v1/chat/completions:");
        assert!(error.to_string().starts_with(&url), "{error}");
        assert!(error.is_retryable() && !error.to_string().contains("sk-secret"));
        let refused = ExternalModelError::Status { url: String::new(), status: 401, body: String::new() };
        assert!(!refused.is_retryable());
    }
}
