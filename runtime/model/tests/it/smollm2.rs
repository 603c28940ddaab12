//! SmolLM2-135M-Instruct (Q4_1 GGUF): token ids equal transformers' GGUF tokenizer and response logprobs are
//! within 1e-3 of transformers' fp32 forward pass, on English, code, Chinese, emoji and ChatML tokens.
//! Fails, saying how to install it, when the model file is absent: a test that passes without running proves
//! nothing.

use std::path::PathBuf;

use serde_json::Value;
use tch::{Device, Kind};
use trinity_model::{ScoreRequest, load_model, score};

use crate::helpers::*;

fn smollm2_path() -> PathBuf {
    let path = std::env::var_os("TRINITY_SMOLLM2_GGUF").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    assert!(
        path.exists(),
        "SmolLM2 GGUF not found at {}: run `cargo xtask setup` (or set TRINITY_SMOLLM2_GGUF to the file)",
        path.display()
    );
    path
}

#[test]
fn smollm2_scores_match_transformers() {
    let path = smollm2_path();
    let model = load_model(&path, Kind::Float, Device::Cpu).unwrap();
    let fixture = read_json(&fixtures().join("smollm2.json"));
    let cases = fixture["cases"].as_array().unwrap();
    let requests: Vec<ScoreRequest> = cases
        .iter()
        .map(|c| match c.get("messages") {
            Some(m) => ScoreRequest::Chat { messages: m.as_array().unwrap().clone() },
            None => ScoreRequest::Text {
                prompt: c["prompt"].as_str().unwrap().to_owned(),
                response: c["response"].as_str().unwrap().to_owned(),
            },
        })
        .collect();
    let scored = score(&model, &requests).unwrap();
    let mut worst = 0f32;
    for (c, s) in cases.iter().zip(&scored) {
        let ids = |v: &Value| ints(v).into_iter().map(|i| i as u32).collect::<Vec<_>>();
        assert_eq!(s.prompt_tokens, ids(&c["prompt_tokens"]), "prompt tokens of {c}");
        assert_eq!(s.response_tokens, ids(&c["response_tokens"]), "response tokens of {c}");
        for (a, b) in s.logprobs.iter().zip(floats(&c["logprobs"])) {
            worst = worst.max((a - b).abs());
        }
    }
    println!("smollm2: max |logprob - transformers| = {worst:.2e} over {} requests", cases.len());
    assert!(worst < 1e-3, "max logprob diff {worst}");
    // The chat case's rendered prompt equals transformers' apply_chat_template output.
    let chat = cases.iter().find(|c| c.get("messages").is_some()).unwrap();
    let msgs = chat["messages"].as_array().unwrap();
    let rendered = model.chat_template.as_ref().unwrap().render(&msgs[..msgs.len() - 1], true, None).unwrap();
    assert_eq!(rendered, chat["rendered_prompt"].as_str().unwrap());
}
