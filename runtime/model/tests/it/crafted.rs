//! Crafted model files: thousands of random mutations (fixed seed) of a tiny GGUF file and of a tiny Hugging
//! Face directory's JSON files. Each must load or be refused with an error; none may panic. What loads is used
//! too (tokenize, render the chat template, one forward pass), since a crafted value that passes loading could
//! still break the first call.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};
use trinity_model::{ChatMessage, GgufFile, LoadedModel, ModelError, load_model};

use crate::helpers::*;

/// A fixed-seed stream, so a failure reproduces.
struct Rng(trinity_rng::SplitMix64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(trinity_rng::SplitMix64::new(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Values that break naive size arithmetic.
const EXTREME_U64: [u64; 9] = [0, 1, 2, 7, 1 << 31, u32::MAX as u64, 1 << 40, 1 << 63, u64::MAX];

/// One random edit of a GGUF file; most land in the header (before `header_len`), where lengths and dims live.
fn mutate_bytes(bytes: &mut Vec<u8>, header_len: usize, rng: &mut Rng) {
    let span = if rng.below(5) == 0 { bytes.len() } else { header_len.min(bytes.len()) };
    let at = rng.below(span);
    match rng.below(6) {
        0 => {
            for _ in 0..1 + rng.below(8) {
                let i = rng.below(span);
                bytes[i] = rng.next() as u8;
            }
        }
        1 | 2 => {
            let value = EXTREME_U64[rng.below(EXTREME_U64.len())].to_le_bytes();
            let width = if rng.below(2) == 0 { 8 } else { 4 };
            for (k, b) in value.iter().take(width).enumerate() {
                if let Some(slot) = bytes.get_mut(at + k) {
                    *slot = *b;
                }
            }
        }
        3 => bytes.truncate(at),
        4 => {
            let end = (at + rng.below(64)).min(bytes.len());
            bytes.drain(at..end);
        }
        _ => {
            let noise: Vec<u8> = (0..rng.below(64)).map(|_| rng.next() as u8).collect();
            bytes.splice(at..at, noise);
        }
    }
}

/// Exercises what loaded: tokenizing, the chat template and a forward pass, each allowed to fail, none to panic.
fn use_model(model: &LoadedModel) {
    let _ = model.tokenizer.encode("Hello, wörld 123 <|im_start|>", false);
    if let Some(template) = &model.chat_template {
        let _ = template.apply(&[ChatMessage::new("user", "hi")], true);
    }
    let vocab = model.decoder.config().vocab_size.clamp(1, 4);
    let ids = Tensor::from_slice(&[0i64, vocab - 1, 0]).view([1, 3]);
    let _ = model.decoder.forward(&ids, None);
}

/// Loads `path` and uses the model, turning a panic into a test failure that names the case.
fn load_without_panic(path: &Path, case: &str) -> Result<(), ModelError> {
    match catch_unwind(AssertUnwindSafe(|| {
        let model = load_model(path, Kind::Float, Device::Cpu)?;
        use_model(&model);
        Ok(())
    })) {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            panic!("{case}: loading panicked: {message}");
        }
    }
}

#[test]
fn mutated_gguf_files_never_panic() {
    let original = std::fs::read(fixtures().join("tiny_llama.gguf")).unwrap();
    let header_len = {
        let g = GgufFile::open(fixtures().join("tiny_llama.gguf")).unwrap();
        g.tensors().iter().map(|t| t.offset).min().unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crafted.gguf");
    let mut rng = Rng::new(0x5eed_0001);
    let (mut loaded, mut refused) = (0, 0);
    for case in 0..1500 {
        let mut bytes = original.clone();
        for _ in 0..1 + rng.below(3) {
            mutate_bytes(&mut bytes, header_len, &mut rng);
        }
        std::fs::write(&path, &bytes).unwrap();
        match load_without_panic(&path, &format!("gguf case {case}")) {
            Ok(()) => loaded += 1,
            Err(_) => refused += 1,
        }
    }
    println!("mutated gguf: {loaded} loaded, {refused} refused, no panic");
    assert!(refused > 0, "no mutation was refused: the mutations do not reach the header");
}

/// One random edit of a JSON tree: a leaf or container replaced by an extreme value, or an object key removed.
fn mutate_json(value: &mut Value, rng: &mut Rng) {
    let mut nodes = 0;
    count_nodes(value, &mut nodes);
    let mut target = rng.below(nodes);
    let replacement = match rng.below(14) {
        0 => json!(0),
        1 => json!(-1),
        2 => json!(i64::MAX),
        3 => json!(u64::MAX),
        4 => json!(1e300),
        5 => json!(-0.0),
        6 => json!(0.5),
        7 => json!("x"),
        8 => Value::Null,
        9 => json!([]),
        10 => json!({}),
        11 => json!(1_i64 << 40),
        12 => json!(3),
        _ => Value::String("\u{0}".repeat(3)),
    };
    let remove = rng.below(4) == 0;
    edit_node(value, &mut target, replacement, remove);
}

fn count_nodes(value: &Value, n: &mut usize) {
    *n += 1;
    match value {
        Value::Array(items) => items.iter().for_each(|v| count_nodes(v, n)),
        Value::Object(map) => map.values().for_each(|v| count_nodes(v, n)),
        _ => {}
    }
}

/// Replaces (or, inside an object, removes) the `target`-th node in pre-order; returns whether it was done.
fn edit_node(value: &mut Value, target: &mut usize, replacement: Value, remove: bool) -> bool {
    if *target == 0 {
        *value = replacement;
        return true;
    }
    *target -= 1;
    match value {
        Value::Array(items) => {
            for item in items.iter_mut() {
                if edit_node(item, target, replacement.clone(), remove) {
                    return true;
                }
            }
        }
        Value::Object(map) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                if *target == 0 && remove {
                    map.remove(&key);
                    return true;
                }
                if let Some(child) = map.get_mut(&key)
                    && edit_node(child, target, replacement.clone(), remove)
                {
                    return true;
                }
            }
        }
        _ => {}
    }
    false
}

#[test]
fn mutated_hf_json_files_never_panic() {
    let source = fixtures().join("tiny/llama_tied");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    let files = ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"];
    let originals: Vec<Value> = files.iter().map(|f| read_json(&source.join(f))).collect();
    let mut rng = Rng::new(0x5eed_0002);
    let (mut loaded, mut refused) = (0, 0);
    for case in 0..600 {
        let which = rng.below(files.len());
        let mut value = originals[which].clone();
        for _ in 0..1 + rng.below(3) {
            mutate_json(&mut value, &mut rng);
        }
        std::fs::write(dir.path().join(files[which]), value.to_string()).unwrap();
        match load_without_panic(dir.path(), &format!("{} case {case}: {value}", files[which])) {
            Ok(()) => loaded += 1,
            Err(_) => refused += 1,
        }
        std::fs::write(dir.path().join(files[which]), originals[which].to_string()).unwrap();
    }
    println!("mutated hf json: {loaded} loaded, {refused} refused, no panic");
    assert!(refused > 0 && loaded > 0, "{loaded} loaded, {refused} refused");
}

#[test]
fn zero_heads_in_config_json_is_a_named_error() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixtures().join("tiny/llama_tied")).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    let config = dir.path().join("config.json");
    let mut value = read_json(&config);
    value["num_attention_heads"] = json!(0);
    value.as_object_mut().unwrap().remove("head_dim");
    std::fs::write(&config, value.to_string()).unwrap();
    let err = load_model(dir.path(), Kind::Float, Device::Cpu).unwrap_err();
    assert!(matches!(err, ModelError::InvalidFile { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("config.json") && text.contains("`num_attention_heads`"), "{text}");
}

#[test]
fn a_tensor_past_the_end_of_a_gguf_file_is_named() {
    let mut bytes = std::fs::read(fixtures().join("tiny_llama.gguf")).unwrap();
    let g = GgufFile::open(fixtures().join("tiny_llama.gguf")).unwrap();
    let last = g.tensors().iter().max_by_key(|t| t.offset).unwrap().clone();
    drop(g);
    bytes.truncate(last.offset + last.n_bytes / 2);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let err = GgufFile::open(&path).unwrap_err().to_string();
    assert!(err.contains("short.gguf") && err.contains(&format!("`{}`", last.name)), "{err}");
    assert!(err.contains("past the end"), "{err}");
}
