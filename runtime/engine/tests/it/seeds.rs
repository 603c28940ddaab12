//! Seeded sampling: the same seed gives the same tokens alone or batched with other requests; samples of one
//! request differ from each other.

use trinity_engine::{EngineConfig, SamplingParams};

use crate::helpers::*;

fn sampled(seed: Option<u64>, n: usize) -> SamplingParams {
    SamplingParams { n, temperature: 1.0, seed, ignore_eos: true, max_tokens: Some(20), ..Default::default() }
}

#[test]
fn a_seed_fixes_the_tokens_whatever_shares_the_batch() {
    let engine = tiny_engine(EngineConfig { max_model_len: 64, max_num_seqs: 16, ..Default::default() });
    let p = prompt(9, 6, 97);
    let alone = run(&engine, p.clone(), sampled(Some(42), 3));
    let crowd: Vec<_> =
        (0..5u64).map(|i| engine.submit(prompt(20 + i, 4 + i as usize, 97), sampled(None, 2)).unwrap()).collect();
    let batched = engine.submit(p.clone(), sampled(Some(42), 3)).unwrap().wait().unwrap();
    for c in crowd {
        c.wait().unwrap();
    }
    assert_same(&alone.completions, &batched.completions, "seed 42 alone vs batched");
    // Samples of one request draw from different streams; another seed gives other tokens.
    let tokens: Vec<_> = alone.completions.iter().map(|c| c.tokens.clone()).collect();
    assert!(tokens[0] != tokens[1] || tokens[1] != tokens[2], "{tokens:?}");
    let other = run(&engine, p.clone(), sampled(Some(43), 3));
    assert_ne!(other.completions[0].tokens, tokens[0]);
    // Unseeded requests are not reproducible.
    let a = run(&engine, p.clone(), sampled(None, 1));
    let b = run(&engine, p, sampled(None, 1));
    assert_ne!(a.completions[0].tokens, b.completions[0].tokens);
}
