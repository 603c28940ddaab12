//! GGUF: dequantization of every supported type against gguf-py, and a tiny Llama and a tiny Qwen2 written the
//! way llama.cpp writes them (Llama with permuted q/k rows, Qwen2 with biases and rows as they are) against
//! transformers' logits of the original models.

use tch::{Device, Kind};
use trinity_model::{GgufFile, LoadedModel, load_model};

use crate::helpers::*;

#[test]
fn every_supported_type_dequantizes_like_gguf_py() {
    let g = GgufFile::open(fixtures().join("quants.gguf")).unwrap();
    let expected = read_json(&fixtures().join("quants.json"));
    for (name, want) in expected.as_object().unwrap() {
        let got = g.dequantize(&format!("t.{name}")).unwrap();
        let want = floats(want);
        assert_eq!(got.len(), want.len(), "{name}");
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-5, "{name}: max diff {worst}");
    }
}

/// Loads a tiny GGUF fixture (tied embeddings, 4 heads on 2 KV heads) and checks its logits against the
/// transformers logits in `expected` (fixture-relative paths).
fn tiny_gguf_matching_transformers(file: &str, expected: &str) -> LoadedModel {
    let model = load_model(&fixtures().join(file), Kind::Float, Device::Cpu).unwrap();
    let config = model.decoder.config();
    assert!(config.tie_word_embeddings);
    assert_eq!((config.num_attention_heads, config.num_key_value_heads), (4, 2));
    let expected = read_json(&fixtures().join(expected));
    let ids = ids_tensor(&expected["input_ids"]);
    let mask = ids_tensor(&expected["attention_mask"]);
    let logits = model.decoder.forward(&ids, Some(&mask)).unwrap();
    let diff = masked_max_diff(&logits, &floats(&expected["logits"]), &expected["attention_mask"]);
    assert!(diff < 1e-4, "{file}: max logit diff {diff}");
    model
}

#[test]
fn tiny_llama_gguf_matches_transformers_and_its_tokenizer() {
    let model = tiny_gguf_matching_transformers("tiny_llama.gguf", "tiny_llama_gguf.json");
    // Same tokenizer as the HF directory's (built by `tokenizers`), and the same template.
    let hf = read_json(&fixtures().join("tiny/llama_tied/expected.json"));
    let text = hf["tokenizer"]["text"].as_str().unwrap();
    let got: Vec<i64> = model.tokenizer.encode(text, false).unwrap().into_iter().map(i64::from).collect();
    assert_eq!(got, ints(&hf["tokenizer"]["ids"]));
    let template = model.chat_template.as_ref().unwrap();
    let rendered = template.render(hf["chat"]["messages"].as_array().unwrap(), true, None).unwrap();
    assert_eq!(rendered, hf["chat"]["rendered"].as_str().unwrap());
    assert_eq!(model.eos_token_ids, vec![2]);
}

/// Qwen2's GGUF layout, which the Qwen2.5-shaped benchmarks and every Qwen2.5 GGUF users have rely on: q/k/v
/// biases, q/k rows not permuted (llama.cpp permutes them only for Llama), tied embeddings.
#[test]
fn tiny_qwen2_gguf_matches_transformers() {
    let model = tiny_gguf_matching_transformers("tiny_qwen2.gguf", "tiny/qwen2_bias/expected.json");
    assert!(model.decoder.config().qkv_bias);
}
