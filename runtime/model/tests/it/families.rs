//! Each tiny model family (Llama tied, Llama untied + llama3 RoPE, Qwen2 biases, Qwen3 q/k norm) matches
//! transformers' logits, with left padding in the batch.

use tch::{Device, Kind};
use trinity_model::{Decoder, ModelConfig, SafetensorsWeights};

use crate::helpers::*;

#[test]
fn tiny_families_match_transformers_logits() {
    for name in ["llama_tied", "llama_untied_llama3", "qwen2_bias", "qwen3_qk_norm"] {
        let dir = fixtures().join("tiny").join(name);
        let config = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let mut weights = SafetensorsWeights::open_dir(&dir).unwrap();
        let model = Decoder::load(config, &mut weights, Kind::Float, Device::Cpu).unwrap();
        let expected = read_json(&dir.join("expected.json"));
        let ids = ids_tensor(&expected["input_ids"]);
        let mask = ids_tensor(&expected["attention_mask"]);
        let logits = model.forward(&ids, Some(&mask)).unwrap();
        let diff = masked_max_diff(&logits, &floats(&expected["logits"]), &expected["attention_mask"]);
        assert!(diff < 1e-4, "{name}: max logit diff {diff}");
    }
}

#[test]
fn bf16_model_stays_close_to_f32() {
    let dir = fixtures().join("tiny/qwen2_bias");
    let config = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let mut weights = SafetensorsWeights::open_dir(&dir).unwrap();
    let model = Decoder::load(config, &mut weights, Kind::BFloat16, Device::Cpu).unwrap();
    let expected = read_json(&dir.join("expected.json"));
    let ids = ids_tensor(&expected["input_ids"]);
    let mask = ids_tensor(&expected["attention_mask"]);
    let logits = model.forward(&ids, Some(&mask)).unwrap().to_kind(Kind::Float);
    let diff = masked_max_diff(&logits, &floats(&expected["logits"]), &expected["attention_mask"]);
    assert!(diff < 0.1, "bf16 max logit diff {diff}");
}
