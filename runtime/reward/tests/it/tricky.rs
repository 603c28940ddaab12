//! Tricky responses, scored through the registry exactly as a workflow would.

use serde_json::{Map, Value, json};
use trinity_reward::{RewardInput, score, total};

fn reward(name: &str, response: &str, truth: &str, args: Value) -> f64 {
    let args: Map<String, Value> = args.as_object().cloned().unwrap_or_default();
    let input = RewardInput { response, truth: Some(truth), prompt: None, args: &args, response_tokens: None };
    total(&score(name, &input).unwrap())
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn math_reward_table() {
    let gsm = "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10";
    let cases: &[(&str, &str, f64)] = &[
        ("<think>0.2 * 50</think>\n<answer>10</answer>", gsm, 1.1),
        ("<think>0.2 * 50</think>\n<answer>$10.00</answer>", gsm, 1.1),
        ("<think>..</think><answer>\\boxed{10}</answer>", gsm, 1.1),
        ("<think>..</think><answer>10 dollars</answer>", gsm, 1.1),
        ("<think>..</think><answer>ten</answer>", gsm, 0.1),
        ("<think>..</think><answer>100</answer>", gsm, 0.1),
        ("She earned $10.", gsm, 0.9),
        ("The answer is 1,000,000.", "1000000", 0.9),
        ("The answer is 1,000,001.", "1000000", -0.1),
        ("<think>x</think><answer>2/4</answer>", "\\frac{1}{2}", 1.1),
        ("<think>x</think><answer>0.3333</answer>", "\\frac{1}{3}", 0.1),
        ("<think>x</think><answer>-0.5</answer>", "-1/2", 1.1),
        ("<think>x</think><answer>1e3</answer>", "1000", 1.1),
        ("<think>x</think><answer></answer>", "4", 0.1),
        ("", "4", -0.1),
        ("<answer>4</answer><think>late</think>", "4", 0.9),
    ];
    for (response, truth, want) in cases {
        let got = reward("math_reward", response, truth, json!({}));
        assert!(close(got, *want), "math_reward({response:?}, {truth:?}) = {got}, want {want}");
    }
}

#[test]
fn boxed_reward_table() {
    let cases: &[(&str, &str, Value, f64)] = &[
        ("So the result is \\boxed{42}.", "42", json!({}), 1.0),
        ("\\boxed{42} no wait \\boxed{41}", "42", json!({}), 0.0),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\dfrac{\\sqrt{3}}{2}", json!({}), 1.0),
        ("\\boxed{x = 5}", "5", json!({}), 1.0),
        ("\\boxed{5\\text{ cm}}", "5", json!({}), 1.0),
        ("the answer is 5", "5", json!({}), 0.0),
        ("<think>a</think>\\boxed{5}", "5", json!({"with_think": true}), 1.0),
        ("\\boxed{5}", "5", json!({"with_think": true}), 0.9),
        ("\\boxed{6}", "5", json!({"with_think": true, "format_score_coef": 0.2}), -0.2),
    ];
    for (response, truth, args, want) in cases {
        let got = reward("math_boxed_reward", response, truth, args.clone());
        assert!(close(got, *want), "math_boxed_reward({response:?}, {truth:?}) = {got}, want {want}");
    }
}

#[test]
fn countdown_and_format_tables() {
    let truth = r#"{"target": 98, "numbers": [44, 19, 35]}"#;
    let cases: &[(&str, f64)] = &[
        ("<think>44 + 19 + 35 = 98</think>\n<answer>44 + 19 + 35</answer>", 1.0),
        ("<answer>(44 + 19) + 35</answer>", 1.0),
        ("<answer>44 + 19 - 35</answer>", 0.1),
        ("<answer>44 + 54</answer>", 0.1),
        ("<answer>44+19+35=98</answer>", 0.1),
        ("<answer>import os</answer>", 0.1),
        ("44 + 19 + 35", 0.0),
        ("<answer>44 + 19 + 35</answer>\n", 0.0),
    ];
    for (response, want) in cases {
        let got = reward("countdown_reward", response, truth, json!({}));
        assert!(close(got, *want), "countdown_reward({response:?}) = {got}, want {want}");
    }
    assert!(close(reward("format_reward", "<think>\nr\n</think>\n<answer>\n1\n</answer>", "", json!({})), 0.1));
    assert!(close(reward("format_reward", "<answer>\n1\n</answer>", "", json!({})), -0.1));
}
