//! Loss aggregation (Trinity-RFT's `aggregate_loss`): how per-token losses become one scalar.
//!
//! With per-token values x, mask m, B rows and padded length L:
//! * `token-mean`: Σ m·x / (Σ m + 1e-8)
//! * `seq-mean-token-sum`: (1/B) Σ_i Σ_t m·x
//! * `seq-mean-token-mean`: (1/B) Σ_i [Σ_t m·x / (Σ_t m + 1e-8)] (a fully masked row counts as 0)
//! * `seq-mean-token-sum-norm`: Σ m·x / (N + 1e-8), N = the normalizer or L
//!
//! A batch trained in parts (micro-batches, data-parallel ranks' shares) gets the whole batch's aggregate as the
//! weighted sum of its parts' aggregates: [`LossAggMode::part_weight`] weighs a part by its share of the whole's
//! denominator (its trained tokens for `token-mean`, its rows for the seq-mean modes; 1 for
//! `seq-mean-token-sum-norm`, whose denominator does not depend on the rows when every part is padded to the
//! whole's width, as the trainer pads them). This is the sum form veRL's newer actors compute with the global token
//! count; Trinity-RFT's default scale (rows in micro-batch / rows in mini-batch) is right only for the seq-mean
//! modes.
//!
//! The seq-mean modes divide by the number of rows; on a batch with no rows libtorch's mean is NaN, as in
//! Trinity-RFT — callers that may hand over an empty split (mix) guard against that themselves.

use std::fmt;
use std::str::FromStr;

use tch::Tensor;

use crate::masked::{masked_mean, masked_sum};

/// What a batch, or a part of one, holds of the aggregation's denominators: rows and trained (unmasked) tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AggCounts {
    pub rows: f64,
    pub tokens: f64,
}

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

impl LossAggMode {
    /// The weight of a part's aggregate in the whole's: for parts that split the whole's rows, each padded to the
    /// whole's width, `Σ part_weight(part, whole) · aggregate(part) = aggregate(whole)` (up to rounding).
    pub fn part_weight(self, part: AggCounts, whole: AggCounts) -> f64 {
        match self {
            // aggregate(part) = S_part / (T_part + ε); the whole's is S_part / (T + ε) summed over the parts.
            LossAggMode::TokenMean => (part.tokens + 1e-8) / (whole.tokens + 1e-8),
            LossAggMode::SeqMeanTokenSum | LossAggMode::SeqMeanTokenMean => {
                if whole.rows > 0.0 {
                    part.rows / whole.rows
                } else {
                    0.0
                }
            }
            // S_part / (N + ε) with the same N (the normalizer or the padded width) in every part.
            LossAggMode::SeqMeanTokenSumNorm => 1.0,
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

    /// Rows of unequal length in parts of 1 and 3 rows: the weighted parts sum to the whole for every mode.
    #[test]
    fn weighted_parts_sum_to_the_whole() {
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]).view([4, 3]);
        let m = Tensor::from_slice(&[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0]).view([4, 3]);
        let counts = |rows: &[i64]| {
            let idx = Tensor::from_slice(rows);
            AggCounts { rows: rows.len() as f64, tokens: scalar(&m.index_select(0, &idx).sum(tch::Kind::Float)) }
        };
        let whole = counts(&[0, 1, 2, 3]);
        for mode in LossAggMode::NAMES.map(|n| n.parse::<LossAggMode>().unwrap()) {
            let mut sum = 0.0;
            for part in [&[0i64][..], &[1, 2, 3]] {
                let idx = Tensor::from_slice(part);
                let agg = scalar(&mode.aggregate(&x.index_select(0, &idx), &m.index_select(0, &idx), None));
                sum += mode.part_weight(counts(part), whole) * agg;
            }
            let all = scalar(&mode.aggregate(&x, &m, None));
            assert!((sum - all).abs() < 1e-5, "{mode}: parts {sum} vs whole {all}");
        }
    }

    #[test]
    fn names_round_trip() {
        for name in LossAggMode::NAMES {
            assert_eq!(name.parse::<LossAggMode>().unwrap().name(), name);
        }
        assert!("mean".parse::<LossAggMode>().unwrap_err().contains("token-mean"));
    }
}
