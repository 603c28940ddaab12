//! `math_reward` and `math_boxed_reward`: answer verification with Trinity-RFT's component names.
//!
//! * `math_reward` (Trinity's `MathRewardFn`): `accuracy` is 1 when the answer — the content of the first
//!   `<answer>…</answer>` if there is one, else the whole response, then its final answer (see
//!   [`crate::answer`]) — equals the reference's final answer, else 0; `format_score` is +0.1 when the
//!   response matches `.*?<think>.*?</think>\s*<answer>.*?</answer>\s*$`, else −0.1. Rewards ∈ {−0.1, 0.1,
//!   0.9, 1.1}. A GSM8K reference (`… #### 72`) counts as 72.
//! * `accuracy_reward` (Trinity's `AccuracyReward` without a parser): `accuracy` only, the response's final
//!   answer (a `\boxed{}` first) against the reference's; no `<answer>` tag handling, no format component.
//! * `math_boxed_reward` (Trinity's `MathBoxedRewardFn`): `accuracy` is 1 only when the response has a
//!   `\boxed{}` whose content equals the reference (itself unboxed if boxed); `format_score` is
//!   −`format_score_coef` (default 0.1) when `reward_fn_args.with_think` is true and the response does not
//!   have exactly one `<think>` before exactly one `</think>`, else 0.

use crate::answer::{equivalent, final_answer, last_boxed};
use crate::error::RewardError;
use crate::format::matches_at_start;
use crate::registry::{RewardComponents, RewardEntry, RewardInput, bool_arg, f64_arg};

/// `math_reward`'s format pattern (Trinity's `MathRewardFn.DEFAULT_FORMAT_PATTERN`).
pub const MATH_FORMAT_PATTERN: &str = r".*?<think>.*?</think>\s*<answer>.*?</answer>\s*$";

/// The text inside the first `<answer>…</answer>`, or the whole text.
pub fn answer_tag_content(text: &str) -> &str {
    let Some(start) = text.find("<answer>") else { return text };
    let inner = &text[start + "<answer>".len()..];
    inner.find("</answer>").map_or(text, |end| &inner[..end])
}

/// Whether `response` answers `truth` (both free text; see the module docs).
pub fn is_correct(response: &str, truth: &str) -> bool {
    let candidate = final_answer(answer_tag_content(response));
    let reference = final_answer(answer_tag_content(truth));
    equivalent(&candidate, &reference)
}

fn truth<'a>(reward: &'static str, input: &RewardInput<'a>) -> Result<&'a str, RewardError> {
    match input.truth {
        Some(t) if !t.trim().is_empty() => Ok(t),
        _ => Err(RewardError::MissingTruth { reward }),
    }
}

fn math_reward(input: &RewardInput<'_>) -> Result<RewardComponents, RewardError> {
    let truth = truth("math_reward", input)?;
    let accuracy = if is_correct(input.response, truth) { 1.0 } else { 0.0 };
    // The pattern is a constant that compiles; a failure could only be a regex-crate bug, scored as no format.
    let formatted = matches_at_start(MATH_FORMAT_PATTERN, input.response).unwrap_or(false);
    let format_score = if formatted { 0.1 } else { -0.1 };
    Ok(RewardComponents::from([("accuracy".to_owned(), accuracy), ("format_score".to_owned(), format_score)]))
}

fn accuracy_reward(input: &RewardInput<'_>) -> Result<RewardComponents, RewardError> {
    let truth = truth("accuracy_reward", input)?;
    let correct = equivalent(&final_answer(input.response), &final_answer(truth));
    Ok(RewardComponents::from([("accuracy".to_owned(), if correct { 1.0 } else { 0.0 })]))
}

/// One `<think>` before one `</think>` (Trinity's `validate_think_pattern`).
pub fn valid_think(text: &str) -> bool {
    let (open, close) = (text.matches("<think>").count(), text.matches("</think>").count());
    open == 1 && close == 1 && text.find("<think>") < text.find("</think>")
}

fn math_boxed_reward(input: &RewardInput<'_>) -> Result<RewardComponents, RewardError> {
    const NAME: &str = "math_boxed_reward";
    let truth = truth(NAME, input)?;
    let with_think = bool_arg(NAME, input.args, "with_think", false)?;
    let coef = f64_arg(NAME, input.args, "format_score_coef", 0.1)?;
    let reference = last_boxed(truth).unwrap_or_else(|| truth.trim().to_owned());
    let accuracy = match last_boxed(input.response) {
        Some(answer) if equivalent(&answer, &reference) => 1.0,
        _ => 0.0,
    };
    let format_score = if with_think && !valid_think(input.response) { -coef } else { 0.0 };
    Ok(RewardComponents::from([("accuracy".to_owned(), accuracy), ("format_score".to_owned(), format_score)]))
}

inventory::submit! {
    RewardEntry {
        name: "math_reward",
        description: "accuracy (answer equals the reference, numerically) + format_score (±0.1 for <think>…<answer>)",
        func: math_reward,
    }
}

inventory::submit! {
    RewardEntry {
        name: "accuracy_reward",
        description: "accuracy of the final answer (\\boxed{} first), compared numerically with the reference",
        func: accuracy_reward,
    }
}

inventory::submit! {
    RewardEntry {
        name: "math_boxed_reward",
        description: "accuracy of the last \\boxed{} answer; with_think: -format_score_coef without one <think>…</think>",
        func: math_boxed_reward,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, Value, json};

    fn math(response: &str, truth: &str) -> (f64, f64) {
        let args = Map::new();
        let out = math_reward(&RewardInput {
            response,
            truth: Some(truth),
            prompt: None,
            args: &args,
            response_tokens: None,
        })
        .unwrap();
        (out["accuracy"], out["format_score"])
    }

    fn boxed(response: &str, truth: &str, args: Value) -> (f64, f64) {
        let args = args.as_object().cloned().unwrap_or_default();
        let out = math_boxed_reward(&RewardInput {
            response,
            truth: Some(truth),
            prompt: None,
            args: &args,
            response_tokens: None,
        })
        .unwrap();
        (out["accuracy"], out["format_score"])
    }

    #[test]
    fn math_reward_takes_the_four_values() {
        assert_eq!(math("<think>2+2</think> <answer>4</answer>", "4"), (1.0, 0.1));
        assert_eq!(math("<think>2+2</think><answer>5</answer>", "4"), (0.0, 0.1));
        assert_eq!(math("the answer is 4", "4"), (1.0, -0.1));
        assert_eq!(math("no idea", "4"), (0.0, -0.1));
    }

    #[test]
    fn gsm8k_references_and_tricky_answers() {
        let gsm =
            "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72";
        assert_eq!(math("<think>..</think><answer>72</answer>", gsm).0, 1.0);
        assert_eq!(math("<think>..</think><answer>24</answer>", gsm).0, 0.0);
        assert_eq!(math("<answer>$1,250.00</answer>", "1250").0, 1.0);
        assert_eq!(math("<answer>\\boxed{\\frac{3}{4}}</answer>", "0.75").0, 1.0);
        assert_eq!(math("<answer>75%</answer>", "75").0, 1.0);
        assert_eq!(math("<answer>18 dollars</answer>", "#### 18").0, 1.0);
        assert_eq!(math("<answer>x = -3</answer>", "-3").0, 1.0);
        assert_eq!(math("<answer>3</answer>", "-3").0, 0.0);
        // Only the first <answer> counts, as in Trinity.
        assert_eq!(math("<answer>5</answer> actually <answer>4</answer>", "4").0, 0.0);
        // Final-number fallback inside the answer.
        assert_eq!(math("<answer>She has 6 + 6 = 12 eggs</answer>", "12").0, 1.0);
        // A wrong number followed by the right number elsewhere outside <answer> does not count.
        assert_eq!(math("12 <answer>13</answer>", "12").0, 0.0);
        // Symbolic answers compare as text.
        assert_eq!(math("<answer>\\frac{\\pi}{2}</answer>", "\\dfrac{\\pi}{2}").0, 1.0);
    }

    #[test]
    fn format_needs_think_then_answer_at_the_end() {
        assert_eq!(math("intro <think>a</think>\n<answer>4</answer>\n", "4").1, 0.1);
        assert_eq!(math("<answer>4</answer><think>a</think>", "4").1, -0.1);
        assert_eq!(math("<think>a</think><answer>4</answer> trailing", "4").1, -0.1);
        assert!(
            regex::Regex::new(&format!("(?sm){MATH_FORMAT_PATTERN}"))
                .unwrap()
                .is_match("<think>\nx\n</think><answer>1</answer>")
        );
    }

    #[test]
    fn missing_truth_is_an_error() {
        let args = Map::new();
        let err =
            math_reward(&RewardInput { response: "4", truth: None, prompt: None, args: &args, response_tokens: None })
                .unwrap_err();
        assert!(err.to_string().contains("response_key"));
        let err = math_reward(&RewardInput {
            response: "4",
            truth: Some(" "),
            prompt: None,
            args: &args,
            response_tokens: None,
        });
        assert!(err.is_err());
    }

    #[test]
    fn accuracy_reward_has_no_format_component() {
        let args = Map::new();
        let run = |response: &str, truth: &str| {
            accuracy_reward(&RewardInput {
                response,
                truth: Some(truth),
                prompt: None,
                args: &args,
                response_tokens: None,
            })
            .unwrap()
        };
        let out = run("so \\boxed{7}", "#### 7");
        assert_eq!(out.len(), 1);
        assert_eq!(out["accuracy"], 1.0);
        assert_eq!(run("<answer>7</answer> but \\boxed{8}", "7")["accuracy"], 0.0);
    }

    #[test]
    fn boxed_reward() {
        assert_eq!(boxed("so \\boxed{12}", "12", json!({})), (1.0, 0.0));
        assert_eq!(boxed("so \\boxed{12}", "\\boxed{12.0}", json!({})), (1.0, 0.0));
        assert_eq!(boxed("first \\boxed{3} last \\boxed{4}", "4", json!({})), (1.0, 0.0));
        // No box, no accuracy, even with the right number.
        assert_eq!(boxed("the answer is 12", "12", json!({})), (0.0, 0.0));
        assert_eq!(boxed("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", json!({})), (1.0, 0.0));
        assert_eq!(boxed("<think>a</think> \\boxed{1}", "1", json!({"with_think": true})), (1.0, 0.0));
        assert_eq!(boxed("\\boxed{1}", "1", json!({"with_think": true, "format_score_coef": 0.5})), (1.0, -0.5));
        assert_eq!(boxed("<think><think></think>\\boxed{1}", "1", json!({"with_think": true})), (1.0, -0.1));
        assert_eq!(boxed("</think><think>\\boxed{1}", "1", json!({"with_think": true})), (1.0, -0.1));
        let args = json!({"with_think": "yes"}).as_object().unwrap().clone();
        let input = RewardInput { response: "", truth: Some("1"), prompt: None, args: &args, response_tokens: None };
        assert!(math_boxed_reward(&input).unwrap_err().to_string().contains("with_think"));
    }
}
