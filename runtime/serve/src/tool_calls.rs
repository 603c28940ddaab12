//! Tool calls in the model's own output, in the hermes format that Qwen2.5/Qwen3, Hermes and many fine-tunes
//! are trained on: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call, possibly
//! after some text. Parsed into OpenAI `tool_calls` (arguments as a JSON string) with the text before the first
//! block as the message content.
//!
//! A block that is not a JSON object with a string `name` makes the whole output plain content, as vLLM's
//! hermes parser does: a client never receives half of a malformed set of calls. The last block may lack its
//! closing tag (generation stopped right after the JSON).

use serde_json::Value;

/// Where a tool call starts; streamed text is held back from here on.
pub(crate) const TOOL_CALL_START: &str = "<tool_call>";
const TOOL_CALL_END: &str = "</tool_call>";

/// One parsed call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolCall {
    pub(crate) name: String,
    /// The arguments as a JSON text (OpenAI's `function.arguments`).
    pub(crate) arguments: String,
}

/// A reply with tool calls.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ParsedReply {
    /// Text before the first call, trimmed; `None` when there is none.
    pub(crate) content: Option<String>,
    pub(crate) calls: Vec<ToolCall>,
}

/// The calls in `text`, or `None` when it holds no well-formed call.
pub(crate) fn parse_hermes(text: &str) -> Option<ParsedReply> {
    let first = text.find(TOOL_CALL_START)?;
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(start) = rest.find(TOOL_CALL_START) {
        let body_start = start + TOOL_CALL_START.len();
        let (body, next) = match rest[body_start..].find(TOOL_CALL_END) {
            Some(end) => (&rest[body_start..body_start + end], body_start + end + TOOL_CALL_END.len()),
            None => (&rest[body_start..], rest.len()),
        };
        calls.push(parse_call(body.trim())?);
        rest = &rest[next..];
    }
    let content = text[..first].trim();
    Some(ParsedReply { content: (!content.is_empty()).then(|| content.to_owned()), calls })
}

fn parse_call(body: &str) -> Option<ToolCall> {
    let Value::Object(mut call) = serde_json::from_str::<Value>(body).ok()? else { return None };
    let Value::String(name) = call.remove("name")? else { return None };
    // Some models write `parameters` instead of `arguments`; a string holding JSON is passed on as is.
    let arguments = match call.remove("arguments").or_else(|| call.remove("parameters")) {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(Value::String(text)) => text,
        Some(value) => value.to_string(),
    };
    Some(ToolCall { name, arguments })
}

/// How many bytes at the end of `text` could be the start of [`TOOL_CALL_START`] (held back while streaming).
pub(crate) fn partial_start_len(text: &str) -> usize {
    partial_tag_len(text, TOOL_CALL_START)
}

/// How many bytes at the end of `text` could be the start of `tag` (a tag split across tokens).
pub(crate) fn partial_tag_len(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| text.len() >= n && text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_calls_after_text_and_an_unclosed_last_call() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"now\"}";
        let reply = parse_hermes(text).unwrap();
        assert_eq!(reply.content.as_deref(), Some("Let me check."));
        assert_eq!(
            reply.calls,
            vec![
                ToolCall { name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() },
                ToolCall { name: "now".into(), arguments: "{}".into() },
            ]
        );
    }

    #[test]
    fn malformed_or_absent_calls_are_plain_content() {
        assert_eq!(parse_hermes("no calls here"), None);
        assert_eq!(parse_hermes("<tool_call>{\"name\": 3}</tool_call>"), None);
        assert_eq!(parse_hermes("<tool_call>{not json}</tool_call>"), None);
        let reply =
            parse_hermes("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>").unwrap();
        assert_eq!(reply.content, None);
        assert_eq!(reply.calls[0].arguments, "{\"x\": 1}");
    }

    #[test]
    fn a_possible_start_tag_at_the_end_is_held_back() {
        assert_eq!(partial_start_len("hello <tool_"), 6);
        assert_eq!(partial_start_len("hello <"), 1);
        assert_eq!(partial_start_len("hello"), 0);
        assert_eq!(partial_start_len("é<t"), 2);
    }
}
