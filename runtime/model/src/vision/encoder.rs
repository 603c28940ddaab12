//! Qwen2.5-VL's vision tower: patches → merged image tokens of the text model's width.
//!
//! - Patch embedding: a Conv3d whose kernel equals its stride and the patch, i.e. one matmul of the flattened
//!   patches (`[N, C·T·P·P]`) with the kernel viewed as `[hidden, C·T·P·P]`.
//! - 2-D rotary embedding: each head's first half rotates by the patch's row, its second half by its column
//!   (frequencies over `head_dim / 4`), laid out as "rotate half" over the whole head.
//! - Window attention: the patches are reordered so that the merge blocks of each `window_size` square window
//!   are contiguous; most blocks attend within their window, the `fullatt_block_indexes` over the whole image
//!   (each frame of each image on its own). Attention is bidirectional.
//! - Blocks: pre-RMSNorm (eps 1e-6) attention with a fused qkv projection (biases), pre-RMSNorm gated MLP with
//!   biases.
//! - Merger: RMSNorm, the `merge²` patches of each block concatenated, Linear → GELU → Linear to
//!   `out_hidden_size`; then the window reordering is undone.

use tch::{Device, Kind, Tensor};

use crate::error::{ModelError, Result};
use crate::safetensors_io::SafetensorsWeights;
use crate::train_ops;
use crate::vision::config::{VisionAct, VisionConfig};

const NORM_EPS: f64 = 1e-6;

#[derive(Debug)]
struct Lin {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Lin {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.f_linear(&self.weight, self.bias.as_ref())?)
    }
}

#[derive(Debug)]
struct Block {
    norm1: Tensor,
    norm2: Tensor,
    qkv: Lin,
    proj: Lin,
    gate: Lin,
    up: Lin,
    down: Lin,
}

/// The vision tower's weights.
#[derive(Debug)]
pub struct VisionEncoder {
    config: VisionConfig,
    kind: Kind,
    /// `[hidden, C·T·P·P]`.
    patch_embed: Tensor,
    blocks: Vec<Block>,
    merger_norm: Tensor,
    merger_fc1: Lin,
    merger_fc2: Lin,
    /// `[head_dim / 4]` f32.
    inv_freq: Tensor,
}

/// Where the tower's weights sit in a checkpoint: `visual.` (transformers 4.x and the released checkpoints) or
/// `model.visual.` (transformers 5's module path).
fn prefix(weights: &SafetensorsWeights) -> &'static str {
    if weights.contains("visual.patch_embed.proj.weight") { "visual." } else { "model.visual." }
}

/// The reordering of one or more images' merge blocks into windows, and the windows' boundaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowLayout {
    /// For each position of the reordered merge blocks, the block it takes (a permutation of `0..blocks`).
    pub window_index: Vec<i64>,
    /// Boundaries of the windows in patches (`0, …, patches`), empty windows left out.
    pub cu_window_seqlens: Vec<i64>,
    /// Boundaries of each frame of each image in patches, for the full-attention blocks.
    pub cu_seqlens: Vec<i64>,
}

/// The window layout of images with `grids` (`[t, h, w]` patches each), as transformers' `get_vision_window_index`
/// computes it: per frame, the grid of merge blocks is padded to whole windows of
/// `window_size / merge / patch` blocks a side, windows are taken row-major, blocks row-major within each.
pub fn window_layout(config: &VisionConfig, grids: &[[i64; 3]]) -> WindowLayout {
    let merge = config.spatial_merge_size;
    let unit = config.merge_unit();
    let win = config.window_size / merge / config.patch_size;
    let mut window_index = Vec::new();
    let mut cu_window_seqlens = vec![0i64];
    let mut cu_seqlens = vec![0i64];
    let mut offset = 0i64;
    for &[t, h, w] in grids {
        let (lh, lw) = (h / merge, w / merge);
        let (nh, nw) = ((lh + win - 1) / win, (lw + win - 1) / win);
        for frame in 0..t {
            for wy in 0..nh {
                for wx in 0..nw {
                    let mut n = 0;
                    for y in wy * win..((wy + 1) * win).min(lh) {
                        for x in wx * win..((wx + 1) * win).min(lw) {
                            window_index.push(offset + (frame * lh + y) * lw + x);
                            n += 1;
                        }
                    }
                    if n > 0 {
                        let last = *cu_window_seqlens.last().unwrap_or(&0);
                        cu_window_seqlens.push(last + n * unit);
                    }
                }
            }
            let last = *cu_seqlens.last().unwrap_or(&0);
            cu_seqlens.push(last + h * w);
        }
        offset += t * lh * lw;
    }
    WindowLayout { window_index, cu_window_seqlens, cu_seqlens }
}

/// The (row, column) of every patch in the processor's order (merge blocks row-major, patches row-major within
/// a block), for each frame of each image.
fn patch_rows_cols(merge: i64, grids: &[[i64; 3]]) -> (Vec<i64>, Vec<i64>) {
    let (mut rows, mut cols) = (Vec::new(), Vec::new());
    for &[t, h, w] in grids {
        for _ in 0..t {
            for by in 0..h / merge {
                for bx in 0..w / merge {
                    for iy in 0..merge {
                        for ix in 0..merge {
                            rows.push(by * merge + iy);
                            cols.push(bx * merge + ix);
                        }
                    }
                }
            }
        }
    }
    (rows, cols)
}

impl VisionEncoder {
    /// Loads the tower from a checkpoint's safetensors in dtype `kind` on `device`.
    pub fn load(config: VisionConfig, weights: &SafetensorsWeights, kind: Kind, device: Device) -> Result<Self> {
        let p = prefix(weights);
        let get = |name: &str, shape: &[i64]| -> Result<Tensor> {
            let full = format!("{p}{name}");
            let t = weights.get(&full)?;
            crate::weights::check_shape(&full, shape, &t.size())?;
            Ok(t.f_to_dtype_layout((kind, device), false, false)?.f_detach()?)
        };
        let lin = |name: &str, out: i64, inp: i64| -> Result<Lin> {
            Ok(Lin {
                weight: get(&format!("{name}.weight"), &[out, inp])?,
                bias: Some(get(&format!("{name}.bias"), &[out])?),
            })
        };
        let (d, ffn) = (config.hidden_size, config.intermediate_size);
        let (c, t, ps) = (config.in_channels, config.temporal_patch_size, config.patch_size);
        let patch_embed = get("patch_embed.proj.weight", &[d, c, t, ps, ps])?.f_reshape([d, -1])?;
        let blocks = (0..config.depth)
            .map(|i| {
                let b = format!("blocks.{i}");
                Ok(Block {
                    norm1: get(&format!("{b}.norm1.weight"), &[d])?,
                    norm2: get(&format!("{b}.norm2.weight"), &[d])?,
                    qkv: lin(&format!("{b}.attn.qkv"), 3 * d, d)?,
                    proj: lin(&format!("{b}.attn.proj"), d, d)?,
                    gate: lin(&format!("{b}.mlp.gate_proj"), ffn, d)?,
                    up: lin(&format!("{b}.mlp.up_proj"), ffn, d)?,
                    down: lin(&format!("{b}.mlp.down_proj"), d, ffn)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let merged = d * config.merge_unit();
        let merger_norm = get("merger.ln_q.weight", &[d])?;
        let merger_fc1 = lin("merger.mlp.0", merged, merged)?;
        let merger_fc2 = lin("merger.mlp.2", config.out_hidden_size, merged)?;
        // inv_freq = 1 / theta^(2i / (head_dim / 2)), i < head_dim / 4, in f32 as transformers builds it.
        let spatial = config.head_dim() / 2;
        let exponent = Tensor::f_arange_start_step(0i64, spatial, 2, (Kind::Int64, device))?.f_to_kind(Kind::Float)?
            / spatial as f64;
        let inv_freq = Tensor::f_pow_scalar(config.rope_theta, &exponent)?.f_reciprocal()?;
        Ok(Self { config, kind, patch_embed, blocks, merger_norm, merger_fc1, merger_fc2, inv_freq })
    }

    /// The tower's configuration.
    pub fn config(&self) -> &VisionConfig {
        &self.config
    }

    /// Encodes the patches of one or more images (`pixel_values` `[patches, C·T·P·P]`, the images' patches one
    /// after another, `grids` their `[t, h, w]`) into `[patches / merge², out_hidden_size]` image tokens, in the
    /// order of the images' placeholders.
    pub fn forward(&self, pixel_values: &Tensor, grids: &[[i64; 3]]) -> Result<Tensor> {
        let c = &self.config;
        let merge = c.spatial_merge_size;
        let patches: i64 = grids.iter().map(|g| g[0] * g[1] * g[2]).sum();
        if grids.iter().any(|g| g.iter().any(|&v| v < 1) || g[1] % merge != 0 || g[2] % merge != 0) {
            return Err(ModelError::InvalidInput(format!(
                "image grids {grids:?}: every side must be positive and the height and width multiples of \
                 spatial_merge_size {merge}"
            )));
        }
        if pixel_values.size() != [patches, c.patch_dim()] {
            return Err(ModelError::InvalidInput(format!(
                "pixel_values {:?} do not fit grids {grids:?}: expected [{patches}, {}]",
                pixel_values.size(),
                c.patch_dim()
            )));
        }
        let device = self.patch_embed.device();
        let unit = c.merge_unit();
        let layout = window_layout(c, grids);
        let x = pixel_values
            .f_to_dtype_layout((self.kind, device), false, false)?
            .f_linear::<Tensor>(&self.patch_embed, None)?;
        let window_index = Tensor::f_from_slice(&layout.window_index)?.f_to_device(device)?;
        // Reorders whole merge blocks of `[patches, ·]` rows into window order.
        let to_windows = |t: &Tensor| -> Result<Tensor> {
            let width = t.size()[1];
            Ok(t.f_reshape([patches / unit, unit, width])?
                .f_index_select(0, &window_index)?
                .f_reshape([patches, width])?)
        };
        let mut x = to_windows(&x)?;
        let (rows, cols) = patch_rows_cols(merge, grids);
        let pos = |v: &[i64]| -> Result<Tensor> {
            Ok(Tensor::f_from_slice(v)?.f_to_device(device)?.f_to_kind(Kind::Float)?.f_unsqueeze(-1)?
                * self.inv_freq.f_unsqueeze(0)?)
        };
        let freqs = Tensor::f_cat(&[pos(&rows)?, pos(&cols)?], -1)?;
        let emb = to_windows(&Tensor::f_cat(&[&freqs, &freqs], -1)?)?;
        // [1, patches, head_dim], f32.
        let (cos, sin) = (emb.f_cos()?.f_unsqueeze(0)?, emb.f_sin()?.f_unsqueeze(0)?);
        for (i, block) in self.blocks.iter().enumerate() {
            let bounds = if c.fullatt_block_indexes.contains(&(i as i64)) {
                &layout.cu_seqlens
            } else {
                &layout.cu_window_seqlens
            };
            let h = train_ops::rms_norm(&x, &block.norm1, NORM_EPS)?;
            // Out of place: autograd through the tower (training it) needs the block inputs kept.
            x = x.f_add(&block.proj.forward(&self.attention(&block.qkv.forward(&h)?, &cos, &sin, bounds)?)?)?;
            let h = train_ops::rms_norm(&x, &block.norm2, NORM_EPS)?;
            let gate = block.gate.forward(&h)?;
            let act = match c.hidden_act {
                VisionAct::Silu => gate.f_silu()?,
                VisionAct::Gelu => gate.f_gelu("none")?,
                VisionAct::GeluTanh => gate.f_gelu("tanh")?,
            };
            x = x.f_add(&block.down.forward(&(act * block.up.forward(&h)?))?)?;
        }
        let merged = train_ops::rms_norm(&x, &self.merger_norm, NORM_EPS)?.f_reshape([patches / unit, -1])?;
        let merged = self.merger_fc2.forward(&self.merger_fc1.forward(&merged)?.f_gelu("none")?)?;
        let reverse = window_index.f_argsort(0, false)?;
        Ok(merged.f_index_select(0, &reverse)?)
    }

    /// Bidirectional attention of the fused `qkv` `[patches, 3·hidden]` within each `[bounds[i], bounds[i+1])`
    /// segment, with the 2-D rotation applied to q and k; returns `[patches, hidden]`.
    fn attention(&self, qkv: &Tensor, cos: &Tensor, sin: &Tensor, bounds: &[i64]) -> Result<Tensor> {
        let n = qkv.size()[0];
        let heads = self.config.num_heads;
        let qkv = qkv.f_reshape([n, 3, heads, -1])?;
        // The rotation runs in f32 like transformers' (`apply_rotary_pos_emb_vision`).
        let rotate = |x: Tensor| -> Result<Tensor> {
            let kind = x.kind();
            let rotated = crate::rope::apply(&x.f_to_kind(Kind::Float)?.f_unsqueeze(0)?, cos, sin)?;
            Ok(rotated.f_squeeze_dim(0)?.f_to_kind(kind)?)
        };
        // [heads, patches, head_dim]
        let q = rotate(qkv.f_select(1, 0)?)?.f_transpose(0, 1)?;
        let k = rotate(qkv.f_select(1, 1)?)?.f_transpose(0, 1)?;
        let v = qkv.f_select(1, 2)?.f_transpose(0, 1)?;
        let mut outs = Vec::with_capacity(bounds.len().saturating_sub(1));
        for pair in bounds.windows(2) {
            let (start, len) = (pair[0], pair[1] - pair[0]);
            let part = |t: &Tensor| -> Result<Tensor> { Ok(t.f_narrow(1, start, len)?.f_unsqueeze(0)?) };
            let o = Tensor::f_scaled_dot_product_attention::<Tensor>(
                &part(&q)?,
                &part(&k)?,
                &part(&v)?,
                None,
                0.0,
                false,
                None,
                false,
            )?;
            outs.push(o.f_squeeze_dim(0)?);
        }
        // [heads, patches, head_dim] → [patches, hidden]
        Ok(Tensor::f_cat(&outs, 1)?.f_transpose(0, 1)?.f_reshape([n, -1])?)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::vision::config::VlConfig;

    fn vision(window_size: i64) -> VisionConfig {
        let mut c = VlConfig::from_json(&json!({
            "model_type": "qwen2_5_vl", "image_token_id": 60,
            "text_config": {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                "num_attention_heads": 2, "num_key_value_heads": 1,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1]}},
            "vision_config": {"depth": 1, "hidden_size": 16, "intermediate_size": 24, "num_heads": 2,
                "window_size": 56, "out_hidden_size": 16},
        }))
        .unwrap()
        .vision;
        c.window_size = window_size;
        c
    }

    #[test]
    fn windows_split_the_merged_grid_row_major() {
        // 8×6 patches → 4×3 merge blocks; windows of 2×2 blocks: [0 1 3 4], [2 5], [6 7 9 10], [8 11].
        let l = window_layout(&vision(56), &[[1, 8, 6]]);
        assert_eq!(l.window_index, vec![0, 1, 3, 4, 2, 5, 6, 7, 9, 10, 8, 11]);
        assert_eq!(l.cu_window_seqlens, vec![0, 16, 24, 40, 48]);
        assert_eq!(l.cu_seqlens, vec![0, 48]);
        // A second image continues the numbering; a window as large as the image is one window.
        let l = window_layout(&vision(112), &[[1, 4, 4], [2, 2, 2]]);
        assert_eq!(l.window_index, vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(l.cu_window_seqlens, vec![0, 16, 20, 24]);
        assert_eq!(l.cu_seqlens, vec![0, 16, 20, 24]);
    }

    #[test]
    fn patch_positions_are_block_major() {
        let (rows, cols) = patch_rows_cols(2, &[[1, 2, 4]]);
        assert_eq!(rows, vec![0, 0, 1, 1, 0, 0, 1, 1]);
        assert_eq!(cols, vec![0, 1, 0, 1, 2, 3, 2, 3]);
    }
}
