//! Named errors: missing files, unknown architectures, shape mismatches, missing tensors.

use tch::{Device, Kind};
use trinity_model::{ModelError, load_model};

use crate::helpers::*;

fn staged_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixtures().join("tiny/llama_tied")).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    dir
}

fn edit_config(dir: &std::path::Path, f: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut v = read_json(&path);
    f(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

#[test]
fn missing_files_are_named() {
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        let dir = staged_copy();
        std::fs::remove_file(dir.path().join(file)).unwrap();
        let err = load_model(dir.path(), Kind::Float, Device::Cpu).unwrap_err();
        assert!(matches!(err, ModelError::MissingFile { ref path } if path.ends_with(file)), "{file}: {err}");
        assert!(err.to_string().contains(file));
    }
    let err = load_model(std::path::Path::new("/nonexistent/model.gguf"), Kind::Float, Device::Cpu).unwrap_err();
    assert!(matches!(err, ModelError::MissingFile { .. }), "{err}");
}

#[test]
fn unknown_architecture_is_named() {
    let dir = staged_copy();
    edit_config(dir.path(), |v| v["model_type"] = "gpt_neox".into());
    let err = load_model(dir.path(), Kind::Float, Device::Cpu).unwrap_err();
    assert!(
        matches!(err.cause(), ModelError::UnknownArchitecture { architecture, .. } if architecture == "gpt_neox"),
        "{err}"
    );
    assert!(err.to_string().contains("gpt_neox") && err.to_string().contains("config.json"), "{err}");
}

#[test]
fn shape_mismatch_and_missing_tensor_are_named() {
    let dir = staged_copy();
    edit_config(dir.path(), |v| v["intermediate_size"] = 40.into());
    let err = load_model(dir.path(), Kind::Float, Device::Cpu).unwrap_err();
    assert!(
        matches!(err, ModelError::ShapeMismatch { ref tensor, ref expected, ref found }
            if tensor == "model.layers.0.mlp.gate_proj.weight" && expected == &[40, 16] && found == &[32, 16]),
        "{err}"
    );
    let dir = staged_copy();
    edit_config(dir.path(), |v| v["num_hidden_layers"] = 3.into());
    let err = load_model(dir.path(), Kind::Float, Device::Cpu).unwrap_err();
    assert!(matches!(err, ModelError::MissingTensor { ref tensor } if tensor.starts_with("model.layers.2.")), "{err}");
}

#[test]
fn gguf_errors_about_metadata_or_tensors_name_the_file() {
    let mut bytes = std::fs::read(fixtures().join("tiny_llama.gguf")).unwrap();
    let key = b"general.architecture";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    // The value after the key: type (u32 8 = string), length (u64 5), then the 5 bytes of `llama`.
    assert_eq!(&bytes[at + 12..at + 17], b"llama");
    bytes[at + 12..at + 17].copy_from_slice(b"mamba");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("renamed.gguf");
    std::fs::write(&path, bytes).unwrap();
    let err = load_model(&path, Kind::Float, Device::Cpu).unwrap_err();
    assert!(matches!(err.cause(), ModelError::UnknownArchitecture { architecture, .. } if architecture == "mamba"));
    assert!(err.to_string().contains("renamed.gguf"), "{err}");
}
