//! Loss aggregation (Trinity-RFT's `aggregate_loss`): how per-token losses become one scalar.
//!
//! With per-token values x, mask m, B rows and padded length L:
//! * `token-mean`: Σ m·x / (Σ m + 1e-8)
//! * `seq-mean-token-sum`: (1/B) Σ_i Σ_t m·x
//! * `seq-mean-token-mean`: (1/B) Σ_i [Σ_t m·x / (Σ_t m + 1e-8)] (a fully masked row counts as 0)
//! * `seq-mean-token-sum-norm`: Σ m·x / (N + 1e-8), N = the normalizer or L
//!
//! The seq-mean modes divide by the number of rows; on a batch with no rows libtorch's mean is NaN, as in
//! Trinity-RFT — callers that may hand over an empty split (mix) guard against that themselves.

use std::fmt;
use std::str::FromStr;

use tch::Tensor;

use crate::masked::{masked_mean, masked_sum};

/// The four aggregation modes, under Trinity-RFT's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LossAggMode {
    #[default]
    TokenMean,
    SeqMeanTokenSum,
    SeqMeanTokenMean,
    SeqMeanTokenSumNorm,
}

impl LossAggMode {
    /// Every mode's name, in Trinity-RFT's order.
    pub const NAMES: [&'static str; 4] =
        ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"];

    /// The name configs use.
    pub fn name(self) -> &'static str {
        match self {
            LossAggMode::TokenMean => Self::NAMES[0],
            LossAggMode::SeqMeanTokenSum => Self::NAMES[1],
            LossAggMode::SeqMeanTokenMean => Self::NAMES[2],
            LossAggMode::SeqMeanTokenSumNorm => Self::NAMES[3],
        }
    }

    /// Reduces `values` (rows × tokens) under `mask` to a scalar; `normalizer` only matters for
    /// `seq-mean-token-sum-norm`.
    pub fn aggregate(self, values: &Tensor, mask: &Tensor, normalizer: Option<f64>) -> Tensor {
        match self {
            LossAggMode::TokenMean => masked_mean(values, mask, None),
            LossAggMode::SeqMeanTokenSum => masked_sum(values, mask, Some(-1)).mean(tch::Kind::Float),
            LossAggMode::SeqMeanTokenMean => masked_mean(values, mask, Some(-1)).mean(tch::Kind::Float),
            LossAggMode::SeqMeanTokenSumNorm => {
                let norm = normalizer.unwrap_or_else(|| mask.size().last().copied().unwrap_or(0) as f64);
                masked_sum(values, mask, None) / (norm + 1e-8)
            }
        }
    }
}

impl FromStr for LossAggMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "token-mean" => Ok(LossAggMode::TokenMean),
            "seq-mean-token-sum" => Ok(LossAggMode::SeqMeanTokenSum),
            "seq-mean-token-mean" => Ok(LossAggMode::SeqMeanTokenMean),
            "seq-mean-token-sum-norm" => Ok(LossAggMode::SeqMeanTokenSumNorm),
            other => Err(format!("invalid loss_agg_mode `{other}`; choose from {}", Self::NAMES.join(", "))),
        }
    }
}

impl fmt::Display for LossAggMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::masked::scalar;

    #[test]
    fn modes_by_hand() {
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).view([2, 3]);
        let m = Tensor::from_slice(&[1.0f32, 1.0, 0.0, 1.0, 0.0, 0.0]).view([2, 3]);
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        close(scalar(&LossAggMode::TokenMean.aggregate(&x, &m, None)), 7.0 / 3.0);
        close(scalar(&LossAggMode::SeqMeanTokenSum.aggregate(&x, &m, None)), 3.5);
        close(scalar(&LossAggMode::SeqMeanTokenMean.aggregate(&x, &m, None)), (1.5 + 4.0) / 2.0);
        close(scalar(&LossAggMode::SeqMeanTokenSumNorm.aggregate(&x, &m, None)), 7.0 / 3.0);
        close(scalar(&LossAggMode::SeqMeanTokenSumNorm.aggregate(&x, &m, Some(7.0))), 1.0);
    }

    #[test]
    fn names_round_trip() {
        for name in LossAggMode::NAMES {
            assert_eq!(name.parse::<LossAggMode>().unwrap().name(), name);
        }
        assert!("mean".parse::<LossAggMode>().unwrap_err().contains("token-mean"));
    }
}
