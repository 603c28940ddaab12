//! Loading a model with its tokenizer and chat template from a Hugging Face directory or a GGUF file, and
//! saving an HF directory that transformers loads.
//!
//! HF directory files: `config.json` (required), `model.safetensors` or `model.safetensors.index.json` + shards
//! (required), `tokenizer.json` (required), `tokenizer_config.json` (special tokens, `chat_template`),
//! `chat_template.jinja` (preferred over the config's template, as in transformers 4.5x+), `generation_config.json`
//! (EOS ids, which override `config.json`'s).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tch::{Device, Kind};

use crate::chat_template::ChatTemplate;
use crate::config::ModelConfig;
use crate::decoder::Decoder;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::gguf_weights::GgufWeights;
use crate::safetensors_io::{SafetensorsWeights, write_safetensors};
use crate::tokenizer::Tokenizer;

/// A decoder with everything needed to talk to it.
#[derive(Debug)]
pub struct LoadedModel {
    /// The network.
    pub decoder: Decoder,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Its chat template, when the checkpoint has one.
    pub chat_template: Option<ChatTemplate>,
    /// Token ids that end a generation (generation_config.json, else config.json, else the tokenizer's EOS).
    pub eos_token_ids: Vec<i64>,
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(
            serde_json::from_str(&text).map_err(|source| ModelError::Json { path: path.to_path_buf(), source })?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ModelError::io(path, e)),
    }
}

fn ids(v: Option<&Value>) -> Vec<i64> {
    match v {
        Some(Value::Number(n)) => n.as_i64().into_iter().collect(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_i64).collect(),
        _ => Vec::new(),
    }
}

/// Loads an HF directory or a `.gguf` file (decided by whether `path` is a directory) in dtype `kind` on `device`.
pub fn load_model(path: &Path, kind: Kind, device: Device) -> Result<LoadedModel> {
    if path.is_dir() {
        load_hf_dir(path, kind, device)
    } else if path.exists() {
        load_gguf(path, kind, device)
    } else {
        Err(ModelError::MissingFile { path: path.to_path_buf() })
    }
}

/// Loads a Hugging Face model directory.
pub fn load_hf_dir(dir: &Path, kind: Kind, device: Device) -> Result<LoadedModel> {
    let config_path = dir.join("config.json");
    let config = ModelConfig::from_file(&config_path).map_err(|e| vision_language_hint(&config_path, e))?;
    let mut weights = SafetensorsWeights::open_dir(dir)?;
    let tok_config = read_json(&dir.join("tokenizer_config.json"))?;
    let tokenizer = Tokenizer::from_files(&dir.join("tokenizer.json"), tok_config.as_ref())?;
    let jinja = dir.join("chat_template.jinja");
    let template_source = if jinja.exists() {
        Some((std::fs::read_to_string(&jinja).map_err(|e| ModelError::io(&jinja, e))?, jinja.display().to_string()))
    } else {
        let name = format!("{} chat_template", dir.join("tokenizer_config.json").display());
        tok_config.as_ref().and_then(|c| c.get("chat_template")).and_then(template_from_config).map(|s| (s, name))
    };
    let chat_template = template_source
        .map(|(source, name)| {
            ChatTemplate::new(&source, tokenizer.bos_token(), tokenizer.eos_token())
                .map(|t| t.named(name.clone()))
                .map_err(|e| ModelError::ChatTemplate(format!("{name}: {e}")))
        })
        .transpose()?;
    let generation = read_json(&dir.join("generation_config.json"))?;
    let mut eos_token_ids = ids(generation.as_ref().and_then(|g| g.get("eos_token_id")));
    if eos_token_ids.is_empty() {
        eos_token_ids = config.eos_token_ids.clone();
    }
    if eos_token_ids.is_empty() {
        eos_token_ids.extend(tokenizer.eos_token_id().map(i64::from));
    }
    let decoder = Decoder::load(config, &mut weights, kind, device)?;
    Ok(LoadedModel { decoder, tokenizer, chat_template, eos_token_ids })
}

/// A Qwen2.5-VL directory is refused by the text-only loader with a message saying where it does load, rather
/// than as an unknown architecture.
fn vision_language_hint(config_path: &Path, err: ModelError) -> ModelError {
    match err.cause() {
        ModelError::UnknownArchitecture { architecture, .. } if architecture == "qwen2_5_vl" => {
            ModelError::InvalidFile {
                path: config_path.to_path_buf(),
                reason: "`model_type` qwen2_5_vl is a vision-language model: trinity_model::vision::Qwen25Vl loads \
                         it, but the text-only loader, and so the CLI, engine and trainer, do not take one yet"
                    .into(),
            }
        }
        _ => err,
    }
}

/// `chat_template` in tokenizer_config.json is a string, or a list of `{name, template}` (we take `default`).
fn template_from_config(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|e| e.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|e| e.get("template"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    }
}

/// Loads a GGUF file: config, dequantized weights, tokenizer and chat template from its metadata.
pub fn load_gguf(path: &Path, kind: Kind, device: Device) -> Result<LoadedModel> {
    let gguf = GgufFile::open(path)?;
    // Metadata errors name the key, tensor errors the tensor; here they also name the file.
    let in_file = |e: ModelError| match e {
        ModelError::Metadata { key, reason } => ModelError::gguf(path, format!("metadata key `{key}`: {reason}")),
        other => ModelError::in_file(path, other),
    };
    let config = ModelConfig::from_gguf(&gguf).map_err(in_file)?;
    let tokenizer = Tokenizer::from_gguf(&gguf).map_err(in_file)?;
    let chat_template = gguf
        .get("tokenizer.chat_template")
        .and_then(|v| v.as_str())
        .map(|s| {
            let name = format!("{} tokenizer.chat_template", path.display());
            ChatTemplate::new(s, tokenizer.bos_token(), tokenizer.eos_token())
                .map(|t| t.named(name.clone()))
                .map_err(|e| ModelError::ChatTemplate(format!("{name}: {e}")))
        })
        .transpose()?;
    let mut eos_token_ids = config.eos_token_ids.clone();
    if eos_token_ids.is_empty() {
        eos_token_ids.extend(tokenizer.eos_token_id().map(i64::from));
    }
    let decoder = {
        let mut source = GgufWeights::new(&gguf, &config);
        Decoder::load(config.clone(), &mut source, kind, device).map_err(in_file)?
    };
    Ok(LoadedModel { decoder, tokenizer, chat_template, eos_token_ids })
}

fn dtype_name(kind: Kind) -> &'static str {
    match kind {
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        Kind::Double => "float64",
        _ => "float32",
    }
}

/// Writes `model` as an HF directory at `dir` (created if needed): `config.json`, `model.safetensors` (weights
/// in the model's dtype; a tied `lm_head` is not stored, as transformers does), `generation_config.json`,
/// `tokenizer.json` and `tokenizer_config.json` (with the chat template).
pub fn save_hf_dir(model: &LoadedModel, dir: &Path) -> Result<()> {
    save_hf_parts(&model.decoder, &model.tokenizer, model.chat_template.as_ref(), &model.eos_token_ids, dir)
}

/// As [`save_hf_dir`], from the parts, for callers whose decoder lives elsewhere (the trainer owns the policy
/// it checkpoints).
pub fn save_hf_parts(
    decoder: &Decoder,
    tokenizer: &Tokenizer,
    chat_template: Option<&ChatTemplate>,
    eos_token_ids: &[i64],
    dir: &Path,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let config = decoder.config();
    let mut cfg = config.to_json(dtype_name(decoder.kind()));
    if let Some(obj) = cfg.as_object_mut() {
        match eos_token_ids {
            [one] => obj.insert("eos_token_id".into(), json!(one)),
            [] => None,
            many => obj.insert("eos_token_id".into(), json!(many)),
        };
    }
    write_json(&dir.join("config.json"), &cfg)?;
    let mut generation = json!({"_from_model_config": false});
    if let Some(obj) = generation.as_object_mut() {
        if let Some(b) = config.bos_token_id {
            obj.insert("bos_token_id".into(), json!(b));
        }
        match eos_token_ids {
            [] => None,
            [one] => obj.insert("eos_token_id".into(), json!(one)),
            many => obj.insert("eos_token_id".into(), json!(many)),
        };
        if let Some(p) = tokenizer.pad_token_id() {
            obj.insert("pad_token_id".into(), json!(p));
        }
    }
    write_json(&dir.join("generation_config.json"), &generation)?;
    write_safetensors(&dir.join("model.safetensors"), &decoder.merged_parameters()?)?;
    tokenizer.save(dir, chat_template.map(ChatTemplate::source))
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    let text =
        serde_json::to_string_pretty(v).map_err(|source| ModelError::Json { path: path.to_path_buf(), source })?;
    std::fs::write(path, text + "\n").map_err(|e| ModelError::io(path, e))
}

/// Converts a GGUF file into an HF directory with f32 weights (dequantized values are exact in f32).
pub fn convert_gguf_to_hf(gguf: &Path, out_dir: &Path) -> Result<PathBuf> {
    let model = load_gguf(gguf, Kind::Float, Device::Cpu)?;
    save_hf_dir(&model, out_dir)?;
    Ok(out_dir.to_path_buf())
}

/// Merges the PEFT LoRA adapter in `adapter` into `base` (an HF directory or GGUF file) and writes the merged
/// model as an f32 HF directory `out_dir`: `W + (alpha/r)·B A` for every adapted projection, as PEFT's
/// `merge_and_unload` computes it.
pub fn merge_adapter_to_hf(base: &Path, adapter: &Path, out_dir: &Path) -> Result<PathBuf> {
    let mut model = load_model(base, Kind::Float, Device::Cpu)?;
    model.decoder.load_lora(adapter)?;
    model.decoder.merge_lora()?;
    save_hf_dir(&model, out_dir)?;
    Ok(out_dir.to_path_buf())
}

/// The base model a PEFT adapter directory names (`base_model_name_or_path` of its `adapter_config.json`).
pub fn adapter_base_model(adapter: &Path) -> Result<Option<PathBuf>> {
    let path = adapter.join(crate::lora::ADAPTER_CONFIG);
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
    let v: Value = serde_json::from_str(&text).map_err(|source| ModelError::Json { path, source })?;
    Ok(v.get("base_model_name_or_path").and_then(Value::as_str).filter(|s| !s.is_empty()).map(PathBuf::from))
}
