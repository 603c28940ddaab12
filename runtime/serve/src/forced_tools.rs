//! Forced tool choices, as vLLM serves them: `tool_choice: "required"` and a named function
//! (`{"type": "function", "function": {"name": "f"}}`) sample under a JSON-schema constraint and come back as
//! `tool_calls`.
//!
//! - `required`: the output is a non-empty JSON array of `{"name": <a tool's name>, "parameters": <that tool's
//!   parameters>}` (vLLM's `get_json_schema_from_tools`); each item becomes a call whose `arguments` are the
//!   parameters re-serialized as Python's `json.dumps(..., ensure_ascii=False)` writes them, as vLLM does.
//! - named: the output is the function's parameters object, which becomes the call's `arguments` as sampled.
//!
//! Like vLLM, the message's `content` is `""` and a whole response's `finish_reason` is the engine's (`stop`),
//! while a streamed one ends with `tool_calls`; the calls are streamed in one delta when the choice ends. Where
//! vLLM fails the request (a `required` output cut short by `max_tokens`, so not a whole array), trinity
//! returns the text as `content` with its `finish_reason` (`length`): the reply is still recorded for training.

use serde_json::{Value, json};
use trinity_explorer::Dumps;

use crate::constrained::Schema;
use crate::error::ApiError;

/// A tool choice that forces a call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ForcedChoice {
    Required,
    Named(String),
}

/// What `tool_choice` asks.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ToolChoice {
    /// `auto` (the default): the model decides, its calls are parsed.
    Auto,
    /// `none`: the tools are shown, nothing is parsed.
    None,
    Forced(ForcedChoice),
}

/// `tool_choice` read against the request's `tools` (already checked by the caller to be function tools).
pub(crate) fn tool_choice(choice: Option<&Value>, tools: Option<&Value>) -> Result<ToolChoice, ApiError> {
    let forced = match choice {
        None => return Ok(ToolChoice::Auto),
        Some(Value::String(s)) if s == "auto" => return Ok(ToolChoice::Auto),
        Some(Value::String(s)) if s == "none" => return Ok(ToolChoice::None),
        Some(Value::String(s)) if s == "required" => ForcedChoice::Required,
        Some(Value::Object(named)) if named.get("type").and_then(Value::as_str) == Some("function") => {
            match named.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
                Some(name) => ForcedChoice::Named(name.to_owned()),
                None => {
                    return Err(ApiError::invalid_param("tool_choice", "a named tool choice needs `function.name`"));
                }
            }
        }
        Some(other) => {
            return Err(ApiError::invalid_param(
                "tool_choice",
                format!(
                    "tool_choice {other} is not one of \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                ),
            ));
        }
    };
    let Some(tools) = tools.and_then(Value::as_array) else {
        return Err(ApiError::invalid_param("tool_choice", "a forced tool choice needs `tools`"));
    };
    if let ForcedChoice::Named(name) = &forced
        && !tools.iter().any(|t| tool_name(t) == Some(name.as_str()))
    {
        return Err(ApiError::invalid_param("tool_choice", format!("tool '{name}' has not been passed in `tools`")));
    }
    Ok(ToolChoice::Forced(forced))
}

pub(crate) fn tool_name(tool: &Value) -> Option<&str> {
    tool.pointer("/function/name").and_then(Value::as_str)
}

fn tool_parameters(tool: &Value) -> Option<&Value> {
    tool.pointer("/function/parameters")
}

/// The schema the output is held to.
pub(crate) fn schema(choice: &ForcedChoice, tools: &Value) -> Schema {
    let tools = tools.as_array().map(Vec::as_slice).unwrap_or_default();
    match choice {
        ForcedChoice::Required => {
            Schema::tool_calls(tools.iter().filter_map(|t| Some((tool_name(t)?, tool_parameters(t)))))
        }
        ForcedChoice::Named(name) => {
            let parameters = tools.iter().find(|t| tool_name(t) == Some(name.as_str())).and_then(tool_parameters);
            Schema::compile(parameters.unwrap_or(&Value::Null))
        }
    }
}

/// What identifies the constraint `choice` puts on `tools`' output across requests ([`crate::constrained::Constraints::get`]).
pub(crate) fn constraint_key(choice: &ForcedChoice, tools: &Value) -> String {
    format!("tool_choice {choice:?} over {tools}")
}

/// The calls a forced choice's output makes (`id_of` gives each its id); `None` when the output is not a whole
/// value (cut short).
pub(crate) fn calls(choice: &ForcedChoice, text: &str, id_of: &dyn Fn() -> String) -> Option<Vec<Value>> {
    let call = |name: &str, arguments: String| json!({"id": id_of(), "type": "function", "function": {"name": name, "arguments": arguments}});
    match choice {
        ForcedChoice::Named(name) => {
            serde_json::from_str::<Value>(text).ok()?;
            Some(vec![call(name, text.to_owned())])
        }
        ForcedChoice::Required => {
            let Value::Array(items) = serde_json::from_str::<Value>(text).ok()? else { return None };
            items
                .iter()
                .map(|item| {
                    let name = item.get("name")?.as_str()?;
                    let parameters = item.get("parameters").filter(|p| !p.is_null()).cloned().unwrap_or(json!({}));
                    Some(call(name, Dumps { ensure_ascii: false, ..Dumps::PYTHON }.text(&parameters)))
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Value {
        json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "now"}},
        ])
    }

    #[test]
    fn tool_choice_reads_vllms_forms_and_names_what_is_wrong() {
        let t = tools();
        assert_eq!(tool_choice(None, Some(&t)).unwrap(), ToolChoice::Auto);
        assert_eq!(tool_choice(Some(&json!("none")), Some(&t)).unwrap(), ToolChoice::None);
        assert_eq!(
            tool_choice(Some(&json!("required")), Some(&t)).unwrap(),
            ToolChoice::Forced(ForcedChoice::Required)
        );
        let named = json!({"type": "function", "function": {"name": "now"}});
        assert_eq!(tool_choice(Some(&named), Some(&t)).unwrap(), ToolChoice::Forced(ForcedChoice::Named("now".into())));
        let unknown = json!({"type": "function", "function": {"name": "later"}});
        assert!(tool_choice(Some(&unknown), Some(&t)).unwrap_err().message.contains("'later'"));
        assert!(tool_choice(Some(&json!("required")), None).unwrap_err().message.contains("needs `tools`"));
        assert!(tool_choice(Some(&json!("always")), Some(&t)).is_err());
    }

    #[test]
    fn outputs_become_calls_as_vllm_returns_them() {
        let ids = std::cell::Cell::new(0);
        let id_of = || {
            ids.set(ids.get() + 1);
            format!("call_{}", ids.get())
        };
        let text =
            r#"[{"name":"get_weather","parameters":{"city":"Paris","n":[1,2.5]}},{"name":"now","parameters":{}}]"#;
        let calls = calls(&ForcedChoice::Required, text, &id_of).unwrap();
        assert_eq!(calls[0]["id"], "call_1");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert_eq!(calls[0]["function"]["arguments"], r#"{"city": "Paris", "n": [1, 2.5]}"#);
        assert_eq!(calls[1]["function"]["arguments"], "{}");
        let named = super::calls(&ForcedChoice::Named("now".into()), r#"{"x": 1}"#, &id_of).unwrap();
        assert_eq!(named[0]["function"]["arguments"], r#"{"x": 1}"#);
        assert_eq!(super::calls(&ForcedChoice::Required, r#"[{"name":"now","#, &id_of), None);
    }
}
