//! The configuration of a Qwen2.5-VL checkpoint (`model_type: qwen2_5_vl`): its text decoder as a Qwen2
//! [`ModelConfig`] plus the multimodal rotary sections, its vision tower, and the special token ids.
//!
//! Two `config.json` layouts exist: transformers 4.x writes the text settings at the top level (with
//! `rope_scaling: {type: mrope, mrope_section}`), transformers 5 nests them under `text_config` (with
//! `rope_parameters`). Both are read: the top-level keys, overlaid with `text_config`'s.

use std::path::Path;

use serde_json::{Map, Value};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// The activation of the vision MLP (`vision_config.hidden_act`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VisionAct {
    /// `silu` (Qwen2.5-VL's).
    Silu,
    /// `gelu` (erf form).
    Gelu,
    /// `gelu_pytorch_tanh`.
    GeluTanh,
}

/// The vision tower's shape (`vision_config`).
#[derive(Debug, Clone, PartialEq)]
pub struct VisionConfig {
    /// Number of vision blocks.
    pub depth: i64,
    /// Width of the vision blocks.
    pub hidden_size: i64,
    /// Width of the vision MLPs.
    pub intermediate_size: i64,
    /// Attention heads of the vision blocks.
    pub num_heads: i64,
    /// Colour channels of a patch (3).
    pub in_channels: i64,
    /// Side of a square patch, in pixels.
    pub patch_size: i64,
    /// Frames one patch spans (an image is repeated to fill them).
    pub temporal_patch_size: i64,
    /// Side of the square of patches the merger folds into one language-model token.
    pub spatial_merge_size: i64,
    /// Side of an attention window, in pixels.
    pub window_size: i64,
    /// The blocks that attend over the whole image instead of within windows.
    pub fullatt_block_indexes: Vec<i64>,
    /// Width of the merger's output (the text model's hidden size).
    pub out_hidden_size: i64,
    /// Activation of the vision MLPs.
    pub hidden_act: VisionAct,
    /// Base of the vision tower's 2-D rotary embedding.
    pub rope_theta: f64,
    /// Temporal positions per second of video (for video inputs; images do not use it).
    pub tokens_per_second: f64,
}

impl VisionConfig {
    /// Per-head width.
    pub fn head_dim(&self) -> i64 {
        self.hidden_size / self.num_heads
    }

    /// Values of one flattened patch: `in_channels · temporal_patch_size · patch_size²`.
    pub fn patch_dim(&self) -> i64 {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Patches folded into one language-model token (`spatial_merge_size²`).
    pub fn merge_unit(&self) -> i64 {
        self.spatial_merge_size * self.spatial_merge_size
    }

    fn from_json(v: &Map<String, Value>) -> Result<Self> {
        let int = |key: &str, default: Option<i64>| -> Result<i64> {
            match v.get(key) {
                Some(Value::Number(n)) => n.as_i64().ok_or_else(|| meta(key, "expected an integer")),
                None | Some(Value::Null) => default.ok_or_else(|| meta(key, "absent")),
                Some(_) => Err(meta(key, "expected an integer")),
            }
        };
        let depth = int("depth", None)?;
        let fullatt_block_indexes = match v.get("fullatt_block_indexes") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|i| i.as_i64().ok_or_else(|| meta("fullatt_block_indexes", "expected a list of integers")))
                .collect::<Result<Vec<_>>>()?,
            None | Some(Value::Null) => Vec::new(),
            Some(_) => return Err(meta("fullatt_block_indexes", "expected a list of integers")),
        };
        let hidden_act = match v.get("hidden_act").and_then(Value::as_str).unwrap_or("silu") {
            "silu" | "swish" => VisionAct::Silu,
            "gelu" => VisionAct::Gelu,
            "gelu_pytorch_tanh" => VisionAct::GeluTanh,
            other => {
                return Err(ModelError::UnsupportedConfig {
                    key: "vision_config.hidden_act".into(),
                    reason: format!("`{other}` is not implemented (silu, gelu, gelu_pytorch_tanh are)"),
                });
            }
        };
        let rope_theta = v
            .get("rope_parameters")
            .and_then(|r| r.get("rope_theta"))
            .and_then(Value::as_f64)
            .or_else(|| v.get("rope_theta").and_then(Value::as_f64))
            .unwrap_or(10000.0);
        let config = Self {
            depth,
            hidden_size: int("hidden_size", None)?,
            intermediate_size: int("intermediate_size", None)?,
            num_heads: int("num_heads", None)?,
            in_channels: int("in_channels", Some(3))?,
            patch_size: int("patch_size", Some(14))?,
            temporal_patch_size: int("temporal_patch_size", Some(2))?,
            spatial_merge_size: int("spatial_merge_size", Some(2))?,
            window_size: int("window_size", Some(112))?,
            fullatt_block_indexes,
            out_hidden_size: int("out_hidden_size", None)?,
            hidden_act,
            rope_theta,
            tokens_per_second: v.get("tokens_per_second").and_then(Value::as_f64).unwrap_or(4.0),
        };
        config.validate()?;
        Ok(config)
    }

    /// Refuses shapes the encoder cannot be built from; every error names the `vision_config` key.
    pub fn validate(&self) -> Result<()> {
        let positive = |key: &str, value: i64| {
            if (1..=1 << 20).contains(&value) {
                Ok(())
            } else {
                Err(meta(key, &format!("must be between 1 and {}, found {value}", 1 << 20)))
            }
        };
        for (key, value) in [
            ("depth", self.depth),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_heads", self.num_heads),
            ("in_channels", self.in_channels),
            ("patch_size", self.patch_size),
            ("temporal_patch_size", self.temporal_patch_size),
            ("spatial_merge_size", self.spatial_merge_size),
            ("window_size", self.window_size),
            ("out_hidden_size", self.out_hidden_size),
        ] {
            positive(key, value)?;
        }
        if self.hidden_size % self.num_heads != 0 || self.head_dim() % 4 != 0 {
            return Err(meta(
                "num_heads",
                &format!(
                    "hidden_size {} over {} heads must give a head width divisible by 4 (the 2-D rotary \
                     embedding rotates halves of the row and column halves)",
                    self.hidden_size, self.num_heads
                ),
            ));
        }
        let unit = self.spatial_merge_size * self.patch_size;
        if self.window_size % unit != 0 {
            return Err(meta(
                "window_size",
                &format!("{} px is not a multiple of spatial_merge_size × patch_size = {unit} px", self.window_size),
            ));
        }
        if let Some(bad) = self.fullatt_block_indexes.iter().find(|&&i| i < 0 || i >= self.depth) {
            return Err(meta(
                "fullatt_block_indexes",
                &format!("{bad} is not a block index below depth {}", self.depth),
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(meta("rope_parameters.rope_theta", "must be a finite number above 0"));
        }
        Ok(())
    }
}

fn meta(key: &str, reason: &str) -> ModelError {
    ModelError::Metadata { key: format!("vision_config.{key}"), reason: reason.to_owned() }
}

/// A Qwen2.5-VL checkpoint's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct VlConfig {
    /// The text decoder (a Qwen2 decoder: q/k/v biases, plain RoPE frequencies).
    pub text: ModelConfig,
    /// The vision tower.
    pub vision: VisionConfig,
    /// How many rotary frequency pairs take the temporal, height and width positions, in that order (repeating
    /// if longer); they sum to `head_dim / 2`.
    pub mrope_section: Vec<i64>,
    /// The placeholder token an image's merged patches replace.
    pub image_token_id: i64,
    /// The placeholder token of video frames.
    pub video_token_id: i64,
    /// The token before an image's placeholders.
    pub vision_start_token_id: i64,
    /// The token after them.
    pub vision_end_token_id: i64,
}

impl VlConfig {
    /// Whether a `config.json` value describes a Qwen2.5-VL model.
    pub fn is_vl(value: &Value) -> bool {
        value.get("model_type").and_then(Value::as_str) == Some("qwen2_5_vl")
    }

    /// Reads a `config.json` file; errors name the file and the key.
    pub fn from_file(path: &Path) -> Result<Self> {
        crate::config::read_config_json(path, Self::from_json)
    }

    /// Parses a `config.json` value of either layout.
    pub fn from_json(value: &Value) -> Result<Self> {
        let obj = value.as_object().ok_or_else(|| ModelError::Metadata {
            key: "config.json".into(),
            reason: "expected a JSON object".into(),
        })?;
        match obj.get("model_type").and_then(Value::as_str) {
            Some("qwen2_5_vl") => {}
            Some(other) => {
                return Err(ModelError::UnknownArchitecture {
                    architecture: other.to_owned(),
                    supported: "qwen2_5_vl",
                });
            }
            None => return Err(ModelError::Metadata { key: "model_type".into(), reason: "absent".into() }),
        }
        // The text settings: the top level (4.x layout) overlaid with `text_config` (5.x layout).
        let mut text: Map<String, Value> = obj
            .iter()
            .filter(|(k, _)| *k != "text_config" && *k != "vision_config")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Some(nested) = obj.get("text_config") {
            let nested = nested.as_object().ok_or_else(|| ModelError::Metadata {
                key: "text_config".into(),
                reason: "expected an object".into(),
            })?;
            for (k, v) in nested {
                // transformers ties the head when either level asks for it.
                if k == "tie_word_embeddings" && text.get(k).and_then(Value::as_bool) == Some(true) {
                    continue;
                }
                text.insert(k.clone(), v.clone());
            }
        }
        let mrope_section = take_mrope_section(&mut text)?;
        text.insert("model_type".into(), Value::from("qwen2"));
        let text = ModelConfig::from_json(&Value::Object(text)).map_err(|e| match e {
            ModelError::Metadata { key, reason } => ModelError::Metadata { key: format!("text_config.{key}"), reason },
            other => other,
        })?;
        let half = text.head_dim / 2;
        if mrope_section.iter().any(|&s| s < 1) || mrope_section.iter().sum::<i64>() != half {
            return Err(ModelError::Metadata {
                key: "text_config.rope_parameters.mrope_section".into(),
                reason: format!("{mrope_section:?} must be positive and sum to head_dim / 2 = {half}"),
            });
        }
        let vision = obj.get("vision_config").and_then(Value::as_object).ok_or_else(|| ModelError::Metadata {
            key: "vision_config".into(),
            reason: "absent or not an object".into(),
        })?;
        let vision = VisionConfig::from_json(vision)?;
        if vision.out_hidden_size != text.hidden_size {
            return Err(meta(
                "out_hidden_size",
                &format!("{} must equal the text model's hidden_size {}", vision.out_hidden_size, text.hidden_size),
            ));
        }
        let token = |key: &str, default: i64| -> Result<i64> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => {
                    v.as_i64().filter(|&id| (0..text.vocab_size).contains(&id)).ok_or_else(|| ModelError::Metadata {
                        key: key.to_owned(),
                        reason: format!("expected a token id below vocab_size {}", text.vocab_size),
                    })
                }
            }
        };
        Ok(Self {
            image_token_id: token("image_token_id", 151655)?,
            video_token_id: token("video_token_id", 151656)?,
            vision_start_token_id: token("vision_start_token_id", 151652)?,
            vision_end_token_id: token("vision_end_token_id", 151653)?,
            text,
            vision,
            mrope_section,
        })
    }
}

/// Removes the multimodal rotary settings from the text settings (leaving a plain RoPE base the Qwen2 parser
/// reads) and returns `mrope_section`.
fn take_mrope_section(text: &mut Map<String, Value>) -> Result<Vec<i64>> {
    let key =
        if text.get("rope_parameters").is_some_and(Value::is_object) { "rope_parameters" } else { "rope_scaling" };
    let Some(Value::Object(rope)) = text.remove(key) else {
        return Err(ModelError::Metadata {
            key: "text_config.rope_parameters.mrope_section".into(),
            reason: "absent (Qwen2.5-VL needs the multimodal rotary sections)".into(),
        });
    };
    let ty = rope.get("rope_type").or_else(|| rope.get("type")).and_then(Value::as_str).unwrap_or("default");
    if ty != "default" && ty != "mrope" {
        return Err(ModelError::UnsupportedConfig {
            key: format!("text_config.{key}.rope_type"),
            reason: format!("`{ty}` is not implemented for Qwen2.5-VL (default / mrope is)"),
        });
    }
    if let Some(theta) = rope.get("rope_theta") {
        text.insert("rope_theta".into(), theta.clone());
    }
    let section = rope.get("mrope_section").and_then(Value::as_array).ok_or_else(|| ModelError::Metadata {
        key: format!("text_config.{key}.mrope_section"),
        reason: "absent or not a list".into(),
    })?;
    section
        .iter()
        .map(|s| {
            s.as_i64().ok_or_else(|| ModelError::Metadata {
                key: format!("text_config.{key}.mrope_section"),
                reason: "expected a list of integers".into(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn vision() -> Value {
        json!({"depth": 2, "hidden_size": 16, "intermediate_size": 24, "num_heads": 2, "patch_size": 14,
               "temporal_patch_size": 2, "spatial_merge_size": 2, "window_size": 56, "fullatt_block_indexes": [1],
               "out_hidden_size": 16, "hidden_act": "silu"})
    }

    fn nested() -> Value {
        json!({
            "model_type": "qwen2_5_vl", "image_token_id": 60, "video_token_id": 61, "vision_start_token_id": 58,
            "vision_end_token_id": 59, "tie_word_embeddings": false,
            "text_config": {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
                "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-6,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1]}},
            "vision_config": vision(),
        })
    }

    #[test]
    fn both_layouts_give_the_same_config() {
        let a = VlConfig::from_json(&nested()).unwrap();
        assert_eq!(a.mrope_section, vec![2, 1, 1]);
        assert_eq!(a.text.rope_theta, 1e6);
        assert_eq!(a.text.head_dim, 8);
        assert!(a.text.qkv_bias && !a.text.tie_word_embeddings);
        assert_eq!(a.vision.fullatt_block_indexes, vec![1]);
        assert_eq!(a.vision.rope_theta, 10000.0);
        assert_eq!(a.vision.patch_dim(), 3 * 2 * 14 * 14);
        let mut flat = nested();
        let text = flat.as_object_mut().unwrap().remove("text_config").unwrap();
        for (k, v) in text.as_object().unwrap() {
            flat[k] = v.clone();
        }
        flat.as_object_mut().unwrap().remove("rope_parameters");
        flat["rope_scaling"] = json!({"type": "mrope", "mrope_section": [2, 1, 1]});
        flat["rope_theta"] = json!(1e6);
        assert_eq!(VlConfig::from_json(&flat).unwrap(), a);
    }

    #[test]
    fn bad_values_are_named() {
        let cases: [(&str, Value, &str); 5] = [
            ("/text_config/rope_parameters/mrope_section", json!([2, 2, 1]), "mrope_section"),
            ("/vision_config/window_size", json!(50), "vision_config.window_size"),
            ("/vision_config/fullatt_block_indexes", json!([2]), "vision_config.fullatt_block_indexes"),
            ("/vision_config/out_hidden_size", json!(8), "vision_config.out_hidden_size"),
            ("/image_token_id", json!(64), "image_token_id"),
        ];
        for (pointer, value, key) in cases {
            let mut v = nested();
            *v.pointer_mut(pointer).unwrap() = value;
            let err = VlConfig::from_json(&v).unwrap_err().to_string();
            assert!(err.contains(key), "{pointer}: {err}");
        }
        let mut v = nested();
        v["vision_config"]["hidden_act"] = json!("quick_gelu");
        assert!(VlConfig::from_json(&v).unwrap_err().to_string().contains("vision_config.hidden_act"));
        v["model_type"] = json!("qwen3_vl");
        assert!(matches!(VlConfig::from_json(&v), Err(ModelError::UnknownArchitecture { .. })));
    }
}
