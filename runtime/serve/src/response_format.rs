//! `response_format`, as vLLM's OpenAI server takes it: `text` samples freely, `json_object` samples any JSON
//! object, and `json_schema` samples under `json_schema.schema` (the form the `openai` client's
//! `chat.completions.parse(response_format=SomeModel)` sends) through the same automaton as forced tool choices
//! (`constrained/`: the subset of JSON Schema it honours, and xgrammar's strict object order, are documented
//! there). The reply is an ordinary message whose `content` is the JSON text; tokens, logprobs and the recorded
//! experience are those of any other reply.
//!
//! vLLM's own extension `structural_tag` is refused, as is combining a format with a forced tool choice (each
//! would constrain the same output).

use serde_json::{Value, json};

use crate::constrained::Schema;
use crate::error::ApiError;

/// A `response_format` that constrains the output: what to compile and the key that identifies it across
/// requests ([`crate::constrained::Constraints::get`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JsonFormat {
    /// The schema the output is held to.
    pub(crate) schema: Value,
}

impl JsonFormat {
    pub(crate) fn key(&self) -> String {
        format!("response_format {}", self.schema)
    }

    pub(crate) fn compile(&self) -> Schema {
        Schema::compile(&self.schema)
    }
}

/// The constraint `format` asks for; `None` for `text` or no format.
pub(crate) fn json_format(format: Option<&Value>) -> Result<Option<JsonFormat>, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else { return Ok(None) };
    let kind = format.get("type").and_then(Value::as_str);
    match kind {
        Some("text") => Ok(None),
        // Any object: `additionalProperties: true` lets every key in, the way the automaton reads an open object.
        Some("json_object") => Ok(Some(JsonFormat { schema: json!({"type": "object", "additionalProperties": true}) })),
        Some("json_schema") => {
            let Some(spec) = format.get("json_schema").and_then(Value::as_object) else {
                return Err(ApiError::invalid_param(
                    "response_format.json_schema",
                    "`json_schema` must be an object: {\"name\": ..., \"schema\": {...}}",
                ));
            };
            match spec.get("schema") {
                Some(schema @ (Value::Object(_) | Value::Bool(true))) => {
                    Ok(Some(JsonFormat { schema: schema.clone() }))
                }
                // OpenAI's API makes the schema optional; without one the output is any JSON value.
                None | Some(Value::Null) => Ok(Some(JsonFormat { schema: json!({}) })),
                Some(other) => Err(ApiError::invalid_param(
                    "response_format.json_schema.schema",
                    format!("the schema must be a JSON Schema object, not {other}"),
                )),
            }
        }
        Some("structural_tag") => Err(ApiError::unsupported(
            "response_format",
            "`structural_tag` is not supported; use `json_schema` (or `tool_choice: \"required\"` for tool calls)",
        )),
        _ => Err(ApiError::invalid_param(
            "response_format.type",
            format!("response_format {format} is not one of `text`, `json_object` or `json_schema`"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constrained::Schema;

    #[test]
    fn formats_read_as_vllm_reads_them_and_name_what_is_wrong() {
        assert_eq!(json_format(None).unwrap(), None);
        assert_eq!(json_format(Some(&json!({"type": "text"}))).unwrap(), None);
        let object = json_format(Some(&json!({"type": "json_object"}))).unwrap().unwrap();
        assert_eq!(object.compile(), Schema::compile(&json!({"type": "object", "additionalProperties": true})));
        let person = json!({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]});
        let schema =
            json!({"type": "json_schema", "json_schema": {"name": "Person", "schema": person, "strict": true}});
        let format = json_format(Some(&schema)).unwrap().unwrap();
        assert_eq!(format.schema, person);
        assert!(format.key().contains("\"name\""));
        let bare = json_format(Some(&json!({"type": "json_schema", "json_schema": {"name": "x"}}))).unwrap();
        assert_eq!(bare.unwrap().schema, json!({}));
        let missing = json_format(Some(&json!({"type": "json_schema"}))).unwrap_err();
        assert!(missing.message.contains("`json_schema` must be an object"), "{}", missing.message);
        let tag = json_format(Some(&json!({"type": "structural_tag", "structures": []}))).unwrap_err();
        assert!(tag.message.contains("structural_tag"), "{}", tag.message);
        assert!(json_format(Some(&json!({"type": "yaml"}))).is_err());
        assert!(json_format(Some(&json!({"type": "json_schema", "json_schema": {"schema": 3}}))).is_err());
    }
}
