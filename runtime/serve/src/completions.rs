//! `POST /v1/completions`: raw prompts (text, token ids, or a batch of either), no chat template. Each prompt
//! gets `n` choices, indexed `prompt * n + sample`; all of one request share its response id.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::generation::{Job, Run, finish_reason_name};
use crate::logprobs::completion_logprobs;
use crate::params::{self, CommonParams};
use crate::server::{AppState, read_body};
use crate::sse::{self, Shape, StreamSpec};
use crate::target;

pub(crate) const ENDPOINT: &str = "completions";

const COMPLETION_FIELDS: &[&str] = &["prompt", "logprobs", "echo", "suffix", "best_of", "add_special_tokens"];

/// `prompt`: text, token ids, or a list of either.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
struct CompletionFields {
    prompt: Prompt,
    #[serde(default)]
    logprobs: Option<usize>,
    #[serde(default)]
    echo: Option<bool>,
    #[serde(default)]
    suffix: Option<String>,
    #[serde(default)]
    best_of: Option<usize>,
    /// vLLM's: whether text prompts get the tokenizer's special tokens (BOS); default true.
    #[serde(default)]
    add_special_tokens: Option<bool>,
}

pub(crate) async fn handle(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let started = Instant::now();
    let run_key = target::run_key(request.uri().path());
    let prepared = match read_body(&state, request).await {
        Ok(body) => prepare(&state, &body, started, run_key),
        Err(error) => Err(error),
    };
    let run = prepared.and_then(|(job, spec)| Ok((Run::start(&state, job).map_err(prompt_param)?, spec)));
    match run {
        Err(error) => {
            state.metrics.request_done(ENDPOINT, error.status.as_u16(), started.elapsed());
            error.into_response()
        }
        Ok((run, spec)) => {
            if spec.include_stream {
                sse::respond(run, spec.spec).into_response()
            } else {
                respond_whole(run, &spec.spec).await
            }
        }
    }
}

/// The engine names `messages` for a prompt too long; here it is `prompt`.
fn prompt_param(mut error: ApiError) -> ApiError {
    if error.param.as_deref() == Some("messages") {
        error.param = Some("prompt".into());
    }
    error
}

/// The stream spec doubles as the output spec of a whole response.
struct Output {
    spec: StreamSpec,
    include_stream: bool,
}

fn prepare(
    state: &AppState,
    body: &[u8],
    started: Instant,
    run_key: Option<String>,
) -> Result<(Job, Output), ApiError> {
    let map = params::object(body)?;
    params::check_known(&map, COMPLETION_FIELDS)?;
    let common: CommonParams = params::typed(&map)?;
    let fields: CompletionFields = params::typed(&map)?;
    let target = state.target(common.model.as_deref(), run_key)?;
    if fields.echo == Some(true) {
        return Err(ApiError::unsupported("echo", "`echo` is not supported"));
    }
    if fields.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported("suffix", "`suffix` is not supported"));
    }
    if fields.best_of.is_some_and(|b| b > common.n.unwrap_or(1)) {
        return Err(ApiError::unsupported("best_of", "`best_of` above `n` is not supported"));
    }
    let top = fields.logprobs.unwrap_or(0);
    if top > 20 {
        return Err(ApiError::invalid_param("logprobs", format!("{top} is more than 20")));
    }
    let tokenizer = target.model.tokenizer();
    let special = fields.add_special_tokens.unwrap_or(true);
    let encode = |text: &str| {
        crate::prompt_length::check_untokenized(&target.model, text, "prompt")?;
        tokenizer.encode(text, special).map_err(|e| ApiError::internal(e.to_string()))
    };
    let prompts: Vec<Vec<u32>> = match fields.prompt {
        Prompt::Text(text) => vec![encode(&text)?],
        Prompt::Tokens(tokens) => vec![tokens],
        Prompt::Texts(texts) => texts.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
        Prompt::TokenLists(lists) => lists,
    };
    if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
        return Err(ApiError::invalid_param("prompt", "every prompt must have at least one token"));
    }
    let params = common.sampling(state.forced_temperature(&target), common.max_tokens.or(Some(16)), top)?;
    let spec = StreamSpec {
        shape: Shape::Completion,
        id: state.ids.next("cmpl-"),
        model: target.name.clone(),
        logprobs: fields.logprobs.is_some(),
        top_logprobs: top > 0,
        return_token_ids: common.return_token_ids.unwrap_or(false),
        include_usage: common.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
        parse_tools: false,
        forced: None,
        // vLLM's reasoning parsers shape chat replies only.
        reasoning: None,
        stop: params.stop.clone(),
    };
    let prompts = prompts.into_iter().map(Arc::new).collect();
    let job = Job { endpoint: ENDPOINT, target, prompts, params, started, constrained_by: None };
    Ok((job, Output { spec, include_stream: common.stream.unwrap_or(false) }))
}

async fn respond_whole(mut run: Run, spec: &StreamSpec) -> Response {
    if let Err(error) = run.finish_all().await {
        run.failed(&error);
        return error.into_response();
    }
    let model = Arc::clone(&run.target.model);
    let tokenizer = model.tokenizer();
    let mut reasons = Vec::with_capacity(run.choices.len());
    let mut choices = Vec::with_capacity(run.choices.len());
    for (index, choice) in run.choices.iter().enumerate() {
        let (text, reason) = match &choice.finished {
            Some((text, reason)) => (text.as_str(), finish_reason_name(*reason)),
            None => ("", "stop"),
        };
        reasons.push(reason);
        let logprobs = spec.logprobs.then(|| {
            completion_logprobs(tokenizer, &choice.tokens, &choice.logprobs, &choice.top, spec.top_logprobs, 0)
        });
        let mut entry = json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason});
        if spec.return_token_ids {
            entry["token_ids"] = json!(choice.tokens);
            entry["prompt_token_ids"] = json!(run.prompts[choice.prompt].as_ref());
        }
        choices.push(entry);
    }
    run.record(&spec.id, &reasons);
    let (prompt_tokens, completion_tokens) = run.usage();
    let body: Value = json!({
        "id": spec.id,
        "object": "text_completion",
        "created": crate::ids::unix_seconds(),
        "model": spec.model,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    });
    run.complete();
    Json(body).into_response()
}
