//! `tool_call_workflow` (and its older name `toolcall_workflow`): function calling on ToolACE-style rows, with
//! the Tool-N1 prompt and reward (arXiv:2505.00024), as Trinity-RFT's `ToolCallWorkflow` has them.
//!
//! A row has `tools` (a JSON string: a list of function schemas), `raw_system` (the system text),
//! `conversations` (`[{from, value}]`, `from` one of human/user, gpt/assistant, observation/tool,
//! function_call) and `answer` (a JSON string: the expected list of `{name, arguments}` calls).
//!
//! Messages: system = `raw_system` + the Qwen tool prompt listing each tool as
//! `{"type": "function", "function": <tool>}` on its own line (Python `json.dumps` spelling), then the
//! conversation turns. The group's `repeat_times` answers come from one request with the taskset's
//! `rollout_args`. Reward (Tool-N1's `compute_score_v0`): 1 when the response has exactly one `<think>` and
//! one `</think>`, the `</think>` before the first `<tool_call>`, and the last `<tool_call>…</tool_call>` holds
//! JSON (a call or a list of calls, each an object with `name` and `arguments`) whose calls equal the answer's
//! as a multiset (name and arguments, key order ignored, `1` ≠ `1.0` as in Python's `json.dumps`); else 0. The
//! reward is also reported as the `accuracy` metric.

use serde_json::Value;
use trinity_buffer::Task;
use trinity_model::ChatMessage;

use crate::error::ExplorerError;
use crate::math_workflow::{describe, sample_group, sampling_params};
use crate::python_json::Dumps;
use crate::workflow::{Workflow, WorkflowContext, WorkflowEntry, WorkflowFuture};

/// Tool-N1's Qwen tool prompt; `{tools}` is replaced by one JSON line per tool.
const TOOL_PROMPT: &str = r#"# Tool

<tools>
{tools}
</tools>

In each action step, you MUST:
1. Think about the reasoning process in the mind and enclosed your reasoning within <think> </think> XML tags.
2. Then, provide a json object with function names and arguments within <tool_call></tool_call> XML tags. i.e., <tool_call>[{"name": <function-name>, "arguments": <args-json-object>}, {"name": <function-name2>, "arguments": <args-json-object2>}, ...]</tool_call>
3. Make sure both the reasoning and the tool call steps are included together in one single reply.
A complete reply example is: <think>To address the query, I need to send the email to Bob and then buy the banana through walmart. </think> <tool_call> [{"name": "email", "arguments": {"receiver": "Bob", "content": "I will bug banana through walmart"}}, {"name": "walmart", "arguments": {"input": "banana"}}]</tool_call>. Please make sure the type of the arguments is correct.
"#;

/// `json.dumps(..., sort_keys=True)`: the form Tool-N1's reward compares calls in.
const SORTED: Dumps = Dumps { sort_keys: true, ..Dumps::PYTHON };

/// A JSON value that may arrive as a JSON string (ToolACE stores `tools` and `answer` as strings).
fn decoded(value: &Value) -> Result<Value, String> {
    match value {
        Value::String(text) => serde_json::from_str(text).map_err(|e| format!("is not JSON: {e}")),
        other => Ok(other.clone()),
    }
}

/// The conversation Trinity builds from a ToolACE row.
pub(crate) fn tool_call_messages(row: &serde_json::Map<String, Value>) -> Result<Vec<ChatMessage>, String> {
    let tools = decoded(row.get("tools").ok_or("the row has no `tools`")?).map_err(|e| format!("`tools` {e}"))?;
    let tools = tools.as_array().ok_or("`tools` must be a list of function schemas")?;
    let lines: Vec<String> = tools
        .iter()
        .map(|tool| Dumps::PYTHON.text(&serde_json::json!({"type": "function", "function": tool})))
        .collect();
    let system = row.get("raw_system").and_then(Value::as_str).unwrap_or("");
    let mut messages =
        vec![ChatMessage::new("system", format!("{system}{}", TOOL_PROMPT.replace("{tools}", &lines.join("\n"))))];
    let turns = row.get("conversations").and_then(Value::as_array).ok_or("the row has no `conversations` list")?;
    for turn in turns {
        let value = turn.get("value").unwrap_or(&Value::Null);
        let text = || value.as_str().map_or_else(|| Dumps::PYTHON.text(value), str::to_owned);
        match turn.get("from").and_then(Value::as_str) {
            Some("human" | "user") => messages.push(ChatMessage::new("user", text())),
            Some("gpt" | "assistant") => messages.push(ChatMessage::new("assistant", text())),
            Some("observation" | "tool") => messages.push(ChatMessage::new("tool", text())),
            Some("function_call") => messages.push(ChatMessage::new("assistant", Dumps::PYTHON.text(value))),
            _ => {}
        }
    }
    Ok(messages)
}

/// The JSON inside the last `<tool_call>…</tool_call>`, decoded once more if it is a JSON string.
fn extract_calls(response: &str) -> Option<Value> {
    let mut last = None;
    let mut rest = response;
    while let Some(start) = rest.find("<tool_call>") {
        let after = &rest[start + "<tool_call>".len()..];
        let Some(end) = after.find("</tool_call>") else { break };
        last = Some(&after[..end]);
        rest = &after[end + "</tool_call>".len()..];
    }
    match serde_json::from_str::<Value>(last?.trim()).ok()? {
        Value::String(inner) => serde_json::from_str(&inner).ok(),
        value => Some(value),
    }
}

/// Each call as `(name, sorted arguments)` in Python's spelling, sorted: a multiset to compare.
fn call_multiset(calls: &[Value]) -> Option<Vec<(String, String)>> {
    let mut keys: Vec<(String, String)> = calls
        .iter()
        .map(|call| Some((SORTED.text(call.get("name")?), SORTED.text(call.get("arguments")?))))
        .collect::<Option<_>>()?;
    keys.sort();
    Some(keys)
}

/// Tool-N1's `compute_score_v0` (see the module docs): 1.0 or 0.0.
pub(crate) fn tool_call_reward(response: &str, answer: &Value) -> f64 {
    let Some(result) = extract_calls(response) else { return 0.0 };
    let result = match result {
        Value::Object(call) => vec![Value::Object(call)],
        Value::Array(calls) => calls,
        _ => return 0.0,
    };
    if response.matches("<think>").count() != 1 || response.matches("</think>").count() != 1 {
        return 0.0;
    }
    if let (Some(think_end), Some(call_start)) = (response.find("</think>"), response.find("<tool_call>"))
        && think_end > call_start
    {
        return 0.0;
    }
    if !result.iter().all(|call| call.get("name").is_some() && call.get("arguments").is_some()) {
        return 0.0;
    }
    let expected: &[Value] = match answer {
        Value::Array(calls) => calls,
        _ => return 0.0,
    };
    if result.is_empty() || expected.is_empty() {
        return if result.len() == expected.len() { 1.0 } else { 0.0 };
    }
    match (call_multiset(&result), call_multiset(expected)) {
        (Some(got), Some(want)) if got == want => 1.0,
        _ => 0.0,
    }
}

#[derive(Debug, Clone, Copy)]
struct ToolCall;

impl Workflow for ToolCall {
    fn run<'a>(&'a self, task: &'a Task, ctx: &'a WorkflowContext) -> WorkflowFuture<'a> {
        Box::pin(async move {
            let fail = |message: String| ExplorerError::Task { task: describe(task), message };
            let messages = tool_call_messages(&task.raw).map_err(fail)?;
            let answer = match task.raw.get("answer") {
                Some(answer) => Some(decoded(answer).map_err(|e| fail(format!("`answer` {e}")))?),
                None => None,
            };
            // A JSON string holding a JSON string: Tool-N1 decodes the answer twice in that case.
            let answer = match answer {
                Some(Value::String(inner)) => {
                    Some(serde_json::from_str(&inner).map_err(|e| fail(format!("`answer` is not JSON: {e}")))?)
                }
                other => other,
            };
            let mut experiences = sample_group(task, ctx, &messages, sampling_params(task, ctx)).await?;
            if answer.is_none() {
                tracing::error!("task {}: the row has no `answer`; every rollout gets reward 0", describe(task));
            }
            for experience in &mut experiences {
                let response = experience.response_text.as_deref().unwrap_or("");
                let reward = answer.as_ref().map_or(0.0, |answer| tool_call_reward(response, answer));
                experience.reward = reward;
                experience.metrics.insert("accuracy".to_owned(), reward);
            }
            Ok(experiences)
        })
    }
}

fn tool_call() -> Box<dyn Workflow> {
    Box::new(ToolCall)
}

inventory::submit! {
    WorkflowEntry {
        name: "tool_call_workflow",
        description: "function calling on ToolACE rows; Tool-N1 reward: think, then the exact calls",
        build: tool_call,
    }
}
inventory::submit! {
    WorkflowEntry { name: "toolcall_workflow", description: "older name of tool_call_workflow", build: tool_call }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn answer() -> Value {
        json!([{"name": "weather", "arguments": {"city": "Paris", "days": 2}}, {"name": "clock", "arguments": {}}])
    }

    #[test]
    fn the_reward_needs_one_think_before_the_exact_calls() {
        let good = r#"<think>two calls</think> <tool_call>[{"name": "clock", "arguments": {}}, {"name": "weather", "arguments": {"days": 2, "city": "Paris"}}]</tool_call>"#;
        assert_eq!(tool_call_reward(good, &answer()), 1.0, "order of calls and of keys does not matter");
        let wrong_type = good.replace("\"days\": 2", "\"days\": 2.0");
        assert_eq!(tool_call_reward(&wrong_type, &answer()), 0.0, "2.0 is not 2, as in json.dumps");
        let names_only = good.replace("Paris", "Rome");
        assert_eq!(tool_call_reward(&names_only, &answer()), 0.0);
        assert_eq!(tool_call_reward(&good.replace("<think>two calls</think> ", ""), &answer()), 0.0);
        let twice = format!("<think>a</think>{good}");
        assert_eq!(tool_call_reward(&twice, &answer()), 0.0, "two <think> tags");
        let late_think = r#"<tool_call>{"name": "clock", "arguments": {}}</tool_call><think>x</think>"#;
        assert_eq!(tool_call_reward(late_think, &json!([{"name": "clock", "arguments": {}}])), 0.0);
        // One call may come as an object; the last <tool_call> counts; a JSON string is decoded again.
        let single =
            r#"<think>x</think><tool_call>[]</tool_call><tool_call>{"name": "clock", "arguments": {}}</tool_call>"#;
        assert_eq!(tool_call_reward(single, &json!([{"name": "clock", "arguments": {}}])), 1.0);
        let quoted = r#"<think>x</think><tool_call>"[{\"name\": \"clock\", \"arguments\": {}}]"</tool_call>"#;
        assert_eq!(tool_call_reward(quoted, &json!([{"name": "clock", "arguments": {}}])), 1.0);
        // No calls expected and none made.
        assert_eq!(tool_call_reward("<think>x</think><tool_call>[]</tool_call>", &json!([])), 1.0);
        assert_eq!(tool_call_reward("<think>x</think><tool_call>[{\"name\": \"a\"}]</tool_call>", &answer()), 0.0);
        assert_eq!(tool_call_reward("<think>x</think> no call", &answer()), 0.0);
    }

    #[test]
    fn messages_follow_tool_n1_prompt_construction() {
        let row = json!({
            "tools": "[{\"name\": \"clock\", \"description\": \"caf\\u00e9 time\", \"parameters\": {}}]",
            "raw_system": "You are helpful.",
            "conversations": [
                {"from": "human", "value": "time?"},
                {"from": "function_call", "value": {"name": "clock", "arguments": {}}},
                {"from": "observation", "value": "noon"},
                {"from": "gpt", "value": "It is noon."},
                {"from": "unknown", "value": "dropped"}
            ],
            "answer": "[]"
        });
        let messages = tool_call_messages(row.as_object().unwrap()).unwrap();
        let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "assistant"]);
        let tool_line =
            r#"{"type": "function", "function": {"name": "clock", "description": "caf\u00e9 time", "parameters": {}}}"#;
        assert!(messages[0].content.starts_with("You are helpful.# Tool\n\n<tools>\n"), "{}", messages[0].content);
        assert!(messages[0].content.contains(&format!("<tools>\n{tool_line}\n</tools>")), "{}", messages[0].content);
        assert_eq!(messages[2].content, r#"{"name": "clock", "arguments": {}}"#);
        assert!(tool_call_messages(json!({"raw_system": ""}).as_object().unwrap()).unwrap_err().contains("tools"));
    }
}
