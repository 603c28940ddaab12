//! `math_dapo_reward`: DAPO's rule-based math reward with its overlong penalty (Trinity-RFT's `MathDAPORewardFn`,
//! DAPO paper arXiv:2503.14476 §2.4 and §3.4).
//!
//! * `accuracy` is +1 when the answer is right and −1 when it is not (DAPO's ±1 outcome reward, not 1/0). The
//!   answer is read as Trinity's `naive_dapo_score.match_answer` reads it: only the text after the last
//!   `</think>` counts; in it, the content of the last `\boxed{…}` (else the last `\fbox{…}`), or the whole text
//!   when there is no box. It is right when it equals the reference after normalisation ([`crate::answer`]):
//!   exact rationals, or numbers within a relative 1e-4 (the numeric branch of veRL's `math_equal`), or the
//!   same normalised text. Unlike `math_reward` there is no "last number of the text" fallback: DAPO grades
//!   the extracted text as a whole, so an unboxed essay is wrong even when it ends with the right number.
//!   Symbolic equality (sympy in Trinity) is not attempted, as everywhere in this crate.
//! * `format_score` is the overlong penalty when `reward_fn_args.enable_overlong_penalty` is true, else 0. With
//!   `max_response_length` Lmax, `cache_length` C and `penalty_factor` f (all required then, Lmax > C) and a
//!   response of L tokens: L ≤ Lmax − C → 0; L > Lmax → −f; otherwise (Lmax − C − L) / C · f.
//!
//! `math_boxed_reward_naive_dapo` (the reward of Trinity-RFT's guru-math benchmark plugin, `NaiveDapoRewardFn`)
//! grades the same way but scores `accuracy` 1 or 0, with `format_score` always 0 and no length penalty.

use crate::answer::{Rational, normalize, parse_number};
use crate::error::RewardError;
use crate::registry::{RewardComponents, RewardEntry, RewardInput, bool_arg, f64_arg};

const NAME: &str = "math_dapo_reward";

/// The answer DAPO grades: after the last `</think>`, the last boxed content, else the whole tail.
pub fn dapo_answer(response: &str) -> &str {
    let tail = response.rsplit("</think>").next().unwrap_or(response);
    boxed_content(tail).unwrap_or(tail)
}

/// The content of the last `\boxed` (or, when there is none, the last `\fbox`): from there, the first `{` and
/// its matching `}`, trimmed. `None` when the braces do not close.
fn boxed_content(text: &str) -> Option<&str> {
    let start = text.rfind("\\boxed").or_else(|| text.rfind("\\fbox"))?;
    let mut depth = 0usize;
    let mut open = None;
    for (i, c) in text[start..].char_indices() {
        match c {
            '{' => {
                depth += 1;
                open.get_or_insert(start + i + 1);
            }
            '}' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    return open.map(|from| text[from..start + i].trim());
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether `candidate` grades as `truth` (see the module docs).
pub fn dapo_correct(candidate: &str, truth: &str) -> bool {
    let (c, t) = (normalize(candidate), normalize(truth));
    match (parse_number(&c), parse_number(&t)) {
        (Some(a), Some(b)) => a == b || close(a, b),
        (None, Some(_)) => false,
        _ => {
            let squash = |s: &str| s.chars().filter(|ch| !ch.is_whitespace()).collect::<String>().to_lowercase();
            !c.is_empty() && squash(&c) == squash(&t)
        }
    }
}

/// `math.isclose(a, b, rel_tol=1e-4)`.
fn close(a: Rational, b: Rational) -> bool {
    let (x, y) = (a.num as f64 / a.den as f64, b.num as f64 / b.den as f64);
    (x - y).abs() <= 1e-4 * x.abs().max(y.abs())
}

/// DAPO's soft overlong penalty for a response of `len` tokens.
pub fn overlong_penalty(len: usize, max_response_length: f64, cache_length: f64, penalty_factor: f64) -> f64 {
    let len = len as f64;
    let expected = max_response_length - cache_length;
    if len <= expected {
        0.0
    } else if len > max_response_length {
        -penalty_factor
    } else {
        (expected - len) / cache_length * penalty_factor
    }
}

fn math_dapo_reward(input: &RewardInput<'_>) -> Result<RewardComponents, RewardError> {
    let truth = match input.truth {
        Some(t) if !t.trim().is_empty() => t,
        _ => return Err(RewardError::MissingTruth { reward: NAME }),
    };
    let accuracy = if dapo_correct(dapo_answer(input.response), truth) { 1.0 } else { -1.0 };
    let mut format_score = 0.0;
    if bool_arg(NAME, input.args, "enable_overlong_penalty", false)? {
        let required = |key: &str| -> Result<f64, RewardError> {
            match input.args.get(key) {
                None | Some(serde_json::Value::Null) => Err(RewardError::BadArg {
                    reward: NAME,
                    key: key.to_owned(),
                    problem: "must be set when enable_overlong_penalty is true".to_owned(),
                }),
                Some(_) => f64_arg(NAME, input.args, key, 0.0),
            }
        };
        let (max_len, cache, factor) =
            (required("max_response_length")?, required("cache_length")?, required("penalty_factor")?);
        if max_len <= cache || cache <= 0.0 {
            return Err(RewardError::BadArg {
                reward: NAME,
                key: "max_response_length".to_owned(),
                problem: format!("({max_len}) must be greater than cache_length ({cache}), which must be positive"),
            });
        }
        let len = input.response_tokens.ok_or_else(|| RewardError::BadArg {
            reward: NAME,
            key: "enable_overlong_penalty".to_owned(),
            problem: "needs the response's token count, which this caller does not give".to_owned(),
        })?;
        format_score = overlong_penalty(len, max_len, cache, factor);
    }
    Ok(RewardComponents::from([("accuracy".to_owned(), accuracy), ("format_score".to_owned(), format_score)]))
}

fn math_boxed_reward_naive_dapo(input: &RewardInput<'_>) -> Result<RewardComponents, RewardError> {
    let truth = match input.truth {
        Some(t) if !t.trim().is_empty() => t,
        _ => return Err(RewardError::MissingTruth { reward: "math_boxed_reward_naive_dapo" }),
    };
    let accuracy = if dapo_correct(dapo_answer(input.response), truth) { 1.0 } else { 0.0 };
    Ok(RewardComponents::from([("accuracy".to_owned(), accuracy), ("format_score".to_owned(), 0.0)]))
}

inventory::submit! {
    RewardEntry {
        name: "math_boxed_reward_naive_dapo",
        description: "naive DAPO grading of the last \\boxed{} after </think>: accuracy 1 or 0",
        func: math_boxed_reward_naive_dapo,
    }
}

inventory::submit! {
    RewardEntry {
        name: "math_dapo_reward",
        description: "DAPO: accuracy ±1 on the last \\boxed{} after </think>; optional overlong length penalty",
        func: math_dapo_reward,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, Value, json};

    fn score(response: &str, truth: &str, tokens: Option<usize>, args: Value) -> Result<(f64, f64), RewardError> {
        let args: Map<String, Value> = args.as_object().cloned().unwrap_or_default();
        let input = RewardInput { response, truth: Some(truth), prompt: None, args: &args, response_tokens: tokens };
        math_dapo_reward(&input).map(|out| (out["accuracy"], out["format_score"]))
    }

    #[test]
    fn accuracy_is_plus_or_minus_one_on_the_boxed_answer_after_thinking() {
        assert_eq!(score("so \\boxed{72}", "72", None, json!({})).unwrap(), (1.0, 0.0));
        assert_eq!(score("so \\boxed{71}", "72", None, json!({})).unwrap(), (-1.0, 0.0));
        // The box inside the thinking does not count; the text after </think> has no box, so it is graded whole.
        assert_eq!(score("<think>\\boxed{72}</think> it is 72", "72", None, json!({})).unwrap().0, -1.0);
        assert_eq!(score("<think>\\boxed{1}</think>\\boxed{72}", "72", None, json!({})).unwrap().0, 1.0);
        // An unboxed bare answer is graded as a whole.
        assert_eq!(score("72", "72", None, json!({})).unwrap().0, 1.0);
        assert_eq!(score("\\boxed{\\frac{1}{2}}", "0.5", None, json!({})).unwrap().0, 1.0);
        assert_eq!(score("\\boxed{3.14159}", "3.1416", None, json!({})).unwrap().0, 1.0);
        assert_eq!(score("\\boxed{3.15}", "3.1416", None, json!({})).unwrap().0, -1.0);
        assert_eq!(score("\\boxed{\\text{Yes}}", "yes", None, json!({})).unwrap().0, 1.0);
        // \boxed wins over a later \fbox, as in Trinity.
        assert_eq!(dapo_answer("\\boxed{1} then \\fbox{2}"), "1");
        assert_eq!(dapo_answer("\\fbox{ 2 }"), "2");
        assert_eq!(dapo_answer("\\boxed{\\frac{a}{b}}"), "\\frac{a}{b}");
        assert_eq!(dapo_answer("open \\boxed{3"), "open \\boxed{3");
    }

    #[test]
    fn naive_dapo_scores_one_or_zero_without_penalty() {
        let args = json!({"enable_overlong_penalty": true}).as_object().cloned().unwrap_or_default();
        let run = |response: &str| {
            let input =
                RewardInput { response, truth: Some("72"), prompt: None, args: &args, response_tokens: Some(99_999) };
            math_boxed_reward_naive_dapo(&input).unwrap()
        };
        assert_eq!(run("<think>..</think> \\boxed{72}")["accuracy"], 1.0);
        assert_eq!(run("\\boxed{71}")["accuracy"], 0.0);
        assert_eq!(run("\\boxed{72}")["format_score"], 0.0);
    }

    #[test]
    fn overlong_penalty_follows_dapo() {
        let args = json!({"enable_overlong_penalty": true, "max_response_length": 20, "cache_length": 4,
            "penalty_factor": 1.0});
        // Lmax − C = 16: no penalty up to 16 tokens, linear to −1 at 20, −f beyond.
        assert_eq!(score("\\boxed{1}", "1", Some(16), args.clone()).unwrap(), (1.0, 0.0));
        assert_eq!(score("\\boxed{1}", "1", Some(17), args.clone()).unwrap(), (1.0, -0.25));
        assert_eq!(score("\\boxed{1}", "1", Some(20), args.clone()).unwrap(), (1.0, -1.0));
        assert_eq!(score("\\boxed{1}", "1", Some(21), args.clone()).unwrap(), (1.0, -1.0));
        let half = json!({"enable_overlong_penalty": true, "max_response_length": 20, "cache_length": 4,
            "penalty_factor": 0.5});
        assert_eq!(score("x", "1", Some(18), half).unwrap(), (-1.0, -0.25));
        // Without the flag, the length does not matter.
        assert_eq!(score("\\boxed{1}", "1", Some(1000), json!({})).unwrap(), (1.0, 0.0));
    }

    #[test]
    fn a_penalty_without_its_arguments_is_an_error() {
        let missing = json!({"enable_overlong_penalty": true, "max_response_length": 20});
        assert!(score("x", "1", Some(3), missing).unwrap_err().to_string().contains("cache_length"));
        let inverted = json!({"enable_overlong_penalty": true, "max_response_length": 4, "cache_length": 8,
            "penalty_factor": 1.0});
        assert!(score("x", "1", Some(3), inverted).unwrap_err().to_string().contains("greater than"));
        let ok = json!({"enable_overlong_penalty": true, "max_response_length": 20, "cache_length": 4,
            "penalty_factor": 1.0});
        assert!(score("x", "1", None, ok).unwrap_err().to_string().contains("token count"));
        assert!(score("x", " ", None, json!({})).is_err());
    }
}
