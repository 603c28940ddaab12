//! Streamed responses (`stream: true`): server-sent events, one chunk per sampled token (text, logprobs and
//! token ids as asked), each choice's end, a usage chunk when `stream_options.include_usage` asks, then
//! `data: [DONE]`.
//!
//! Text is released as soon as it cannot turn out to be part of something the client must not see: the last
//! `longest stop string - 1` bytes wait (the engine cuts the final text before a stop string), and with tool
//! parsing on, text from a `<tool_call>` tag (or what may be the start of one) waits for the end of the
//! choice, where the calls go out as one `tool_calls` delta. When a choice ends, whatever of its final text
//! was held back follows. The response is recorded when its last choice ends, before that choice's final
//! chunk, so an agent that has seen the end of the stream can send feedback at once.
//!
//! A client that disconnects makes the write fail; axum then drops this stream, which drops the [`Run`] and
//! with it the engine streams: the sequences leave the batch at the next decode step.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use futures_util::stream;
use serde_json::{Value, json};
use trinity_engine::{FinishReason, IncrementalText};

use crate::chat::{chat_message, split_reasoning};
use crate::generation::{Run, Update, finish_reason_name};
use crate::logprobs::{chat_entry, completion_logprobs};
use crate::reasoning::{self, Phase, ReasoningParser};
use crate::tool_calls::{TOOL_CALL_START, partial_start_len};

/// Which API's chunks to produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `chat.completion.chunk` objects with `delta`s.
    Chat,
    /// `text_completion` objects with `text`.
    Completion,
}

/// What the stream carries.
#[derive(Debug, Clone)]
pub(crate) struct StreamSpec {
    pub(crate) shape: Shape,
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) logprobs: bool,
    pub(crate) top_logprobs: bool,
    pub(crate) return_token_ids: bool,
    pub(crate) include_usage: bool,
    pub(crate) parse_tools: bool,
    /// A forced tool choice: no text goes out, the calls come in one delta when the choice ends.
    pub(crate) forced: Option<crate::forced_tools::ForcedChoice>,
    /// Splits `<think>` text into `delta.reasoning_content` (chat streams only; `None` for completions).
    pub(crate) reasoning: Option<ReasoningParser>,
    /// The request's stop strings: text is never released past the start of one, and the last
    /// `longest - 1` bytes wait for the next token.
    pub(crate) stop: Vec<String>,
}

/// Per choice: its text so far and how much of it went out.
#[derive(Debug, Default)]
struct ChoiceText {
    text: IncrementalText,
    sent: usize,
    /// A `<tool_call>` tag appeared: nothing more is sent until the choice ends.
    in_tool_call: bool,
    /// Text offset of the next token (completions' `text_offset`).
    offset: usize,
    /// With a reasoning parser: where the reply is, the reasoning sent so far, and where the answer starts.
    phase: Phase,
    reasoning_sent: String,
    content_from: Option<usize>,
}

struct StreamState {
    run: Run,
    spec: StreamSpec,
    created: u64,
    texts: Vec<ChoiceText>,
    reasons: Vec<Option<&'static str>>,
    queue: VecDeque<Event>,
    over: bool,
}

/// The SSE response for a started run.
pub(crate) fn respond(run: Run, spec: StreamSpec) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let choices = run.choices.len();
    let mut state = StreamState {
        run,
        spec,
        created: crate::ids::unix_seconds(),
        texts: (0..choices).map(|_| ChoiceText::default()).collect(),
        reasons: vec![None; choices],
        queue: VecDeque::new(),
        over: false,
    };
    state.opening();
    let events = stream::unfold(state, |mut state| async move {
        loop {
            if let Some(event) = state.queue.pop_front() {
                return Some((Ok(event), state));
            }
            if state.over {
                return None;
            }
            state.advance().await;
        }
    });
    // Comments keep idle connections (a long queue for KV-cache slots) open through proxies.
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

impl StreamState {
    fn push(&mut self, chunk: Value) {
        // Serializing a `Value` cannot fail.
        self.queue.push_back(Event::default().data(chunk.to_string()));
    }

    fn chunk(&self, choices: Vec<Value>) -> Value {
        let object = match self.spec.shape {
            Shape::Chat => "chat.completion.chunk",
            Shape::Completion => "text_completion",
        };
        json!({"id": self.spec.id, "object": object, "created": self.created, "model": self.spec.model, "choices": choices})
    }

    /// Chat streams open with each choice's role (and the prompt's token ids when asked).
    fn opening(&mut self) {
        if self.spec.shape != Shape::Chat {
            return;
        }
        for index in 0..self.texts.len() {
            let mut chunk = self.chunk(vec![json!({
                "index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null,
            })]);
            if index == 0 && self.spec.return_token_ids {
                chunk["prompt_token_ids"] = json!(self.run.prompts[0].as_ref());
            }
            self.push(chunk);
        }
    }

    /// Takes the next engine event and queues what it produces.
    async fn advance(&mut self) {
        match self.run.next().await {
            None => {
                if self.spec.include_usage {
                    let (prompt, completion) = self.run.usage();
                    let mut chunk = self.chunk(Vec::new());
                    chunk["usage"] = json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion});
                    self.push(chunk);
                }
                self.queue.push_back(Event::default().data("[DONE]"));
                self.run.complete();
                self.over = true;
            }
            Some(Ok(Update::Token(index))) => self.token(index),
            Some(Ok(Update::Finished(index))) => self.finished(index),
            Some(Err(error)) => {
                tracing::warn!(%error.message, "a streamed request failed");
                self.push(error.body());
                self.queue.push_back(Event::default().data("[DONE]"));
                self.run.failed(&error);
                self.over = true;
            }
        }
    }

    /// A new token of choice `index`: its releasable text, logprob and id.
    fn token(&mut self, index: usize) {
        let model = std::sync::Arc::clone(&self.run.target.model);
        let tokenizer = model.tokenizer();
        let choice = &self.run.choices[index];
        let (Some(&token), Some(&logprob)) = (choice.tokens.last(), choice.logprobs.last()) else { return };
        let top = self.spec.top_logprobs.then(|| choice.top.last().map(Vec::as_slice)).flatten();
        let spec = &self.spec;
        let text = &mut self.texts[index];
        if let Err(error) = text.text.push(tokenizer, &choice.tokens) {
            tracing::debug!(%error, "detokenizing a streamed token failed");
        }
        let thinking = release_reasoning(text, spec);
        let delta = if text.phase == Phase::Content { release(text, spec).to_owned() } else { String::new() };
        let mut entry = match spec.shape {
            Shape::Chat => {
                let logprobs = spec.logprobs.then(|| json!({"content": [chat_entry(tokenizer, token, logprob, top)]}));
                if delta.is_empty() && thinking.is_empty() && logprobs.is_none() && !spec.return_token_ids {
                    return;
                }
                let mut message = serde_json::Map::new();
                if !thinking.is_empty() {
                    message.insert("reasoning_content".into(), json!(thinking));
                }
                if !delta.is_empty() || thinking.is_empty() {
                    message.insert("content".into(), json!(delta));
                }
                json!({"index": index, "delta": message, "logprobs": logprobs, "finish_reason": null})
            }
            Shape::Completion => {
                let top = top.map(|t| vec![t.to_vec()]).unwrap_or_default();
                let logprobs = spec.logprobs.then(|| {
                    completion_logprobs(tokenizer, &[token], &[logprob], &top, spec.top_logprobs, text.offset)
                });
                text.offset += crate::logprobs::token_text(tokenizer, token).len();
                if delta.is_empty() && logprobs.is_none() && !spec.return_token_ids {
                    return;
                }
                json!({"index": index, "text": delta, "logprobs": logprobs, "finish_reason": null})
            }
        };
        if spec.return_token_ids {
            entry["token_ids"] = json!([token]);
        }
        let chunk = self.chunk(vec![entry]);
        self.push(chunk);
    }

    /// Choice `index` ended: record the response if it was the last, send the held-back text or the tool
    /// calls, then the finish reason.
    fn finished(&mut self, index: usize) {
        let state = std::sync::Arc::clone(self.run.state());
        let (final_text, reason) = match &self.run.choices[index].finished {
            Some((text, reason)) => (text.clone(), *reason),
            None => (String::new(), FinishReason::Stop),
        };
        let reason = finish_reason_name(reason);
        let reasoning = self.spec.reasoning;
        let choice = &self.texts[index];
        let sent = match (reasoning, choice.content_from) {
            (None, _) => choice.text.text()[..choice.sent].to_owned(),
            (Some(_), Some(from)) => choice.text.text()[from..choice.sent].to_owned(),
            (Some(_), None) => String::new(),
        };
        let (thinking, answer) = split_reasoning(&final_text, reasoning);
        let (message, reason) = match self.spec.shape {
            Shape::Chat => {
                let id_of = || state.ids.next("call_");
                let with_reasoning = reasoning.is_some();
                let tools = (self.spec.parse_tools, self.spec.forced.as_ref());
                let (message, reason) =
                    chat_message(thinking.as_deref(), answer.as_deref(), with_reasoning, reason, tools, &id_of);
                // A streamed forced call ends with `tool_calls`, as vLLM streams it.
                let forced_calls = self.spec.forced.is_some() && message.get("tool_calls").is_some();
                (message, if forced_calls { "tool_calls" } else { reason })
            }
            Shape::Completion => (json!({"content": final_text}), reason),
        };
        self.reasons[index] = Some(reason);
        let answer = answer.unwrap_or_default();
        // Visible text: the answer, or with tool calls the answer before the first call.
        let visible = match message.get("tool_calls") {
            Some(_) if self.spec.forced.is_some() => "",
            Some(_) => answer.find(TOOL_CALL_START).map_or("", |at| answer[..at].trim_end()),
            None => answer.as_str(),
        };
        let rest = unsent(visible, &sent, "text");
        let thinking_rest = unsent(thinking.as_deref().unwrap_or_default(), &choice.reasoning_sent, "reasoning");
        let mut delta = serde_json::Map::new();
        if !thinking_rest.is_empty() {
            delta.insert("reasoning_content".into(), json!(thinking_rest));
        }
        if !rest.is_empty() {
            delta.insert("content".into(), json!(rest));
        }
        if let Some(Value::Array(calls)) = message.get("tool_calls") {
            let calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(i, call)| {
                    let mut call = call.clone();
                    call["index"] = json!(i);
                    call
                })
                .collect();
            delta.insert("tool_calls".into(), Value::Array(calls));
        }
        if self.reasons.iter().all(Option::is_some) {
            let reasons: Vec<&'static str> = self.reasons.iter().map(|r| r.unwrap_or("stop")).collect();
            let id = self.spec.id.clone();
            self.run.record(&id, &reasons);
        }
        let finish = match self.spec.shape {
            Shape::Chat => {
                if !delta.is_empty() {
                    let entry = json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": null});
                    let chunk = self.chunk(vec![entry]);
                    self.push(chunk);
                }
                json!({"index": index, "delta": {}, "logprobs": null, "finish_reason": reason})
            }
            Shape::Completion => json!({"index": index, "text": rest, "logprobs": null, "finish_reason": reason}),
        };
        let chunk = self.chunk(vec![finish]);
        self.push(chunk);
    }
}

/// What of `whole` was not streamed yet, given that `sent` was; empty (with a debug line) when the final text
/// does not continue what went out (the engine cut it before a stop string the stream could not foresee).
fn unsent<'a>(whole: &'a str, sent: &str, what: &str) -> &'a str {
    whole.strip_prefix(sent).unwrap_or_else(|| {
        tracing::debug!(sent = %sent, whole = %whole, "streamed {what} differs from the final {what}");
        ""
    })
}

/// The reasoning of `choice` that can go out now; moves the choice to [`Phase::Content`] once its answer starts
/// (at once without a parser).
fn release_reasoning(choice: &mut ChoiceText, spec: &StreamSpec) -> String {
    let parser = match spec.reasoning {
        Some(parser) if choice.phase != Phase::Content => parser,
        _ => {
            choice.phase = Phase::Content;
            return String::new();
        }
    };
    let text = choice.text.text();
    let limit = stop_limit(text, choice.sent, &spec.stop);
    let released = reasoning::advance(parser, &mut choice.phase, &text[..limit], &mut choice.sent);
    choice.content_from = choice.content_from.or(released.content_from);
    choice.reasoning_sent.push_str(&released.reasoning);
    released.reasoning
}

/// How far text can go out: short of the last `longest stop string - 1` bytes, and never past the start of a
/// stop string (the token that completes one is streamed before the sample's end).
fn stop_limit(text: &str, sent: usize, stop: &[String]) -> usize {
    let longest = stop.iter().map(String::len).max().unwrap_or(0);
    let mut end = text.len().saturating_sub(longest.saturating_sub(1));
    if longest > 0 {
        let mut from = sent.saturating_sub(longest - 1);
        while !text.is_char_boundary(from) {
            from -= 1;
        }
        if let Some(at) = stop.iter().filter_map(|s| text[from..].find(s.as_str())).min() {
            end = end.min(from + at);
        }
    }
    while end > sent && !text.is_char_boundary(end) {
        end -= 1;
    }
    end.max(sent.min(text.len()))
}

/// The text of `choice` that can go out now (and marks it sent).
fn release<'a>(choice: &'a mut ChoiceText, spec: &StreamSpec) -> &'a str {
    let text = choice.text.text();
    if choice.in_tool_call || spec.forced.is_some() {
        return "";
    }
    let mut end = stop_limit(text, choice.sent, &spec.stop);
    if spec.parse_tools {
        match text[choice.sent..].find(TOOL_CALL_START) {
            Some(at) => {
                choice.in_tool_call = true;
                end = end.min(choice.sent + at);
            }
            None => end = end.min(text.len() - partial_start_len(text)),
        }
    }
    while end > choice.sent && !text.is_char_boundary(end) {
        end -= 1;
    }
    if end <= choice.sent {
        return "";
    }
    let start = choice.sent;
    choice.sent = end;
    &text[start..end]
}
