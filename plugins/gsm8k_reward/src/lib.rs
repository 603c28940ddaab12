//! `gsm8k_reward`: GSM8K answer match as a trinity reward plugin.
//!
//! The reference answer is GSM8K's `"... #### 72"` (or a bare number); the response's answer is, in order of
//! preference, the number after its last `####`, inside its last `\boxed{}`, inside `<answer></answer>`, or its
//! last number. Numbers compare after dropping `,` and `$`, as numbers (`72.0` equals `72`). One component:
//! `accuracy`, 1 or 0.

use trinity_plugin_sdk::wasm::reward::{Metric, Reward, Task, metric};

struct Gsm8k;

impl Reward for Gsm8k {
    const NAME: &'static str = "gsm8k_reward";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str = "GSM8K answer match: final number vs the reference after ####";

    fn score(task: &Task, response: &str) -> Result<Vec<Metric>, String> {
        let truth = task.truth.as_deref().ok_or("the task has no reference answer (check format.response_key)")?;
        let expected = reference_answer(truth).ok_or_else(|| format!("reference answer {truth:?} has no number"))?;
        let correct = response_answer(response).is_some_and(|answer| answer == expected);
        Ok(vec![metric("accuracy", if correct { 1.0 } else { 0.0 })])
    }
}

trinity_plugin_sdk::export_reward!(Gsm8k);

/// The number of a GSM8K reference: after the last `####`, else the last number.
fn reference_answer(truth: &str) -> Option<f64> {
    match truth.rsplit_once("####") {
        Some((_, tail)) => first_number(tail),
        None => last_number(truth),
    }
}

/// The number a response answers.
fn response_answer(response: &str) -> Option<f64> {
    if let Some((_, tail)) = response.rsplit_once("####") {
        return first_number(tail);
    }
    if let Some(start) = response.rfind("\\boxed{") {
        let inner = &response[start + "\\boxed{".len()..];
        return first_number(inner.split('}').next().unwrap_or(inner));
    }
    if let (Some(start), Some(end)) = (response.rfind("<answer>"), response.rfind("</answer>"))
        && start < end
    {
        return last_number(&response[start + "<answer>".len()..end]);
    }
    last_number(response)
}

/// Numbers in `text`, in order: digits with optional sign, `,` separators, one decimal point; `$` is skipped.
fn numbers(text: &str) -> Vec<f64> {
    let mut found = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let next_is_digit = chars.peek().is_some_and(char::is_ascii_digit);
        match c {
            '0'..='9' => current.push(c),
            ',' if !current.is_empty() && next_is_digit => {}
            '.' if !current.is_empty() && !current.contains('.') && next_is_digit => current.push(c),
            '-' if current.is_empty() && next_is_digit => current.push(c),
            _ => {
                if let Ok(n) = current.parse() {
                    found.push(n);
                }
                current.clear();
            }
        }
    }
    if let Ok(n) = current.parse() {
        found.push(n);
    }
    found
}

fn first_number(text: &str) -> Option<f64> {
    numbers(text).first().copied()
}

fn last_number(text: &str) -> Option<f64> {
    numbers(text).last().copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(truth: &str) -> Task {
        Task {
            taskset: "gsm8k".into(),
            index: 0,
            prompt: Some("q".into()),
            truth: Some(truth.into()),
            system_prompt: None,
            raw: "{}".into(),
            args: "{}".into(),
        }
    }

    fn accuracy(truth: &str, response: &str) -> f64 {
        Gsm8k::score(&task(truth), response).unwrap()[0].value
    }

    #[test]
    fn matches_the_final_number() {
        let truth = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72";
        assert_eq!(accuracy(truth, "She sold 48 + 24 = 72 clips. #### 72"), 1.0);
        assert_eq!(accuracy(truth, "The answer is \\boxed{72}."), 1.0);
        assert_eq!(accuracy(truth, "<answer>$72.00</answer>"), 1.0);
        assert_eq!(accuracy(truth, "48 then 24, so 72"), 1.0);
        assert_eq!(accuracy(truth, "#### 71"), 0.0);
        assert_eq!(accuracy(truth, "no idea"), 0.0);
        assert_eq!(accuracy("1,234", "it is 1,234"), 1.0);
        assert_eq!(accuracy("-5", "x = -5"), 1.0);
    }

    #[test]
    fn a_task_without_a_number_is_an_error() {
        assert!(Gsm8k::score(&task("none"), "1").is_err());
    }
}
