//! Limits and stopping: too-long prompts, exhausted KV budget, truncation, min/max tokens, EOS, stop ids and
//! stop strings — each a named error or a finish reason, never a crash.

use trinity_engine::{Engine, EngineConfig, EngineError, EngineModel, FinishReason, SamplingParams};

use crate::helpers::*;

#[test]
fn a_prompt_that_leaves_no_room_is_a_named_error_and_the_engine_goes_on() {
    let engine = tiny_engine(EngineConfig { max_model_len: 32, max_num_seqs: 2, ..Default::default() });
    let err = engine.submit(prompt(1, 32, 97), SamplingParams::greedy(4)).unwrap_err();
    assert!(
        matches!(err, EngineError::PromptTooLong { prompt_tokens: 32, limit: 31, limit_name: "max_model_len - 1", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("too long"), "{err}");
    // The longest prompt that fits gets one token, truncated by max_model_len.
    let g = run(&engine, prompt(1, 31, 97), forced_greedy(10));
    assert_eq!(g.completions[0].tokens.len(), 1);
    assert_eq!(g.completions[0].finish_reason, FinishReason::Length);

    let engine = tiny_engine(EngineConfig { max_model_len: 32, max_prompt_tokens: Some(10), ..Default::default() });
    let err = engine.submit(prompt(1, 11, 97), SamplingParams::greedy(4)).unwrap_err();
    assert!(matches!(err, EngineError::PromptTooLong { limit: 10, limit_name: "max_prompt_tokens", .. }), "{err}");
    assert!(matches!(engine.submit(vec![], SamplingParams::greedy(4)), Err(EngineError::EmptyPrompt { .. })));
    let err = engine.submit(vec![3, 97], SamplingParams::greedy(4)).unwrap_err();
    assert!(matches!(err, EngineError::InvalidParams { param: "prompt", .. }), "{err}");
}

#[test]
fn responses_are_truncated_by_max_model_len_max_tokens_and_max_response_tokens() {
    let engine = tiny_engine(EngineConfig { max_model_len: 20, max_response_tokens: Some(7), ..Default::default() });
    let by_len = run(&engine, prompt(2, 15, 97), forced_greedy(100));
    assert_eq!((by_len.completions[0].tokens.len(), by_len.completions[0].finish_reason), (5, FinishReason::Length));
    // `max_response_tokens` is the default of a request without `max_tokens`, as Trinity-RFT's vLLM engine has
    // it; a request's own `max_tokens` may ask for more, up to what `max_model_len` leaves.
    let unset = SamplingParams { max_tokens: None, ..forced_greedy(1) };
    let by_response_default = run(&engine, prompt(2, 5, 97), unset);
    assert_eq!(by_response_default.completions[0].tokens.len(), 7);
    let past_the_default = run(&engine, prompt(2, 5, 97), forced_greedy(12));
    assert_eq!(past_the_default.completions[0].tokens.len(), 12);
    let by_max_tokens = run(&engine, prompt(2, 5, 97), forced_greedy(3));
    assert_eq!(by_max_tokens.completions[0].tokens.len(), 3);
    assert_eq!(by_max_tokens.completions[0].tokens[..], by_response_default.completions[0].tokens[..3]);
    assert_eq!(past_the_default.completions[0].tokens[..7], by_response_default.completions[0].tokens[..]);
}

#[test]
fn the_kv_budget_sets_the_slots_and_excess_requests_wait() {
    let decoder = || EngineModel { decoder: tiny_decoder(7, 97), tokenizer: None, eos_token_ids: vec![1] };
    let config = EngineConfig { max_model_len: 64, max_num_seqs: 64, ..Default::default() };
    let per_slot = config.bytes_per_slot(&tiny_config(97), tch::Kind::Float);
    assert_eq!(per_slot, 2 * 2 * 2 * 16 * 65 * 4);

    let err =
        Engine::start(decoder(), EngineConfig { kv_cache_bytes: Some(per_slot - 1), ..config.clone() }).unwrap_err();
    assert!(matches!(err, EngineError::KvBudgetTooSmall { max_model_len: 64, .. }), "{err}");

    let engine = Engine::start(decoder(), EngineConfig { kv_cache_bytes: Some(2 * per_slot + 5), ..config }).unwrap();
    assert_eq!(engine.info().num_slots, 2);
    let err = engine.submit(prompt(3, 4, 97), SamplingParams { n: 3, ..SamplingParams::greedy(2) }).unwrap_err();
    assert!(matches!(err, EngineError::TooManySamples { n: 3, slots: 2, .. }), "{err}");
    // Six requests (seven sequences) through two slots: they queue and all finish, each as if alone.
    let requests: Vec<_> = (0..6u64)
        .map(|i| {
            (
                prompt(10 + i, 3 + i as usize, 97),
                SamplingParams { n: 1 + (i == 2) as usize, ..forced_greedy(5 + i as usize) },
            )
        })
        .collect();
    let alone: Vec<_> = requests.iter().map(|(p, s)| run(&engine, p.clone(), s.clone())).collect();
    let pending: Vec<_> = requests.iter().map(|(p, s)| engine.submit(p.clone(), s.clone()).unwrap()).collect();
    for (handle, alone) in pending.into_iter().zip(alone) {
        assert_same(&handle.wait().unwrap().completions, &alone.completions, "queued vs alone");
    }
}

#[test]
fn eos_ends_a_sample_unless_ignored_or_masked_by_min_tokens() {
    // Find the token the model produces third for this prompt, then make it the EOS id of a second engine.
    let probe = tiny_engine(EngineConfig { max_model_len: 64, ..Default::default() });
    let p = prompt(4, 6, 97);
    let free = run(&probe, p.clone(), forced_greedy(12)).completions.remove(0);
    let eos = free.tokens[2];
    assert!(!free.tokens[..2].contains(&eos), "pick another prompt: {:?}", free.tokens);
    let model = EngineModel { decoder: tiny_decoder(7, 97), tokenizer: None, eos_token_ids: vec![i64::from(eos)] };
    let engine = Engine::start(model, EngineConfig { max_model_len: 64, ..Default::default() }).unwrap();

    let stopped = run(&engine, p.clone(), SamplingParams::greedy(12)).completions.remove(0);
    assert_eq!(stopped.tokens, free.tokens[..3]);
    assert_eq!(stopped.finish_reason, FinishReason::Eos);
    assert_eq!(stopped.logprobs.len(), 3);

    let ignored = run(&engine, p.clone(), forced_greedy(12)).completions.remove(0);
    assert_eq!((ignored.tokens.len(), ignored.finish_reason), (12, FinishReason::Length));

    let masked = run(&engine, p.clone(), SamplingParams { min_tokens: 6, ..SamplingParams::greedy(12) });
    let masked = &masked.completions[0];
    assert!(masked.tokens.len() >= 6);
    assert!(!masked.tokens[..6].contains(&eos), "{:?}", masked.tokens);
    // The masked position's logprob is still the unmasked distribution's (what the trainer computes).
    assert_eq!(masked.tokens[..2], free.tokens[..2]);

    let by_stop_id = run(&probe, p.clone(), SamplingParams { stop_token_ids: vec![eos], ..forced_greedy(12) });
    assert_eq!(by_stop_id.completions[0].tokens, free.tokens[..3]);
    assert_eq!(by_stop_id.completions[0].finish_reason, FinishReason::Stop);
}

#[test]
fn stop_strings_cut_the_text_and_keep_the_tokens_that_made_them() {
    let tokenizer = tiny_tokenizer();
    let model = EngineModel { decoder: tiny_decoder(11, 6), tokenizer: Some(tokenizer.clone()), eos_token_ids: vec![] };
    let engine = Engine::start(model, EngineConfig { max_model_len: 64, ..Default::default() }).unwrap();
    let p = vec![0, 2, 3, 5, 1];
    let full = run(&engine, p.clone(), forced_greedy(30)).completions.remove(0);
    assert_eq!(full.text, tokenizer.decode(&full.tokens, true).unwrap());
    let stop: String = full.text.chars().skip(5).take(2).collect();
    let cut = full.text.find(&stop).unwrap();

    let stopped =
        run(&engine, p.clone(), SamplingParams { stop: vec![stop.clone(), "zz".into()], ..forced_greedy(30) });
    let stopped = &stopped.completions[0];
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    assert_eq!(stopped.text, full.text[..cut], "stop string {stop:?}");
    assert_eq!(stopped.tokens[..], full.tokens[..stopped.tokens.len()]);
    // The returned tokens run through the one that completed the stop string.
    let through = tokenizer.decode(&stopped.tokens, true).unwrap();
    assert!(through[cut..].starts_with(&stop), "{through:?}");
    let before = tokenizer.decode(&stopped.tokens[..stopped.tokens.len() - 1], true).unwrap();
    assert!(!before[cut.min(before.len())..].starts_with(&stop), "{before:?}");

    let err = tiny_engine(EngineConfig::default())
        .submit(vec![2, 3], SamplingParams { stop: vec!["x".into()], ..Default::default() })
        .unwrap_err();
    assert!(matches!(err, EngineError::InvalidParams { param: "stop", .. }), "{err}");
}
