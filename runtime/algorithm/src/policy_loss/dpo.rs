//! `dpo`: direct preference optimization (Trinity-RFT's `DPOLossFn`); needs `ref_logprob`.
//!
//! Rows alternate chosen, rejected (Trinity-RFT's `split_dpo_experience_to_single_turn`). For pair k:
//! C_k = Σ_t m·ℓ over the chosen row, R_k over the rejected row, and likewise C_k^ref, R_k^ref;
//! z_k = (C_k − C_k^ref) − (R_k − R_k^ref); loss_k = −(1 − ls)·logσ(βz_k) − ls·logσ(−βz_k); loss = mean_k.
//! Metrics: `chosen_reward` = β·mean_k(C_k − C_k^ref), `rejected_reward`, `accuracy_mean` =
//! mean_k[C_k − C_k^ref > R_k − R_k^ref], `dpo_loss`.
//!
//! Trinity-RFT bug fixed here: it sums the logprobs of *every* chosen row of a micro-batch into one scalar
//! (and every rejected row into another), so with more than one pair per micro-batch it optimizes one
//! aggregate preference instead of each pair. We sum per row; with exactly one pair the two agree.

use tch::{Kind, Tensor};

use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::masked::masked_sum;
use crate::metrics::Metrics;
use crate::policy_loss::{Inputs, PolicyLossFn, PolicyLossFnEntry, item};

const NAME: &str = "dpo";

const ARGS: &[ArgSpec] = &[arg("beta", ArgDefault::Float(0.1)), arg("label_smoothing", ArgDefault::Float(0.0))];

#[derive(Debug)]
struct Dpo {
    beta: f64,
    label_smoothing: f64,
}

fn build(args: &Args) -> Result<Box<dyn PolicyLossFn>, AlgorithmError> {
    Ok(Box::new(Dpo { beta: args.f64("beta")?, label_smoothing: args.f64("label_smoothing")? }))
}

inventory::submit! { PolicyLossFnEntry { name: NAME, args: ARGS, build } }

impl PolicyLossFn for Dpo {
    fn reads_ref_logprob(&self) -> bool {
        true
    }

    fn loss(&self, batch: &Batch) -> Result<(Tensor, Metrics), AlgorithmError> {
        let Inputs { logprob, mask } = Inputs::new(batch, NAME)?;
        let reference = batch.need("ref_logprob", &batch.ref_logprob, NAME)?;
        let rows = batch.rows() as i64;
        if rows % 2 != 0 {
            return Err(AlgorithmError::field(
                "logprob",
                format!("dpo needs rows in (chosen, rejected) pairs, got {rows} rows"),
            ));
        }
        let chosen = |t: &Tensor| t.slice(0, 0, rows, 2);
        let rejected = |t: &Tensor| t.slice(0, 1, rows, 2);
        let row_sum = |t: &Tensor, m: &Tensor| masked_sum(t, m, Some(-1));
        let (cm, rm) = (chosen(mask), rejected(mask));
        let chosen_ratio = row_sum(&chosen(logprob), &cm) - row_sum(&chosen(reference), &cm);
        let rejected_ratio = row_sum(&rejected(logprob), &rm) - row_sum(&rejected(reference), &rm);
        let logits = &chosen_ratio - &rejected_ratio;
        let losses = -(&logits * self.beta).log_sigmoid() * (1.0 - self.label_smoothing)
            - (&logits * -self.beta).log_sigmoid() * self.label_smoothing;
        let loss = losses.mean(Kind::Float);
        let mut metrics = Metrics::new();
        metrics.insert("chosen_reward".into(), self.beta * item(&chosen_ratio.detach().mean(Kind::Float)));
        metrics.insert("rejected_reward".into(), self.beta * item(&rejected_ratio.detach().mean(Kind::Float)));
        let accuracy = chosen_ratio.gt_tensor(&rejected_ratio).to_kind(Kind::Float).mean(Kind::Float);
        metrics.insert("accuracy_mean".into(), item(&accuracy));
        metrics.insert("dpo_loss".into(), item(&loss));
        Ok((loss, metrics))
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{eval_err, eval_json, json};

    #[test]
    fn matches_trinity_on_one_pair() {
        crate::testing::check_fixtures("policy_loss_dpo");
    }

    #[test]
    fn pairs_are_scored_separately() {
        // Two pairs with opposite preferences: per pair the losses are log σ(±βz); Trinity-RFT's whole-batch
        // sum would see z = 0 and give log 2.
        let out = eval_json(json!({
            "policy_loss_fn": "dpo", "policy_loss_fn_args": {"beta": 1.0},
            "batch": {"logprob": [[-1.0], [-2.0], [-2.0], [-1.0]], "ref_logprob": [[-1.5], [-1.5], [-1.5], [-1.5]],
                      "action_mask": [[1], [1], [1], [1]]}
        }));
        let expected = (-(-(1.0f64.exp()).ln_1p()) + -(-((-1.0f64).exp()).ln_1p())) / 2.0;
        let got = out["pg_loss"].as_f64().unwrap();
        assert!((got - expected).abs() < 1e-5, "{got} vs {expected}");
        assert_eq!(out["metrics"]["accuracy_mean"].as_f64().unwrap(), 0.5);
    }

    #[test]
    fn odd_rows_are_an_error() {
        let err = eval_err(json!({
            "policy_loss_fn": "dpo",
            "batch": {"logprob": [[-1.0]], "ref_logprob": [[-1.0]], "action_mask": [[1]]}
        }));
        assert!(err.contains("pairs"), "{err}");
    }
}
