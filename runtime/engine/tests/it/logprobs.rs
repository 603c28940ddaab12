//! The engine's logprobs equal the training forward pass's (`forward_hidden` + `token_logprobs` over the
//! whole sequence at the rollout temperature), and a weight sync changes the engine's model in place.

use tch::{Device, Kind, Tensor};
use trinity_engine::{Engine, EngineConfig, EngineError, EngineModel, SamplingParams};

use crate::helpers::*;

/// Generates with `params` and compares every sample's logprobs with the training path, computed on the
/// engine's own decoder (on its thread, between steps). Returns the largest difference.
fn check_against_training(engine: &Engine, prompts: &[Vec<u32>], params: &SamplingParams) -> f32 {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let mut worst = 0f32;
    let pending: Vec<_> = prompts.iter().map(|p| engine.submit(p.clone(), params.clone()).unwrap()).collect();
    for (p, handle) in prompts.iter().zip(pending) {
        for c in handle.wait().unwrap().completions {
            assert_eq!(c.tokens.len(), c.logprobs.len());
            let (prompt, tokens) = (p.clone(), c.tokens.clone());
            let temperature = f64::from(params.logprob_temperature());
            let want =
                rt.block_on(engine.with_decoder(move |d| training_logprobs(d, &prompt, &tokens, temperature))).unwrap();
            for (a, b) in c.logprobs.iter().zip(&want) {
                worst = worst.max((a - b).abs());
            }
        }
    }
    worst
}

#[test]
fn tiny_model_logprobs_equal_the_training_forward_pass() {
    let engine = tiny_engine(EngineConfig { max_model_len: 64, max_num_seqs: 8, ..Default::default() });
    let prompts: Vec<Vec<u32>> = (0..4u64).map(|i| prompt(i, 3 + 5 * i as usize, 97)).collect();
    let greedy = check_against_training(&engine, &prompts, &forced_greedy(20));
    // Sampled at temperature 0.7 with filters: the logprob is still log_softmax(logits / 0.7) at the token.
    let sampled = SamplingParams { n: 2, temperature: 0.7, top_k: 20, top_p: 0.9, seed: Some(3), ..forced_greedy(20) };
    let sampled = check_against_training(&engine, &prompts, &SamplingParams { temperature: 0.7, ..sampled });
    println!("tiny: max |engine - training| logprob: greedy {greedy:.2e}, sampled {sampled:.2e}");
    assert!(greedy <= 1e-4 && sampled <= 1e-4, "greedy {greedy}, sampled {sampled}");
}

#[test]
fn smollm2_logprobs_equal_the_training_forward_pass() {
    let path = smollm2_path();
    let model = trinity_model::load_model(&path, Kind::Float, Device::Cpu).unwrap();
    let prompts: Vec<Vec<u32>> = ["Write a short poem about rain.", "The three laws of motion are"]
        .iter()
        .map(|t| model.tokenizer.encode(t, false).unwrap())
        .collect();
    let engine =
        Engine::start(EngineModel::from(model), EngineConfig { max_model_len: 64, ..Default::default() }).unwrap();
    let params = SamplingParams { temperature: 0.8, seed: Some(1), ..forced_greedy(16) };
    let worst = check_against_training(&engine, &prompts, &params);
    println!("smollm2: max |engine - training| logprob = {worst:.2e}");
    assert!(worst <= 1e-4, "{worst}");
}

/// The tiny engine, a prompt, and what the same engine generates for it with seed 8's weights (the trainer's).
fn engine_and_wanted() -> (Engine, Vec<u32>, trinity_engine::Generation) {
    let config = EngineConfig { max_model_len: 64, ..Default::default() };
    let engine = tiny_engine(config.clone());
    let reference =
        Engine::start(EngineModel { decoder: tiny_decoder(8, 97), tokenizer: None, eos_token_ids: vec![1] }, config)
            .unwrap();
    let p = prompt(5, 7, 97);
    let want = run(&reference, p.clone(), forced_greedy(12));
    (engine, p, want)
}

#[test]
fn weight_sync_copies_in_place_and_changes_what_the_engine_generates() {
    let (engine, p, want) = engine_and_wanted();
    let before = run(&engine, p.clone(), forced_greedy(12));
    assert_ne!(before.completions[0].tokens, want.completions[0].tokens);

    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let ptr = |e: &Engine| {
        rt.block_on(e.with_decoder(|d| d.var_store().variables()["model.embed_tokens.weight"].data_ptr() as usize))
            .unwrap()
    };
    let storage = ptr(&engine);
    // The trainer side: a decoder in another dtype, whose parameters are handed over as shallow handles.
    let trainer =
        trinity_model::Decoder::load(tiny_config(97), &mut SeededWeights(8), Kind::Double, Device::Cpu).unwrap();
    rt.block_on(engine.sync_weights(trainer.named_parameters().unwrap())).unwrap();
    assert_eq!(ptr(&engine), storage);
    let after = run(&engine, p.clone(), forced_greedy(12));
    assert_eq!(after.completions[0].tokens, want.completions[0].tokens);

    let mut partial = trainer.named_parameters().unwrap();
    partial.pop();
    let err = rt.block_on(engine.sync_weights(partial)).unwrap_err();
    assert!(matches!(err, EngineError::Model(trinity_model::ModelError::MissingTensor { .. })), "{err}");
}

#[test]
fn a_weight_sink_fed_part_by_part_equals_a_whole_sync() {
    let (engine, p, want) = engine_and_wanted();
    let trainer =
        trinity_model::Decoder::load(tiny_config(97), &mut SeededWeights(8), Kind::Double, Device::Cpu).unwrap();
    let params = trainer.named_parameters().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();

    // A request is queued when the sync starts: it still finishes, and what runs after the sync samples with the
    // new weights.
    let running = engine.submit(p.clone(), forced_greedy(12)).unwrap();
    let sink = engine.weight_sink().unwrap();
    for part in params.chunks(3) {
        let part = part.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
        sink.send(part).unwrap();
    }
    rt.block_on(sink.finish()).unwrap();
    running.wait().unwrap();
    let after = run(&engine, p.clone(), forced_greedy(12));
    assert_eq!(after.completions[0].tokens, want.completions[0].tokens);

    // A part naming a tensor the engine lacks fails the sync at its end; the parts after it are still taken,
    // so a sender inside a collective never blocks.
    let sink = engine.weight_sink().unwrap();
    sink.send(vec![("model.nope".into(), Tensor::zeros([2], (Kind::Float, Device::Cpu)))]).unwrap();
    sink.send(params.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect()).unwrap();
    let err = rt.block_on(sink.finish()).unwrap_err();
    assert!(err.to_string().contains("model.nope"), "{err}");
    // A sink that misses a parameter says how many it covered.
    let sink = engine.weight_sink().unwrap();
    sink.send(params[1..].iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect()).unwrap();
    let err = rt.block_on(sink.finish()).unwrap_err();
    assert!(err.to_string().contains(&format!("covered {} of {}", params.len() - 1, params.len())), "{err}");
}
