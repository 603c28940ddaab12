//! One task: a taskset row plus everything needed to roll it out.
//!
//! Invariant: a [`Task`] is self-contained — the workflow and reward names, their arguments, the format keys
//! and the rollout arguments are resolved when the task is built (taskset defaults, overridden per row by
//! `format.workflow_key` / `format.reward_fn_key`), so the explorer never goes back to the config.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use trinity_config::buffer::{FormatConfig, RolloutArgs, TasksetConfig};

use crate::error::{BufferError, Result};

/// One dataset row as read from a taskset file: field name → JSON value.
pub type Row = Map<String, Value>;

/// A task the explorer runs `repeat_times` times (one group).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// Name of the taskset the row comes from (metrics use it: `eval/<name>/accuracy`).
    pub taskset: String,
    /// Position of that taskset among the explorer's training (or eval) tasksets.
    pub taskset_id: usize,
    /// Row index within the taskset; with `taskset_id` it identifies the task across epochs.
    pub index: usize,
    /// Explore step the task was drawn for (0 for eval tasks).
    pub batch_id: u64,
    /// Whether the task comes from an eval taskset.
    pub is_eval: bool,
    /// The row itself.
    pub raw: Row,
    /// Workflow name (registered name such as `math_workflow`), if any is configured.
    pub workflow: Option<String>,
    /// Reward function name (registered name such as `math_reward`), if any is configured.
    pub reward_fn: Option<String>,
    pub workflow_args: Map<String, Value>,
    pub reward_fn_args: Map<String, Value>,
    /// Which row fields hold the prompt, the answer, the system prompt.
    pub format: FormatConfig,
    pub rollout_args: RolloutArgs,
    /// Rollouts of this task (group size).
    pub repeat_times: u32,
}

impl Task {
    /// Builds the task for row `index` of `taskset`, checking per-row override fields.
    ///
    /// A `workflow_key` / `reward_fn_key` field that is present must be a string (or null, meaning "use the
    /// taskset's default"); anything else is an error naming the row, because silently falling back would run
    /// the wrong workflow.
    pub fn from_row(config: &TasksetConfig, taskset_id: usize, index: usize, raw: Row, is_eval: bool) -> Result<Task> {
        let workflow = row_override(config, index, &raw, &config.format.workflow_key)?
            .or_else(|| config.default_workflow_type.clone());
        let reward_fn = row_override(config, index, &raw, &config.format.reward_fn_key)?
            .or_else(|| config.default_reward_fn_type.clone());
        check_text(config, index, &raw, &config.format.prompt_key)?;
        if let Some(key) = &config.format.system_prompt_key {
            check_text(config, index, &raw, key)?;
        }
        Ok(Task {
            taskset: config.name.clone(),
            taskset_id,
            index,
            batch_id: 0,
            is_eval,
            raw,
            workflow,
            reward_fn,
            workflow_args: config.workflow_args.clone(),
            reward_fn_args: config.reward_fn_args.clone(),
            format: config.format.clone(),
            rollout_args: config.rollout_args.clone(),
            repeat_times: config.repeat_times.unwrap_or(1).max(1),
        })
    }

    /// The user prompt (`raw[format.prompt_key]`) as text: strings as they are, numbers in their JSON form
    /// ([`Task::from_row`] refuses other kinds).
    pub fn prompt(&self) -> Option<String> {
        self.raw.get(&self.format.prompt_key).and_then(value_text)
    }

    /// The reference answer (`raw[format.response_key]`) as text: strings as they are, numbers and objects as
    /// JSON (a countdown truth `{"target": .., "numbers": [..]}` stays parseable).
    pub fn truth(&self) -> Option<String> {
        self.raw.get(&self.format.response_key).and_then(value_text)
    }

    /// The system prompt: the row's `system_prompt_key` field wins over the taskset's `system_prompt`.
    pub fn system_prompt(&self) -> Option<String> {
        self.format
            .system_prompt_key
            .as_ref()
            .and_then(|key| self.raw.get(key))
            .and_then(value_text)
            .or_else(|| self.format.system_prompt.clone())
    }

    /// The pre-filled start of the assistant's reply, if configured.
    pub fn reply_prefix(&self) -> Option<&str> {
        self.format.reply_prefix.as_deref()
    }
}

/// Text of a row value; `None` for null so that a null answer reads as "absent".
fn value_text(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// A prompt field, when the row has it, must be text: a number reads as its digits, but a mapping, list or
/// boolean would reach the model as JSON source text that nobody wrote as a prompt.
fn check_text(config: &TasksetConfig, index: usize, raw: &Row, key: &str) -> Result<()> {
    match raw.get(key) {
        None | Some(Value::Null | Value::String(_) | Value::Number(_)) => Ok(()),
        Some(other) => Err(BufferError::BadField {
            taskset: config.name.clone(),
            row: index,
            key: key.to_owned(),
            problem: format!(
                "is the prompt's text and must be a string, found {}; point `format.prompt_key` (or \
                 `system_prompt_key`) at a text field",
                crate::error::json_kind(other)
            ),
        }),
    }
}

fn row_override(config: &TasksetConfig, index: usize, raw: &Row, key: &str) -> Result<Option<String>> {
    if key.is_empty() {
        return Ok(None);
    }
    match raw.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(name)) if name.trim().is_empty() => Ok(None),
        Some(Value::String(name)) => Ok(Some(name.clone())),
        Some(other) => Err(BufferError::BadField {
            taskset: config.name.clone(),
            row: index,
            key: key.to_owned(),
            problem: format!("must be a workflow or reward name (a string), found {}", crate::error::json_kind(other)),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config() -> TasksetConfig {
        let mut config = TasksetConfig { name: "gsm8k".into(), repeat_times: Some(4), ..Default::default() };
        config.format.prompt_key = "question".into();
        config.format.response_key = "answer".into();
        config.format.workflow_key = "wf".into();
        config.format.reward_fn_key = "rf".into();
        config.format.system_prompt = Some("be brief".into());
        config.default_workflow_type = Some("math_workflow".into());
        config.default_reward_fn_type = Some("math_reward".into());
        config
    }

    fn row(value: Value) -> Row {
        match value {
            Value::Object(map) => map,
            _ => Row::new(),
        }
    }

    #[test]
    fn defaults_come_from_the_taskset() {
        let task = Task::from_row(&config(), 0, 7, row(json!({"question": "1+1?", "answer": 2})), false).unwrap();
        assert_eq!(task.workflow.as_deref(), Some("math_workflow"));
        assert_eq!(task.reward_fn.as_deref(), Some("math_reward"));
        assert_eq!(task.prompt().as_deref(), Some("1+1?"));
        assert_eq!(task.truth().as_deref(), Some("2"));
        assert_eq!(task.system_prompt().as_deref(), Some("be brief"));
        assert_eq!(task.repeat_times, 4);
        assert_eq!(task.index, 7);
    }

    #[test]
    fn rows_override_workflow_and_reward() {
        let raw = row(json!({"question": "q", "wf": "math_boxed_workflow", "rf": "countdown_reward"}));
        let task = Task::from_row(&config(), 0, 0, raw, false).unwrap();
        assert_eq!(task.workflow.as_deref(), Some("math_boxed_workflow"));
        assert_eq!(task.reward_fn.as_deref(), Some("countdown_reward"));
    }

    #[test]
    fn a_non_string_override_is_an_error_naming_the_row() {
        let err = Task::from_row(&config(), 0, 3, row(json!({"question": "q", "rf": 5})), false).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("row 3") && text.contains("`rf`") && text.contains("gsm8k"), "{text}");
    }

    #[test]
    fn a_prompt_that_is_not_text_is_an_error_naming_the_row_and_key() {
        for bad in [json!({"a": 1}), json!(["x"]), json!(true)] {
            let raw = row(json!({"question": bad, "answer": 1}));
            let text = Task::from_row(&config(), 0, 4, raw, false).unwrap_err().to_string();
            assert!(text.contains("row 4") && text.contains("`question`") && text.contains("gsm8k"), "{text}");
            assert!(text.contains("must be a string"), "{text}");
        }
        let mut with_key = config();
        with_key.format.system_prompt_key = Some("sys".into());
        let raw = row(json!({"question": "q", "sys": {"role": "system"}}));
        let text = Task::from_row(&with_key, 0, 2, raw, false).unwrap_err().to_string();
        assert!(text.contains("`sys`"), "{text}");
        let number = Task::from_row(&config(), 0, 0, row(json!({"question": 12})), false).unwrap();
        assert_eq!(number.prompt().as_deref(), Some("12"));
    }

    #[test]
    fn row_system_prompt_wins_and_object_truth_stays_json() {
        let mut config = config();
        config.format.system_prompt_key = Some("sys".into());
        let raw = row(json!({"sys": "row prompt", "answer": {"target": 3, "numbers": [1, 2]}}));
        let task = Task::from_row(&config, 0, 0, raw, true).unwrap();
        assert_eq!(task.system_prompt().as_deref(), Some("row prompt"));
        let truth: Value = serde_json::from_str(&task.truth().unwrap()).unwrap();
        assert_eq!(truth["target"], 3);
        assert_eq!(task.prompt(), None);
    }
}
