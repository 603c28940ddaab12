//! The reward registry: built-ins register an [`RewardEntry`] with `inventory`; [`lookup`] finds one by the
//! name configs use (`default_reward_fn_type`, a row's `reward_fn_key`).
//!
//! WASM reward plugins (a later issue) implement the same contract: [`RewardInput`] in, named components out.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::error::RewardError;

/// Named reward components, summed into the reward (e.g. `accuracy` + `format_score`).
pub type RewardComponents = BTreeMap<String, f64>;

/// What a reward function sees of one rollout.
#[derive(Debug, Clone, Copy)]
pub struct RewardInput<'a> {
    /// The model's response text.
    pub response: &'a str,
    /// The task's reference answer (`raw[format.response_key]` as text).
    pub truth: Option<&'a str>,
    /// The task's prompt, for rewards that need it.
    pub prompt: Option<&'a str>,
    /// The taskset's `reward_fn_args`.
    pub args: &'a Map<String, Value>,
}

/// Signature of a built-in reward function.
pub type RewardFn = fn(&RewardInput<'_>) -> Result<RewardComponents, RewardError>;

/// One registered reward function.
#[derive(Debug)]
pub struct RewardEntry {
    /// The name configs use.
    pub name: &'static str,
    /// One line for `trinity plugins list`.
    pub description: &'static str,
    pub func: RewardFn,
}

inventory::collect!(RewardEntry);

/// The entry registered under `name`.
pub fn lookup(name: &str) -> Option<&'static RewardEntry> {
    inventory::iter::<RewardEntry>.into_iter().find(|e| e.name == name)
}

/// Every registered entry, sorted by name.
pub fn entries() -> Vec<&'static RewardEntry> {
    let mut all: Vec<_> = inventory::iter::<RewardEntry>.into_iter().collect();
    all.sort_by_key(|e| e.name);
    all
}

/// Every registered name, sorted.
pub fn names() -> Vec<&'static str> {
    entries().into_iter().map(|e| e.name).collect()
}

/// Scores `input` with the reward registered as `name`.
pub fn score(name: &str, input: &RewardInput<'_>) -> Result<RewardComponents, RewardError> {
    let entry =
        lookup(name).ok_or_else(|| RewardError::Unknown { name: name.to_owned(), known: names().join(", ") })?;
    (entry.func)(input)
}

/// The reward: the sum of the components.
pub fn total(components: &RewardComponents) -> f64 {
    components.values().sum()
}

/// Reads an optional boolean argument.
pub(crate) fn bool_arg(
    reward: &'static str,
    args: &Map<String, Value>,
    key: &str,
    default: bool,
) -> Result<bool, RewardError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(RewardError::BadArg {
            reward,
            key: key.to_owned(),
            problem: format!("must be true or false, found {other}"),
        }),
    }
}

/// Reads an optional number argument.
pub(crate) fn f64_arg(
    reward: &'static str,
    args: &Map<String, Value>,
    key: &str,
    default: f64,
) -> Result<f64, RewardError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Number(n)) => n.as_f64().ok_or_else(|| RewardError::BadArg {
            reward,
            key: key.to_owned(),
            problem: "is out of range".to_owned(),
        }),
        Some(other) => Err(RewardError::BadArg {
            reward,
            key: key.to_owned(),
            problem: format!("must be a number, found {other}"),
        }),
    }
}

/// Reads an optional string argument.
pub(crate) fn str_arg<'a>(
    reward: &'static str,
    args: &'a Map<String, Value>,
    key: &str,
) -> Result<Option<&'a str>, RewardError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(RewardError::BadArg {
            reward,
            key: key.to_owned(),
            problem: format!("must be a string, found {other}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_ins_are_registered() {
        assert_eq!(
            names(),
            ["accuracy_reward", "countdown_reward", "format_reward", "math_boxed_reward", "math_reward"]
        );
        let args = Map::new();
        let input =
            RewardInput { response: "<think>x</think><answer>4</answer>", truth: Some("4"), prompt: None, args: &args };
        let out = score("math_reward", &input).unwrap();
        assert!((total(&out) - 1.1).abs() < 1e-12);
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let args = Map::new();
        let input = RewardInput { response: "", truth: None, prompt: None, args: &args };
        let text = score("math_rewrd", &input).unwrap_err().to_string();
        assert!(text.contains("math_rewrd") && text.contains("math_reward"), "{text}");
    }
}
