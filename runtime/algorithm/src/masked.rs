//! Masked reductions (Trinity-RFT's `algorithm/utils.py`), the building blocks of every loss and advantage.
//!
//! * `masked_sum(x, m) = Σ m·x`, masked-out entries zeroed first so a NaN or inf under the mask cannot leak.
//! * `masked_mean(x, m) = masked_sum(x, m) / (Σ m + 1e-8)`; an empty mask gives 0, not NaN.
//! * `masked_var(x, m) = masked_mean((x − μ)², m) · N/(N−1)` with N = Σ m (unbiased; N ∈ {0, 1} is an error).
//! * `masked_whiten(x, m) = (x − μ) · rsqrt(var + 1e-8)`, applied to every entry (no re-masking).

use tch::{Kind, Tensor};

use crate::error::AlgorithmError;

/// `Σ m·x` over all entries, or over `dim` when given.
pub fn masked_sum(values: &Tensor, mask: &Tensor, dim: Option<i64>) -> Tensor {
    let valid = values.where_scalarother(&mask.gt(0.0), 0.0) * mask;
    match dim {
        None => valid.sum(Kind::Float),
        Some(d) => valid.sum_dim_intlist(d, false, Kind::Float),
    }
}

/// `Σ m·x / (Σ m + 1e-8)` over all entries, or over `dim` when given.
pub fn masked_mean(values: &Tensor, mask: &Tensor, dim: Option<i64>) -> Tensor {
    let count = match dim {
        None => mask.sum(Kind::Float),
        Some(d) => mask.sum_dim_intlist(d, false, Kind::Float),
    };
    masked_sum(values, mask, dim) / (count + 1e-8)
}

/// Unbiased masked variance over all entries.
pub fn masked_var(values: &Tensor, mask: &Tensor, field: &str) -> Result<Tensor, AlgorithmError> {
    let mean = masked_mean(values, mask, None);
    let centered = values - &mean;
    let variance = masked_mean(&centered.square(), mask, None);
    let n = mask.sum(Kind::Float).double_value(&[]);
    if n == 0.0 {
        return Err(AlgorithmError::field(field, "whitening needs at least one unmasked token"));
    }
    if n == 1.0 {
        return Err(AlgorithmError::field(
            field,
            "whitening needs at least two unmasked tokens (unbiased variance of one value)",
        ));
    }
    Ok(variance * (n / (n - 1.0)))
}

/// `(x − μ) · rsqrt(var + 1e-8)` with masked statistics.
pub fn masked_whiten(values: &Tensor, mask: &Tensor, field: &str) -> Result<Tensor, AlgorithmError> {
    let mean = masked_mean(values, mask, None);
    let var = masked_var(values, mask, field)?;
    Ok((values - mean) * (var + 1e-8).rsqrt())
}

/// A scalar tensor as `f64` (metrics are reported in double precision, as Python floats are).
pub(crate) fn scalar(t: &Tensor) -> f64 {
    t.double_value(&[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_entries_never_leak() {
        let x = Tensor::from_slice(&[1.0f32, f32::NAN, 3.0]).view([1, 3]);
        let m = Tensor::from_slice(&[1.0f32, 0.0, 1.0]).view([1, 3]);
        assert_eq!(scalar(&masked_sum(&x, &m, None)), 4.0);
        assert!((scalar(&masked_mean(&x, &m, None)) - 2.0).abs() < 1e-6);
        let empty = Tensor::zeros([1, 3], (Kind::Float, tch::Device::Cpu));
        assert_eq!(scalar(&masked_mean(&x, &empty, None)), 0.0);
    }

    #[test]
    fn variance_of_one_token_is_an_error() {
        let x = Tensor::from_slice(&[1.0f32, 2.0]);
        let m = Tensor::from_slice(&[1.0f32, 0.0]);
        assert!(masked_whiten(&x, &m, "returns").unwrap_err().to_string().contains("returns"));
        let m2 = Tensor::from_slice(&[1.0f32, 1.0]);
        let w = masked_whiten(&x, &m2, "returns").unwrap();
        assert!((w.double_value(&[1]) - 0.5f64.sqrt()).abs() < 1e-5);
    }
}
