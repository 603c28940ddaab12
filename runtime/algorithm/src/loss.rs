//! The training loss of one batch, `pg_loss − entropy_loss + kl_loss`, composed in one place: the trainer (per
//! micro-batch, each term weighted by its share of the mini-batch) and `trinity algorithm eval` (one batch, every
//! weight 1) both take the policy loss, then the entropy and KL terms from [`loss_terms`], and add them with
//! [`combine`], so which terms run, on which condition, in which order and with which sign is the same in both
//! by construction.

use tch::Tensor;

use crate::aggregation::LossAggMode;
use crate::batch::Batch;
use crate::entropy::EntropyLossFn;
use crate::error::AlgorithmError;
use crate::kl::KlFn;
use crate::metrics::Metrics;

/// An entropy or KL term: `coef · aggregate`, the aggregate alone, and the component's metrics.
#[derive(Debug)]
pub struct Term {
    pub scaled: Tensor,
    pub raw: Tensor,
    pub metrics: Metrics,
}

/// The terms of one batch's loss beside the policy loss.
#[derive(Debug)]
pub struct LossTerms {
    /// The entropy term, when it runs: the batch has entropies or the coefficient is not 0 (then the entropies
    /// are required, and their absence is the component's error).
    pub entropy: Option<Term>,
    /// The KL loss, when it runs: the batch has reference logprobs or the coefficient is not 0.
    pub kl: Option<Term>,
}

/// The entropy and KL terms of `batch`'s loss, in Trinity-RFT's order (after the policy loss, which the caller
/// computes first: eval may have none). `entropy` and `kl` are the components with the names their errors use;
/// `mode` aggregates both.
pub fn loss_terms(
    entropy: Option<(&str, &EntropyLossFn)>,
    kl: Option<(&str, &KlFn)>,
    batch: &Batch,
    mode: LossAggMode,
) -> Result<LossTerms, AlgorithmError> {
    let term = |(scaled, raw, metrics): (Tensor, Tensor, Metrics)| Term { scaled, raw, metrics };
    let entropy = match entropy {
        Some((name, f)) if batch.entropy.is_some() || f.entropy_coef != 0.0 => Some(term(f.loss(batch, mode, name)?)),
        _ => None,
    };
    let kl = match kl {
        Some((name, f)) if batch.ref_logprob.is_some() || f.kl_coef != 0.0 => Some(term(f.loss(batch, mode, name)?)),
        _ => None,
    };
    Ok(LossTerms { entropy, kl })
}

/// The loss from its (already weighted) terms: `pg − entropy + kl`, a missing term adding nothing.
pub fn combine(pg: Tensor, entropy: Option<Tensor>, kl: Option<Tensor>) -> Tensor {
    let mut loss = pg;
    if let Some(e) = entropy {
        loss = &loss - e;
    }
    if let Some(k) = kl {
        loss = &loss + k;
    }
    loss
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry;

    fn batch() -> Batch {
        let mut b = Batch::new(Tensor::from_slice(&[1f32, 1.0, 1.0, 0.0]).view([2, 2]));
        b.logprob = Some(Tensor::from_slice(&[-1f32, -2.0, -0.5, -1.0]).view([2, 2]));
        b.old_logprob = Some(Tensor::from_slice(&[-1.1f32, -1.9, -0.5, -1.0]).view([2, 2]));
        b.advantages = Some(Tensor::from_slice(&[1f32, 1.0, -1.0, -1.0]).view([2, 2]));
        b
    }

    fn entropy_fn(coef: f64) -> EntropyLossFn {
        let args = registry::resolve_args(
            registry::Kind::EntropyLoss,
            "default",
            serde_json::json!({"entropy_coef": coef}).as_object(),
        )
        .unwrap();
        registry::entropy_loss_fn("default", &args).unwrap()
    }

    fn kl_fn(coef: f64) -> KlFn {
        let args = registry::resolve_args(registry::Kind::KlFn, "k1", serde_json::json!({"kl_coef": coef}).as_object())
            .unwrap();
        registry::kl_fn("k1", &args).unwrap()
    }

    fn ppo() -> Box<dyn crate::policy_loss::PolicyLossFn> {
        let args = registry::resolve_args(registry::Kind::PolicyLoss, "ppo", None).unwrap();
        registry::policy_loss_fn("ppo", &args).unwrap()
    }

    #[test]
    fn terms_run_when_their_input_is_there_or_their_coefficient_asks() {
        let (policy, mode) = (ppo(), LossAggMode::TokenMean);
        let (e0, k0) = (entropy_fn(0.0), kl_fn(0.0));
        // Nothing to read and nothing asked: only the policy loss.
        let t = loss_terms(Some(("default", &e0)), Some(("k1", &k0)), &batch(), mode).unwrap();
        assert!(t.entropy.is_none() && t.kl.is_none());
        // A coefficient asks for its input, and its absence is the component's error.
        let (e1, k1) = (entropy_fn(0.1), kl_fn(0.5));
        assert!(loss_terms(Some(("default", &e1)), None, &batch(), mode).is_err());
        assert!(loss_terms(None, Some(("k1", &k1)), &batch(), mode).is_err());
        let mut b = batch();
        b.entropy = Some(Tensor::from_slice(&[1f32, 3.0, 2.0, 0.0]).view([2, 2]));
        b.ref_logprob = Some(Tensor::from_slice(&[-1.5f32, -1.5, -0.5, -1.0]).view([2, 2]));
        let t = loss_terms(Some(("default", &e1)), Some(("k1", &k1)), &b, mode).unwrap();
        let (entropy, kl) = (t.entropy.unwrap(), t.kl.unwrap());
        let value = |t: &Tensor| t.double_value(&[]);
        // Token means over the 3 real tokens: entropy 2, k1 = logprob − ref = (0.5 − 0.5 + 0) / 3 = 0.
        assert!((value(&entropy.raw) - 2.0).abs() < 1e-6 && (value(&entropy.scaled) - 0.2).abs() < 1e-6);
        assert!(value(&kl.raw).abs() < 1e-6);
        let (pg, _) = policy.loss(&b).unwrap();
        let loss = combine(pg.shallow_clone(), Some(entropy.scaled), Some(kl.scaled));
        assert!((value(&loss) - (value(&pg) - 0.2)).abs() < 1e-6);
    }
}
