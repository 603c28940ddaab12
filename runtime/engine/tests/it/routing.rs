//! Routed experts through the engine ([`EngineConfig::return_routed_experts`]): what a rollout records for the
//! trainer's routing replay, on a tiny random Qwen3-MoE.

use tch::{Device, Kind, Tensor};
use trinity_engine::{Engine, EngineConfig, EngineModel, SamplingParams};
use trinity_model::{Decoder, Family, ModelConfig, MoeConfig};

use crate::helpers::{EOS, SeededWeights, forced_greedy, prompt, run, tiny_config};

const VOCAB: i64 = 61;

/// Three layers, the middle one dense; 6 experts, top 2.
pub fn tiny_moe_config() -> ModelConfig {
    ModelConfig {
        family: Family::Qwen3Moe,
        num_hidden_layers: 3,
        qk_norm: true,
        moe: Some(MoeConfig {
            num_experts: 6,
            num_experts_per_tok: 2,
            moe_intermediate_size: 24,
            norm_topk_prob: true,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![1],
            router_aux_loss_coef: 0.001,
            output_router_logits: false,
        }),
        ..tiny_config(VOCAB)
    }
}

fn moe_decoder() -> Decoder {
    Decoder::load(tiny_moe_config(), &mut SeededWeights(11), Kind::Float, Device::Cpu).unwrap()
}

fn moe_engine(routed: bool) -> Engine {
    let model = EngineModel { decoder: moe_decoder(), tokenizer: None, eos_token_ids: vec![i64::from(EOS)] };
    let config =
        EngineConfig { max_model_len: 64, max_num_seqs: 6, return_routed_experts: routed, ..Default::default() };
    Engine::start(model, config).unwrap()
}

/// The experts the training forward routes `tokens` to, `[T, L, k]` flat.
fn full_forward_experts(decoder: &Decoder, tokens: &[u32]) -> Vec<u16> {
    let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
    let ids = Tensor::from_slice(&ids).view([1, -1]);
    let routed = tch::no_grad(|| decoder.forward_hidden_routed(&ids, None, None, false)).unwrap();
    Vec::<i64>::try_from(routed.experts.reshape([-1])).unwrap().into_iter().map(|e| e as u16).collect()
}

#[test]
fn completions_carry_the_experts_of_every_token_read() {
    let engine = moe_engine(true);
    let layout = engine.info().routing.expect("a MoE model has a routing layout");
    assert_eq!((layout.layers, layout.top_k, layout.num_experts), (2, 2, 6));
    let reference = moe_decoder();
    let prompts = [prompt(1, 9, VOCAB as u32), prompt(2, 4, VOCAB as u32)];
    let pending: Vec<_> = prompts
        .iter()
        .map(|p| {
            engine.submit(p.clone(), SamplingParams { n: 2, max_tokens: Some(7), seed: Some(5), ..Default::default() })
        })
        .collect::<Result<_, _>>()
        .unwrap();
    for (p, pending) in prompts.iter().zip(pending) {
        let generation = pending.wait().unwrap();
        for c in &generation.completions {
            let routed = c.routed_experts.as_ref().expect("routed experts were asked for");
            assert_eq!((routed.layers, routed.top_k), (2, 2));
            // The prompt and every generated token but the last: what the model read.
            assert_eq!(routed.tokens(), p.len() + c.tokens.len() - 1);
            let mut read = p.clone();
            read.extend_from_slice(&c.tokens[..c.tokens.len() - 1]);
            assert_eq!(routed.ids, full_forward_experts(&reference, &read), "prefill and decode route as training");
            assert!(routed.ids.iter().all(|&e| e < 6));
        }
    }
}

#[test]
fn routing_is_recorded_only_when_asked_and_only_for_a_mixture_of_experts() {
    let off = moe_engine(false);
    let g = run(&off, prompt(3, 5, VOCAB as u32), forced_greedy(4));
    assert!(g.completions[0].routed_experts.is_none());
    // The same tokens either way: recording changes nothing that is sampled.
    let on = moe_engine(true);
    let h = run(&on, prompt(3, 5, VOCAB as u32), forced_greedy(4));
    assert_eq!(g.completions[0].tokens, h.completions[0].tokens);

    let dense = EngineModel {
        decoder: crate::helpers::tiny_decoder(7, 97),
        tokenizer: None,
        eos_token_ids: vec![i64::from(EOS)],
    };
    let err = Engine::start(dense, EngineConfig { return_routed_experts: true, ..Default::default() }).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("return_routed_experts") && text.contains("mixture-of-experts"), "{text}");
}

#[test]
fn a_repeated_prompt_is_routed_again_rather_than_reused() {
    let engine = moe_engine(true);
    let reference = moe_decoder();
    let p = prompt(4, 12, VOCAB as u32);
    for _ in 0..2 {
        let g = run(&engine, p.clone(), forced_greedy(3));
        let c = &g.completions[0];
        let mut read = p.clone();
        read.extend_from_slice(&c.tokens[..c.tokens.len() - 1]);
        assert_eq!(c.routed_experts.as_ref().unwrap().ids, full_forward_experts(&reference, &read));
    }
    assert_eq!(engine.stats().reused_prompt_tokens, 0);
}
