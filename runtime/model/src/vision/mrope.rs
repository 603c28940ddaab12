//! Multimodal rotary positions (M-RoPE) of Qwen2-VL / Qwen2.5-VL's text decoder.
//!
//! Every token has three positions: temporal, height and width. A text token has the same value in all three
//! (its running index), so a text-only sequence rotates exactly as plain RoPE. The `t · h · w / merge²` tokens
//! of an image share the temporal position of the image's start and take their merged row and column, offset by
//! that start; the text after the image resumes at `start + max(h, w) / merge`. The rotary frequencies are then
//! split into `mrope_section` runs (in frequency pairs), the first taking the temporal positions, the second the
//! heights, the third the widths (cycling if there are more).

use tch::{Device, Kind, Tensor};

use crate::error::{ModelError, Result};
use crate::vision::config::VlConfig;

/// The 3-D positions of one row's real tokens and the offset generation continues from (`rope_deltas`: the
/// position of the token after the row minus the row's length).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowPositions {
    /// `[3][tokens]`: temporal, height, width.
    pub positions: [Vec<i64>; 3],
    /// `max position + 1 - tokens`.
    pub delta: i64,
}

/// The 3-D positions of `ids` (one row's real tokens, no padding) holding the images of `grids` in order
/// (`[t, h, w]` patches each), as transformers' `get_rope_index` assigns them. Errors when the placeholders do
/// not match the grids, or on video placeholders (videos are not implemented yet).
pub fn rope_index(config: &VlConfig, ids: &[i64], grids: &[[i64; 3]]) -> Result<RowPositions> {
    let merge = config.vision.spatial_merge_size;
    let mut out: [Vec<i64>; 3] =
        [Vec::with_capacity(ids.len()), Vec::with_capacity(ids.len()), Vec::with_capacity(ids.len())];
    let mut next = 0i64;
    let mut grids = grids.iter();
    let mut i = 0;
    while i < ids.len() {
        let id = ids[i];
        if id == config.video_token_id {
            return Err(ModelError::InvalidInput(format!(
                "token {i} is a video placeholder ({id}): video inputs are not implemented yet"
            )));
        }
        if id != config.image_token_id {
            for axis in &mut out {
                axis.push(next);
            }
            next += 1;
            i += 1;
            continue;
        }
        let &[t, h, w] = grids.next().ok_or_else(|| {
            ModelError::InvalidInput(format!("image placeholder at token {i} has no image left to fill it"))
        })?;
        let (lh, lw) = (h / merge, w / merge);
        let count = (t * lh * lw) as usize;
        let run = ids[i..].iter().take_while(|&&x| x == config.image_token_id).count();
        if run < count || (run > count && grids.len() == 0) {
            return Err(ModelError::InvalidInput(format!(
                "the image at token {i} ({t}×{h}×{w} patches) needs {count} placeholders, found a run of {run}"
            )));
        }
        for ti in 0..t {
            for hi in 0..lh {
                for wi in 0..lw {
                    out[0].push(next + ti);
                    out[1].push(next + hi);
                    out[2].push(next + wi);
                }
            }
        }
        next += lh.max(lw);
        i += count;
    }
    if grids.len() != 0 {
        return Err(ModelError::InvalidInput(format!(
            "{} image(s) given beyond the placeholders in the prompt",
            grids.len()
        )));
    }
    let max = out.iter().flat_map(|a| a.iter().copied()).max().unwrap_or(-1);
    Ok(RowPositions { positions: out, delta: max + 1 - ids.len() as i64 })
}

/// Positions `[3, B, T]` for a batch `ids` `[B, T]` with an optional mask `[B, T]` (nonzero at real tokens,
/// padding anywhere): each row's real tokens numbered by [`rope_index`], padding at 0. `grids` are all images in
/// row order. Returns the positions and each row's delta.
pub fn batch_positions(
    config: &VlConfig,
    ids: &Tensor,
    mask: Option<&Tensor>,
    grids: &[[i64; 3]],
) -> Result<(Tensor, Vec<i64>)> {
    let size = ids.size();
    let [b, t] = size[..] else {
        return Err(ModelError::InvalidInput(format!("input_ids must be [B, T], got {size:?}")));
    };
    let all: Vec<i64> = Vec::try_from(ids.f_to_device(Device::Cpu)?.f_to_kind(Kind::Int64)?.f_flatten(0, -1)?)?;
    let valid: Vec<bool> = match mask {
        Some(m) => Vec::<i64>::try_from(m.f_to_device(Device::Cpu)?.f_to_kind(Kind::Int64)?.f_flatten(0, -1)?)?
            .into_iter()
            .map(|v| v != 0)
            .collect(),
        None => vec![true; all.len()],
    };
    let merge_unit = config.vision.spatial_merge_size * config.vision.spatial_merge_size;
    let (b, t) = (b as usize, t as usize);
    let mut positions = vec![0i64; 3 * b * t];
    let mut deltas = Vec::with_capacity(b);
    let mut grid_at = 0;
    for row in 0..b {
        let cols: Vec<usize> = (0..t).filter(|&c| valid[row * t + c]).collect();
        let row_ids: Vec<i64> = cols.iter().map(|&c| all[row * t + c]).collect();
        // This row's images: as many grids as its placeholders take.
        let mut placeholders = row_ids.iter().filter(|&&x| x == config.image_token_id).count() as i64;
        let start = grid_at;
        while placeholders > 0 && grid_at < grids.len() {
            let [gt, gh, gw] = grids[grid_at];
            placeholders -= gt * gh * gw / merge_unit;
            grid_at += 1;
        }
        let row_pos = rope_index(config, &row_ids, &grids[start..grid_at])?;
        for (axis, values) in row_pos.positions.iter().enumerate() {
            for (&c, &p) in cols.iter().zip(values) {
                positions[(axis * b + row) * t + c] = p;
            }
        }
        deltas.push(row_pos.delta);
    }
    if grid_at != grids.len() {
        return Err(ModelError::InvalidInput(format!(
            "{} image(s) given, the prompts' placeholders take {grid_at}",
            grids.len()
        )));
    }
    let positions = Tensor::f_from_slice(&positions)?.f_view([3, b as i64, t as i64])?.f_to_device(ids.device())?;
    Ok((positions, deltas))
}

/// cos and sin tables `[B, T, head_dim]` in `kind` for 3-D positions `[3, B, T]`: the frequencies of
/// `inv_freq` (`[head_dim / 2]`, f32) in `sections` runs, run `i` rotated by the positions of axis `i % 3`.
pub fn cos_sin(inv_freq: &Tensor, positions: &Tensor, sections: &[i64], kind: Kind) -> Result<(Tensor, Tensor)> {
    let freqs = positions.f_to_kind(Kind::Float)?.f_unsqueeze(-1)? * inv_freq.f_view([1, 1, 1, -1])?;
    let mut parts = Vec::with_capacity(sections.len());
    let mut start = 0;
    for (i, &len) in sections.iter().enumerate() {
        parts.push(freqs.f_get(i as i64 % 3)?.f_narrow(-1, start, len)?);
        start += len;
    }
    let freqs = Tensor::f_cat(&parts, -1)?;
    let emb = Tensor::f_cat(&[&freqs, &freqs], -1)?;
    Ok((emb.f_cos()?.f_to_kind(kind)?, emb.f_sin()?.f_to_kind(kind)?))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn config() -> VlConfig {
        VlConfig::from_json(&json!({
            "model_type": "qwen2_5_vl", "image_token_id": 60, "video_token_id": 61,
            "vision_start_token_id": 58, "vision_end_token_id": 59,
            "text_config": {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                "num_attention_heads": 2, "num_key_value_heads": 1,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1]}},
            "vision_config": {"depth": 1, "hidden_size": 16, "intermediate_size": 24, "num_heads": 2,
                "window_size": 56, "out_hidden_size": 16},
        }))
        .unwrap()
    }

    #[test]
    fn image_tokens_take_their_grid_and_text_resumes_after_it() {
        let c = config();
        // 2 text, start, a 1×4×6 image (2×3 merged), end, 1 text.
        let ids = [1, 5, 58, 60, 60, 60, 60, 60, 60, 59, 7];
        let p = rope_index(&c, &ids, &[[1, 4, 6]]).unwrap();
        assert_eq!(p.positions[0], vec![0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7]);
        assert_eq!(p.positions[1], vec![0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7]);
        assert_eq!(p.positions[2], vec![0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7]);
        assert_eq!(p.delta, 8 - 11);
        assert!(rope_index(&c, &ids, &[]).is_err());
        assert!(rope_index(&c, &ids, &[[1, 4, 4]]).is_err());
        assert!(rope_index(&c, &ids, &[[1, 4, 6], [1, 2, 2]]).is_err());
        assert!(rope_index(&c, &[1, 61], &[]).unwrap_err().to_string().contains("video"));
    }

    #[test]
    fn text_only_positions_rotate_as_plain_rope() {
        let inv = Tensor::from_slice(&[1.0f32, 0.1, 0.01, 0.001]);
        let pos = Tensor::arange(5, (Kind::Int64, Device::Cpu)).view([1, 5]);
        let (c3, s3) = cos_sin(&inv, &pos.unsqueeze(0).expand([3, 1, 5], false), &[2, 1, 1], Kind::Float).unwrap();
        let (c1, s1) = crate::rope::cos_sin(&inv, &pos, Kind::Float).unwrap();
        assert_eq!((c3 - c1).abs().max().double_value(&[]), 0.0);
        assert_eq!((s3 - s1).abs().max().double_value(&[]), 0.0);
    }

    #[test]
    fn batch_rows_are_numbered_over_their_real_tokens() {
        let c = config();
        let ids = Tensor::from_slice(&[0i64, 0, 58, 60, 59, 1, 58, 60, 59, 2]).view([2, 5]);
        let mask = Tensor::from_slice(&[0i64, 0, 1, 1, 1, 1, 1, 1, 1, 1]).view([2, 5]);
        let (p, d) = batch_positions(&c, &ids, Some(&mask), &[[1, 2, 2], [1, 2, 2]]).unwrap();
        let v: Vec<i64> = Vec::try_from(p.flatten(0, -1)).unwrap();
        assert_eq!(&v[..10], &[0, 0, 0, 1, 2, 0, 1, 2, 3, 4]);
        assert_eq!(d, vec![0, 0]);
    }
}
