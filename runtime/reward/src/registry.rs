//! The reward registry: built-ins register an [`RewardEntry`] with `inventory`; [`lookup`] finds one by the
//! name configs use (`default_reward_fn_type`, a row's `reward_fn_key`).
//!
//! Reward plugins (WASM components, loaded at run time) register a [`GroupReward`] with [`register`]: the same
//! contract, [`RewardInput`]s in and named components out, but a whole group per call. Lookups consult them
//! first, then the built-ins; [`register`] refuses a built-in's name unless told to replace it.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

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
    /// How many tokens the response has, when the caller knows (rewards that penalise length need it, as
    /// Trinity-RFT passes `response_token` to them).
    pub response_tokens: Option<usize>,
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

/// A reward function registered at run time: scores the responses of one task's group in one call.
pub trait GroupReward: Send + Sync + std::fmt::Debug {
    /// One set of components per input, in order; `row` is the task's taskset row when known.
    fn score_group(
        &self,
        row: Option<&Map<String, Value>>,
        inputs: &[RewardInput<'_>],
    ) -> Result<Vec<RewardComponents>, RewardError>;
}

/// Reward functions registered at run time, by name.
static DYNAMIC: RwLock<BTreeMap<String, Arc<dyn GroupReward>>> = RwLock::new(BTreeMap::new());

fn dynamic(name: &str) -> Option<Arc<dyn GroupReward>> {
    DYNAMIC.read().unwrap_or_else(|poisoned| poisoned.into_inner()).get(name).cloned()
}

/// Registers `reward` under `name` for the rest of the process. A built-in of the same name is an error unless
/// `replace_builtin` (the plugin then wins); a second registration of one name is always an error.
pub fn register(name: &str, reward: Arc<dyn GroupReward>, replace_builtin: bool) -> Result<(), RewardError> {
    let mut all = DYNAMIC.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    if all.contains_key(name) {
        return Err(RewardError::NameTaken { name: name.to_owned(), by: "another plugin" });
    }
    if lookup(name).is_some() && !replace_builtin {
        return Err(RewardError::NameTaken { name: name.to_owned(), by: "a built-in reward function" });
    }
    all.insert(name.to_owned(), reward);
    Ok(())
}

/// Scores the responses of one task's group with the reward called `name` (a plugin scores them in one call).
pub fn score_group(
    name: &str,
    row: Option<&Map<String, Value>>,
    inputs: &[RewardInput<'_>],
) -> Result<Vec<RewardComponents>, RewardError> {
    if let Some(reward) = dynamic(name) {
        let scores = reward.score_group(row, inputs)?;
        if scores.len() != inputs.len() {
            return Err(RewardError::Plugin {
                reward: name.to_owned(),
                message: format!("plugin `{name}`: {} scores for {} responses", scores.len(), inputs.len()),
            });
        }
        return Ok(scores);
    }
    inputs.iter().map(|input| score(name, input)).collect()
}

/// The built-in entry registered under `name`.
pub fn lookup(name: &str) -> Option<&'static RewardEntry> {
    inventory::iter::<RewardEntry>.into_iter().find(|e| e.name == name)
}

/// Every built-in entry, sorted by name.
pub fn entries() -> Vec<&'static RewardEntry> {
    let mut all: Vec<_> = inventory::iter::<RewardEntry>.into_iter().collect();
    all.sort_by_key(|e| e.name);
    all
}

/// Every registered name (built-in or plugin), sorted.
pub fn names() -> Vec<String> {
    let mut all: Vec<String> = entries().into_iter().map(|e| e.name.to_owned()).collect();
    all.extend(DYNAMIC.read().unwrap_or_else(|poisoned| poisoned.into_inner()).keys().cloned());
    all.sort_unstable();
    all.dedup();
    all
}

/// Scores `input` with the reward registered as `name`.
pub fn score(name: &str, input: &RewardInput<'_>) -> Result<RewardComponents, RewardError> {
    if let Some(reward) = dynamic(name) {
        let mut scores = reward.score_group(None, std::slice::from_ref(input))?;
        return match (scores.pop(), scores.is_empty()) {
            (Some(components), true) => Ok(components),
            _ => Err(RewardError::Plugin {
                reward: name.to_owned(),
                message: format!("plugin `{name}`: not one score for one response"),
            }),
        };
    }
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
        let builtins: Vec<&str> = entries().into_iter().map(|e| e.name).collect();
        assert_eq!(
            builtins,
            [
                "accuracy_reward",
                "countdown_reward",
                "format_reward",
                "math_boxed_reward",
                "math_boxed_reward_naive_dapo",
                "math_dapo_reward",
                "math_reward",
                "rm_gallery_reward"
            ]
        );
        let args = Map::new();
        let input = RewardInput {
            response: "<think>x</think><answer>4</answer>",
            truth: Some("4"),
            prompt: None,
            args: &args,
            response_tokens: None,
        };
        let out = score("math_reward", &input).unwrap();
        assert!((total(&out) - 1.1).abs() < 1e-12);
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let args = Map::new();
        let input = RewardInput { response: "", truth: None, prompt: None, args: &args, response_tokens: None };
        let text = score("math_rewrd", &input).unwrap_err().to_string();
        assert!(text.contains("math_rewrd") && text.contains("math_reward"), "{text}");
    }

    #[derive(Debug)]
    struct Constant;

    impl GroupReward for Constant {
        fn score_group(
            &self,
            _row: Option<&Map<String, Value>>,
            inputs: &[RewardInput<'_>],
        ) -> Result<Vec<RewardComponents>, RewardError> {
            Ok(inputs.iter().map(|_| RewardComponents::from([("c".to_owned(), 0.5)])).collect())
        }
    }

    #[test]
    fn plugins_register_beside_built_ins_and_clash_by_name() {
        let error = register("math_reward", Arc::new(Constant), false).unwrap_err();
        assert!(error.to_string().contains("override_builtin"), "{error}");
        register("test_constant_reward", Arc::new(Constant), false).unwrap();
        assert!(names().contains(&"test_constant_reward".to_owned()));
        let args = Map::new();
        let input = RewardInput { response: "x", truth: None, prompt: None, args: &args, response_tokens: None };
        assert_eq!(score("test_constant_reward", &input).unwrap()["c"], 0.5);
        assert_eq!(score_group("test_constant_reward", None, &[input, input]).unwrap().len(), 2);
        let again = register("test_constant_reward", Arc::new(Constant), true).unwrap_err();
        assert!(again.to_string().contains("another plugin"), "{again}");
        // Built-ins score a group one response at a time.
        let answered = RewardInput { truth: Some("4"), ..input };
        let group = score_group("math_reward", None, &[answered, answered]).unwrap();
        assert_eq!(group.len(), 2);
    }
}
