//! `rm_gallery_reward` (Trinity-RFT 0.5.2's `RMGalleryFn`) for the one RM-Gallery reward that needs no model:
//! `reward_fn_args.reward_name: math_verify_reward`.
//!
//! Trinity-RFT 0.5.2 built the RM-Gallery reward named by `reward_name` and returned its score dimensions by
//! name; 0.6.0 no longer registers `rm_gallery_reward`. RM-Gallery's `math_verify_reward` (the one Trinity's
//! `grpo_math` example names) is rule-based, no reward model: it parses the reference and the whole response
//! (LaTeX, then plain expressions), compares the first answer each gives and scores 1.0 when they agree, else 0.0,
//! under the dimension name `math_verify`. trinity scores it with [`crate::math`]'s answer check (the response's
//! final answer, a `\boxed{}` first, against the reference's, compared numerically; non-numeric answers as
//! normalised text), so `math_verify` here is what `accuracy_reward` gives under another name. RM-Gallery's
//! other rewards are LLM judges or library code trinity does not have: any other `reward_name` is an error that
//! says so.

use crate::answer::{equivalent, final_answer};
use crate::error::RewardError;
use crate::registry::{RewardComponents, RewardEntry, RewardInput, str_arg};

const NAME: &str = "rm_gallery_reward";

/// The RM-Gallery rewards this function can stand in for.
const SUPPORTED: &str = "math_verify_reward";

fn rm_gallery_reward(input: &RewardInput<'_>) -> Result<RewardComponents, RewardError> {
    match str_arg(NAME, input.args, "reward_name")? {
        Some(SUPPORTED) => {}
        Some(other) => {
            return Err(RewardError::BadArg {
                reward: NAME,
                key: "reward_name".into(),
                problem: format!(
                    "`{other}` is an RM-Gallery reward trinity cannot run (RM-Gallery's judges need its Python \
                     library and an LLM service, and Trinity-RFT 0.6.0 dropped rm_gallery_reward); only \
                     `{SUPPORTED}` is built in. Use one of trinity's reward functions (`trinity plugins list`) or \
                     a WASM reward plugin instead"
                ),
            });
        }
        None => {
            return Err(RewardError::BadArg {
                reward: NAME,
                key: "reward_name".into(),
                problem: format!("is required: the RM-Gallery reward to run (`{SUPPORTED}`)"),
            });
        }
    }
    let truth = match input.truth {
        Some(t) if !t.trim().is_empty() => t,
        _ => return Err(RewardError::MissingTruth { reward: NAME }),
    };
    let correct = equivalent(&final_answer(input.response), &final_answer(truth));
    Ok(RewardComponents::from([("math_verify".to_owned(), if correct { 1.0 } else { 0.0 })]))
}

inventory::submit! {
    RewardEntry {
        name: NAME,
        description: "RM-Gallery's math_verify_reward (reward_fn_args.reward_name): 1 when the final answer matches",
        func: rm_gallery_reward,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, Value, json};

    fn score(response: &str, truth: &str, args: Value) -> Result<RewardComponents, RewardError> {
        let args: Map<String, Value> = args.as_object().cloned().unwrap_or_default();
        rm_gallery_reward(&RewardInput {
            response,
            truth: Some(truth),
            prompt: None,
            args: &args,
            response_tokens: None,
        })
    }

    /// Trinity-RFT 0.5.2's own test of `math_rm_workflow` with `rm_gallery_reward` / `math_verify_reward`:
    /// reference 36, and these four responses score 1, 1, 1, 0.
    #[test]
    fn trinity_s_math_verify_cases() {
        let args = json!({"reward_name": "math_verify_reward"});
        let responses = [
            "<think> balabalabala 99 </think>\n \\boxed{36}",
            "answer is \\boxed{36 }",
            "Kim's total points are 6 + 30 =\\boxed{36}",
            "<think> balalaba </think> \\boxed{35.00}",
        ];
        let got: Vec<f64> = responses.iter().map(|r| score(r, "36", args.clone()).unwrap()["math_verify"]).collect();
        assert_eq!(got, [1.0, 1.0, 1.0, 0.0]);
    }

    #[test]
    fn other_rm_gallery_rewards_and_a_missing_name_are_refused() {
        let err = score("\\boxed{1}", "1", json!({"reward_name": "base_helpfulness_listwise"})).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("base_helpfulness_listwise") && text.contains("math_verify_reward"), "{text}");
        let err = score("\\boxed{1}", "1", json!({})).unwrap_err().to_string();
        assert!(err.contains("reward_name") && err.contains("required"), "{err}");
    }
}
