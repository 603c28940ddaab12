//! Rows whose advantages are all 0 run forward only (`perf/forward_only_rows`) and leave the update as a backward
//! over every row gives it. The comparison runs the same rows with those zeros replaced by 1e-30: not predicted
//! to be without gradient, so every row backpropagates, and a gradient of 1e-30 of the loss's is none in fp32.

use tch::Kind;
use trinity_trainer::{MicroBatching, TrainRow, Trainer, TrainerOptions};

use crate::{algorithm, max_param_diff, tiny_model, trainer};

/// Three groups of four rows with prompts and responses of different lengths; groups 0 and 2 have all-zero
/// advantages (`zero` in their place), group 1 does not.
fn rows(zero: f32) -> Vec<TrainRow> {
    let prompts: [&[i64]; 3] = [&[1, 2, 3], &[4, 5], &[6, 7, 8, 9]];
    let mut out = Vec::new();
    for (g, prompt) in prompts.iter().enumerate() {
        for k in 0..4usize {
            let response: Vec<i64> = (0..1 + (g + k) % 4).map(|j| ((3 * g + 5 * k + j) % 14 + 2) as i64).collect();
            let n = response.len();
            let advantage = if g == 1 { [0.9, -0.3, -0.3, -0.3][k] } else { zero };
            out.push(TrainRow {
                advantages: Some(vec![advantage; n]),
                logprobs: (0..n).map(|j| -1.5 - 0.1 * j as f32).collect(),
                reward: Some(if advantage > 0.0 { 1.0 } else { 0.0 }),
                group_id: Some(format!("task-{g}")),
                ..TrainRow::sft(prompt, &response)
            });
        }
    }
    out
}

/// Three steps at a learning rate of 5e-2 leave the two ways of computing one update 1e-5 apart (summation order,
/// amplified by AdamW); rows left out of the backward while they had gradient put them 0.2 apart.
const TOLERANCE: f64 = 1e-4;

fn trained(policy_loss: &str, zero: f32, steps: usize) -> (Trainer, Vec<trinity_trainer::StepMetrics>) {
    let alg = algorithm("grpo", |a| {
        a.kl_loss_fn = Some("none".into());
        a.policy_loss_fn = Some(policy_loss.into());
        a.policy_loss_fn_args = None;
    });
    // Micro-batches of 5 rows cut across the groups, so one pass mixes rows with and without gradient.
    let options = TrainerOptions { micro_batching: MicroBatching::Rows(5), ..TrainerOptions::default() };
    let mut t = trainer(tiny_model(4, Kind::Float), &alg, 5e-2, options);
    let metrics = (0..steps).map(|_| t.train_step(&rows(zero)).unwrap()).collect();
    (t, metrics)
}

#[test]
fn rows_with_zero_advantages_run_forward_only_and_leave_the_update_as_it_was() {
    let (skipping, fast) = trained("ppo", 0.0, 3);
    let (full, slow) = trained("ppo", 1e-30, 3);
    assert!(max_param_diff(skipping.policy(), full.policy()) < TOLERANCE);
    for (a, b) in fast.iter().zip(&slow) {
        assert_eq!(a["perf/forward_only_rows"], 8.0, "groups 0 and 2");
        assert_eq!(b["perf/forward_only_rows"], 0.0);
        // Not `actor/pg_clipfrac`: an advantage of 1e-30 counts as clipped where the ratio leaves the clip range,
        // one of 0 does not.
        for key in ["actor/pg_loss", "actor/ppo_kl", "actor/entropy", "actor/grad_norm"] {
            assert!((a[key] - b[key]).abs() < 1e-5 * b[key].abs().max(1.0), "{key}: {} vs {}", a[key], b[key]);
        }
    }
    // The rows with gradient did move the model.
    assert!(max_param_diff(skipping.policy(), &tiny_model(4, Kind::Float)) > 1e-2);
}

#[test]
fn a_loss_with_gradient_at_zero_advantage_trains_every_row() {
    // SFT's loss ignores the advantages: the rows predicted to be without gradient have some, run again with
    // autograd, and later steps no longer predict.
    let (predicted, metrics) = trained("sft", 0.0, 2);
    let (full, _) = trained("sft", 1e-30, 2);
    assert!(max_param_diff(predicted.policy(), full.policy()) < TOLERANCE);
    assert!(metrics.iter().all(|m| m["perf/forward_only_rows"] == 0.0));
}
