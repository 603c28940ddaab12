//! Continuous batching: requests that join a running batch, wait for slots, or leave early get exactly the
//! tokens (and logprobs) they get when run alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tch::{Device, Kind};
use trinity_engine::{Engine, EngineConfig, EngineModel, FinishReason, Generation, SamplingParams};

use crate::helpers::*;

/// Waits until the engine has run `steps` more decode steps than `from` (bounded, so a bug cannot hang).
fn wait_steps(engine: &Engine, from: u64, steps: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while engine.stats().decode_steps < from + steps && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Runs `requests` one at a time, then with staggered arrivals (each batch of arrivals a few decode steps
/// after the previous one), and checks both give the same tokens.
fn alone_equals_staggered(engine: &Engine, requests: &[(Vec<u32>, SamplingParams)], waves: &[usize]) {
    let alone: Vec<Generation> = requests.iter().map(|(p, s)| run(engine, p.clone(), s.clone())).collect();
    let mut pending = Vec::new();
    let mut next = 0;
    for &wave in waves {
        let steps = engine.stats().decode_steps;
        for (p, s) in &requests[next..next + wave] {
            pending.push(engine.submit(p.clone(), s.clone()).unwrap());
        }
        next += wave;
        wait_steps(engine, steps, 3);
    }
    assert_eq!(next, requests.len());
    for (i, (handle, alone)) in pending.into_iter().zip(&alone).enumerate() {
        assert_same(&handle.wait().unwrap().completions, &alone.completions, &format!("request {i}"));
    }
}

#[test]
fn requests_arriving_at_different_times_match_running_alone() {
    // Five slots for eight sequences: some requests also wait for a slot, and early finishers leave holes
    // that later sequences are moved into.
    let engine = tiny_engine(EngineConfig { max_model_len: 96, max_num_seqs: 5, ..Default::default() });
    let lengths = [(3, 30), (17, 6), (9, 21), (1, 12), (25, 4), (6, 40), (12, 9)];
    let mut requests: Vec<(Vec<u32>, SamplingParams)> =
        lengths.iter().enumerate().map(|(i, &(p, n))| (prompt(i as u64, p, 97), forced_greedy(n))).collect();
    // Two greedy samples of one prompt share a prefill and must both equal the lone run.
    requests[2].1.n = 2;
    alone_equals_staggered(&engine, &requests, &[2, 1, 3, 1]);
    let stats = engine.stats();
    assert_eq!(stats.requests, 14);
    assert_eq!(stats.generated_tokens, 2 * 143, "{stats:?}");
}

#[test]
fn concurrent_async_callers_share_decode_steps() {
    let engine = Arc::new(tiny_engine(EngineConfig { max_model_len: 64, max_num_seqs: 16, ..Default::default() }));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let results = rt.block_on(async {
        let tasks: Vec<_> = (0..12u64)
            .map(|i| {
                let engine = Arc::clone(&engine);
                tokio::spawn(
                    async move { engine.generate(prompt(100 + i, 5 + i as usize, 97), forced_greedy(10)).await },
                )
            })
            .collect();
        let mut out = Vec::new();
        for task in tasks {
            out.push(task.await.unwrap().unwrap());
        }
        out
    });
    assert!(results.iter().all(|g| g.completions[0].tokens.len() == 10));
    // Alone, 12 requests of 10 tokens need 12 * 9 decode steps; batched they need far fewer.
    let steps = engine.stats().decode_steps;
    assert!(steps < 60, "{steps} decode steps for 12 concurrent requests");
}

#[test]
fn dropping_a_pending_generation_cancels_it_and_frees_its_slot() {
    let engine = tiny_engine(EngineConfig { max_model_len: 512, max_num_seqs: 1, ..Default::default() });
    let long = engine.submit(prompt(1, 4, 97), forced_greedy(500)).unwrap();
    wait_steps(&engine, 0, 2);
    drop(long);
    // With one slot, this only finishes if the cancelled request left.
    let short = run(&engine, prompt(2, 4, 97), forced_greedy(3));
    assert_eq!(short.completions[0].tokens.len(), 3);
    assert!(engine.stats().decode_steps < 400);
}

#[test]
fn smollm2_requests_joining_mid_flight_match_running_alone() {
    let path = smollm2_path();
    let model = trinity_model::load_model(&path, Kind::Float, Device::Cpu).unwrap();
    let texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,"];
    let requests: Vec<(Vec<u32>, SamplingParams)> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| (model.tokenizer.encode(t, false).unwrap(), forced_greedy(8 + 2 * i)))
        .collect();
    let engine = Engine::start(
        EngineModel::from(model),
        EngineConfig { max_model_len: 64, max_num_seqs: 4, ..Default::default() },
    )
    .unwrap();
    alone_equals_staggered(&engine, &requests, &[1, 2, 1]);
    let g = run(&engine, requests[0].0.clone(), SamplingParams::greedy(8));
    assert!(g.completions[0].text.to_lowercase().contains("paris"), "{:?}", g.completions[0].text);
    assert!(matches!(g.completions[0].finish_reason, FinishReason::Eos | FinishReason::Length));
}

#[test]
fn prompts_sharing_a_prefix_match_running_alone() {
    // Admitted together, the common 12-token prefix is prefilled once and copied; one prompt is the prefix
    // plus a single token, one has a second sample.
    let engine = tiny_engine(EngineConfig { max_model_len: 64, max_num_seqs: 8, ..Default::default() });
    let system = prompt(77, 12, 97);
    let requests: Vec<(Vec<u32>, SamplingParams)> = [5usize, 1, 9, 3]
        .iter()
        .enumerate()
        .map(|(i, &extra)| {
            let p = [system.clone(), prompt(200 + i as u64, extra, 97)].concat();
            (p, SamplingParams { n: 1 + (i == 2) as usize, ..forced_greedy(6 + i) })
        })
        .collect();
    alone_equals_staggered(&engine, &requests, &[4]);
}

/// A fresh engine over the tests' tiny model.
fn fresh_run(config: &EngineConfig, prompt: Vec<u32>, params: SamplingParams) -> Generation {
    run(&tiny_engine(config.clone()), prompt, params)
}

#[test]
fn a_prompt_sharing_an_earlier_ones_start_reuses_its_cache() {
    // One request at a time, as eval tasks and agent turns arrive: the second prompt shares the first one's
    // 12-token system prompt, the third continues the second's conversation (prompt, answer, new message).
    // Each equals its run on a fresh engine, and the shared starts were copied, not computed: the answer too,
    // but for its newest token, whose keys and values no pass computed.
    let config = EngineConfig { max_model_len: 96, max_num_seqs: 4, ..Default::default() };
    let engine = tiny_engine(config.clone());
    let system = prompt(77, 12, 97);
    let first = [system.clone(), prompt(1, 5, 97)].concat();
    let second = [system.clone(), prompt(2, 7, 97)].concat();
    let answer = run(&engine, first, forced_greedy(6));
    assert_eq!(engine.stats().reused_prompt_tokens, 0);
    let answer2 = run(&engine, second.clone(), forced_greedy(6));
    assert_eq!(engine.stats().reused_prompt_tokens, 12);
    assert_same(&answer2.completions, &fresh_run(&config, second.clone(), forced_greedy(6)).completions, "second");
    let turn = [second.clone(), answer2.completions[0].tokens.clone(), prompt(3, 4, 97)].concat();
    let answer3 = run(&engine, turn.clone(), forced_greedy(6));
    assert_eq!(engine.stats().reused_prompt_tokens, 12 + second.len() as u64 + 5);
    assert_same(&answer3.completions, &fresh_run(&config, turn, forced_greedy(6)).completions, "next turn");
    assert!(!answer.completions[0].tokens.is_empty());
}

#[test]
fn interleaved_conversations_each_reuse_their_own() {
    // Three agents take turns, one request at a time: each turn continues that agent's conversation, so each
    // reuses its own cached conversation however many other turns came between, and equals a fresh engine.
    let config = EngineConfig { max_model_len: 128, max_num_seqs: 4, ..Default::default() };
    let engine = tiny_engine(config.clone());
    let mut conversations: Vec<Vec<u32>> = (0..3).map(|a| prompt(300 + a, 10, 97)).collect();
    for turn in 0..3u64 {
        for (agent, conversation) in conversations.iter_mut().enumerate() {
            let before = engine.stats().reused_prompt_tokens;
            let answer = run(&engine, conversation.clone(), forced_greedy(5));
            let reused = engine.stats().reused_prompt_tokens - before;
            // Nothing at first; then all of the conversation but the 3 new tokens and the previous answer's
            // newest token.
            let expected = if turn == 0 { 0 } else { conversation.len() as u64 - 3 - 1 };
            assert_eq!(reused, expected, "agent {agent}, turn {turn}");
            let fresh = fresh_run(&config, conversation.clone(), forced_greedy(5));
            assert_same(&answer.completions, &fresh.completions, &format!("agent {agent}, turn {turn}"));
            conversation.extend(&answer.completions[0].tokens);
            conversation.extend(prompt(400 + 10 * turn + agent as u64, 3, 97));
        }
    }
}

#[test]
fn an_admission_that_needs_the_slots_keeps_the_entry_it_reuses() {
    // Four slots, three cached conversations in them; a request for three samples needs three slots, so only
    // one entry can stay: the one it reuses, moved out of the way of its samples.
    let config = EngineConfig { max_model_len: 96, max_num_seqs: 4, ..Default::default() };
    let engine = tiny_engine(config.clone());
    let starts: Vec<Vec<u32>> = (0..3).map(|a| prompt(500 + a, 12, 97)).collect();
    let answers: Vec<Generation> = starts.iter().map(|p| run(&engine, p.clone(), forced_greedy(4))).collect();
    // The request continues the second conversation: not the most recently used entry, and below the slot
    // the admission leaves free, so it must be kept and moved.
    let turn = [starts[1].clone(), answers[1].completions[0].tokens.clone(), prompt(600, 2, 97)].concat();
    let params = SamplingParams { n: 3, ..forced_greedy(5) };
    let before = engine.stats().reused_prompt_tokens;
    let three = run(&engine, turn.clone(), params.clone());
    assert_eq!(engine.stats().reused_prompt_tokens - before, 12 + 3);
    assert_same(&three.completions, &fresh_run(&config, turn.clone(), params).completions, "three samples");
    // The entry survived the admission: the same turn again reuses it (the three samples are not cached).
    let before = engine.stats().reused_prompt_tokens;
    let again = run(&engine, turn.clone(), forced_greedy(5));
    assert_eq!(engine.stats().reused_prompt_tokens - before, turn.len() as u64 - 1);
    assert_same(&again.completions, &three.completions[..1], "again");
}

#[test]
fn prompts_admitted_together_take_what_the_cache_holds_of_their_shared_start() {
    // The cache holds 10 tokens of a 20-token start that three prompts admitted together share: those 10 are
    // copied, the other 10 computed once, and every prompt equals its fresh run.
    let config = EngineConfig { max_model_len: 96, max_num_seqs: 8, ..Default::default() };
    let engine = tiny_engine(config.clone());
    let system = prompt(700, 20, 97);
    run(&engine, [system[..10].to_vec(), prompt(701, 3, 97)].concat(), forced_greedy(2));
    // Seven samples of a short prompt (too short to cache) leave one slot and the cached entry keeps it. The
    // first of the three prompts asks for two samples, so none can start (requests start in arrival order)
    // until the seven finish; then all three are admitted together.
    let steps = engine.stats().decode_steps;
    let busy = engine.submit(prompt(702, 4, 97), SamplingParams { n: 7, ..forced_greedy(30) }).unwrap();
    wait_steps(&engine, steps, 2);
    let before = engine.stats().reused_prompt_tokens;
    let requests: Vec<(Vec<u32>, SamplingParams)> = (0..3)
        .map(|i| {
            (
                [system.clone(), prompt(710 + i, 4, 97)].concat(),
                SamplingParams { n: 2 - i.min(1) as usize, ..forced_greedy(5) },
            )
        })
        .collect();
    let handles: Vec<_> = requests.iter().map(|(p, s)| engine.submit(p.clone(), s.clone()).unwrap()).collect();
    assert_eq!(busy.wait().unwrap().completions.len(), 7);
    for ((p, s), handle) in requests.iter().zip(handles) {
        let g = handle.wait().unwrap();
        assert_same(&g.completions, &fresh_run(&config, p.clone(), s.clone()).completions, "shared start");
    }
    assert_eq!(engine.stats().reused_prompt_tokens - before, 3 * 10);
}

#[test]
fn new_weights_empty_the_prefix_cache() {
    let config = EngineConfig { max_model_len: 96, max_num_seqs: 4, ..Default::default() };
    let engine = tiny_engine(config.clone());
    let system = prompt(77, 12, 97);
    run(&engine, [system.clone(), prompt(1, 5, 97)].concat(), forced_greedy(4));
    // Another model's weights, synced in place: keys and values computed with the old ones must not be reused.
    let other = tiny_decoder(8, 97);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(engine.sync_weights(other.named_parameters().unwrap())).unwrap();
    let second = [system, prompt(2, 7, 97)].concat();
    let after = run(&engine, second.clone(), forced_greedy(6));
    assert_eq!(engine.stats().reused_prompt_tokens, 0);
    let model = EngineModel { decoder: tiny_decoder(8, 97), tokenizer: None, eos_token_ids: vec![i64::from(EOS)] };
    let fresh = Engine::start(model, config).unwrap();
    assert_same(&after.completions, &run(&fresh, second, forced_greedy(6)).completions, "after the sync");
}
