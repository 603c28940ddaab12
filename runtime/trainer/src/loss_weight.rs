//! How a micro-batch's loss terms and metrics weigh in its mini-batch's, so that a step's loss, gradient and logged
//! values do not depend on how its rows are cut into micro-batches, passes or data-parallel ranks' shares.
//!
//! Each term of the loss (policy loss, entropy bonus, KL loss, the critic's value loss) is an aggregate under some
//! `loss_agg_mode` ([`trinity_algorithm::aggregation`]); the mini-batch's is the sum over its micro-batches of each
//! micro-batch's aggregate times [`LossAggMode::part_weight`], with the denominators (rows, trained tokens) counted
//! over the whole mini-batch. Every rank holds the whole step's rows, so it counts the global denominators itself:
//! no collective is needed, and the ranks' gradients are then summed ([`crate::data_parallel`]). A term of unknown
//! form (a policy loss whose [`loss_agg_mode`](trinity_algorithm::policy_loss::PolicyLossFn::loss_agg_mode) is
//! `None`: DPO's mean over pairs, `mix`, a library's loss) is weighted by rows, Trinity-RFT's
//! `micro_bsz / ppo_mini_batch_size`.
//!
//! Metrics: a component's metrics whose names end in `loss` are its aggregate, so they are summed with the loss
//! weight; the others (clip fractions, `ppo_kl`, entropy) are means weighted by the micro-batch's share of the
//! denominator (its tokens under `token-mean`, else its rows), which for token means is the whole mini-batch's
//! token mean. The shares of a mini-batch's micro-batches add up to 1 over all ranks, so a metric's mean is the
//! mean over mini-batches of each mini-batch's value.

use tch::{Kind, Tensor};
use trinity_algorithm::{AggCounts, LossAggMode};

use crate::error::Result;

/// The step's trained tokens per row (the action mask's sum), and which rows are expert rows.
#[derive(Debug)]
pub(crate) struct RowCounts {
    tokens: Vec<f64>,
    expert: Vec<bool>,
}

impl RowCounts {
    /// From the step's `[N, R]` action mask and its rows' expert flags (empty: none is).
    pub(crate) fn new(mask: &Tensor, expert: &[bool]) -> Result<Self> {
        let tokens = Vec::<f64>::try_from(mask.f_sum_dim_intlist(1, false, Kind::Double)?)?;
        Ok(RowCounts { tokens, expert: expert.to_vec() })
    }

    /// Rows and trained tokens of `rows` (repeats count again), or of its usual (non-expert) rows only.
    pub(crate) fn of(&self, rows: &[usize], usual_only: bool) -> AggCounts {
        let mut counts = AggCounts::default();
        for &i in rows.iter().filter(|&&i| !(usual_only && self.expert.get(i).copied().unwrap_or(false))) {
            counts.rows += 1.0;
            counts.tokens += self.tokens[i];
        }
        counts
    }
}

/// How one term's micro-batch value weighs: `loss` in the mini-batch's loss (and loss metrics), `share` in the
/// means of its other metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Weight {
    pub loss: f64,
    pub share: f64,
}

impl Weight {
    /// A value that is already the whole's (counted once per rank and pooled as a mean over ranks).
    pub(crate) const WHOLE: Weight = Weight { loss: 1.0, share: 1.0 };

    /// The weight of a part with `part` counts of a mini-batch with `whole` counts, for a term aggregated under
    /// `mode` (`None`: by rows).
    pub(crate) fn new(mode: Option<LossAggMode>, part: AggCounts, whole: AggCounts) -> Self {
        let rows = LossAggMode::SeqMeanTokenMean.part_weight(part, whole);
        match mode {
            None => Weight { loss: rows, share: rows },
            Some(LossAggMode::TokenMean) => {
                let tokens = LossAggMode::TokenMean.part_weight(part, whole);
                Weight { loss: tokens, share: tokens }
            }
            Some(m) => Weight { loss: m.part_weight(part, whole), share: rows },
        }
    }

    /// The weight of a metric of `key` (see the module docs).
    pub(crate) fn of_metric(self, key: &str) -> f64 {
        if key.ends_with("loss") { self.loss } else { self.share }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_weights() {
        let mask = Tensor::from_slice(&[1.0f32, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0]).view([3, 3]);
        let counts = RowCounts::new(&mask, &[false, true, false]).unwrap();
        let whole = counts.of(&[0, 1, 2], false);
        assert_eq!(whole, AggCounts { rows: 3.0, tokens: 6.0 });
        assert_eq!(counts.of(&[0, 1, 2], true), AggCounts { rows: 2.0, tokens: 5.0 });
        let part = counts.of(&[1], false);
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-8, "{a} vs {b}");
        close(Weight::new(Some(LossAggMode::TokenMean), part, whole).loss, 1.0 / 6.0);
        close(Weight::new(Some(LossAggMode::SeqMeanTokenSum), part, whole).share, 1.0 / 3.0);
        let norm = Weight::new(Some(LossAggMode::SeqMeanTokenSumNorm), part, whole);
        assert_eq!((norm.of_metric("pg_loss"), norm.of_metric("pg_clipfrac")), (1.0, 1.0 / 3.0));
        close(Weight::new(None, part, whole).loss, 1.0 / 3.0);
    }
}
