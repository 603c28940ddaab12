//! Qwen3-MoE against transformers (`tiny/qwen3_moe`: 3 layers, layer 1 dense, 4 experts, top 2, renormalised):
//! logits, the experts each token was routed to, a decode step, routing replay, gradients of experts and router,
//! the load-balancing loss, and the same model read from llama.cpp's `qwen3moe` GGUF layout.

use serde_json::Value;
use tch::{Device, Kind, Tensor};
use trinity_model::{Decoder, ModelConfig, SafetensorsWeights, load_balancing_loss, load_model};

use crate::helpers::*;

fn moe_model(kind: Kind) -> (Decoder, Value) {
    let dir = fixtures().join("tiny/qwen3_moe");
    let config = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let mut weights = SafetensorsWeights::open_dir(&dir).unwrap();
    let model = Decoder::load(config, &mut weights, kind, Device::Cpu).unwrap();
    (model, read_json(&dir.join("expected.json")))
}

/// transformers' routing at the real tokens, `[B, T, layers, k]` with padding rows as -1.
fn expected_experts(expected: &Value) -> Vec<i64> {
    let mask: Vec<i64> = expected["attention_mask"].as_array().unwrap().iter().flat_map(ints).collect();
    let mut out = Vec::new();
    for (i, token) in
        expected["routed_experts"].as_array().unwrap().iter().flat_map(|row| row.as_array().unwrap()).enumerate()
    {
        for layer in token.as_array().unwrap() {
            out.extend(ints(layer).into_iter().map(|e| if mask[i] == 1 { e } else { -1 }));
        }
    }
    out
}

/// `experts` `[B, T, L, k]` with the padding positions of `expected`'s mask set to -1.
fn masked(experts: &Tensor, expected: &Value) -> Vec<i64> {
    let mask = ids_tensor(&expected["attention_mask"]).view([2, 8, 1, 1]);
    let e = experts.where_self(&mask.ne(0), &Tensor::from(-1i64));
    Vec::try_from(e.flatten(0, -1)).unwrap()
}

#[test]
fn qwen3_moe_matches_transformers_logits_and_routing() {
    let (model, expected) = moe_model(Kind::Float);
    assert_eq!(model.sparse_layers(), [0, 2]);
    let ids = ids_tensor(&expected["input_ids"]);
    let mask = ids_tensor(&expected["attention_mask"]);
    let routed = model.forward_hidden_routed(&ids, Some(&mask), None, true).unwrap();
    let logits = model.logits(&routed.hidden).unwrap();
    let diff = masked_max_diff(&logits, &floats(&expected["logits"]), &expected["attention_mask"]);
    assert!(diff < 1e-4, "max logit diff {diff}");
    assert_eq!(routed.experts.size(), [2, 8, 2, 2]);
    assert_eq!(masked(&routed.experts, &expected), expected_experts(&expected), "routed experts");
    // The load-balancing loss of transformers' load_balancing_loss_func over the same router logits.
    assert_eq!(routed.router_logits.len(), 2);
    let aux = load_balancing_loss(&routed.router_logits, 4, 2, Some(&mask)).unwrap().double_value(&[]);
    let want = expected["load_balancing_loss"].as_f64().unwrap();
    assert!((aux - want).abs() < 1e-5, "load-balancing loss {aux}, transformers {want}");
}

#[test]
fn bf16_qwen3_moe_stays_close_to_f32() {
    let (model, expected) = moe_model(Kind::BFloat16);
    let ids = ids_tensor(&expected["input_ids"]);
    let mask = ids_tensor(&expected["attention_mask"]);
    let logits = model.forward(&ids, Some(&mask)).unwrap().to_kind(Kind::Float);
    let diff = masked_max_diff(&logits, &floats(&expected["logits"]), &expected["attention_mask"]);
    assert!(diff < 0.1, "bf16 max logit diff {diff}");
}

/// A prefill of the first 5 tokens of each row and 3 decode steps give the full forward's logits and routing.
#[test]
fn prefill_and_decode_match_the_full_forward() {
    for kind in [Kind::Float, Kind::BFloat16] {
        let (model, expected) = moe_model(kind);
        let ids = ids_tensor(&expected["input_ids"]);
        let full = model.forward_hidden_routed(&ids, None, None, false).unwrap();
        let full_logits = model.logits(&full.hidden).unwrap().to_kind(Kind::Float);
        let mut cache = model.new_cache(2, 16).unwrap();
        let (h, experts) = model.forward_with_cache_routed(&ids.narrow(1, 0, 5), &mut cache, &[0, 1], &[5, 5]).unwrap();
        let mut steps = vec![(model.logits(&h).unwrap(), experts, 0, 5)];
        for pos in 5..8 {
            let (h, experts) =
                model.forward_with_cache_routed(&ids.narrow(1, pos, 1), &mut cache, &[0, 1], &[1, 1]).unwrap();
            steps.push((model.logits(&h).unwrap(), experts, pos, 1));
        }
        let tolerance = if kind == Kind::Float { 1e-4 } else { 0.1 };
        for (logits, experts, start, len) in steps {
            let want = full_logits.narrow(1, start, len);
            let diff = (logits.to_kind(Kind::Float) - &want).abs().max().double_value(&[]);
            assert!(diff < tolerance, "{kind:?} positions {start}..{}: {diff}", start + len);
            if kind == Kind::Float {
                assert!(experts.equal(&full.experts.narrow(1, start, len)), "routing at {start}..{}", start + len);
            }
        }
    }
}

/// Replayed experts are the ones used, even where the router ranks them last, and they change the logits; the
/// replayed forward's gradients still reach the router.
#[test]
fn replayed_routing_overrides_the_router() {
    let (model, expected) = moe_model(Kind::Float);
    let ids = ids_tensor(&expected["input_ids"]);
    let mask = ids_tensor(&expected["attention_mask"]);
    let own = model.forward_hidden_routed(&ids, Some(&mask), None, false).unwrap();
    // With 4 experts and top 2, each token's other two experts are the ones its router likes least.
    let all = Tensor::arange(4, (Kind::Int64, Device::Cpu)).view([1, 1, 1, 1, 4]);
    let chosen = own.experts.unsqueeze(-1).eq_tensor(&all).any_dim(-2, false);
    let others = chosen.logical_not().nonzero().select(1, 3).view([2, 8, 2, 2]);
    let replayed = model.forward_hidden_routed(&ids, Some(&mask), Some(&others), false).unwrap();
    assert!(replayed.experts.equal(&others));
    assert!(!others.equal(&own.experts));
    let (own_logits, replayed_logits) = (model.logits(&own.hidden).unwrap(), model.logits(&replayed.hidden).unwrap());
    let change = (&own_logits - &replayed_logits).abs().max().double_value(&[]);
    assert!(change > 1e-3, "replayed experts changed the logits by only {change}");
    replayed_logits.sum(Kind::Float).backward();
    let router = &model.var_store().variables()["model.layers.0.mlp.gate.weight"];
    assert!(router.grad().abs().sum(Kind::Float).double_value(&[]) > 0.0, "the router gets gradients");
    let bad = model.forward_hidden_routed(&ids, Some(&mask), Some(&others.narrow(2, 0, 1)), false).unwrap_err();
    assert!(bad.to_string().contains("[2, 8, 2, 2]"), "{bad}");
}

/// Gradients of a weighted sum of the logits equal PyTorch's, for a router, two experts' projections and the
/// dense layer's MLP.
#[test]
fn gradients_match_pytorch() {
    let (model, expected) = moe_model(Kind::Float);
    let ids = ids_tensor(&expected["input_ids"]);
    let mask = ids_tensor(&expected["attention_mask"]);
    let logits = model.forward(&ids, Some(&mask)).unwrap();
    let n = logits.numel() as i64;
    let weights = (Tensor::arange(n, (Kind::Float, Device::Cpu)) * 0.37).sin().view(logits.size().as_slice());
    (logits * weights * mask.unsqueeze(-1).to_kind(Kind::Float)).sum(Kind::Float).backward();
    let vars = model.var_store().variables();
    for (name, want) in expected["grads"].as_object().unwrap() {
        let got: Vec<f32> = Vec::try_from(vars[name].grad().flatten(0, -1)).unwrap();
        let want = floats(want);
        assert_eq!(got.len(), want.len(), "{name}");
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
        let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max) / scale;
        assert!(worst < 1e-4, "gradient of {name}: relative error {worst}");
    }
}

#[test]
fn qwen3moe_gguf_matches_transformers() {
    let model = load_model(&fixtures().join("tiny_qwen3moe.gguf"), Kind::Float, Device::Cpu).unwrap();
    let moe = model.decoder.config().moe.clone().unwrap();
    assert_eq!((moe.num_experts, moe.num_experts_per_tok, moe.mlp_only_layers.as_slice()), (4, 2, &[1][..]));
    let expected = read_json(&fixtures().join("tiny/qwen3_moe/expected.json"));
    let ids = ids_tensor(&expected["input_ids"]);
    let mask = ids_tensor(&expected["attention_mask"]);
    let logits = model.decoder.forward(&ids, Some(&mask)).unwrap();
    let diff = masked_max_diff(&logits, &floats(&expected["logits"]), &expected["attention_mask"]);
    assert!(diff < 1e-4, "max logit diff {diff}");
}
