//! What each fuzz target does with its input, as plain functions that panic on a finding. The fuzz targets call
//! them, and trinity-model's regression test (`runtime/model/tests/it/fuzz_regressions.rs`) includes this file
//! and replays every input kept under `fuzz/regressions/` through the same functions, so a fixed crash stays
//! fixed under exactly the checks that found it.
//!
//! A finding is a panic (an overflow under debug assertions included), a hang or a runaway allocation, or an
//! error about a file that does not name the file.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tch::{Device, Kind};
use trinity_model::{ChatMessage, ChatTemplate, GgufFile, ModelConfig, RopeScaling, SafetensorsWeights, Tokenizer};

/// A GGUF file, through everything `trinity generate model.gguf` does with one: the header, every decodable
/// tensor, then the whole load (config and tokenizer from the metadata, chat template, weights) and a use of
/// what loaded.
pub fn gguf(data: &[u8]) {
    let path = scratch_file("fuzz.gguf", data);
    match GgufFile::open(&path) {
        Err(e) => assert_names_file(&e, &path),
        Ok(gguf) => {
            for info in gguf.tensors() {
                // Decodable tensors' bytes lie inside the file, so this is bounded by its size.
                if info.ggml_type.is_decodable() {
                    let _ = gguf.dequantize(&info.name);
                }
            }
        }
    }
    match trinity_model::load_model(&path, Kind::Float, Device::Cpu) {
        Err(e) => assert_names_file(&e, &path),
        Ok(model) => {
            if let Ok(ids) = model.tokenizer.encode("Hi <|im_start|>user\nwhat is 2+2?", true) {
                let _ = model.tokenizer.decode(&ids, false);
            }
            if let Some(template) = &model.chat_template {
                let _ = template.apply(&[ChatMessage::new("user", "hello")], true);
            }
        }
    }
}

/// A `config.json`: parsed, its parameter shapes computed as a decoder load does, and written back, which must
/// read back as the same config.
pub fn hf_config(data: &[u8]) {
    let path = scratch_file("config.json", data);
    match ModelConfig::from_file(&path) {
        Err(e) => assert_names_file(&e, &path),
        Ok(config) => {
            let _ = config.gqa_groups();
            assert!(!trinity_model::param_specs(&config).is_empty());
            let mut again = ModelConfig::from_json(&config.to_json("float32")).expect("a written config reads back");
            same_floats(&mut again, &config);
            assert_eq!(again, ModelConfig { torch_dtype: Some("float32".into()), ..config });
        }
    }
}

/// A `model.safetensors`: the header parsed and every tensor it lists read into libtorch.
pub fn safetensors_header(data: &[u8]) {
    let path = scratch_file("model.safetensors", data);
    match SafetensorsWeights::open_files(std::slice::from_ref(&path)) {
        Err(e) => assert_names_file(&e, &path),
        Ok(weights) => {
            for name in weights.names() {
                if let Err(e) = weights.get(&name) {
                    assert_names_file(&e, &path);
                }
            }
        }
    }
}

/// `tokenizer.json`, `tokenizer_config.json` and a text, joined by `0xFF` bytes: the tokenizer is loaded, then
/// encodes the text and decodes the ids back.
pub fn tokenizer(data: &[u8]) {
    let parts = split_parts(data, 3);
    let path = scratch_file("tokenizer.json", parts[0]);
    let config = parts.get(1).and_then(|c| serde_json::from_slice::<Value>(c).ok());
    let text = String::from_utf8_lossy(parts.get(2).copied().unwrap_or_default());
    let tokenizer = match Tokenizer::from_files(&path, config.as_ref()) {
        Ok(t) => t,
        Err(e) => return assert_names_file(&e, &path),
    };
    for add_special in [false, true] {
        if let Ok(ids) = tokenizer.encode(&text, add_special) {
            let _ = tokenizer.decode(&ids, true);
            let _ = tokenizer.decode(&ids, false);
        }
    }
    let _ = tokenizer.decode(&[0, 1, 2, u32::MAX], false);
    if let Some(id) = tokenizer.bos_token().and_then(|t| tokenizer.token_to_id(t)) {
        let _ = tokenizer.id_to_token(id);
    }
}

/// A chat template and the messages it renders (JSON), joined by a `0xFF` byte: compiled and rendered the way a
/// model file's template is, under its instruction fuel and output cap.
pub fn chat_template(data: &[u8]) {
    let parts = split_parts(data, 2);
    let Ok(source) = std::str::from_utf8(parts[0]) else { return };
    let messages = match parts.get(1).and_then(|m| serde_json::from_slice::<Value>(m).ok()) {
        Some(Value::Array(list)) => list,
        Some(other) => vec![other],
        None => vec![json!({"role": "system", "content": "Be brief."}), json!({"role": "user", "content": "2+2?"})],
    };
    let Ok(template) = ChatTemplate::new(source, Some("<s>"), Some("</s>")) else { return };
    for add_generation_prompt in [false, true] {
        let _ = template.render(&messages, add_generation_prompt, None);
    }
    let tools = json!([{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]);
    let _ = template.render(&messages, true, Some(&tools));
}

/// Sets `again`'s floats to `config`'s where they differ by rounding alone: serde_json parses floats to within
/// an ulp or so unless its `float_roundtrip` feature is on, which is no fault of the config reader.
fn same_floats(again: &mut ModelConfig, config: &ModelConfig) {
    fn snap(a: &mut f64, b: f64) {
        if (*a - b).abs() <= a.abs().max(b.abs()) * 1e-14 {
            *a = b;
        }
    }
    snap(&mut again.rms_norm_eps, config.rms_norm_eps);
    snap(&mut again.rope_theta, config.rope_theta);
    match (&mut again.rope_scaling, &config.rope_scaling) {
        (RopeScaling::Linear { factor: a }, RopeScaling::Linear { factor: b }) => snap(a, *b),
        (
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings },
            RopeScaling::Llama3 {
                factor: f,
                low_freq_factor: lo,
                high_freq_factor: hi,
                original_max_position_embeddings: orig,
            },
        ) => {
            snap(factor, *f);
            snap(low_freq_factor, *lo);
            snap(high_freq_factor, *hi);
            snap(original_max_position_embeddings, *orig);
        }
        _ => {}
    }
}

thread_local! {
    /// A scratch directory per thread (the regression test replays inputs on several threads at once), removed
    /// when the thread ends.
    static SCRATCH: tempfile::TempDir = tempfile::Builder::new()
        .prefix("trinity-fuzz-")
        .tempdir()
        .expect("a scratch directory can be created");
}

/// Writes `bytes` to `name` in this thread's scratch directory and returns the path. The readers under test
/// open files by path (and memory-map them), so the fuzzed bytes go through the same code a user's file does.
fn scratch_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = SCRATCH.with(|dir| dir.path().join(name));
    std::fs::write(&path, bytes).expect("the scratch file can be written");
    path
}

/// Splits an input into at most `n` parts at `0xFF` bytes, which never occur in UTF-8 text, so a seed made of
/// text files joined by `0xFF` splits back into those files.
fn split_parts(data: &[u8], n: usize) -> Vec<&[u8]> {
    data.splitn(n, |&b| b == 0xFF).collect()
}

/// Panics (a finding) when an error about a file does not name it.
fn assert_names_file(err: &impl std::fmt::Display, path: &Path) {
    let msg = err.to_string();
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    assert!(msg.contains(name), "the error does not name the file {}: {msg}", path.display());
}
