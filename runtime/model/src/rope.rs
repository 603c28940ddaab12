//! Rotary position embeddings, computed the way transformers computes them so logits agree to float precision.
//!
//! The inverse frequencies are built in f32 with the same operations as transformers' `_compute_*_parameters`
//! (including llama3's piecewise scaling); cos/sin are computed from positions on the fly in f32 (cheap compared
//! with attention, and it lets every row of a batch have its own positions), then cast to the activations'
//! dtype. Rotation uses the "rotate half" layout (first half / second half of each head), which is the HF layout;
//! GGUF llama weights are permuted back to it when loaded.

use tch::{Device, Kind, Tensor};

use crate::config::{ModelConfig, RopeScaling};
use crate::error::Result;

/// Inverse frequencies `[head_dim / 2]` (f32) on `device`.
pub(crate) fn inv_freq(config: &ModelConfig, device: Device) -> Result<Tensor> {
    let dim = config.head_dim;
    let exponent =
        Tensor::f_arange_start_step(0i64, dim, 2, (Kind::Int64, device))?.f_to_kind(Kind::Float)? / dim as f64;
    let base = Tensor::f_pow_scalar(config.rope_theta, &exponent)?;
    let inv = base.f_reciprocal()?;
    Ok(match config.rope_scaling {
        RopeScaling::None => inv,
        RopeScaling::Linear { factor } => inv / factor,
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
            let old = original_max_position_embeddings;
            let low_freq_wavelen = old / low_freq_factor;
            let high_freq_wavelen = old / high_freq_factor;
            let wavelen = inv.f_reciprocal()? * (2.0 * std::f64::consts::PI);
            let is_low = wavelen.f_gt(low_freq_wavelen)?;
            let scaled = &inv / factor;
            let inv_llama = scaled.f_where_self(&is_low, &inv)?;
            let smooth = ((wavelen.f_reciprocal()? * old) - low_freq_factor) / (high_freq_factor - low_freq_factor);
            let smoothed = (smooth.f_neg()? + 1.0) * &inv_llama / factor + &smooth * &inv_llama;
            let is_medium = wavelen.f_ge(high_freq_wavelen)?.f_logical_and(&wavelen.f_le(low_freq_wavelen)?)?;
            smoothed.f_where_self(&is_medium, &inv_llama)?
        }
    })
}

/// cos and sin tables `[B, T, head_dim]` in `kind` for integer positions `[B, T]`.
pub(crate) fn cos_sin(inv_freq: &Tensor, positions: &Tensor, kind: Kind) -> Result<(Tensor, Tensor)> {
    let freqs = positions.f_to_kind(Kind::Float)?.f_unsqueeze(-1)? * inv_freq.f_view([1, 1, -1])?;
    let emb = Tensor::f_cat(&[&freqs, &freqs], -1)?;
    Ok((emb.f_cos()?.f_to_kind(kind)?, emb.f_sin()?.f_to_kind(kind)?))
}

/// Rotates `x` `[B, T, heads, head_dim]` by the tables from [`cos_sin`].
pub(crate) fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.size().last().copied().unwrap_or(0) / 2;
    let x1 = x.f_narrow(-1, 0, half)?;
    let x2 = x.f_narrow(-1, half, half)?;
    let rotated = Tensor::f_cat(&[&x2.f_neg()?, &x1], -1)?;
    let cos = cos.f_unsqueeze(2)?;
    let sin = sin.f_unsqueeze(2)?;
    Ok(x * cos + rotated * sin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;

    fn cfg(scaling: RopeScaling) -> ModelConfig {
        ModelConfig {
            vocab_size: 8,
            hidden_size: 16,
            intermediate_size: 32,
            num_hidden_layers: 1,
            num_attention_heads: 1,
            num_key_value_heads: 1,
            head_dim: 16,
            rms_norm_eps: 1e-5,
            rope_scaling: scaling,
            max_position_embeddings: 64,
            eos_token_ids: vec![],
            ..ModelConfig::tiny(Family::Llama)
        }
    }

    #[test]
    fn plain_frequencies_and_rotation_preserve_norm() {
        let inv = inv_freq(&cfg(RopeScaling::None), Device::Cpu).unwrap();
        let v: Vec<f32> = Vec::try_from(&inv).unwrap();
        assert_eq!(v[0], 1.0);
        assert!((v[1] - 10000f32.powf(-2.0 / 16.0)).abs() < 1e-7);
        let x = Tensor::randn([1, 3, 2, 16], (Kind::Float, Device::Cpu));
        let pos = Tensor::from_slice(&[0i64, 5, 9]).view([1, 3]);
        let (c, s) = cos_sin(&inv, &pos, Kind::Float).unwrap();
        let y = apply(&x, &c, &s).unwrap();
        let diff = (y.norm() - x.norm()).abs().double_value(&[]);
        assert!(diff < 1e-4, "{diff}");
        // Position 0 is the identity.
        let d0 = (y.narrow(1, 0, 1) - x.narrow(1, 0, 1)).abs().max().double_value(&[]);
        assert!(d0 < 1e-6);
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let plain: Vec<f32> = Vec::try_from(&inv_freq(&cfg(RopeScaling::None), Device::Cpu).unwrap()).unwrap();
        let scaled = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64.0,
        };
        let v: Vec<f32> = Vec::try_from(&inv_freq(&cfg(scaled), Device::Cpu).unwrap()).unwrap();
        assert_eq!(v[0], plain[0]);
        assert!((v[7] - plain[7] / 8.0).abs() < 1e-9);
    }
}
