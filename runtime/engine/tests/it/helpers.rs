//! Tiny models, tokenizers and engines for the tests.

use std::path::PathBuf;

use tch::{Device, Kind, Tensor};
use trinity_engine::{Completion, Engine, EngineConfig, EngineModel, Generation, SamplingParams};
use trinity_model::{Decoder, Family, ModelConfig, Tokenizer, WeightSource};
use trinity_rng::mix;

/// End-of-sequence id of the tiny models.
pub const EOS: u32 = 1;

/// A two-layer Llama-style config (GQA, tied embeddings), wider than [`ModelConfig::tiny`].
pub fn tiny_config(vocab_size: i64) -> ModelConfig {
    ModelConfig {
        vocab_size,
        hidden_size: 64,
        intermediate_size: 96,
        head_dim: 16,
        max_position_embeddings: 512,
        eos_token_ids: vec![i64::from(EOS)],
        ..ModelConfig::tiny(Family::Llama)
    }
}

/// Weights from a hash of (seed, name, index): deterministic without torch's global generator (which tests
/// running in parallel would share), and large enough (uniform in ±0.3) that logits have clear winners.
pub struct SeededWeights(pub u64);

impl WeightSource for SeededWeights {
    fn load(&mut self, name: &str, shape: &[i64]) -> trinity_model::Result<Tensor> {
        let n: i64 = shape.iter().product();
        if name.ends_with("norm.weight") {
            return Ok(Tensor::ones(shape, (Kind::Float, Device::Cpu)));
        }
        let key = name.bytes().fold(mix(self.0), |h, b| mix(h ^ u64::from(b)));
        let values: Vec<f32> =
            (0..n as u64).map(|i| ((mix(key ^ i) >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.6).collect();
        Ok(Tensor::from_slice(&values).view(shape))
    }
}

/// A tiny decoder with weights from `seed`.
pub fn tiny_decoder(seed: u64, vocab_size: i64) -> Decoder {
    Decoder::load(tiny_config(vocab_size), &mut SeededWeights(seed), Kind::Float, Device::Cpu).unwrap()
}

/// An engine over a tiny model (vocabulary 97, no tokenizer).
pub fn tiny_engine(config: EngineConfig) -> Engine {
    let model = EngineModel { decoder: tiny_decoder(7, 97), tokenizer: None, eos_token_ids: vec![i64::from(EOS)] };
    Engine::start(model, config).unwrap()
}

/// A byte-level BPE tokenizer whose 8 ids cover `a b c d \n` and `é`, for the stop-string tests.
pub fn tiny_tokenizer() -> Tokenizer {
    let vocab: serde_json::Map<String, serde_json::Value> = ["a", "b", "c", "d", "Ċ", "ab", "Ã", "©"]
        .iter()
        .enumerate()
        .map(|(i, t)| ((*t).to_owned(), i.into()))
        .collect();
    let byte_level = serde_json::json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false
    });
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": byte_level, "post_processor": null, "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": [["a", "b"]]
        },
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, json.to_string()).unwrap();
    Tokenizer::from_files(&path, None).unwrap()
}

/// A deterministic prompt of `len` ids in `1..vocab` (never 0, so padding is visible in bugs).
pub fn prompt(seed: u64, len: usize, vocab: u32) -> Vec<u32> {
    (0..len as u64).map(|i| 2 + (mix(seed ^ mix(i)) % u64::from(vocab - 2)) as u32).collect()
}

/// Greedy parameters that run exactly `max_tokens` tokens.
pub fn forced_greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams { ignore_eos: true, ..SamplingParams::greedy(max_tokens) }
}

/// Generates and waits (blocking).
pub fn run(engine: &Engine, prompt: Vec<u32>, params: SamplingParams) -> Generation {
    engine.submit(prompt, params).unwrap().wait().unwrap()
}

/// The SmolLM2 GGUF that `cargo xtask setup` installs (or `TRINITY_SMOLLM2_GGUF`). A missing file fails the test
/// that needs it, saying how to install it: a test that passes without running proves nothing.
pub fn smollm2_path() -> PathBuf {
    let path = std::env::var_os("TRINITY_SMOLLM2_GGUF").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    assert!(
        path.exists(),
        "SmolLM2 GGUF not found at {}: run `cargo xtask setup` (or set TRINITY_SMOLLM2_GGUF to the file)",
        path.display()
    );
    path
}

/// Log-probabilities of `response` after `prompt` from the training forward pass
/// (`forward_hidden` + `token_logprobs`) at `temperature`.
pub fn training_logprobs(decoder: &Decoder, prompt: &[u32], response: &[u32], temperature: f64) -> Vec<f32> {
    let ids: Vec<i64> = prompt.iter().chain(response).map(|&t| i64::from(t)).collect();
    let t = ids.len() as i64;
    let ids = Tensor::from_slice(&ids).view([1, t]);
    let lp = tch::no_grad(|| {
        let hidden = decoder.forward_hidden(&ids, None).unwrap();
        decoder.token_logprobs(&hidden.narrow(1, 0, t - 1), &ids.narrow(1, 1, t - 1), temperature, 64).unwrap()
    });
    let all: Vec<f32> = Vec::try_from(lp.view([-1])).unwrap();
    all[prompt.len() - 1..].to_vec()
}

/// Same tokens, text and finish reasons, logprobs within 1e-4 (batch shapes change matmul rounding).
pub fn assert_same(a: &[Completion], b: &[Completion], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        assert_eq!((&x.tokens, &x.text, x.finish_reason), (&y.tokens, &y.text, y.finish_reason), "{what}");
        for (p, q) in x.logprobs.iter().zip(&y.logprobs) {
            assert!((p - q).abs() < 1e-4, "{what}: logprob {p} vs {q}");
        }
    }
}
