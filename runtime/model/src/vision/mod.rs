//! Vision-language models: Qwen2.5-VL (`Qwen2_5_VLForConditionalGeneration`, `model_type: qwen2_5_vl`).
//!
//! The model is the Qwen2 text [`Decoder`] with two changes to its input: the embeddings of the image
//! placeholder tokens are replaced by the vision tower's outputs ([`VisionEncoder`], fed by
//! [`ImageProcessor`]), and the rotary positions are 3-D ([`mrope`]). A prompt without images runs exactly as
//! the plain decoder (every 3-D position of a text token has equal components), so text-only scoring and
//! generation can use the [`Decoder`] itself.
//!
//! ```text
//! let vl = Qwen25Vl::load_dir(dir, Kind::Float, Device::Cpu)?;
//! let image = vl.processor.preprocess(&rgb, height, width)?;              // pixel_values, grid_thw
//! // the prompt holds vision_start, grid.prod() / merge² image placeholders, vision_end
//! let logits = vl.forward(&ids /*[B,T]*/, None, Some((&image.pixel_values, &[image.grid_thw])))?;
//! ```

pub mod config;
pub mod encoder;
pub mod mrope;
pub mod preprocess;

use std::path::Path;

use serde_json::Value;
use tch::{Device, Kind, Tensor};

pub use config::{VisionAct, VisionConfig, VlConfig};
pub use encoder::VisionEncoder;
pub use preprocess::{ImagePatches, ImageProcessor};

use crate::decoder::Decoder;
use crate::error::{ModelError, Result};
use crate::safetensors_io::SafetensorsWeights;
use crate::weights::WeightSource;

/// The text decoder's weights of a VL checkpoint under the plain decoder's names: transformers 4.x and the
/// released checkpoints store them as `model.layers.*` (as the decoder names them), transformers 5's module
/// path is `model.language_model.*`.
struct TextWeights<'a>(&'a mut SafetensorsWeights);

impl WeightSource for TextWeights<'_> {
    fn load(&mut self, name: &str, shape: &[i64]) -> Result<Tensor> {
        if !self.0.contains(name)
            && let Some(rest) = name.strip_prefix("model.")
        {
            let nested = format!("model.language_model.{rest}");
            if self.0.contains(&nested) {
                return self.0.load(&nested, shape);
            }
        }
        self.0.load(name, shape)
    }
}

/// Expands each image placeholder of a rendered prompt to the tokens its image takes, as the processor does
/// before tokenized prompts reach the model: chat templates write one `<|image_pad|>` per image between
/// `<|vision_start|>` and `<|vision_end|>`, the model needs `t · h · w / merge²` of them (`grids` in order,
/// `[t, h, w]` patches each). Errors when the prompt has more or fewer placeholders than images.
pub fn expand_image_placeholders(config: &VlConfig, ids: &[i64], grids: &[[i64; 3]]) -> Result<Vec<i64>> {
    let unit = config.vision.merge_unit();
    let mut out = Vec::with_capacity(ids.len());
    let mut images = grids.iter();
    for &id in ids {
        if id != config.image_token_id {
            out.push(id);
            continue;
        }
        let [t, h, w] = images.next().ok_or_else(|| {
            ModelError::InvalidInput(format!("the prompt has more image placeholders than the {} images", grids.len()))
        })?;
        out.extend(std::iter::repeat_n(id, (t * h * w / unit) as usize));
    }
    if images.len() > 0 {
        return Err(ModelError::InvalidInput(format!(
            "{} images but only {} placeholders in the prompt",
            grids.len(),
            grids.len() - images.len()
        )));
    }
    Ok(out)
}

/// Images for one forward: their patches one after another (`[patches, patch_dim]`) and each one's grid.
pub type Images<'a> = (&'a Tensor, &'a [[i64; 3]]);

/// A Qwen2.5-VL model: the text decoder, the vision tower and the image processor.
#[derive(Debug)]
pub struct Qwen25Vl {
    /// Token ids, placeholders and shapes.
    pub config: VlConfig,
    /// The text decoder (its rotary tables are replaced by the 3-D ones for prompts with images).
    pub decoder: Decoder,
    /// The vision tower.
    pub vision: VisionEncoder,
    /// The image processor (`preprocessor_config.json`, Qwen2-VL's defaults without one).
    pub processor: ImageProcessor,
}

impl Qwen25Vl {
    /// Loads an HF directory (`config.json`, safetensors weights, optional `preprocessor_config.json`).
    pub fn load_dir(dir: &Path, kind: Kind, device: Device) -> Result<Self> {
        let config = VlConfig::from_file(&dir.join("config.json"))?;
        let mut weights = SafetensorsWeights::open_dir(dir)?;
        let pre = dir.join("preprocessor_config.json");
        let processor = match std::fs::read_to_string(&pre) {
            Ok(text) => {
                let v: Value =
                    serde_json::from_str(&text).map_err(|source| ModelError::Json { path: pre.clone(), source })?;
                ImageProcessor::from_json(&v).map_err(|e| ModelError::in_file(&pre, e))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ImageProcessor::default(),
            Err(e) => return Err(ModelError::io(&pre, e)),
        };
        let v = &config.vision;
        if (processor.patch_size, processor.temporal_patch_size, processor.merge_size)
            != (v.patch_size, v.temporal_patch_size, v.spatial_merge_size)
        {
            return Err(ModelError::InvalidFile {
                path: pre,
                reason: format!(
                    "patch_size {}, temporal_patch_size {}, merge_size {} differ from config.json's vision_config \
                     ({}, {}, {})",
                    processor.patch_size,
                    processor.temporal_patch_size,
                    processor.merge_size,
                    v.patch_size,
                    v.temporal_patch_size,
                    v.spatial_merge_size
                ),
            });
        }
        let vision = VisionEncoder::load(config.vision.clone(), &weights, kind, device)
            .map_err(|e| ModelError::in_file(dir.join("model.safetensors"), e))?;
        let decoder = Decoder::load(config.text.clone(), &mut TextWeights(&mut weights), kind, device)
            .map_err(|e| ModelError::in_file(dir.join("model.safetensors"), e))?;
        Ok(Self { config, decoder, vision, processor })
    }

    /// The input embeddings `[B, T, hidden]` of `ids` `[B, T]`: token embeddings, with the image placeholders'
    /// rows (in row-major order) replaced by the vision tower's outputs for `images`.
    pub fn embed(&self, ids: &Tensor, images: Option<Images<'_>>) -> Result<Tensor> {
        let ids = ids.f_to_device(self.decoder.device())?;
        let embeds = self.decoder.embed(&ids)?;
        let placeholders = ids.f_eq(self.config.image_token_id)?;
        let count = i64::try_from(placeholders.f_sum(Kind::Int64)?)?;
        let Some((pixel_values, grids)) = images else {
            if count > 0 {
                return Err(ModelError::InvalidInput(format!(
                    "the prompt holds {count} image placeholders (token {}) but no images were given",
                    self.config.image_token_id
                )));
            }
            return Ok(embeds);
        };
        let features = self.vision.forward(pixel_values, grids)?.f_to_kind(embeds.kind())?;
        if features.size()[0] != count {
            return Err(ModelError::InvalidInput(format!(
                "the images give {} tokens but the prompt holds {count} placeholders (token {})",
                features.size()[0],
                self.config.image_token_id
            )));
        }
        let mask = placeholders.f_unsqueeze(-1)?.f_expand_as(&embeds)?;
        Ok(embeds.f_masked_scatter(&mask, &features)?)
    }

    /// Final-normed hidden states `[B, T, hidden]` of prompts `ids` `[B, T]` (padding anywhere, marked by
    /// `attention_mask`) holding the placeholders of `images`, as transformers' forward with `mm_token_type_ids`
    /// computes them. Differentiable through the text decoder.
    pub fn forward_hidden(
        &self,
        ids: &Tensor,
        attention_mask: Option<&Tensor>,
        images: Option<Images<'_>>,
    ) -> Result<Tensor> {
        let grids: &[[i64; 3]] = images.map_or(&[], |(_, g)| g);
        let embeds = self.embed(ids, images)?;
        let (positions, _) = mrope::batch_positions(&self.config, ids, attention_mask, grids)?;
        let inv_freq = crate::rope::inv_freq(&self.config.text, self.decoder.device())?;
        let (cos, sin) = mrope::cos_sin(
            &inv_freq,
            &positions.f_to_device(self.decoder.device())?,
            &self.config.mrope_section,
            self.decoder.kind(),
        )?;
        self.decoder.forward_hidden_from_embeds(embeds, &cos, &sin, attention_mask)
    }

    /// Logits `[B, T, vocab]` of [`Qwen25Vl::forward_hidden`].
    pub fn forward(&self, ids: &Tensor, attention_mask: Option<&Tensor>, images: Option<Images<'_>>) -> Result<Tensor> {
        self.decoder.logits(&self.forward_hidden(ids, attention_mask, images)?)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_placeholder_expands_to_its_image_tokens() {
        let c = VlConfig::from_json(&json!({
            "model_type": "qwen2_5_vl", "image_token_id": 60, "video_token_id": 61,
            "text_config": {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                "num_attention_heads": 2, "num_key_value_heads": 1,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1]}},
            "vision_config": {"depth": 1, "hidden_size": 16, "intermediate_size": 24, "num_heads": 2,
                "window_size": 56, "out_hidden_size": 16},
        }))
        .unwrap();
        let ids = [1, 58, 60, 59, 5, 58, 60, 59];
        let out = expand_image_placeholders(&c, &ids, &[[1, 4, 2], [1, 2, 2]]).unwrap();
        assert_eq!(out, vec![1, 58, 60, 60, 59, 5, 58, 60, 59]);
        assert!(expand_image_placeholders(&c, &ids, &[[1, 4, 2]]).is_err());
        assert!(expand_image_placeholders(&c, &ids, &[[1, 2, 2]; 3]).is_err());
    }
}
