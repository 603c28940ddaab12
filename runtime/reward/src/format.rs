//! `format_reward`: +0.1 if the response is laid out as reasoning then answer, −0.1 otherwise
//! (Trinity-RFT's `FormatReward`, after open-r1).
//!
//! The check follows Python's `re.match(pattern, response, DOTALL | MULTILINE)`: the pattern must match at
//! the start of the response (not necessarily to its end: with MULTILINE, `$` also matches before a line
//! break). `reward_fn_args.pattern` replaces the default; it is Rust `regex` syntax, which agrees with
//! Python's for the usual `^…$`, `.*?`, `\s` patterns (no look-around or back-references).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use regex::Regex;

use crate::error::RewardError;
use crate::registry::{RewardComponents, RewardEntry, RewardInput, str_arg};

/// Trinity's default pattern for `format_reward`.
pub const DEFAULT_PATTERN: &str = r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$";

/// Whether `pattern` (with DOTALL and MULTILINE) matches at the start of `text`.
pub fn matches_at_start(pattern: &str, text: &str) -> Result<bool, regex::Error> {
    let re = compiled(pattern)?;
    // The leftmost match starts at 0 whenever any match does, so this is `re.match`.
    Ok(re.find(text).is_some_and(|m| m.start() == 0))
}

/// Compiles each pattern once per process: rewards run for every rollout, and configs use one or two
/// patterns.
fn compiled(pattern: &str) -> Result<Regex, regex::Error> {
    static CACHE: OnceLock<Mutex<HashMap<String, Regex>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Mutex::default);
    // A poisoned cache only means a panic elsewhere mid-insert; the map itself is still valid.
    if let Some(re) = cache.lock().unwrap_or_else(PoisonError::into_inner).get(pattern) {
        return Ok(re.clone());
    }
    let re = Regex::new(&format!("(?sm){pattern}"))?;
    cache.lock().unwrap_or_else(PoisonError::into_inner).insert(pattern.to_owned(), re.clone());
    Ok(re)
}

/// ±0.1 under the key `format_score`.
pub fn format_score(pattern: &str, response: &str) -> Result<f64, regex::Error> {
    Ok(if matches_at_start(pattern, response)? { 0.1 } else { -0.1 })
}

fn format_reward(input: &RewardInput<'_>) -> Result<RewardComponents, RewardError> {
    let pattern = str_arg("format_reward", input.args, "pattern")?.unwrap_or(DEFAULT_PATTERN);
    let score = format_score(pattern, input.response).map_err(|e| RewardError::BadArg {
        reward: "format_reward",
        key: "pattern".to_owned(),
        problem: format!("is not a valid regular expression: {e}"),
    })?;
    Ok(RewardComponents::from([("format_score".to_owned(), score)]))
}

inventory::submit! {
    RewardEntry {
        name: "format_reward",
        description: "+0.1 for `<think>\\n…\\n</think>\\n<answer>\\n…\\n</answer>`, else -0.1",
        func: format_reward,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, Value, json};

    fn run(response: &str, args: &Map<String, Value>) -> Result<f64, RewardError> {
        let input = RewardInput { response, truth: None, prompt: None, args, response_tokens: None };
        format_reward(&input).map(|c| c["format_score"])
    }

    #[test]
    fn default_pattern() {
        let none = Map::new();
        assert_eq!(run("<think>\nhmm\n</think>\n<answer>\n4\n</answer>", &none).unwrap(), 0.1);
        // Multi-line reasoning (DOTALL).
        assert_eq!(run("<think>\na\nb\n</think>\n<answer>\n4\n</answer>", &none).unwrap(), 0.1);
        // MULTILINE `$`: trailing text on later lines still matches, as in Python.
        assert_eq!(run("<think>\na\n</think>\n<answer>\n4\n</answer>\nbye", &none).unwrap(), 0.1);
        // Must start at the beginning.
        assert_eq!(run("so <think>\na\n</think>\n<answer>\n4\n</answer>", &none).unwrap(), -0.1);
        // Newlines are required by the default pattern.
        assert_eq!(run("<think>a</think><answer>4</answer>", &none).unwrap(), -0.1);
        assert_eq!(run("", &none).unwrap(), -0.1);
    }

    #[test]
    fn custom_and_invalid_patterns() {
        let args = json!({"pattern": r"<answer>.*?</answer>"}).as_object().unwrap().clone();
        assert_eq!(run("<answer>4</answer>", &args).unwrap(), 0.1);
        let bad = json!({"pattern": "(unclosed"}).as_object().unwrap().clone();
        assert!(matches!(run("x", &bad), Err(RewardError::BadArg { .. })));
        let wrong_type = json!({"pattern": 5}).as_object().unwrap().clone();
        assert!(run("x", &wrong_type).unwrap_err().to_string().contains("reward_fn_args.pattern"));
    }
}
