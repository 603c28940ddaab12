//! `clipb`: GRPO advantages with Clip_B token filtering (Trinity-RFT 0.6.0's `ClipBAdvantageFn`,
//! arXiv:2602.03392), trainer side.
//!
//! Advantages are `grpo_verl`'s: s_i = Σ_t token_level_rewards_i, per group (`group_id`) μ, σ = mean, unbiased
//! std (one row: μ = 0, σ = 1), A_i = (s_i − μ)/(σ + ε)·m_i; returns = A.
//!
//! Then the training mask is narrowed. With ℓ the rollout logprobs (Trinity reads `rollout_log_probs`:
//! `rollout_logprob` when the trainer recomputed `old_logprob`, else `old_logprob`, which then holds them) and H
//! the per-token entropy of the policy before the update (`entropy`, which the trainer computes for this
//! function), S = e^ℓ·(H + ℓ). Over the mask's n = max(Σm, 1)
//! tokens: E = Σ S·m / n, Var = Σ (S − E)²·m / n (population variance), σ_S = √Var. When σ_S < 1e-12 every
//! token is kept; otherwise a token with A < 0 is kept only when S − E ≥ −μ·σ_S, and tokens with A ≥ 0 are
//! always kept. The narrowed mask m·keep is what the losses train on ([`AdvantageOutput::action_mask`]).
//!
//! Metrics (under `advantage/` in the trainer): `frac_clipped` = 1 − Σ m' / n, `frac_clipped_pos` and
//! `frac_clipped_neg` the same over the tokens with A > 0 and A < 0 (each denominator clamped to at least 1, so
//! a batch without positive tokens reports `frac_clipped_pos` = 1, as Trinity-RFT does), `ES` = E, `varS` = Var.

use tch::{Kind, Tensor};

use crate::advantage::grpo_verl::sequence_scores;
use crate::advantage::{
    AdvantageFn, AdvantageFnEntry, AdvantageOutput, PolicyStats, broadcast_rows, mean_f32, std_f32,
};
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::{Batch, group_rows};
use crate::error::AlgorithmError;
use crate::metrics::Metrics;

/// A one-element tensor as `f64`.
pub(crate) fn scalar(t: &Tensor) -> f64 {
    t.double_value(&[])
}

const NAME: &str = "clipb";

const ARGS: &[ArgSpec] = &[arg("epsilon", ArgDefault::Float(1e-6)), arg("mu", ArgDefault::Float(2.5))];

/// Below this spread of the entropy signal nothing is clipped (Trinity-RFT's constant).
pub(crate) const MIN_SIGNAL_STD: f64 = 1e-12;

#[derive(Debug)]
struct ClipB {
    epsilon: f32,
    mu: f64,
}

fn build(args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    Ok(Box::new(ClipB { epsilon: args.f64("epsilon")? as f32, mu: args.f64("mu")? }))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: true, build } }

/// `grpo_verl`'s group-normalised scores, one per row, in `f32`: (s − μ)/(σ + ε), μ = 0 and σ = 1 for a group
/// of one.
pub(crate) fn group_scores(batch: &Batch, epsilon: f32, component: &str) -> Result<Vec<f32>, AlgorithmError> {
    let mut scores = sequence_scores(batch, component)?;
    for group in group_rows(batch.groups(component)?) {
        let s: Vec<f32> = group.iter().map(|&i| scores[i]).collect();
        let (mean, std) = if s.len() == 1 { (0.0, 1.0) } else { (mean_f32(&s), std_f32(&s)) };
        for &i in &group {
            scores[i] = (scores[i] - mean) / (std + epsilon);
        }
    }
    Ok(scores)
}

/// The entropy signal S = e^ℓ·(H + ℓ) per token.
pub(crate) fn entropy_signal(logprob: &Tensor, entropy: &Tensor) -> Tensor {
    logprob.exp() * (entropy + logprob)
}

/// Masked mean and population variance of `x` over `mask`'s tokens (n clamped to at least 1).
pub(crate) fn masked_moments(x: &Tensor, mask: &Tensor) -> (Tensor, Tensor) {
    let n = mask.sum(Kind::Float).clamp_min(1.0);
    let mean = (x * mask).sum(Kind::Float) / &n;
    let var = ((x - &mean).square() * mask).sum(Kind::Float) / &n;
    (mean, var)
}

/// The clipping metrics both Clip_B and Clip_V report: the fraction of the mask's tokens (all, A > 0, A < 0)
/// the narrowed mask drops, each denominator clamped to at least 1.
pub(crate) fn clip_fractions(mask: &Tensor, clipped: &Tensor, advantages: &Tensor) -> Metrics {
    let frac = |part: Option<&Tensor>| {
        let (kept, total) = match part {
            Some(p) => ((clipped * p).sum(Kind::Float), (mask * p).sum(Kind::Float)),
            None => (clipped.sum(Kind::Float), mask.sum(Kind::Float)),
        };
        1.0 - scalar(&(kept / total.clamp_min(1.0)))
    };
    let pos = advantages.gt(0.0).to_kind(Kind::Float);
    let neg = advantages.lt(0.0).to_kind(Kind::Float);
    Metrics::from([
        ("frac_clipped".to_owned(), frac(None)),
        ("frac_clipped_pos".to_owned(), frac(Some(&pos))),
        ("frac_clipped_neg".to_owned(), frac(Some(&neg))),
    ])
}

impl AdvantageFn for ClipB {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let scores = group_scores(batch, self.epsilon, NAME)?;
        let logprob = match &batch.rollout_logprob {
            Some(rollout) => rollout,
            None => batch.need("old_logprob", &batch.old_logprob, NAME)?,
        };
        let entropy = batch.need("entropy", &batch.entropy, NAME)?;
        let mask = &batch.action_mask;
        let advantages = broadcast_rows(&scores, mask);

        let signal = entropy_signal(logprob, entropy);
        let (mean, var) = masked_moments(&signal, mask);
        let std = scalar(&var.sqrt());
        let keep = if std < MIN_SIGNAL_STD {
            mask.ones_like()
        } else {
            let kept_negative = (&signal - &mean).ge(-self.mu * std);
            advantages.lt(0.0).logical_not().logical_or(&kept_negative).to_kind(Kind::Float)
        };
        let clipped = mask * keep;

        let mut metrics = clip_fractions(mask, &clipped, &advantages);
        metrics.insert("ES".into(), scalar(&mean));
        metrics.insert("varS".into(), scalar(&var));
        Ok(AdvantageOutput { returns: advantages.copy(), advantages, metrics, rows: None, action_mask: Some(clipped) })
    }

    fn policy_stats(&self) -> PolicyStats {
        PolicyStats { entropy: true, necs: false }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::testing::{assert_close as close, eval_err, eval_json, json};

    /// Rows 0–1 are group a (rewards 1, 0), row 2 a group of one (reward 3). The expected numbers below are
    /// 0.6.0's `ClipBAdvantageFn.__call__` (trinity/algorithm/advantage_fn/clipb_advantage.py) restated in a
    /// short plain-Python script (double precision): S = [[0.09048, 0.13534], [0.60653, 0.04756],
    /// [−0.07358, 0.44449]], E = 0.208471, Var = 0.056478 (σ_S = 0.237651).
    pub(crate) fn batch() -> serde_json::Value {
        json!({
            "group_id": ["a", "a", "b"],
            "token_level_rewards": [[0.0, 1.0], [0.0, 0.0], [0.0, 3.0]],
            "old_logprob": [[-0.1, -2.0], [-0.5, -0.05], [-1.0, -0.3]],
            "entropy": [[0.2, 3.0], [1.5, 0.1], [0.8, 0.9]],
            "action_mask": [[1, 1], [1, 1], [1, 1]]
        })
    }

    #[test]
    fn advantages_and_lower_side_clip_of_negative_tokens() {
        // Group a: A = ±0.5/(0.707107 + 1e-6); group of one: A = 3/(1 + 1e-6). With μ = 0.5 the negative row 1's
        // second token (S − E = −0.16091 < −0.5·σ_S = −0.11883) is clipped; row 2's first token lies further
        // below E but its advantage is positive, so it stays.
        let out = eval_json(json!({"advantage_fn": "clipb", "advantage_fn_args": {"mu": 0.5}, "batch": batch()}));
        close(&out["advantages"][0][0], 0.707_105_78);
        close(&out["advantages"][1][1], -0.707_105_78);
        close(&out["advantages"][2][0], 2.999_997);
        close(&out["returns"][2][1], 2.999_997);
        assert_eq!(out["action_mask"], json!([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]));
        let m = &out["metrics"];
        close(&m["advantage/frac_clipped"], 1.0 / 6.0);
        close(&m["advantage/frac_clipped_neg"], 0.5);
        close(&m["advantage/frac_clipped_pos"], 0.0);
        close(&m["advantage/ES"], 0.208_471_03);
        close(&m["advantage/varS"], 0.056_478_18);
    }

    #[test]
    fn default_mu_keeps_everything_here_and_all_equal_rewards_report_one() {
        // μ = 2.5: −2.5·σ_S = −0.594 is below every S − E, so nothing is clipped.
        let out = eval_json(json!({"advantage_fn": "clipb", "batch": batch()}));
        assert_eq!(out["action_mask"], json!([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]));
        close(&out["metrics"]["advantage/frac_clipped"], 0.0);
        // All-equal rewards in one group: every advantage is 0, and Trinity's clamped denominators give
        // frac_clipped_pos = frac_clipped_neg = 1 − 0/1 = 1 although nothing is clipped.
        let mut b = batch();
        b["group_id"] = json!(["a", "a", "a"]);
        b["token_level_rewards"] = json!([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]);
        let out = eval_json(json!({"advantage_fn": "clipb", "advantage_fn_args": {"mu": 0.5}, "batch": b}));
        close(&out["advantages"][0][0], 0.0);
        assert_eq!(out["action_mask"], json!([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]));
        close(&out["metrics"]["advantage/frac_clipped"], 0.0);
        close(&out["metrics"]["advantage/frac_clipped_pos"], 1.0);
        close(&out["metrics"]["advantage/frac_clipped_neg"], 1.0);
    }

    #[test]
    fn a_flat_signal_keeps_every_token_and_padding_stays_masked() {
        // ℓ = 0 and H = 0 everywhere: S = 0, σ_S = 0 < 1e-12, so even μ = 0 clips nothing.
        let out = eval_json(json!({"advantage_fn": "clipb", "advantage_fn_args": {"mu": 0.0}, "batch": {
            "group_id": ["a", "a"], "reward": [1.0, 0.0], "old_logprob": [[0.0, 0.0], [0.0, 0.0]],
            "entropy": [[0.0, 0.0], [0.0, 0.0]], "action_mask": [[1, 0], [1, 1]]}}));
        assert_eq!(out["action_mask"], json!([[1.0, 0.0], [1.0, 1.0]]));
        close(&out["metrics"]["advantage/varS"], 0.0);
    }

    #[test]
    fn epsilon_enters_the_denominator_and_entropy_is_required() {
        let out = eval_json(json!({"advantage_fn": "clipb", "advantage_fn_args": {"epsilon": 0.5}, "batch": batch()}));
        // Group a: 0.5/(0.707107 + 0.5) = 0.414214; group of one: 3/(1 + 0.5) = 2.
        close(&out["advantages"][0][1], 0.414_213_56);
        close(&out["advantages"][2][1], 2.0);
        let mut b = batch();
        b.as_object_mut().unwrap().remove("entropy");
        let err = eval_err(json!({"advantage_fn": "clipb", "batch": b}));
        assert!(err.contains("entropy") && err.contains("clipb"), "{err}");
    }

    #[test]
    fn the_rollout_logprobs_win_over_recomputed_old_ones() {
        // With `rollout_logprob` beside a recomputed `old_logprob`, S is built from the rollout's (Trinity reads
        // `rollout_log_probs`): the same ES as the batch whose old_logprob holds them.
        let mut b = batch();
        b["rollout_logprob"] = b["old_logprob"].clone();
        b["old_logprob"] = json!([[-3.0, -3.0], [-3.0, -3.0], [-3.0, -3.0]]);
        let out = eval_json(json!({"advantage_fn": "clipb", "batch": b}));
        close(&out["metrics"]["advantage/ES"], 0.208_471_03);
    }

    #[test]
    fn losses_train_on_the_narrowed_mask() {
        // SFT's token-mean loss over the narrowed mask: row 1's second token leaves the mean and the gradient.
        let mut b = batch();
        b["logprob"] = json!([[-1.0, -2.0], [-3.0, -4.0], [-5.0, -6.0]]);
        let out = eval_json(json!({"advantage_fn": "clipb", "advantage_fn_args": {"mu": 0.5},
                                   "policy_loss_fn": "sft", "batch": b}));
        close(&out["pg_loss"], (1.0 + 2.0 + 3.0 + 5.0 + 6.0) / 5.0);
        close(&out["grad_logprob"][1][1], 0.0);
        close(&out["grad_logprob"][1][0], -0.2);
    }
}
