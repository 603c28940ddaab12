//! `countdown_reward` (Trinity-RFT's `CountDownRewardFn`, after TinyZero): the reference is JSON
//! `{"target": T, "numbers": [..]}`; the response's equation is the last `<answer>…</answer>` on its last
//! line. Score (key `score`): 0 without such an equation; 0.1 (format score) when the equation does not use
//! exactly the given numbers, each once, or has characters other than digits, `+ - * / ( ) .` and spaces,
//! or cannot be evaluated, or misses the target by 1e-5 or more; 1.0 when it hits the target.

use serde_json::Value;

use crate::error::RewardError;
use crate::expr::evaluate;
use crate::registry::{RewardComponents, RewardEntry, RewardInput};

const NAME: &str = "countdown_reward";

/// A countdown reference answer.
#[derive(Debug, Clone, PartialEq)]
pub struct CountdownTruth {
    pub target: f64,
    pub numbers: Vec<i64>,
}

/// Parses `{"target": .., "numbers": [..]}` (extra keys are ignored, so a whole generated row works).
pub fn parse_truth(truth: &str) -> Result<CountdownTruth, RewardError> {
    let bad =
        |problem: &str| RewardError::BadTruth { reward: NAME, truth: truth.to_owned(), problem: problem.to_owned() };
    let value: Value = serde_json::from_str(truth).map_err(|_| bad("is not JSON"))?;
    let target = value.get("target").and_then(Value::as_f64).ok_or_else(|| bad("has no numeric `target`"))?;
    let numbers = value
        .get("numbers")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("has no `numbers` list"))?
        .iter()
        .map(Value::as_i64)
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad("has a `numbers` entry that is not an integer"))?;
    Ok(CountdownTruth { target, numbers })
}

/// The equation: the last `<answer>…</answer>` on the response's last line, trimmed.
pub fn extract_equation(response: &str) -> Option<&str> {
    let last_line = response.rsplit('\n').next().unwrap_or(response);
    let mut found = None;
    let mut rest = last_line;
    let mut offset = 0;
    while let Some(start) = rest.find("<answer>") {
        let inner_start = start + "<answer>".len();
        let Some(len) = rest[inner_start..].find("</answer>") else { break };
        found = Some(&last_line[offset + inner_start..offset + inner_start + len]);
        let consumed = inner_start + len + "</answer>".len();
        offset += consumed;
        rest = &rest[consumed..];
    }
    found.map(str::trim)
}

/// Whether the equation's integers are exactly the given numbers (as multisets).
pub fn uses_numbers_once(equation: &str, numbers: &[i64]) -> bool {
    let mut used = Vec::new();
    let mut current = String::new();
    for c in equation.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_digit() {
            current.push(c);
        } else if !current.is_empty() {
            match current.parse::<i64>() {
                Ok(n) => used.push(n),
                Err(_) => return false,
            }
            current.clear();
        }
    }
    let mut given = numbers.to_vec();
    used.sort_unstable();
    given.sort_unstable();
    used == given
}

/// The countdown score of one response.
pub fn countdown_score(response: &str, truth: &CountdownTruth) -> f64 {
    const FORMAT_SCORE: f64 = 0.1;
    let Some(equation) = extract_equation(response) else { return 0.0 };
    if !uses_numbers_once(equation, &truth.numbers) {
        return FORMAT_SCORE;
    }
    let allowed = |c: char| c.is_ascii_digit() || "+-*/(). \t\r\n".contains(c);
    if equation.is_empty() || !equation.chars().all(allowed) {
        return FORMAT_SCORE;
    }
    match evaluate(equation) {
        Ok(value) if (value - truth.target).abs() < 1e-5 => 1.0,
        _ => FORMAT_SCORE,
    }
}

fn countdown_reward(input: &RewardInput<'_>) -> Result<RewardComponents, RewardError> {
    let truth = input.truth.filter(|t| !t.trim().is_empty()).ok_or(RewardError::MissingTruth { reward: NAME })?;
    let truth = parse_truth(truth)?;
    Ok(RewardComponents::from([("score".to_owned(), countdown_score(input.response, &truth))]))
}

inventory::submit! {
    RewardEntry {
        name: NAME,
        description: "1 for an equation hitting the target with each number once, 0.1 for a well-formed miss, else 0",
        func: countdown_reward,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    const TRUTH: &str = r#"{"target": 24, "numbers": [3, 4, 2]}"#;

    fn score(response: &str) -> f64 {
        let args = Map::new();
        countdown_reward(&RewardInput {
            response,
            truth: Some(TRUTH),
            prompt: None,
            args: &args,
            response_tokens: None,
        })
        .unwrap()["score"]
    }

    #[test]
    fn correct_equations_score_one() {
        assert_eq!(score("<think>try</think>\n<answer> (3 * 4) * 2 </answer>"), 1.0);
        assert_eq!(score("<answer>4*3*2</answer>"), 1.0);
        assert_eq!(score("<answer>3 * (4 + 4) </answer>"), 0.1);
        // Division stays exact enough: 24 = 4 / (2 / (3 * 4))... uses 4 twice, so format only.
        assert_eq!(score("<answer>2 * 4 * 3.0</answer>"), 0.1, "3.0 reads as numbers 3 and 0");
    }

    #[test]
    fn partial_credit_and_zero() {
        assert_eq!(score("<answer>3 + 4 + 2</answer>"), 0.1);
        assert_eq!(score("<answer>3 * 4</answer>"), 0.1);
        assert_eq!(score("<answer>3 * 4 * 2 * 1</answer>"), 0.1);
        assert_eq!(score("<answer>3 x 4 x 2</answer>"), 0.1);
        assert_eq!(score("<answer>3 * 4 * 2 =</answer>"), 0.1);
        assert_eq!(score("<answer>2 / (4 - 4) * 3</answer>"), 0.1);
        assert_eq!(score("<answer>3(4)2</answer>"), 0.1);
        assert_eq!(score("3 * 4 * 2"), 0.0);
        assert_eq!(score("<answer>3*4*2</answer>\nthat's it"), 0.0, "answer must be on the last line");
        assert_eq!(score("<answer>3+4+2</answer> or <answer>3*4*2</answer>"), 1.0, "last answer on the line");
        assert_eq!(score("<answer>3*4*2"), 0.0);
    }

    #[test]
    fn true_division_counts() {
        let args = Map::new();
        let truth = r#"{"target": 2, "numbers": [6, 9, 3]}"#;
        let input = RewardInput {
            response: "<answer>(9 - 6) / 3 * 2</answer>",
            truth: Some(truth),
            prompt: None,
            args: &args,
            response_tokens: None,
        };
        assert_eq!(countdown_reward(&input).unwrap()["score"], 0.1);
        let input = RewardInput {
            response: "<answer>6 / (9 / 3)</answer>",
            truth: Some(truth),
            prompt: None,
            args: &args,
            response_tokens: None,
        };
        assert_eq!(countdown_reward(&input).unwrap()["score"], 1.0);
    }

    #[test]
    fn broken_references_are_errors() {
        let args = Map::new();
        for truth in ["24", "{\"target\": 24}", "{\"target\": 24, \"numbers\": [1.5]}", "nope"] {
            let input = RewardInput {
                response: "<answer>1</answer>",
                truth: Some(truth),
                prompt: None,
                args: &args,
                response_tokens: None,
            };
            assert!(matches!(countdown_reward(&input), Err(RewardError::BadTruth { .. })), "{truth}");
        }
        let input = RewardInput { response: "", truth: None, prompt: None, args: &args, response_tokens: None };
        assert!(matches!(countdown_reward(&input), Err(RewardError::MissingTruth { .. })));
        // Extra keys are fine: a whole generated row is a valid reference.
        assert!(parse_truth(r#"{"numbers": [1, 2], "target": 3, "id": 7}"#).is_ok());
    }
}
