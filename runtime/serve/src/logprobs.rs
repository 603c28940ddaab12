//! Logprobs in OpenAI's two shapes: chat's `logprobs.content[{token, logprob, bytes, top_logprobs}]` and the
//! legacy completions' `{tokens, token_logprobs, top_logprobs, text_offset}`.
//!
//! A token's text is the tokenizer's decoding of that id alone, special tokens kept (vLLM's choice): a
//! byte-level token that holds part of a UTF-8 character decodes to U+FFFD, and `bytes` are that text's bytes.
//! The logprobs are the engine's: `log_softmax(logits / T)` at the sampling temperature, the values the trainer
//! recomputes.

use serde_json::{Map, Value, json};
use trinity_engine::TopLogprob;
use trinity_model::Tokenizer;

/// The text of one token.
pub(crate) fn token_text(tokenizer: &Tokenizer, token: u32) -> String {
    tokenizer.decode(&[token], false).unwrap_or_default()
}

/// A chat `logprobs.content` entry.
pub(crate) fn chat_entry(tokenizer: &Tokenizer, token: u32, logprob: f32, top: Option<&[TopLogprob]>) -> Value {
    let text = token_text(tokenizer, token);
    let top: Vec<Value> = top
        .unwrap_or_default()
        .iter()
        .map(|t| {
            let text = token_text(tokenizer, t.token);
            json!({"token": text, "logprob": t.logprob, "bytes": text.as_bytes()})
        })
        .collect();
    json!({"token": text, "logprob": logprob, "bytes": text.as_bytes(), "top_logprobs": top})
}

/// Chat `logprobs` for tokens `range` of a choice.
pub(crate) fn chat_logprobs(
    tokenizer: &Tokenizer,
    tokens: &[u32],
    logprobs: &[f32],
    top: &[Vec<TopLogprob>],
    top_wanted: bool,
) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .zip(logprobs)
        .enumerate()
        .map(|(i, (&t, &lp))| chat_entry(tokenizer, t, lp, top_wanted.then(|| top.get(i).map(Vec::as_slice)).flatten()))
        .collect();
    json!({"content": content})
}

/// Legacy completions `logprobs`; `offset` is the text offset of the first token.
pub(crate) fn completion_logprobs(
    tokenizer: &Tokenizer,
    tokens: &[u32],
    logprobs: &[f32],
    top: &[Vec<TopLogprob>],
    top_wanted: bool,
    mut offset: usize,
) -> Value {
    let mut texts = Vec::with_capacity(tokens.len());
    let mut offsets = Vec::with_capacity(tokens.len());
    let mut tops = Vec::with_capacity(tokens.len());
    for (i, &t) in tokens.iter().enumerate() {
        let text = token_text(tokenizer, t);
        offsets.push(offset);
        offset += text.len();
        texts.push(text);
        if top_wanted {
            let mut map = Map::new();
            for alt in top.get(i).map(Vec::as_slice).unwrap_or_default() {
                map.insert(token_text(tokenizer, alt.token), json!(alt.logprob));
            }
            tops.push(Value::Object(map));
        }
    }
    json!({
        "tokens": texts,
        "token_logprobs": logprobs,
        "top_logprobs": if top_wanted { Value::Array(tops) } else { Value::Null },
        "text_offset": offsets,
    })
}
