//! Streamed requests: the same tokens as whole requests, delivered as they are sampled, with top logprobs on
//! request; dropping a stream cancels its request and frees its KV-cache slots.

use std::time::{Duration, Instant};

use trinity_engine::{
    Completion, EngineConfig, EngineError, GenerationEvent, GenerationStream, SamplingParams, StreamedToken,
};

use crate::helpers::*;

/// Every event of a stream, in order (blocking).
fn drain(mut stream: GenerationStream) -> (Vec<StreamedToken>, Vec<(usize, Completion)>) {
    let mut tokens = Vec::new();
    let mut finished = Vec::new();
    while let Some(event) = stream.blocking_next() {
        match event.unwrap() {
            GenerationEvent::Token(token) => tokens.push(token),
            GenerationEvent::Finished { sample, completion } => finished.push((sample, completion)),
        }
    }
    (tokens, finished)
}

#[test]
fn a_streamed_request_yields_the_tokens_of_the_whole_request_one_by_one() {
    let engine = tiny_engine(EngineConfig { max_model_len: 64, max_num_seqs: 4, ..Default::default() });
    let params = SamplingParams { n: 3, seed: Some(5), max_tokens: Some(12), ..SamplingParams::default() };
    let whole = run(&engine, prompt(3, 9, 97), params.clone());
    let (tokens, mut finished) = drain(engine.submit_stream(prompt(3, 9, 97), params).unwrap());
    finished.sort_by_key(|(sample, _)| *sample);
    assert_eq!(finished.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![0, 1, 2]);
    let completions: Vec<Completion> = finished.into_iter().map(|(_, c)| c).collect();
    assert_same(&completions, &whole.completions, "streamed vs whole");
    for (sample, completion) in completions.iter().enumerate() {
        let streamed: Vec<&StreamedToken> = tokens.iter().filter(|t| t.sample == sample).collect();
        assert_eq!(streamed.iter().map(|t| t.token).collect::<Vec<_>>(), completion.tokens, "sample {sample}");
        assert_eq!(streamed.iter().map(|t| t.logprob).collect::<Vec<_>>(), completion.logprobs);
        assert!(streamed.iter().all(|t| t.top_logprobs.is_empty()), "none asked for");
    }
}

#[test]
fn top_logprobs_are_sorted_and_contain_the_greedy_choice() {
    let engine = tiny_engine(EngineConfig { max_model_len: 64, max_num_seqs: 4, ..Default::default() });
    let params = SamplingParams { top_logprobs: 5, ..forced_greedy(8) };
    let (tokens, finished) = drain(engine.submit_stream(prompt(4, 7, 97), params).unwrap());
    assert_eq!((tokens.len(), finished.len()), (8, 1));
    for token in &tokens {
        assert_eq!(token.top_logprobs.len(), 5);
        // Greedy: the chosen token is the most likely one, with the same logprob.
        assert_eq!(token.top_logprobs[0].token, token.token);
        assert!((token.top_logprobs[0].logprob - token.logprob).abs() < 1e-6);
        assert!(token.top_logprobs.windows(2).all(|w| w[0].logprob >= w[1].logprob));
    }
    // A sampled request's top logprobs use the sampling temperature, like its logprobs.
    let params = SamplingParams { temperature: 0.5, seed: Some(1), top_logprobs: 97, ..forced_greedy(4) };
    let (tokens, _) = drain(engine.submit_stream(prompt(4, 7, 97), params).unwrap());
    for token in &tokens {
        let mass: f64 = token.top_logprobs.iter().map(|t| f64::from(t.logprob).exp()).sum();
        assert!((mass - 1.0).abs() < 1e-4, "the whole vocabulary sums to one: {mass}");
        let own = token.top_logprobs.iter().find(|t| t.token == token.token).unwrap();
        assert!((own.logprob - token.logprob).abs() < 1e-6);
    }
    let err = engine.submit_stream(prompt(4, 7, 97), SamplingParams { top_logprobs: 98, ..forced_greedy(4) });
    assert!(matches!(err, Err(EngineError::InvalidParams { param: "top_logprobs", .. })), "{err:?}");
}

#[test]
fn dropping_a_stream_frees_its_slots_at_the_next_step() {
    let engine = tiny_engine(EngineConfig { max_model_len: 512, max_num_seqs: 2, ..Default::default() });
    let mut stream = engine.submit_stream(prompt(5, 4, 97), SamplingParams { n: 2, ..forced_greedy(500) }).unwrap();
    // Wait for the first tokens, so the request is running (both slots taken), then walk away.
    assert!(matches!(stream.blocking_next(), Some(Ok(GenerationEvent::Token(_)))));
    drop(stream);
    // A request that needs both slots can only run once the dropped one has left the batch.
    let started = Instant::now();
    let next = run(&engine, prompt(6, 4, 97), SamplingParams { n: 2, ..forced_greedy(3) });
    assert_eq!(next.completions.len(), 2);
    // The gauge is set after the step that answered the request: wait for it (bounded).
    while engine.stats().running_sequences > 0 && started.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let stats = engine.stats();
    assert_eq!(stats.cancelled_requests, 1, "{stats:?}");
    assert_eq!(stats.running_sequences, 0, "{stats:?}");
    // Far fewer than the 2 × 500 tokens the dropped request asked for were generated.
    assert!(stats.generated_tokens < 2 * 500, "{stats:?}");
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn a_streamed_stop_string_ends_the_sample_with_the_text_cut_before_it() {
    let model = trinity_engine::EngineModel {
        decoder: tiny_decoder(11, 6),
        tokenizer: Some(tiny_tokenizer()),
        eos_token_ids: vec![],
    };
    let engine =
        trinity_engine::Engine::start(model, EngineConfig { max_model_len: 64, ..Default::default() }).unwrap();
    let p = vec![0, 2, 3, 5, 1];
    let full = run(&engine, p.clone(), forced_greedy(30)).completions.remove(0);
    let stop: String = full.text.chars().skip(5).take(2).collect();
    let cut = full.text.find(&stop).unwrap();
    let params = SamplingParams { stop: vec![stop.clone()], ..forced_greedy(30) };
    let (tokens, finished) = drain(engine.submit_stream(p, params).unwrap());
    let completion = &finished[0].1;
    assert_eq!(completion.text, full.text[..cut], "stop string {stop:?}");
    assert_eq!(tokens.iter().map(|t| t.token).collect::<Vec<_>>(), completion.tokens);
}
