//! A recomputed layer's LoRA dropout draws the masks its forward drew (`csrc/checkpoint.cpp` restores libtorch's
//! global generator for the recomputation). Its own test binary, with this one test: the masks come from the
//! process-wide generator, which other tests running in parallel threads would draw from between the two runs
//! compared here.

use tch::{Device, Kind, Tensor};
use trinity_model::{Decoder, LoraSpec, ModelConfig, RandomWeights};

fn tiny() -> Decoder {
    let config = ModelConfig::from_json(&serde_json::json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 32,
        "intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": true,
        "vocab_size": 32, "hidden_act": "silu", "eos_token_id": 1,
    }))
    .unwrap();
    tch::manual_seed(0);
    Decoder::load(config, &mut RandomWeights, Kind::Float, Device::Cpu).unwrap()
}

/// The loss and every adapter's gradient after one forward and backward with dropout drawn from `seed`.
fn run(m: &Decoder, seed: i64) -> (f64, Vec<(String, Tensor)>) {
    tch::manual_seed(seed);
    let ids = Tensor::from_slice(&[0i64, 3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]).view([2, 6]);
    let mask = Tensor::from_slice(&[0i64, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]).view([2, 6]);
    let hidden = m.forward_hidden(&ids, Some(&mask)).unwrap();
    let weights = (Tensor::arange(hidden.numel() as i64, (Kind::Float, Device::Cpu)) * 0.37).sin();
    let loss = (&hidden * weights.view(hidden.size().as_slice())).sum(Kind::Float);
    loss.backward();
    let grads = m
        .lora_parameters()
        .into_iter()
        .map(|(name, mut t)| {
            let g = t.grad().copy();
            t.zero_grad();
            (name, g)
        })
        .collect();
    (loss.double_value(&[]), grads)
}

#[test]
fn recomputed_lora_dropout_replays_the_forwards_masks() {
    let mut m = tiny();
    let spec = LoraSpec { dropout: 0.3, ..LoraSpec::all_linear(4, 8.0) };
    m.add_lora(&spec, 3).unwrap();
    tch::no_grad(|| {
        for (name, t) in m.lora_parameters() {
            if name.contains("lora_B") {
                t.shallow_clone().copy_(&(Tensor::randn(t.size(), (Kind::Float, Device::Cpu)) * 0.1));
            }
        }
    });
    let (kept_loss, kept) = run(&m, 11);
    let (other_loss, _) = run(&m, 12);
    assert_ne!(kept_loss, other_loss, "the dropout must draw from the generator, or this test shows nothing");
    m.set_recompute_activations(true).unwrap();
    // The backward recomputes the last layer first, after every layer's forward has drawn its masks: each
    // recomputation must put the generator back where its layer's forward drew.
    let (recomputed_loss, recomputed) = run(&m, 11);
    assert_eq!(kept_loss, recomputed_loss, "the forward's values");
    assert_eq!(kept.len(), recomputed.len());
    for ((name, want), (_, got)) in kept.iter().zip(&recomputed) {
        let scale = want.abs().max().double_value(&[]).max(1e-6);
        let diff = (want - got).abs().max().double_value(&[]);
        assert!(diff / scale < 1e-5, "gradient of {name}: {diff}");
    }
}
