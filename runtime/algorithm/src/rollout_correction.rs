//! Rollout correction (veRL's `rollout_corr_helper.py`, Trinity-RFT 0.6.0's `rollout_correction`): how far the
//! rollout engine's logprobs ℓ_roll are from the old logprobs ℓ_old the trainer recomputed, and what to do about
//! it, once per train step on the whole batch.
//!
//! With log r = ℓ_old − ℓ_roll per token and mask m:
//! * importance-sampling weights (`compute_rollout_correction_weights`): `token` w_t = e^{clamp(log r_t, ±20)};
//!   `sequence` w_i = e^{clamp(Σ_t m·log r, ±20)} on every token of the row; masked to m, then truncated to at
//!   most the threshold (TIS), detached; with batch normalisation divided by their mean (the masked token mean
//!   for `token`, the mean over rows with a token of each row's masked mean for `sequence`) when that is
//!   above 1e-8. The trainer multiplies each token's policy-loss term by w (veRL's `pg_losses · w`).
//! * rejection sampling (`compute_rollout_rejection_mask`): with log r clamped to ±20, k1 = −log r,
//!   k2 = ½(log r)², k3 = e^{log r} − 1 − log r; per token, or per row as the masked sum, masked mean or masked
//!   max (0 for a row without tokens); k1 is kept when ln lower ≤ k1 ≤ ln upper, k2 and k3 when ≤ upper. A token
//!   (or every token of a row, for the `seq_*` criteria) that fails any criterion gets mask 0.
//! * metrics (`compute_is_metrics`, `compute_rs_metrics`, `compute_offpolicy_metrics`), under veRL's names with
//!   the `rollout_corr/` prefix; the mismatch metrics compare ℓ_old with ℓ_roll on the mask before rejection.
//!
//! A batch without a trained token has nothing to correct: veRL raises there, this returns the inputs unchanged
//! and no metrics.

use tch::{Kind, Tensor};
use trinity_config::verl::{IsLevel, RolloutCorrectionSettings, RsAggregate, RsCriterion};

use crate::masked::{masked_mean, masked_sum};
use crate::metrics::Metrics;

/// veRL's `SAFETY_BOUND`: log ratios are clamped to ±20 before exponentiating.
const SAFETY_BOUND: f64 = 20.0;

/// What the correction gives the trainer.
#[derive(Debug)]
pub struct Correction {
    /// `[N, R]` weights (0 off the mask) when `rollout_is` is set.
    pub weights: Option<Tensor>,
    /// The action mask with the rejected tokens set to 0.
    pub mask: Tensor,
    /// `rollout_corr/*` metrics.
    pub metrics: Metrics,
}

fn item(t: &Tensor) -> f64 {
    t.double_value(&[])
}

/// Max and min of `values` where `keep` (a bool tensor) holds; `None` when it holds nowhere.
fn masked_extrema(values: &Tensor, keep: &Tensor) -> Option<(f64, f64)> {
    let picked = values.masked_select(keep);
    (picked.numel() > 0).then(|| (item(&picked.max()), item(&picked.min())))
}

/// Sample standard deviation (torch's `std`, n − 1), 0 for fewer than two values.
fn sample_std(values: &Tensor) -> f64 {
    if values.numel() > 1 { item(&values.std(true)) } else { 0.0 }
}

/// Applies `settings` to a batch: `old` and `rollout` logprobs and the action mask, all `[N, R]`.
pub fn correct(settings: &RolloutCorrectionSettings, old: &Tensor, rollout: &Tensor, mask: &Tensor) -> Correction {
    let old = old.to_kind(Kind::Float);
    let rollout = rollout.to_kind(Kind::Float);
    let mask = mask.to_kind(Kind::Float);
    let mut metrics = Metrics::new();
    if item(&mask.sum(Kind::Float)) <= 0.0 {
        return Correction { weights: None, mask, metrics };
    }
    let log_ratio = &old - &rollout;
    let weights = settings.is_level.map(|level| importance_weights(settings, level, &log_ratio, &mask, &mut metrics));
    let mut kept = mask.shallow_clone();
    if !settings.rs.is_empty() {
        kept = rejection_mask(&settings.rs, &log_ratio, &mask, &mut metrics);
    }
    offpolicy_metrics(&old, &rollout, &mask, &mut metrics);
    let metrics = metrics.into_iter().map(|(k, v)| (format!("rollout_corr/{k}"), v)).collect();
    Correction { weights, mask: kept, metrics }
}

/// Truncated (and optionally normalised) IS weights and veRL's `rollout_is_*` metrics.
fn importance_weights(
    settings: &RolloutCorrectionSettings,
    level: IsLevel,
    log_ratio: &Tensor,
    mask: &Tensor,
    metrics: &mut Metrics,
) -> Tensor {
    let threshold = settings.is_threshold;
    let (raw, log_for_metrics) = match level {
        IsLevel::Token => (log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp(), log_ratio.shallow_clone()),
        IsLevel::Sequence => {
            let sum = masked_sum(log_ratio, mask, Some(-1)).unsqueeze(-1);
            (sum.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp().expand_as(log_ratio), sum)
        }
    };
    let raw = raw * mask;
    is_metrics(&raw, &log_for_metrics, mask, level, threshold, metrics);
    let mut weights = raw.clamp_max(threshold).detach();
    if settings.is_batch_normalize {
        let mean = match level {
            IsLevel::Token => item(&masked_mean(&weights, mask, None)),
            IsLevel::Sequence => {
                let per_row = masked_mean(&weights, mask, Some(-1));
                let rows = mask.sum_dim_intlist(-1, false, Kind::Float).gt(0.0).to_kind(Kind::Float);
                item(&((per_row * &rows).sum(Kind::Float) / rows.sum(Kind::Float).clamp_min(1e-8)))
            }
        };
        if mean > 1e-8 {
            weights /= mean;
            metrics.insert("rollout_is_batch_norm_factor".into(), mean);
        } else {
            metrics.insert("rollout_is_batch_norm_factor".into(), 1.0);
        }
    }
    weights
}

/// veRL's `compute_is_metrics`, on the weights before truncation.
fn is_metrics(weights: &Tensor, log_ratio: &Tensor, mask: &Tensor, level: IsLevel, threshold: f64, m: &mut Metrics) {
    let lower = 1.0 / threshold;
    let keep = mask.gt(0.0);
    m.insert("rollout_is_mean".into(), item(&masked_mean(weights, mask, None)));
    match level {
        IsLevel::Sequence => {
            // Over every row's summed log ratio, rows without tokens included (their sum is 0), as veRL does.
            m.insert("rollout_is_max".into(), item(&log_ratio.max().clamp_max(SAFETY_BOUND).exp()));
            m.insert("rollout_is_min".into(), item(&log_ratio.min().exp()));
            let high = log_ratio.gt(threshold.ln()).to_kind(Kind::Float).mean(Kind::Float);
            let low = log_ratio.lt(lower.ln()).to_kind(Kind::Float).mean(Kind::Float);
            m.insert("rollout_is_ratio_fraction_high".into(), item(&high));
            m.insert("rollout_is_ratio_fraction_low".into(), item(&low));
        }
        IsLevel::Token => {
            let high = masked_mean(&weights.gt(threshold).to_kind(Kind::Float), mask, None);
            let low = masked_mean(&weights.lt(lower).to_kind(Kind::Float), mask, None);
            m.insert("rollout_is_ratio_fraction_high".into(), item(&high));
            m.insert("rollout_is_ratio_fraction_low".into(), item(&low));
            if let Some((max, min)) = masked_extrema(weights, &keep) {
                m.insert("rollout_is_max".into(), max);
                m.insert("rollout_is_min".into(), min);
            }
        }
    }
    let clamped = weights.clamp(lower, threshold);
    let std = if item(&mask.sum(Kind::Float)) > 1.0 {
        let mean = masked_mean(&clamped, mask, None);
        let var = masked_mean(&clamped.square(), mask, None) - mean.square();
        item(&var.clamp_min(0.0).sqrt())
    } else {
        0.0
    };
    m.insert("rollout_is_std".into(), std);
    let normalized = &clamped / (masked_mean(&clamped, mask, None) + 1e-8);
    m.insert("rollout_is_eff_sample_size".into(), 1.0 / item(&masked_mean(&normalized.square(), mask, None)));
    let per_row = masked_mean(weights, mask, Some(-1));
    m.insert("rollout_is_seq_mean".into(), item(&per_row.mean(Kind::Float)));
    m.insert("rollout_is_seq_std".into(), sample_std(&per_row));
    m.insert("rollout_is_seq_max".into(), item(&per_row.max()));
    m.insert("rollout_is_seq_min".into(), item(&per_row.min()));
    m.insert("rollout_is_seq_max_deviation".into(), item(&(&per_row - 1.0).abs().max()));
    m.insert(
        "rollout_is_seq_fraction_high".into(),
        item(&per_row.gt(threshold).to_kind(Kind::Float).mean(Kind::Float)),
    );
    m.insert("rollout_is_seq_fraction_low".into(), item(&per_row.lt(lower).to_kind(Kind::Float).mean(Kind::Float)));
}

/// The mask after every criterion of `rs`, and veRL's `rollout_rs_*` metrics.
fn rejection_mask(rs: &[RsCriterion], log_ratio: &Tensor, mask: &Tensor, m: &mut Metrics) -> Tensor {
    let safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND);
    let keep_token = mask.gt(0.0);
    let row_has_tokens = mask.sum_dim_intlist(-1, false, Kind::Float).gt(0.0);
    let mut combined = mask.ones_like();
    for criterion in rs {
        let per_token = match criterion.estimator {
            1 => -&safe,
            2 => safe.square() * 0.5,
            _ => safe.exp() - 1.0 - &safe,
        };
        let (lower_log, upper) = match criterion.lower {
            Some(lower) => (Some(lower.ln()), criterion.upper.ln()),
            None => (None, criterion.upper),
        };
        let per_row = match criterion.aggregate {
            RsAggregate::Token => None,
            RsAggregate::SeqSum => Some(masked_sum(&per_token, mask, Some(-1))),
            RsAggregate::SeqMean => Some(masked_mean(&per_token, mask, Some(-1))),
            RsAggregate::SeqMax => {
                let max = per_token.masked_fill(&keep_token.logical_not(), f64::NEG_INFINITY).amax([-1], false);
                Some(max.where_scalarother(&max.isinf().logical_not(), 0.0))
            }
        };
        let within = |stat: &Tensor| {
            let upper_ok = stat.le(upper);
            match lower_log {
                Some(l) => upper_ok.logical_and(&stat.ge(l)),
                None => upper_ok,
            }
        };
        let (stat, keep) = match &per_row {
            None => (per_token.shallow_clone(), within(&per_token)),
            Some(row) => (row.unsqueeze(-1).expand_as(mask), within(row).unsqueeze(-1).expand_as(mask)),
        };
        let keep_f = keep.to_kind(Kind::Float);
        combined *= &keep_f;
        rs_metrics(criterion, &stat, per_row.as_ref(), mask, &row_has_tokens, lower_log, upper, m);
        let name = &criterion.name;
        let rejected = masked_mean(&(1.0 - &keep_f), mask, None);
        m.insert(format!("rollout_rs_{name}_masked_fraction"), item(&rejected));
        // A row counts as rejected when one of its tokens is.
        let row_kept = keep.logical_not().logical_and(&keep_token).logical_not().all_dim(-1, false);
        let valid = row_has_tokens.to_kind(Kind::Float);
        let row_rejected: Tensor = (1.0 - row_kept.to_kind(Kind::Float)) * &valid;
        m.insert(
            format!("rollout_rs_{name}_seq_masked_fraction"),
            item(&(row_rejected.sum(Kind::Float) / valid.sum(Kind::Float))),
        );
    }
    m.insert("rollout_rs_masked_fraction".into(), item(&masked_mean(&(1.0 - &combined), mask, None)));
    let final_keep = combined.gt(0.5).logical_and(&keep_token);
    let row_has_rejected = final_keep.logical_not().logical_and(&keep_token).any_dim(-1, false);
    m.insert("rollout_rs_seq_masked_fraction".into(), item(&row_has_rejected.to_kind(Kind::Float).mean(Kind::Float)));
    mask * combined
}

/// veRL's `compute_rs_metrics` for one criterion; `stat` is per token (a row's statistic on each of its tokens for
/// the `seq_*` criteria), the thresholds in the statistic's space (logs for k1; lower 0 and unused for k2, k3).
#[allow(clippy::too_many_arguments)]
fn rs_metrics(
    criterion: &RsCriterion,
    stat: &Tensor,
    per_row: Option<&Tensor>,
    mask: &Tensor,
    row_has_tokens: &Tensor,
    lower_log: Option<f64>,
    upper: f64,
    m: &mut Metrics,
) {
    let prefix = format!("rollout_rs_{}", criterion.name);
    let keep = mask.gt(0.0);
    let rows = match per_row {
        Some(r) => r.shallow_clone(),
        None => masked_mean(stat, mask, Some(-1)),
    };
    let rows = rows.masked_select(row_has_tokens);
    let lower = lower_log.unwrap_or(0.0);
    m.insert(format!("{prefix}_mean"), item(&masked_mean(stat, mask, None)));
    let sequence = per_row.is_some() && rows.numel() > 0;
    let (max, min) = if sequence {
        (item(&rows.max()), item(&rows.min()))
    } else {
        masked_extrema(stat, &keep).unwrap_or((0.0, 0.0))
    };
    m.insert(format!("{prefix}_max"), max);
    m.insert(format!("{prefix}_min"), min);
    let frac = |t: Tensor| item(&t.to_kind(Kind::Float).mean(Kind::Float));
    let (high, low) = if sequence {
        (frac(rows.gt(upper)), if lower_log.is_some() { frac(rows.lt(lower)) } else { 0.0 })
    } else {
        let mean_of = |t: Tensor| item(&masked_mean(&t.to_kind(Kind::Float), mask, None));
        (mean_of(stat.gt(upper)), if lower_log.is_some() { mean_of(stat.lt(lower)) } else { 0.0 })
    };
    m.insert(format!("{prefix}_fraction_high"), high);
    m.insert(format!("{prefix}_fraction_low"), low);
    let std = if item(&mask.sum(Kind::Float)) > 1.0 {
        let clamped = stat.clamp(lower, upper);
        let mean = masked_mean(&clamped, mask, None);
        item(&(masked_mean(&clamped.square(), mask, None) - mean.square()).clamp_min(0.0).sqrt())
    } else {
        0.0
    };
    m.insert(format!("{prefix}_std"), std);
    if rows.numel() > 0 {
        m.insert(format!("{prefix}_seq_mean"), item(&rows.mean(Kind::Float)));
        m.insert(format!("{prefix}_seq_std"), sample_std(&rows));
        m.insert(format!("{prefix}_seq_max"), item(&rows.max()));
        m.insert(format!("{prefix}_seq_min"), item(&rows.min()));
        m.insert(format!("{prefix}_seq_max_deviation"), item(&rows.abs().max()));
        m.insert(format!("{prefix}_seq_fraction_high"), frac(rows.gt(upper)));
        if lower_log.is_some() {
            m.insert(format!("{prefix}_seq_fraction_low"), frac(rows.lt(lower)));
        }
    }
}

/// veRL's `compute_offpolicy_metrics`: training and rollout perplexities, KL estimators, χ².
fn offpolicy_metrics(old: &Tensor, rollout: &Tensor, mask: &Tensor, m: &mut Metrics) {
    let mean_old = masked_mean(old, mask, Some(-1));
    let mean_roll = masked_mean(rollout, mask, Some(-1));
    m.insert("training_ppl".into(), item(&(-&mean_old).exp().mean(Kind::Float)));
    m.insert("training_log_ppl".into(), item(&(-&mean_old).mean(Kind::Float)));
    m.insert("kl".into(), item(&masked_mean(&(rollout - old), mask, None)));
    let log_ratio = old - rollout;
    m.insert("k3_kl".into(), item(&masked_mean(&(log_ratio.exp() - &log_ratio - 1.0), mask, None)));
    m.insert("rollout_ppl".into(), item(&(-&mean_roll).exp().mean(Kind::Float)));
    m.insert("rollout_log_ppl".into(), item(&(-&mean_roll).mean(Kind::Float)));
    let diff = &mean_roll - &mean_old;
    m.insert("log_ppl_diff".into(), item(&diff.mean(Kind::Float)));
    m.insert("log_ppl_abs_diff".into(), item(&diff.abs().mean(Kind::Float)));
    m.insert("log_ppl_diff_max".into(), item(&diff.max()));
    m.insert("log_ppl_diff_min".into(), item(&diff.min()));
    m.insert("ppl_ratio".into(), item(&diff.exp().mean(Kind::Float)));
    let rho = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp();
    m.insert("chi2_token".into(), item(&(masked_mean(&rho.square(), mask, None) - 1.0)));
    let sum = masked_sum(&log_ratio, mask, Some(-1)).clamp(-SAFETY_BOUND, SAFETY_BOUND);
    m.insert("chi2_seq".into(), item(&((sum * 2.0).exp().mean(Kind::Float) - 1.0)));
}

#[cfg(test)]
mod tests {
    use trinity_config::verl::{NumberOrText, RolloutCorrection};

    use super::*;

    fn settings(
        is: Option<&str>,
        normalize: bool,
        rs: Option<&str>,
        rs_threshold: Option<&str>,
    ) -> RolloutCorrectionSettings {
        let rc = RolloutCorrection {
            bypass_mode: false,
            rollout_is: is.map(str::to_owned),
            rollout_is_threshold: 2.0,
            rollout_is_batch_normalize: normalize,
            rollout_rs: rs.map(str::to_owned),
            rollout_rs_threshold: rs_threshold.map(|t| NumberOrText::Text(t.to_owned())),
            ..RolloutCorrection::default()
        };
        rc.settings().unwrap()
    }

    fn t(rows: &[[f32; 3]]) -> Tensor {
        Tensor::from_slice(rows.concat().as_slice()).view([rows.len() as i64, 3])
    }

    /// Two rows, the second with a padding token whose logprobs are junk: log r = ℓ_old − ℓ_roll is
    /// [0.2, −0.5, 0] and [0, 0.8, ·].
    fn inputs() -> (Tensor, Tensor, Tensor) {
        (
            t(&[[-1.0, -2.0, -0.5], [-0.3, -0.2, -9.0]]),
            t(&[[-1.2, -1.5, -0.5], [-0.3, -1.0, -1.0]]),
            t(&[[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]),
        )
    }

    fn rows(x: &Tensor) -> Vec<Vec<f64>> {
        Vec::<Vec<f64>>::try_from(x.to_kind(Kind::Double)).unwrap()
    }

    fn close(a: f64, b: f64, what: &str) {
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{what}: {a}, expected {b}");
    }

    fn assert_rows(got: &Tensor, want: &[[f64; 3]]) {
        for (g, w) in rows(got).iter().zip(want) {
            for (a, b) in g.iter().zip(w) {
                close(*a, *b, &format!("{got:?}"));
            }
        }
    }

    /// Every metric veRL logs and no other, at the values of the formulas.
    fn assert_metrics(got: &Metrics, want: &[(&str, f64)]) {
        let names: Vec<String> = want.iter().map(|(k, _)| format!("rollout_corr/{k}")).collect();
        assert_eq!(got.keys().cloned().collect::<Vec<_>>(), names);
        for (k, v) in want {
            close(got[&format!("rollout_corr/{k}")], *v, k);
        }
    }

    // The expected numbers: veRL 0.7.1's `rollout_corr_helper.py` (`compute_rollout_correction_weights`,
    // `compute_is_metrics`, `compute_rollout_rejection_mask`, `compute_rs_metrics`, `compute_offpolicy_metrics`)
    // transcribed line by line into plain Python float arithmetic and run on `inputs()`. By hand for the first
    // case: token weights e^0.2 = 1.2214, e^−0.5 = 0.6065, 1, 1 and e^0.8 = 2.2255 truncated to 2; token_k1 keeps
    // −log r in [ln 0.7, ln 1.5] = [−0.357, 0.405], rejecting the tokens at −log r = 0.5 and −0.8; seq_mean_k3 is
    // mean(e^x − 1 − x) = 0.0426 and 0.2128 per row, rejecting row 2 (> 0.05); kl = mean(ℓ_roll − ℓ_old) = −0.1.
    /// `rollout_is: token`, threshold 2; `rollout_rs: token_k1,seq_mean_k3` at `0.7_1.5,0.05`.
    const TOKEN_K1_SEQ_MEAN_K3: &[(&str, f64)] = &[
        ("chi2_seq", 1.7509220302445705),
        ("chi2_token", 0.762547309116471),
        ("k3_kl", 0.1106948690516645),
        ("kl", -0.0999999998),
        ("log_ppl_abs_diff", 0.2499999988333333),
        ("log_ppl_diff", -0.1499999991666668),
        ("log_ppl_diff_max", 0.0999999996666665),
        ("log_ppl_diff_min", -0.3999999980000001),
        ("ppl_ratio", 0.8877454825417682),
        ("rollout_is_eff_sample_size", 0.8642770220903765),
        ("rollout_is_max", 2.225540928492468),
        ("rollout_is_mean", 1.2106948668516646),
        ("rollout_is_min", 0.6065306597126334),
        ("rollout_is_ratio_fraction_high", 0.1999999996),
        ("rollout_is_ratio_fraction_low", 0.0),
        ("rollout_is_seq_fraction_high", 0.0),
        ("rollout_is_seq_fraction_low", 0.0),
        ("rollout_is_seq_max", 1.6127704561823817),
        ("rollout_is_seq_max_deviation", 0.6127704561823817),
        ("rollout_is_seq_mean", 1.2777074628322507),
        ("rollout_is_seq_min", 0.9426444694821196),
        ("rollout_is_seq_std", 0.4738506294450815),
        ("rollout_is_std", 0.46189664766773036),
        ("rollout_log_ppl", 0.8583333299305557),
        ("rollout_ppl", 2.4106092796695457),
        ("rollout_rs_masked_fraction", 0.5999999988),
        ("rollout_rs_seq_masked_fraction", 1.0),
        ("rollout_rs_seq_mean_k3_fraction_high", 0.5),
        ("rollout_rs_seq_mean_k3_fraction_low", 0.0),
        ("rollout_rs_seq_mean_k3_masked_fraction", 0.3999999992),
        ("rollout_rs_seq_mean_k3_max", 0.2127704631823816),
        ("rollout_rs_seq_mean_k3_mean", 0.11069486854083463),
        ("rollout_rs_seq_mean_k3_min", 0.042644472482119535),
        ("rollout_rs_seq_mean_k3_seq_fraction_high", 0.5),
        ("rollout_rs_seq_mean_k3_seq_masked_fraction", 0.5),
        ("rollout_rs_seq_mean_k3_seq_max", 0.2127704631823816),
        ("rollout_rs_seq_mean_k3_seq_max_deviation", 0.2127704631823816),
        ("rollout_rs_seq_mean_k3_seq_mean", 0.12770746783225057),
        ("rollout_rs_seq_mean_k3_seq_min", 0.042644472482119535),
        ("rollout_rs_seq_mean_k3_seq_std", 0.12029724168023483),
        ("rollout_rs_seq_mean_k3_std", 0.003603458414666892),
        ("rollout_rs_token_k1_fraction_high", 0.1999999996),
        ("rollout_rs_token_k1_fraction_low", 0.1999999996),
        ("rollout_rs_token_k1_masked_fraction", 0.3999999992),
        ("rollout_rs_token_k1_max", 0.5),
        ("rollout_rs_token_k1_mean", -0.0999999998),
        ("rollout_rs_token_k1_min", -0.8),
        ("rollout_rs_token_k1_seq_fraction_high", 0.0),
        ("rollout_rs_token_k1_seq_fraction_low", 0.5),
        ("rollout_rs_token_k1_seq_masked_fraction", 1.0),
        ("rollout_rs_token_k1_seq_max", 0.09999999966666669),
        ("rollout_rs_token_k1_seq_max_deviation", 0.399999998),
        ("rollout_rs_token_k1_seq_mean", -0.14999999916666668),
        ("rollout_rs_token_k1_seq_min", -0.399999998),
        ("rollout_rs_token_k1_seq_std", 0.35355338894335797),
        ("rollout_rs_token_k1_std", 0.255752257464733),
        ("training_log_ppl", 0.7083333307638888),
        ("training_ppl", 2.247647972873998),
    ];
    /// `rollout_is: sequence`, threshold 2, batch-normalised; `rollout_rs: seq_max_k2` at 0.1 (rejects every row).
    const SEQUENCE_NORMALIZED_SEQ_MAX_K2: &[(&str, f64)] = &[
        ("chi2_seq", 1.7509220302445705),
        ("chi2_token", 0.762547309116471),
        ("k3_kl", 0.1106948690516645),
        ("kl", -0.0999999998),
        ("log_ppl_abs_diff", 0.2499999988333333),
        ("log_ppl_diff", -0.1499999991666668),
        ("log_ppl_diff_max", 0.0999999996666665),
        ("log_ppl_diff_min", -0.3999999980000001),
        ("ppl_ratio", 0.8877454825417682),
        ("rollout_is_batch_norm_factor", 1.370409104106162),
        ("rollout_is_eff_sample_size", 0.8027617028291429),
        ("rollout_is_max", 2.225540928492468),
        ("rollout_is_mean", 1.334707301136603),
        ("rollout_is_min", 0.7408182206817179),
        ("rollout_is_ratio_fraction_high", 0.5),
        ("rollout_is_ratio_fraction_low", 0.0),
        ("rollout_is_seq_fraction_high", 0.5),
        ("rollout_is_seq_fraction_low", 0.0),
        ("rollout_is_seq_max", 2.2255409173647633),
        ("rollout_is_seq_max_deviation", 1.2255409173647633),
        ("rollout_is_seq_mean", 1.4831795677885435),
        ("rollout_is_seq_min", 0.7408182182123239),
        ("rollout_is_seq_std", 1.0498574887522842),
        ("rollout_is_std", 0.6168705724417192),
        ("rollout_log_ppl", 0.8583333299305557),
        ("rollout_ppl", 2.4106092796695457),
        ("rollout_rs_masked_fraction", 0.9999999980000001),
        ("rollout_rs_seq_masked_fraction", 1.0),
        ("rollout_rs_seq_max_k2_fraction_high", 1.0),
        ("rollout_rs_seq_max_k2_fraction_low", 0.0),
        ("rollout_rs_seq_max_k2_masked_fraction", 0.9999999980000001),
        ("rollout_rs_seq_max_k2_max", 0.32000000000000006),
        ("rollout_rs_seq_max_k2_mean", 0.20299999959400003),
        ("rollout_rs_seq_max_k2_min", 0.125),
        ("rollout_rs_seq_max_k2_seq_fraction_high", 1.0),
        ("rollout_rs_seq_max_k2_seq_masked_fraction", 1.0),
        ("rollout_rs_seq_max_k2_seq_max", 0.32000000000000006),
        ("rollout_rs_seq_max_k2_seq_max_deviation", 0.32000000000000006),
        ("rollout_rs_seq_max_k2_seq_mean", 0.22250000000000003),
        ("rollout_rs_seq_max_k2_seq_min", 0.125),
        ("rollout_rs_seq_max_k2_seq_std", 0.1378858223313768),
        ("rollout_rs_seq_max_k2_std", 4.472136140012669e-06),
        ("training_log_ppl", 0.7083333307638888),
        ("training_ppl", 2.247647972873998),
    ];

    #[test]
    fn token_weights_are_truncated_and_rejected_tokens_leave_the_mask() {
        let (old, rollout, mask) = inputs();
        let s = settings(Some("token"), false, Some("token_k1,seq_mean_k3"), Some("0.7_1.5,0.05"));
        let c = correct(&s, &old, &rollout, &mask);
        assert_rows(c.weights.as_ref().unwrap(), &[[1.2214028, 0.6065307, 1.0], [1.0, 2.0, 0.0]]);
        assert_rows(&c.mask, &[[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]);
        assert_metrics(&c.metrics, TOKEN_K1_SEQ_MEAN_K3);
    }

    /// Sequence weights e^−0.3 = 0.7408 and e^0.8 → 2, normalised by their mean 1.3704; every row rejected.
    #[test]
    fn sequence_weights_normalise_to_mean_one_and_all_rows_can_be_rejected() {
        let (old, rollout, mask) = inputs();
        let s = settings(Some("sequence"), true, Some("seq_max_k2"), Some("0.1"));
        let c = correct(&s, &old, &rollout, &mask);
        let (a, b) = (0.7408182 / 1.3704091, 2.0 / 1.3704091);
        assert_rows(c.weights.as_ref().unwrap(), &[[a, a, a], [b, b, 0.0]]);
        assert_rows(&c.mask, &[[0.0; 3], [0.0; 3]]);
        assert_metrics(&c.metrics, SEQUENCE_NORMALIZED_SEQ_MAX_K2);
    }

    /// Bypass mode (the old logprobs are the rollout's): weight 1 everywhere, nothing rejected, no mismatch.
    #[test]
    fn identical_logprobs_give_weight_one_and_reject_nothing() {
        let (old, _, mask) = inputs();
        for level in ["token", "sequence"] {
            let s = settings(
                Some(level),
                true,
                Some("token_k1,seq_sum_k1,seq_mean_k3,seq_max_k2"),
                Some("0.5_2.0,2.0,0.01,0.01"),
            );
            let c = correct(&s, &old, &old, &mask);
            assert_rows(c.weights.as_ref().unwrap(), &[[1.0; 3], [1.0, 1.0, 0.0]]);
            assert_rows(&c.mask, &[[1.0; 3], [1.0, 1.0, 0.0]]);
            for k in ["kl", "k3_kl", "chi2_token", "chi2_seq", "log_ppl_diff", "rollout_rs_masked_fraction"] {
                close(c.metrics[&format!("rollout_corr/{k}")], 0.0, k);
            }
            close(c.metrics["rollout_corr/rollout_is_eff_sample_size"], 1.0, "ess");
        }
    }

    /// No weights without `rollout_is`; no trained token: nothing to correct (veRL raises).
    #[test]
    fn metrics_only_and_empty_batches() {
        let (old, rollout, mask) = inputs();
        let c = correct(&settings(None, false, None, None), &old, &rollout, &mask);
        assert!(c.weights.is_none());
        assert_rows(&c.mask, &[[1.0; 3], [1.0, 1.0, 0.0]]);
        close(c.metrics["rollout_corr/kl"], -0.1, "kl");
        assert!(!c.metrics.keys().any(|k| k.contains("rollout_is") || k.contains("rollout_rs")));
        let empty = mask.zeros_like();
        let c = correct(&settings(Some("token"), false, None, None), &old, &rollout, &empty);
        assert!(c.weights.is_none() && c.metrics.is_empty());
    }
}
