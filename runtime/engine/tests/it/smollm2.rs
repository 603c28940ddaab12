//! SmolLM2-135M-Instruct (fp32): greedy continuations of 16 chat prompts, batched together, equal
//! transformers' greedy `generate()` for the first 16 tokens on at least 14 of them
//! (fixture: `tests/fixtures/make_greedy_fixture.py`). Skipped when the model file is absent.

use serde_json::Value;
use tch::{Device, Kind};
use trinity_engine::{Engine, EngineConfig, EngineModel, SamplingParams};

use crate::helpers::*;

#[test]
fn smollm2_greedy_matches_transformers() {
    let path = smollm2_path();
    let fixture: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/smollm2_greedy.json")).unwrap(),
    )
    .unwrap();
    let model = trinity_model::load_model(&path, Kind::Float, Device::Cpu).unwrap();
    let template = model.chat_template.as_ref().unwrap();
    let ids = |v: &Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
    let cases = fixture["cases"].as_array().unwrap();
    let mut prompts = Vec::new();
    for case in cases {
        let text = template.render(case["messages"].as_array().unwrap(), true, None).unwrap();
        let tokens = model.tokenizer.encode(&text, false).unwrap();
        assert_eq!(tokens, ids(&case["prompt_tokens"]), "prompt tokens of {}", case["messages"]);
        prompts.push(tokens);
    }
    let engine = Engine::start(
        EngineModel::from(model),
        EngineConfig { max_model_len: 128, max_num_seqs: 16, ..Default::default() },
    )
    .unwrap();
    let pending: Vec<_> = prompts.into_iter().map(|p| engine.submit(p, SamplingParams::greedy(16)).unwrap()).collect();
    let mut equal = 0;
    for (case, handle) in cases.iter().zip(pending) {
        let got = handle.wait().unwrap().completions.remove(0).tokens;
        let want = ids(&case["tokens"]);
        if got == want {
            equal += 1;
        } else {
            println!("differs: {}\n  trinity      {got:?}\n  transformers {want:?}", case["messages"]);
        }
    }
    println!("smollm2 greedy: {equal} of {} prompts equal transformers for 16 tokens", cases.len());
    assert!(equal >= 14, "{equal} of {}", cases.len());
}
