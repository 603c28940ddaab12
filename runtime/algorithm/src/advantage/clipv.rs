//! `clipv`: GRPO advantages with Clip_V token filtering (Trinity-RFT 0.6.0's `ClipVAdvantageFn`,
//! arXiv:2602.03392), trainer side.
//!
//! Advantages are `grpo_verl`'s, as in [`super::clipb`]. Then, with ℓ the policy's logprobs before the update
//! (`old_logprob`; Trinity reads `old_log_probs`, recomputed under `bypass_mode: false`), H the per-token
//! entropy (`entropy`) and N the per-token `necs` field: D = N − e^ℓ·(H + ℓ), and over the mask's
//! n = max(Σm, 1) tokens σ_D = the population std of D. When σ_D < 1e-12 every token is kept. Otherwise a token
//! with A > 0 is kept and every other token (A < 0 *and* A = 0, as Trinity-RFT's `torch.where` has it) is kept
//! only when D ≤ μ·σ_D (not centred). When that clips more than `max_frac` of the n tokens and the clipped
//! tokens with A < 0 number more than k = max(⌊max_frac·n⌋, 1), only the k of them with the largest D stay
//! clipped (libtorch's `topk`); clipped A = 0 tokens stay clipped either way.
//!
//! `necs` is not produced by Trinity-RFT 0.6.0 itself: its entropy example leaves Clip_V's trainer patch "coming
//! soon", so 0.6.0 stops on the missing field. trinity's trainer computes it from the whole next-token
//! distribution p as N = Σ_v p_v·S_v = Σ_v p_v²·(H + log p_v), the expectation under p of the entropy
//! discriminator S_v = p_v·(H + log p_v) (the quantity the paper's first-order entropy change
//! ΔH ∝ −A·(S − E_p[S]) subtracts, so D = N − S is the token's share of the entropy change per unit of A); a
//! batch for `trinity algorithm eval` brings its own.
//!
//! Metrics (under `advantage/` in the trainer): `frac_clipped`, `frac_clipped_pos`, `frac_clipped_neg` as
//! [`super::clipb`] reports them, and `stdD` = σ_D.

use tch::{Kind, Tensor};

use crate::advantage::clipb::{MIN_SIGNAL_STD, clip_fractions, entropy_signal, group_scores, masked_moments, scalar};
use crate::advantage::{AdvantageFn, AdvantageFnEntry, AdvantageOutput, PolicyStats, broadcast_rows};
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;

const NAME: &str = "clipv";

// `mu` is 8.5 as `default_args()` gives it (the constructor's own default is 2.0; see `args`).
const ARGS: &[ArgSpec] = &[
    arg("epsilon", ArgDefault::Float(1e-6)),
    arg("mu", ArgDefault::Float(8.5)),
    arg("max_frac", ArgDefault::Float(1e-4)),
];

#[derive(Debug)]
struct ClipV {
    epsilon: f32,
    mu: f64,
    max_frac: f64,
}

fn build(args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    Ok(Box::new(ClipV { epsilon: args.f64("epsilon")? as f32, mu: args.f64("mu")?, max_frac: args.f64("max_frac")? }))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: true, build } }

impl ClipV {
    /// Which tokens stay in the mask (1.0) given the advantages and D.
    fn keep(&self, advantages: &Tensor, d: &Tensor, mask: &Tensor, std: f64) -> Tensor {
        let in_mask = mask.gt(0.0);
        let keep_neg = d.le(self.mu * std);
        let keep = advantages.gt(0.0).logical_or(&keep_neg);
        let total = scalar(&mask.sum(Kind::Float).clamp_min(1.0));
        let clipped = in_mask.logical_and(&keep.logical_not());
        if scalar(&clipped.sum(Kind::Float)) / total <= self.max_frac {
            return keep.to_kind(Kind::Float);
        }
        let cap = ((self.max_frac * total) as i64).max(1);
        let candidates = advantages.lt(0.0).logical_and(&in_mask).logical_and(&keep_neg.logical_not());
        let count = scalar(&candidates.sum(Kind::Float)) as i64;
        if count <= cap {
            return keep.to_kind(Kind::Float);
        }
        // Only the `cap` negative-advantage tokens with the largest D stay clipped.
        let scores = d.masked_fill(&candidates.logical_not(), f64::NEG_INFINITY).view([-1]);
        let (_, top) = scores.topk(cap, -1, true, true);
        let limited = scores.zeros_like().to_kind(Kind::Bool).index_fill(0, &top, 1).view_as(d);
        keep.logical_or(&candidates).logical_and(&limited.logical_not()).to_kind(Kind::Float)
    }
}

impl AdvantageFn for ClipV {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let scores = group_scores(batch, self.epsilon, NAME)?;
        let logprob = batch.need("old_logprob", &batch.old_logprob, NAME)?;
        let entropy = batch.need("entropy", &batch.entropy, NAME)?;
        let necs = batch.need("necs", &batch.necs, NAME)?;
        let mask = &batch.action_mask;
        let advantages = broadcast_rows(&scores, mask);

        let d = necs - entropy_signal(logprob, entropy);
        let (_, var) = masked_moments(&d, mask);
        let std = scalar(&var.sqrt());
        let keep = if std < MIN_SIGNAL_STD { mask.ones_like() } else { self.keep(&advantages, &d, mask, std) };
        let clipped = mask * keep;

        let mut metrics = clip_fractions(mask, &clipped, &advantages);
        metrics.insert("stdD".into(), std);
        Ok(AdvantageOutput { returns: advantages.copy(), advantages, metrics, rows: None, action_mask: Some(clipped) })
    }

    fn policy_stats(&self) -> PolicyStats {
        PolicyStats { entropy: true, necs: true }
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{assert_close as close, eval_err, eval_json, json};

    /// clipb's batch plus `necs`. The expected numbers are 0.6.0's `ClipVAdvantageFn.__call__`
    /// (trinity/algorithm/advantage_fn/clipv_advantage.py) restated in a short plain-Python script (double
    /// precision): D = [[0.40952, −0.03534], [1.39347, 0.25244], [0.07358, 1.05551]], σ_D = 0.522983.
    fn batch() -> serde_json::Value {
        let mut batch = super::super::clipb::tests::batch();
        batch["necs"] = json!([[0.5, 0.1], [2.0, 0.3], [0.0, 1.5]]);
        batch
    }

    fn run(args: serde_json::Value, batch: serde_json::Value) -> serde_json::Value {
        eval_json(json!({"advantage_fn": "clipv", "advantage_fn_args": args, "batch": batch}))
    }

    #[test]
    fn negative_tokens_above_mu_sigma_are_clipped() {
        // μ = 0.5: μ·σ_D = 0.26149; of the negative row 1 only D = 1.39347 lies above it.
        let out = run(json!({"mu": 0.5, "max_frac": 1.0}), batch());
        close(&out["advantages"][1][0], -0.707_105_78);
        close(&out["advantages"][2][0], 2.999_997);
        assert_eq!(out["action_mask"], json!([[1.0, 1.0], [0.0, 1.0], [1.0, 1.0]]));
        let m = &out["metrics"];
        close(&m["advantage/frac_clipped"], 1.0 / 6.0);
        close(&m["advantage/frac_clipped_neg"], 0.5);
        close(&m["advantage/frac_clipped_pos"], 0.0);
        close(&m["advantage/stdD"], 0.522_982_53);
        // The defaults (μ = 8.5) clip nothing here.
        let out = run(json!({}), batch());
        assert_eq!(out["action_mask"], json!([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]));
        close(&out["metrics"]["advantage/frac_clipped"], 0.0);
    }

    #[test]
    fn max_frac_caps_the_negative_tokens_clipped() {
        // μ = 0: both negative tokens (D > 0) violate. Uncapped both go; with max_frac = 0.1, 2/6 > 0.1 and the
        // cap max(⌊0.6⌋, 1) = 1 leaves only the larger D (1.39347) clipped.
        let out = run(json!({"mu": 0.0, "max_frac": 1.0}), batch());
        assert_eq!(out["action_mask"], json!([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]));
        close(&out["metrics"]["advantage/frac_clipped"], 1.0 / 3.0);
        let out = run(json!({"mu": 0.0, "max_frac": 0.1}), batch());
        assert_eq!(out["action_mask"], json!([[1.0, 1.0], [0.0, 1.0], [1.0, 1.0]]));
        close(&out["metrics"]["advantage/frac_clipped_neg"], 0.5);
    }

    #[test]
    fn zero_advantage_tokens_are_filtered_too_and_not_capped() {
        // All-equal rewards: A = 0 everywhere. Trinity-RFT applies the D ≤ μ·σ_D test to them as well and its
        // cap counts only negative-advantage tokens, so with μ = 0 every token with D > 0 is clipped even
        // under max_frac = 0.1; the clamped denominators report frac_clipped_pos = frac_clipped_neg = 1.
        let mut b = batch();
        b["group_id"] = json!(["a", "a", "a"]);
        b["token_level_rewards"] = json!([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]);
        let out = run(json!({"mu": 0.0, "max_frac": 0.1}), b);
        close(&out["advantages"][0][0], 0.0);
        assert_eq!(out["action_mask"], json!([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]));
        close(&out["metrics"]["advantage/frac_clipped"], 5.0 / 6.0);
        close(&out["metrics"]["advantage/frac_clipped_pos"], 1.0);
        close(&out["metrics"]["advantage/frac_clipped_neg"], 1.0);
    }

    #[test]
    fn flat_signal_epsilon_and_required_fields() {
        // N equal to S everywhere: D = 0, σ_D = 0 < 1e-12, nothing is clipped even with μ = 0.
        let out = run(
            json!({"mu": 0.0}),
            json!({
            "group_id": ["a", "a"], "reward": [1.0, 0.0], "old_logprob": [[0.0], [0.0]], "entropy": [[0.0], [0.0]],
            "necs": [[0.0], [0.0]], "action_mask": [[1], [1]]}),
        );
        assert_eq!(out["action_mask"], json!([[1.0], [1.0]]));
        close(&out["metrics"]["advantage/stdD"], 0.0);
        let out = run(json!({"epsilon": 0.5}), batch());
        close(&out["advantages"][0][0], 0.414_213_56);
        close(&out["advantages"][2][0], 2.0);
        let mut b = batch();
        b.as_object_mut().unwrap().remove("necs");
        let err = eval_err(json!({"advantage_fn": "clipv", "batch": b}));
        assert!(err.contains("necs") && err.contains("clipv"), "{err}");
    }
}
