//! `POST /v1/chat/completions`: messages rendered with the model's chat template (tools through its `tools`
//! variable), the reply sampled by the engine, tool calls parsed from the model's own output (or, for a forced
//! tool choice, sampled under the tools' schema: `forced_tools.rs`; a JSON `response_format` is sampled under its
//! schema: `response_format.rs`), every choice recorded.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use trinity_explorer::RolloutModel;
use trinity_model::ChatMessage;

use crate::constrained;
use crate::error::ApiError;
use crate::forced_tools::{self, ForcedChoice, ToolChoice};
use crate::generation::{Job, Run, finish_reason_name};
use crate::logprobs::chat_logprobs;
use crate::params::{self, CommonParams};
use crate::reasoning::ReasoningParser;
use crate::response_format;
use crate::server::{AppState, read_body};
use crate::sse::{self, Shape, StreamSpec};
use crate::target;
use crate::tool_calls::parse_hermes;

pub(crate) const ENDPOINT: &str = "chat.completions";

const CHAT_FIELDS: &[&str] = &[
    "messages",
    "logprobs",
    "top_logprobs",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "add_generation_prompt",
    "continue_final_message",
];

/// The chat-only fields.
#[derive(Debug, Deserialize)]
struct ChatFields {
    messages: Vec<Value>,
    #[serde(default)]
    logprobs: Option<bool>,
    #[serde(default)]
    top_logprobs: Option<usize>,
    #[serde(default)]
    max_completion_tokens: Option<usize>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    response_format: Option<Value>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: Option<bool>,
}

/// What shapes the response besides the tokens.
#[derive(Debug)]
pub(crate) struct ChatOutput {
    pub(crate) stream: Option<StreamSpec>,
    pub(crate) logprobs: bool,
    pub(crate) top_logprobs: bool,
    pub(crate) return_token_ids: bool,
    pub(crate) parse_tools: bool,
    /// A forced tool choice: the output was sampled under its schema and becomes `tool_calls`.
    pub(crate) forced: Option<ForcedChoice>,
    pub(crate) reasoning: Option<ReasoningParser>,
    pub(crate) model: String,
}

pub(crate) async fn handle(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let started = Instant::now();
    let run_key = target::run_key(request.uri().path());
    let prepared = match read_body(&state, request).await {
        Ok(body) => prepare(&state, &body, started, run_key),
        Err(error) => Err(error),
    };
    let run = prepared.and_then(|(job, output)| Ok((Run::start(&state, job)?, output)));
    match run {
        Err(error) => {
            state.metrics.request_done(ENDPOINT, error.status.as_u16(), started.elapsed());
            error.into_response()
        }
        Ok((run, output)) => match output.stream {
            Some(spec) => sse::respond(run, spec).into_response(),
            None => respond_whole(run, &output).await,
        },
    }
}

/// Parses and validates the body, renders and tokenizes the prompt.
fn prepare(
    state: &AppState,
    body: &[u8],
    started: Instant,
    run_key: Option<String>,
) -> Result<(Job, ChatOutput), ApiError> {
    let map = params::object(body)?;
    params::check_known(&map, CHAT_FIELDS)?;
    let common: CommonParams = params::typed(&map)?;
    let fields: ChatFields = params::typed(&map)?;
    let target = state.target(common.model.as_deref(), run_key)?;
    let format = response_format::json_format(fields.response_format.as_ref())?;
    let logprobs = fields.logprobs.unwrap_or(false);
    let top = fields.top_logprobs.unwrap_or(0);
    if top > 20 {
        return Err(ApiError::invalid_param("top_logprobs", format!("{top} is more than 20")));
    }
    if top > 0 && !logprobs {
        return Err(ApiError::invalid_param("top_logprobs", "`top_logprobs` needs `logprobs: true`"));
    }
    let tools = check_tools(fields.tools.as_deref())?;
    let choice = forced_tools::tool_choice(fields.tool_choice.as_ref(), tools.as_ref())?;
    let parse_tools = tools.is_some() && choice == ToolChoice::Auto;
    let forced = match choice {
        ToolChoice::Forced(forced) => Some(forced),
        ToolChoice::Auto | ToolChoice::None => None,
    };
    if forced.is_some() && format.is_some() {
        return Err(ApiError::invalid_param(
            "response_format",
            "a JSON response_format cannot be combined with a forced tool_choice: both constrain the same output",
        ));
    }
    if parse_tools && !state.options.auto_tool_choice {
        return Err(ApiError::invalid_param(
            "tool_choice",
            "\"auto\" tool choice needs `explorer.rollout_model.enable_auto_tool_choice: true` with \
             `tool_call_parser: hermes` in the config; send tool_choice \"none\" to show the tools without parsing calls",
        ));
    }
    if fields.messages.is_empty() {
        return Err(ApiError::invalid_param("messages", "`messages` must not be empty"));
    }
    let messages = normalize_messages(&fields.messages)?;
    let prompt = render_prompt(&target.model, &messages, tools.as_ref(), &fields)?;
    let max_tokens = fields.max_completion_tokens.or(common.max_tokens);
    let mut params = common.sampling(state.forced_temperature(&target), max_tokens, if logprobs { top } else { 0 })?;
    if let (Some(forced), Some(tools)) = (&forced, &tools) {
        let key = forced_tools::constraint_key(forced, tools);
        params.constraint = Some(state.constraints.get(&target.model, key, || forced_tools::schema(forced, tools)));
    }
    if let Some(format) = &format {
        params.constraint = Some(state.constraints.get(&target.model, format.key(), || format.compile()));
    }
    // Under a reasoning parser the schema holds the answer, after the model's `</think>`, as in vLLM.
    if state.options.reasoning_parser.is_some() {
        let tokenizer = target.model.tokenizer();
        params.constraint = params.constraint.take().map(|c| constrained::after_reasoning(c, tokenizer, &prompt));
    }
    let constrained_by = match (&forced, &format) {
        (Some(_), _) => Some("tool_choice"),
        (None, Some(_)) => Some("response_format"),
        (None, None) => None,
    };
    let return_token_ids = common.return_token_ids.unwrap_or(false);
    let stream = common.stream.unwrap_or(false).then(|| StreamSpec {
        shape: Shape::Chat,
        id: state.ids.next("chatcmpl-"),
        model: target.name.clone(),
        logprobs,
        top_logprobs: top > 0,
        return_token_ids,
        include_usage: common.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
        parse_tools,
        forced: forced.clone(),
        reasoning: state.options.reasoning_parser,
        stop: params.stop.clone(),
    });
    let output = ChatOutput {
        stream,
        logprobs,
        top_logprobs: top > 0,
        return_token_ids,
        parse_tools,
        forced,
        reasoning: state.options.reasoning_parser,
        model: target.name.clone(),
    };
    let job = Job { endpoint: ENDPOINT, target, prompts: vec![Arc::new(prompt)], params, started, constrained_by };
    Ok((job, output))
}

/// Checks the tool schemas: each `{"type": "function", "function": {"name": ..}}`. `None` when there are none.
fn check_tools(tools: Option<&[Value]>) -> Result<Option<Value>, ApiError> {
    let Some(tools) = tools.filter(|t| !t.is_empty()) else { return Ok(None) };
    for (i, tool) in tools.iter().enumerate() {
        let is_function = tool.get("type").and_then(Value::as_str) == Some("function");
        if !is_function || forced_tools::tool_name(tool).is_none() {
            return Err(ApiError::invalid_param(
                &format!("tools[{i}]"),
                "each tool must be `{\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}`",
            ));
        }
    }
    Ok(Some(Value::Array(tools.to_vec())))
}

/// The message fields passed to the chat template.
const MESSAGE_FIELDS: &[&str] =
    &["role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content", "refusal"];

/// Messages as the chat template expects them: content as one string (text parts joined by newlines, as
/// vLLM does), `developer` as `system`, assistant tool-call arguments as objects (templates serialize them
/// with `tojson`).
fn normalize_messages(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    messages
        .iter()
        .enumerate()
        .map(|(i, message)| {
            let at = |field: &str| format!("messages[{i}].{field}");
            let Value::Object(fields) = message else {
                return Err(ApiError::invalid_param(&format!("messages[{i}]"), "a message must be an object"));
            };
            if let Some(unknown) = fields.keys().find(|k| !MESSAGE_FIELDS.contains(&k.as_str())) {
                return Err(ApiError::invalid_param(&at(unknown), format!("unknown message field `{unknown}`")));
            }
            let role = match fields.get("role").and_then(Value::as_str) {
                Some("developer") => "system",
                Some(role @ ("system" | "user" | "assistant" | "tool")) => role,
                Some(other) => {
                    return Err(ApiError::invalid_param(
                        &at("role"),
                        format!("unknown role `{other}` (system, developer, user, assistant, tool)"),
                    ));
                }
                None => return Err(ApiError::invalid_param(&at("role"), "a message needs a `role`")),
            };
            let content = match fields.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(text)) => text.clone(),
                Some(Value::Array(parts)) => text_parts(parts, &at("content"))?,
                Some(_) => {
                    return Err(ApiError::invalid_param(&at("content"), "content must be a string or a list of parts"));
                }
            };
            let mut out = Map::new();
            out.insert("role".into(), json!(role));
            out.insert("content".into(), json!(content));
            for key in ["name", "tool_call_id"] {
                if let Some(value) = fields.get(key).filter(|v| !v.is_null()) {
                    out.insert(key.into(), value.clone());
                }
            }
            if let Some(calls) = fields.get("tool_calls").filter(|v| !v.is_null()) {
                out.insert("tool_calls".into(), template_tool_calls(calls, &at("tool_calls"))?);
            }
            Ok(Value::Object(out))
        })
        .collect()
}

/// The text of a content-part list; other part types (images, audio) are refused.
fn text_parts(parts: &[Value], at: &str) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
            (Some("text"), Some(text)) => texts.push(text),
            (kind, _) => {
                return Err(ApiError::invalid_param(
                    &format!("{at}[{j}]"),
                    format!("only text parts are supported (got type {})", kind.unwrap_or("none")),
                ));
            }
        }
    }
    Ok(texts.join("\n"))
}

/// Tool calls of an assistant message with `function.arguments` parsed from its JSON text.
fn template_tool_calls(calls: &Value, at: &str) -> Result<Value, ApiError> {
    let Value::Array(calls) = calls else {
        return Err(ApiError::invalid_param(at, "`tool_calls` must be a list"));
    };
    let mut out = Vec::with_capacity(calls.len());
    for call in calls {
        let mut call = call.clone();
        if let Some(arguments) = call.pointer_mut("/function/arguments")
            && let Value::String(text) = arguments
            && let Ok(parsed) = serde_json::from_str::<Value>(text)
        {
            *arguments = parsed;
        }
        out.push(call);
    }
    Ok(Value::Array(out))
}

/// Renders the messages (with tools) and tokenizes them as the engine will see them.
fn render_prompt(
    rollout: &RolloutModel,
    messages: &[Value],
    tools: Option<&Value>,
    fields: &ChatFields,
) -> Result<Vec<u32>, ApiError> {
    let continue_final = fields.continue_final_message.unwrap_or(false);
    let add_generation_prompt = fields.add_generation_prompt.unwrap_or(!continue_final);
    if continue_final && add_generation_prompt {
        return Err(ApiError::invalid_param(
            "continue_final_message",
            "`continue_final_message` and `add_generation_prompt` cannot both be set",
        ));
    }
    let text = match rollout.chat_template() {
        Some(template) => template.render(messages, add_generation_prompt, tools),
        None if tools.is_some() => {
            return Err(ApiError::invalid_param("tools", "the model has no chat template to render tools with"));
        }
        None => {
            let plain: Vec<ChatMessage> =
                messages.iter().map(|m| ChatMessage::new(str_field(m, "role"), str_field(m, "content"))).collect();
            rollout.render_chat(&plain, add_generation_prompt)
        }
    }
    .map_err(|e| ApiError::invalid(Some("messages".to_owned()), format!("the chat template failed: {e}")))?;
    let text = if continue_final { continued(&text, messages)? } else { text };
    crate::prompt_length::check_untokenized(rollout, &text, "messages")?;
    let prompt = rollout.tokenizer().encode(&text, false).map_err(|e| ApiError::internal(e.to_string()))?;
    if prompt.is_empty() {
        return Err(ApiError::invalid_param("messages", "the rendered prompt is empty"));
    }
    Ok(prompt)
}

fn str_field(message: &Value, key: &str) -> String {
    message.get(key).and_then(Value::as_str).unwrap_or_default().to_owned()
}

/// The rendered text cut right after the final (assistant) message's content, so the reply continues it.
fn continued(text: &str, messages: &[Value]) -> Result<String, ApiError> {
    let last = messages.last().filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"));
    let content = last.map(|m| str_field(m, "content"));
    match content.and_then(|c| text.rfind(c.as_str()).map(|at| at + c.len())) {
        Some(end) => Ok(text[..end].to_owned()),
        None => Err(ApiError::invalid_param(
            "continue_final_message",
            "`continue_final_message` needs a final assistant message whose content the chat template keeps",
        )),
    }
}

/// A finished reply's reasoning and answer: with a reasoning parser the thinking is split off (both `None`
/// when empty, as vLLM returns them); without one the whole text is the answer.
pub(crate) fn split_reasoning(text: &str, parser: Option<ReasoningParser>) -> (Option<String>, Option<String>) {
    match parser {
        Some(parser) => parser.split(text),
        None => (None, Some(text.to_owned())),
    }
}

/// The message and finish reason of a finished choice, from its reasoning and answer as `split_reasoning` made
/// them (`with_reasoning`: a parser is on, so the message carries `reasoning_content` even when empty); tool
/// calls are parsed out of the answer when asked (vLLM parses tools in the answer only, so a call the model only
/// thought about is none). The caller splits, so a streamed reply that also needs the split does it once.
/// A forced choice's answer is its calls, with `content` `""` and the engine's finish reason, as vLLM returns
/// a whole response (a streamed one says `tool_calls`: the caller's to set).
pub(crate) fn chat_message(
    thinking: Option<&str>,
    answer: Option<&str>,
    with_reasoning: bool,
    reason: &'static str,
    tools: (bool, Option<&ForcedChoice>),
    id_of: &dyn Fn() -> String,
) -> (Value, &'static str) {
    let (parse_tools, forced) = tools;
    let forced_calls = forced.and_then(|f| forced_tools::calls(f, answer.unwrap_or_default(), id_of));
    let calls = if parse_tools { parse_hermes(answer.unwrap_or_default()) } else { None };
    let (mut message, reason) = match (forced_calls, calls) {
        (Some(calls), _) => (json!({"role": "assistant", "content": "", "tool_calls": calls}), reason),
        (None, calls) => chat_reply(answer, reason, calls, id_of),
    };
    if with_reasoning {
        message["reasoning_content"] = json!(thinking);
    }
    (message, reason)
}

/// The message of an answer with the calls parsed from it, if any.
fn chat_reply(
    answer: Option<&str>,
    reason: &'static str,
    calls: Option<crate::tool_calls::ParsedReply>,
    id_of: &dyn Fn() -> String,
) -> (Value, &'static str) {
    match calls {
        Some(reply) => {
            let calls: Vec<Value> = reply
                .calls
                .iter()
                .map(|c| json!({"id": id_of(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                .collect();
            (json!({"role": "assistant", "content": reply.content, "tool_calls": calls}), "tool_calls")
        }
        None => (json!({"role": "assistant", "content": answer}), reason),
    }
}

/// Runs the request to the end and answers with one `chat.completion` object.
async fn respond_whole(mut run: Run, output: &ChatOutput) -> Response {
    if let Err(error) = run.finish_all().await {
        run.failed(&error);
        return error.into_response();
    }
    let state = Arc::clone(run.state());
    let id = state.ids.next("chatcmpl-");
    let model = Arc::clone(&run.target.model);
    let tokenizer = model.tokenizer();
    let mut reasons = Vec::with_capacity(run.choices.len());
    let mut choices = Vec::with_capacity(run.choices.len());
    for (index, choice) in run.choices.iter().enumerate() {
        let (text, reason) =
            choice.finished.as_ref().map_or(("", trinity_engine::FinishReason::Stop), |(t, r)| (t.as_str(), *r));
        let (thinking, answer) = split_reasoning(text, output.reasoning);
        let id_of = || state.ids.next("call_");
        let (message, reason) = chat_message(
            thinking.as_deref(),
            answer.as_deref(),
            output.reasoning.is_some(),
            finish_reason_name(reason),
            (output.parse_tools, output.forced.as_ref()),
            &id_of,
        );
        reasons.push(reason);
        let logprobs = output
            .logprobs
            .then(|| chat_logprobs(tokenizer, &choice.tokens, &choice.logprobs, &choice.top, output.top_logprobs));
        let mut entry = json!({"index": index, "message": message, "logprobs": logprobs, "finish_reason": reason});
        if output.return_token_ids {
            entry["token_ids"] = json!(choice.tokens);
        }
        choices.push(entry);
    }
    run.record(&id, &reasons);
    let (prompt_tokens, completion_tokens) = run.usage();
    let mut body = json!({
        "id": id,
        "object": "chat.completion",
        "created": crate::ids::unix_seconds(),
        "model": output.model,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    });
    if output.return_token_ids {
        body["prompt_token_ids"] = json!(run.prompts[0].as_ref());
    }
    run.complete();
    Json(body).into_response()
}
