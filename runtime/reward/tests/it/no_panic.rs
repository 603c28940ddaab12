//! Hostile responses: thousands of random splices of the syntax the rewards look for never panic and always
//! give a finite score.

use serde_json::{Map, json};
use trinity_reward::{RewardInput, names, score, total};

const PIECES: [&str; 32] = [
    "\\boxed{",
    "\\boxed ",
    "\\fbox{",
    "}",
    "{",
    "####",
    "<answer>",
    "</answer>",
    "<think>",
    "</think>",
    "\n",
    " ",
    "1",
    "-",
    "2,000",
    ".",
    "/",
    "\\frac",
    "\\dfrac{1}{",
    "$",
    "%",
    "\\text{ cm}",
    "e9",
    "İ",
    "×",
    "answer is",
    "Answer:",
    "(",
    ")",
    "**",
    "//",
    "99999999999999999999999999999999",
];

#[test]
fn random_splices_never_panic() {
    let mut state = 0x1234_5678_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let args = Map::new();
    let countdown_truth = json!({"target": 3, "numbers": [1, 2]}).to_string();
    for _ in 0..3000 {
        let len = (next() % 12) as usize;
        let response: String = (0..len).map(|_| PIECES[(next() % PIECES.len() as u64) as usize]).collect();
        let truth: String = (0..(next() % 4) as usize + 1).map(|_| PIECES[(next() % 32) as usize]).collect();
        for name in names() {
            let truth = if name == "countdown_reward" { countdown_truth.as_str() } else { truth.as_str() };
            let input = RewardInput {
                response: &response,
                truth: Some(truth),
                prompt: None,
                args: &args,
                response_tokens: None,
            };
            if let Ok(components) = score(&name, &input) {
                assert!(total(&components).is_finite(), "{name} {response:?} {truth:?}");
            }
        }
    }
}
