//! Constrained sampling: a request's constraint decides which tokens each sample may choose, on the row-wise
//! CPU path and the libtorch path alike, while its logprobs stay the unmasked ones the trainer recomputes and
//! the requests sharing its steps sample as before.

use std::sync::Arc;

use trinity_engine::{
    Constraint, ConstraintError, ConstraintState, EngineConfig, EngineError, FinishReason, SamplingParams,
    TokenConstraint,
};

use crate::helpers::*;

/// Multiples of `step`, at least `min` of them and at most `max`.
#[derive(Debug)]
struct Multiples {
    step: u32,
    min: usize,
    max: usize,
    vocab: usize,
}

struct Count {
    rule: Arc<Multiples>,
    taken: usize,
}

#[derive(Debug)]
struct Shared(Arc<Multiples>);

impl TokenConstraint for Shared {
    fn start(&self) -> Box<dyn ConstraintState> {
        Box::new(Count { rule: Arc::clone(&self.0), taken: 0 })
    }
}

impl ConstraintState for Count {
    fn allowed(&mut self) -> Result<Arc<[bool]>, ConstraintError> {
        Ok((0..self.rule.vocab as u32).map(|id| id.is_multiple_of(self.rule.step)).collect())
    }
    fn advance(&mut self, token: u32) -> Result<(), ConstraintError> {
        if !token.is_multiple_of(self.rule.step) {
            return Err(format!("{token} is not a multiple of {}", self.rule.step));
        }
        self.taken += 1;
        Ok(())
    }
    fn can_end(&self) -> bool {
        self.taken >= self.rule.min
    }
    fn must_end(&self) -> bool {
        self.taken >= self.rule.max
    }
}

fn multiples(step: u32, min: usize, max: usize) -> Constraint {
    Constraint(Arc::new(Shared(Arc::new(Multiples { step, min, max, vocab: 97 }))))
}

#[test]
fn constrained_samples_follow_the_mask_and_keep_unmasked_logprobs() {
    let engine = tiny_engine(EngineConfig { max_model_len: 64, max_num_seqs: 16, ..Default::default() });
    let constrained = SamplingParams {
        n: 4,
        temperature: 1.0,
        seed: Some(5),
        max_tokens: Some(30),
        constraint: Some(multiples(5, 3, 6)),
        ..Default::default()
    };
    // top-k sends the step's rows through the libtorch path.
    let filtered = SamplingParams { top_k: 40, seed: Some(6), ..constrained.clone() };
    let free = SamplingParams { n: 2, seed: Some(7), ..forced_greedy(12) };
    let free_alone = run(&engine, prompt(3, 6, 97), free.clone());
    let handles: Vec<_> = [(1, &constrained), (2, &filtered), (3, &free)]
        .into_iter()
        .map(|(seed, params)| engine.submit(prompt(seed, 6, 97), params.clone()).unwrap())
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.wait().unwrap()).collect();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    for (seed, generation) in [(1, &results[0]), (2, &results[1])] {
        for c in &generation.completions {
            // Multiples of 5, then EOS (1) once at least 3 were taken; at 6 only EOS is left.
            let (body, last) = c.tokens.split_at(c.tokens.len() - 1);
            assert!(body.iter().all(|t| t.is_multiple_of(5)), "{:?}", c.tokens);
            assert_eq!((last[0], c.finish_reason), (EOS, FinishReason::Eos), "{:?}", c.tokens);
            assert!((3..=6).contains(&body.len()), "{:?}", c.tokens);
            let (p, tokens) = (prompt(seed, 6, 97), c.tokens.clone());
            let want = rt.block_on(engine.with_decoder(move |d| training_logprobs(d, &p, &tokens, 1.0))).unwrap();
            for (a, b) in c.logprobs.iter().zip(&want) {
                assert!((a - b).abs() < 1e-4, "engine {a} vs training {b}: the logprob is the unmasked one");
            }
        }
    }
    // The random model alone would not pick multiples of 5 this often.
    let free_tokens: Vec<u32> = results[2].completions.iter().flat_map(|c| c.tokens.clone()).collect();
    assert!(free_tokens.iter().any(|t| !t.is_multiple_of(5)));
    let tokens = |g: &trinity_engine::Generation| g.completions.iter().map(|c| c.tokens.clone()).collect::<Vec<_>>();
    assert_eq!(tokens(&results[2]), tokens(&free_alone), "an unconstrained request samples as alone");
}

#[test]
fn a_sample_that_cannot_end_on_eos_stops_where_its_output_is_complete() {
    let engine = tiny_engine(EngineConfig { max_model_len: 64, max_num_seqs: 4, ..Default::default() });
    let params = SamplingParams { constraint: Some(multiples(3, 2, 4)), ..forced_greedy(30) };
    let c = &run(&engine, prompt(9, 5, 97), params).completions[0];
    assert_eq!(c.tokens.len(), 4, "{:?}", c.tokens);
    assert!(c.tokens.iter().all(|t| t.is_multiple_of(3)));
    assert_eq!(c.finish_reason, FinishReason::Stop);
}

#[test]
fn a_constraint_that_allows_nothing_fails_only_its_request() {
    let engine = tiny_engine(EngineConfig { max_model_len: 64, max_num_seqs: 4, ..Default::default() });
    // A state that allows no id and cannot end yet.
    let none = Constraint(Arc::new(Shared(Arc::new(Multiples { step: 1000, min: 9, max: 9, vocab: 0 }))));
    let bad = engine.submit(prompt(1, 5, 97), SamplingParams { constraint: Some(none), ..forced_greedy(5) }).unwrap();
    let good = engine.submit(prompt(2, 5, 97), forced_greedy(5)).unwrap();
    match bad.wait() {
        Err(EngineError::ConstraintFailed { reason, .. }) => assert!(reason.contains("allows no token"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(good.wait().unwrap().completions[0].tokens.len(), 5);
}
