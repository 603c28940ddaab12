//! Image preprocessing as Qwen2-VL's image processor does it (transformers' PIL backend), so that pixel values
//! fed to the vision tower are the ones the model was trained on.
//!
//! Steps: choose the size with [`smart_resize`] (both sides multiples of `patch_size · merge_size`, the pixel
//! count within `[min_pixels, max_pixels]`, the aspect ratio kept as well as that allows); resize the 8-bit
//! RGB image with Pillow's bicubic filter ([`resize_bicubic`], Pillow's fixed-point arithmetic reproduced, so
//! the resized bytes are Pillow's); rescale by 1/255 and normalize with the CLIP mean and std; repeat the frame
//! `temporal_patch_size` times; and flatten into patches in the processor's order: merge blocks row-major, the
//! `merge_size²` patches of a block row-major within it, each patch flattened as `[channel, frame, row, col]`.

use serde_json::Value;
use tch::{Device, Kind, Tensor};

use crate::error::{ModelError, Result};

/// OpenAI CLIP's per-channel mean, the processor's default `image_mean`.
pub const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
/// OpenAI CLIP's per-channel standard deviation, the processor's default `image_std`.
pub const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];

/// The image processor's settings (`preprocessor_config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct ImageProcessor {
    /// Side of a patch in pixels.
    pub patch_size: i64,
    /// Frames per patch (an image is repeated to fill them).
    pub temporal_patch_size: i64,
    /// Side of the square of patches merged into one token.
    pub merge_size: i64,
    /// Fewest pixels a resized image may have.
    pub min_pixels: i64,
    /// Most pixels a resized image may have.
    pub max_pixels: i64,
    /// Per-channel mean subtracted after rescaling.
    pub image_mean: [f64; 3],
    /// Per-channel standard deviation divided by after that.
    pub image_std: [f64; 3],
    /// Multiplier taking bytes to `[0, 1]`.
    pub rescale_factor: f64,
}

impl Default for ImageProcessor {
    fn default() -> Self {
        Self {
            patch_size: 14,
            temporal_patch_size: 2,
            merge_size: 2,
            min_pixels: 56 * 56,
            max_pixels: 28 * 28 * 1280,
            image_mean: CLIP_MEAN,
            image_std: CLIP_STD,
            rescale_factor: 1.0 / 255.0,
        }
    }
}

/// One preprocessed image: its patches and their grid.
#[derive(Debug)]
pub struct ImagePatches {
    /// `[t · h · w, channels · temporal_patch_size · patch_size²]` f32.
    pub pixel_values: Tensor,
    /// Patches along time, height and width (`image_grid_thw`).
    pub grid_thw: [i64; 3],
}

impl ImageProcessor {
    /// Reads the settings from a `preprocessor_config.json` value; absent keys keep Qwen2-VL's defaults. Both
    /// spellings of the pixel bounds are read (`min_pixels`/`max_pixels`, or `size.shortest_edge`/`longest_edge`).
    /// Settings the processor would apply that we do not (`do_resize: false`, a resampling other than bicubic,
    /// no rescale or normalize) are refused rather than ignored.
    pub fn from_json(v: &Value) -> Result<Self> {
        let mut p = Self::default();
        let int = |key: &str| v.get(key).and_then(Value::as_i64);
        let bad = |key: &str, reason: &str| ModelError::UnsupportedConfig {
            key: format!("preprocessor_config.{key}"),
            reason: reason.to_owned(),
        };
        if let Some(x) = int("patch_size") {
            p.patch_size = x;
        }
        if let Some(x) = int("temporal_patch_size") {
            p.temporal_patch_size = x;
        }
        if let Some(x) = int("merge_size") {
            p.merge_size = x;
        }
        let size = v.get("size");
        if let Some(x) = size.and_then(|s| s.get("shortest_edge")).and_then(Value::as_i64).or_else(|| int("min_pixels"))
        {
            p.min_pixels = x;
        }
        if let Some(x) = size.and_then(|s| s.get("longest_edge")).and_then(Value::as_i64).or_else(|| int("max_pixels"))
        {
            p.max_pixels = x;
        }
        let triple = |key: &str, default: [f64; 3]| -> Result<[f64; 3]> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(Value::Array(a)) if a.len() == 3 && a.iter().all(Value::is_number) => {
                    Ok([0, 1, 2].map(|i| a[i].as_f64().unwrap_or(0.0)))
                }
                Some(_) => Err(bad(key, "expected three numbers")),
            }
        };
        p.image_mean = triple("image_mean", CLIP_MEAN)?;
        p.image_std = triple("image_std", CLIP_STD)?;
        if let Some(f) = v.get("rescale_factor").and_then(Value::as_f64) {
            p.rescale_factor = f;
        }
        for key in ["do_resize", "do_rescale", "do_normalize"] {
            if v.get(key).and_then(Value::as_bool) == Some(false) {
                return Err(bad(
                    key,
                    "false is not implemented (Qwen2-VL's processor resizes, rescales and normalizes)",
                ));
            }
        }
        // PILImageResampling.BICUBIC is 3.
        if let Some(r) = v.get("resample").and_then(Value::as_i64).filter(|&r| r != 3) {
            return Err(bad("resample", &format!("{r} is not implemented (3, bicubic, is)")));
        }
        p.validate()?;
        Ok(p)
    }

    fn validate(&self) -> Result<()> {
        let bad = |key: &str, reason: String| ModelError::UnsupportedConfig {
            key: format!("preprocessor_config.{key}"),
            reason,
        };
        for (key, value) in [
            ("patch_size", self.patch_size),
            ("temporal_patch_size", self.temporal_patch_size),
            ("merge_size", self.merge_size),
            ("min_pixels", self.min_pixels),
            ("max_pixels", self.max_pixels),
        ] {
            if value < 1 {
                return Err(bad(key, format!("must be at least 1, found {value}")));
            }
        }
        if self.min_pixels > self.max_pixels {
            return Err(bad("min_pixels", format!("{} exceeds max_pixels {}", self.min_pixels, self.max_pixels)));
        }
        if self.image_std.contains(&0.0) {
            return Err(bad("image_std", "a zero standard deviation".into()));
        }
        Ok(())
    }

    /// Preprocesses one 8-bit RGB image, `height × width × 3` bytes row-major (channels last, as decoded).
    pub fn preprocess(&self, rgb: &[u8], height: usize, width: usize) -> Result<ImagePatches> {
        if height == 0 || width == 0 || rgb.len() != height * width * 3 {
            return Err(ModelError::InvalidInput(format!(
                "an RGB image of {height}×{width} needs {} bytes, got {}",
                height * width * 3,
                rgb.len()
            )));
        }
        let factor = (self.patch_size * self.merge_size) as usize;
        let (h, w) = smart_resize(height, width, factor, self.min_pixels as usize, self.max_pixels as usize)?;
        let resized = resize_bicubic(rgb, height, width, h, w);
        // Rescaled in f64 and stored as f32, then normalized in f32, as the processor's NumPy code does.
        let mean = self.image_mean.map(|m| m as f32);
        let std = self.image_std.map(|s| s as f32);
        let mut planes = vec![0f32; 3 * h * w];
        for (i, px) in resized.chunks_exact(3).enumerate() {
            for c in 0..3 {
                let v = (f64::from(px[c]) * self.rescale_factor) as f32;
                planes[c * h * w + i] = (v - mean[c]) / std[c];
            }
        }
        let (p, m, t) = (self.patch_size, self.merge_size, self.temporal_patch_size);
        let (gh, gw) = ((h as i64) / p, (w as i64) / p);
        // [C, H, W] → [C, gh/m, m, p, gw/m, m, p] → [gh/m, gw/m, m, m, C, p, p], then a frame axis repeated t times.
        let image = Tensor::f_from_slice(&planes)?.f_view(&[3, gh / m, m, p, gw / m, m, p][..])?;
        let patches = image
            .f_permute([1, 4, 2, 5, 0, 3, 6])?
            .f_unsqueeze(5)?
            .f_expand(&[gh / m, gw / m, m, m, 3, t, p, p][..], false)?;
        let pixel_values = patches.f_reshape([gh * gw, 3 * t * p * p])?.f_contiguous()?;
        Ok(ImagePatches {
            pixel_values: pixel_values.f_to_device(Device::Cpu)?.f_to_kind(Kind::Float)?,
            grid_thw: [1, gh, gw],
        })
    }
}

/// The size Qwen2-VL's processor resizes a `height × width` image to: each side rounded to a multiple of
/// `factor`, then scaled (keeping the aspect ratio) into `[min_pixels, max_pixels]`. Errors on aspect ratios
/// past 200, which the processor refuses too.
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: usize,
    max_pixels: usize,
) -> Result<(usize, usize)> {
    let (hf, wf, f) = (height as f64, width as f64, factor as f64);
    if height == 0 || width == 0 || hf.max(wf) / hf.min(wf) > 200.0 {
        return Err(ModelError::InvalidInput(format!(
            "image {height}×{width}: the aspect ratio must be below 200 (Qwen2-VL's processor refuses it)"
        )));
    }
    // Python's round() rounds halves to even.
    let round = |x: f64| x.round_ties_even();
    let mut h = (round(hf / f) * f) as usize;
    let mut w = (round(wf / f) * f) as usize;
    if h * w > max_pixels {
        let beta = (hf * wf / max_pixels as f64).sqrt();
        h = factor.max(((hf / beta / f).floor() * f) as usize);
        w = factor.max(((wf / beta / f).floor() * f) as usize);
    } else if h * w < min_pixels {
        let beta = (min_pixels as f64 / (hf * wf)).sqrt();
        h = ((hf * beta / f).ceil() * f) as usize;
        w = ((wf * beta / f).ceil() * f) as usize;
    }
    Ok((h, w))
}

/// Pillow's bicubic kernel (`a = -0.5`), support 2.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// Bits of Pillow's fixed-point filter coefficients for 8-bit images (`PRECISION_BITS`).
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Filter taps for resampling `in_size` samples to `out_size` as Pillow computes them (`precompute_coeffs` then
/// `normalize_coeffs_8bpc`): for each output sample, the first input sample and fixed-point weights.
fn coefficients(in_size: usize, out_size: usize) -> Vec<(usize, Vec<i32>)> {
    let scale = in_size as f64 / out_size as f64;
    let filter_scale = scale.max(1.0);
    let support = 2.0 * filter_scale;
    (0..out_size)
        .map(|xx| {
            let center = (xx as f64 + 0.5) * scale;
            let ss = 1.0 / filter_scale;
            // C's (int) cast truncates toward zero.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            let weights: Vec<f64> = (xmin..xmax).map(|x| bicubic((x as f64 - center + 0.5) * ss)).collect();
            let total: f64 = weights.iter().sum();
            let fixed = weights
                .iter()
                .map(|&w| {
                    let w = if total != 0.0 { w / total } else { w };
                    let scaled = w * f64::from(1u32 << PRECISION_BITS);
                    (if scaled < 0.0 { scaled - 0.5 } else { scaled + 0.5 }) as i32
                })
                .collect();
            (xmin, fixed)
        })
        .collect()
}

/// Rounds a fixed-point accumulator to a byte, clamping as Pillow's `clip8` does.
fn clip8(acc: i64) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// The horizontal pass: every row of `h × w` RGB resampled to `out_w` pixels.
fn resample_rows(src: &[u8], h: usize, w: usize, out_w: usize) -> Vec<u8> {
    let taps = coefficients(w, out_w);
    let mut out = vec![0u8; h * out_w * 3];
    for y in 0..h {
        for (xx, (xmin, k)) in taps.iter().enumerate() {
            for c in 0..3 {
                let mut acc: i64 = 1 << (PRECISION_BITS - 1);
                for (i, &kv) in k.iter().enumerate() {
                    acc += i64::from(src[(y * w + xmin + i) * 3 + c]) * i64::from(kv);
                }
                out[(y * out_w + xx) * 3 + c] = clip8(acc);
            }
        }
    }
    out
}

/// The vertical pass: every column of `h × w` RGB resampled to `out_h` pixels.
fn resample_cols(src: &[u8], h: usize, w: usize, out_h: usize) -> Vec<u8> {
    let taps = coefficients(h, out_h);
    let mut out = vec![0u8; out_h * w * 3];
    for (yy, (ymin, k)) in taps.iter().enumerate() {
        for x in 0..w {
            for c in 0..3 {
                let mut acc: i64 = 1 << (PRECISION_BITS - 1);
                for (i, &kv) in k.iter().enumerate() {
                    acc += i64::from(src[((ymin + i) * w + x) * 3 + c]) * i64::from(kv);
                }
                out[(yy * w + x) * 3 + c] = clip8(acc);
            }
        }
    }
    out
}

/// Resizes an 8-bit RGB image (`h × w × 3`, channels last) to `out_h × out_w` as Pillow's
/// `Image.resize(..., BICUBIC)` does: the horizontal pass first, each pass rounded to bytes, a pass skipped
/// when its axis keeps its size.
pub fn resize_bicubic(src: &[u8], h: usize, w: usize, out_h: usize, out_w: usize) -> Vec<u8> {
    let rows = if out_w != w { resample_rows(src, h, w, out_w) } else { src.to_vec() };
    if out_h != h { resample_cols(&rows, h, out_w, out_h) } else { rows }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_resize_follows_the_processor() {
        // Rounded to multiples of 28 (ties to even: 42 / 28 = 1.5 → 2, 70 / 28 = 2.5 → 2).
        assert_eq!(smart_resize(100, 90, 28, 3136, 1_003_520).unwrap(), (112, 84));
        assert_eq!(smart_resize(42, 70, 28, 784, 1_003_520).unwrap(), (56, 56));
        // Over the budget: scaled down, floors of multiples, at least one factor.
        assert_eq!(smart_resize(60, 75, 28, 784, 2352).unwrap(), (28, 28));
        // Under it: scaled up.
        assert_eq!(smart_resize(20, 20, 28, 3136, 1_003_520).unwrap(), (56, 56));
        assert!(smart_resize(1, 300, 28, 3136, 1_003_520).is_err());
    }

    #[test]
    fn resizing_to_the_same_size_is_the_identity_and_constants_stay_constant() {
        let img: Vec<u8> = (0..5 * 7 * 3).map(|i| (i * 37 % 256) as u8).collect();
        assert_eq!(resize_bicubic(&img, 5, 7, 5, 7), img);
        let flat = vec![200u8; 9 * 11 * 3];
        assert!(resize_bicubic(&flat, 9, 11, 28, 20).iter().all(|&v| v == 200));
        assert!(resize_bicubic(&flat, 9, 11, 4, 3).iter().all(|&v| v == 200));
    }

    #[test]
    fn patches_come_in_the_processor_order() {
        // A 56×56 image needs no resize: patch (block, inner) values can be traced back to pixels.
        let p = ImageProcessor { min_pixels: 56 * 56, ..ImageProcessor::default() };
        let rgb: Vec<u8> = (0..56 * 56).flat_map(|i| [(i % 251) as u8, (i % 7) as u8, (i / 56) as u8]).collect();
        let out = p.preprocess(&rgb, 56, 56).unwrap();
        assert_eq!(out.grid_thw, [1, 4, 4]);
        assert_eq!(out.pixel_values.size(), vec![16, 3 * 2 * 14 * 14]);
        let v: Vec<f32> = Vec::try_from(out.pixel_values.flatten(0, -1)).unwrap();
        let norm = |byte: u8, c: usize| ((f64::from(byte) / 255.0) as f32 - CLIP_MEAN[c] as f32) / CLIP_STD[c] as f32;
        // Patch 2 is block (0, 0)'s second row, first column: pixel rows 14.., cols 0..; patch 4 is block (0, 1).
        for (patch, row0, col0) in [(2usize, 14usize, 0usize), (4, 0, 28), (15, 42, 42)] {
            for (c, frame, r, col) in [(0, 0, 0, 0), (2, 1, 3, 5), (1, 0, 13, 13)] {
                let idx = patch * 1176 + c * 392 + frame * 196 + r * 14 + col;
                let pixel = (row0 + r) * 56 + col0 + col;
                assert_eq!(v[idx], norm(rgb[pixel * 3 + c], c), "patch {patch} c {c} frame {frame} ({r}, {col})");
            }
        }
    }
}
