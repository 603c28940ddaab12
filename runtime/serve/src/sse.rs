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

use crate::chat::chat_message;
use crate::generation::{Run, Update, finish_reason_name};
use crate::logprobs::{chat_entry, completion_logprobs};
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
        let delta = release(text, spec).to_owned();
        let mut entry = match spec.shape {
            Shape::Chat => {
                let logprobs = spec.logprobs.then(|| json!({"content": [chat_entry(tokenizer, token, logprob, top)]}));
                if delta.is_empty() && logprobs.is_none() && !spec.return_token_ids {
                    return;
                }
                json!({"index": index, "delta": {"content": delta}, "logprobs": logprobs, "finish_reason": null})
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
        let sent = self.texts[index].text.text()[..self.texts[index].sent].to_owned();
        let (message, reason) = match self.spec.shape {
            Shape::Chat => chat_message(&final_text, reason, self.spec.parse_tools, &|| state.ids.next("call_")),
            Shape::Completion => (json!({"content": final_text}), reason),
        };
        self.reasons[index] = Some(reason);
        // Visible text: the final text, or with tool calls the text before the first call.
        let visible = match message.get("tool_calls") {
            Some(_) => final_text.find(TOOL_CALL_START).map_or("", |at| final_text[..at].trim_end()),
            None => final_text.as_str(),
        };
        let rest = match visible.strip_prefix(sent.as_str()) {
            Some(rest) => rest,
            None => {
                tracing::debug!(sent = %sent, visible = %visible, "streamed text differs from the final text");
                ""
            }
        };
        let mut delta = serde_json::Map::new();
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

/// The text of `choice` that can go out now (and marks it sent).
fn release<'a>(choice: &'a mut ChoiceText, spec: &StreamSpec) -> &'a str {
    let text = choice.text.text();
    if choice.in_tool_call {
        return "";
    }
    let longest = spec.stop.iter().map(String::len).max().unwrap_or(0);
    let mut end = text.len().saturating_sub(longest.saturating_sub(1));
    if longest > 0 {
        // The token that completes a stop string is streamed before the sample's end: stop at its start.
        let mut from = choice.sent.saturating_sub(longest - 1);
        while !text.is_char_boundary(from) {
            from -= 1;
        }
        if let Some(at) = spec.stop.iter().filter_map(|s| text[from..].find(s.as_str())).min() {
            end = end.min(from + at);
        }
    }
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
