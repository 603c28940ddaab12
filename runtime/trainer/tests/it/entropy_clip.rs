//! Clip_B and Clip_V in the trainer: the policy's entropy (and `necs`) before the update reach the advantage
//! function, Clip_B reads the rollout logprobs even when old logprobs are recomputed, and the losses train on the
//! mask the function narrows.

use serde_json::json;
use tch::Kind;
use trinity_config::algorithm::AlgorithmConfig;
use trinity_trainer::{TrainRow, TrainerOptions};

use crate::{algorithm, args, max_param_diff, tiny_model, trainer};

/// Eight rows in two groups of four, rewards 1, 0, 1, 0 on the last token, responses of 2 to 4 tokens with made-up
/// rollout logprobs (far from the tiny model's own).
fn rows() -> Vec<TrainRow> {
    (0..8usize)
        .map(|k| {
            let prompt = vec![1 + (k / 4) as i64, 2, 3];
            let response: Vec<i64> = (0..2 + k % 3).map(|t| ((k * 5 + 3 * t) % 14) as i64 + 2).collect();
            let mut row = TrainRow::sft(&prompt, &response);
            row.logprobs = (0..response.len()).map(|t| -1.0 - 0.3 * t as f32 - 0.1 * k as f32).collect();
            let mut rewards = vec![0.0; response.len()];
            *rewards.last_mut().unwrap() = if k % 2 == 0 { 1.0 } else { 0.0 };
            row.token_level_rewards = Some(rewards);
            row.group_id = Some(format!("task-{}", k / 4));
            row
        })
        .collect()
}

fn clip(name: &str, fn_args: serde_json::Value) -> AlgorithmConfig {
    algorithm("grpo_verl", |a| {
        a.advantage_fn = Some(name.into());
        a.advantage_fn_args = args(fn_args);
        a.kl_loss_fn = Some("none".into());
    })
}

/// One step of `alg` on `rows` from the same tiny model; the trained model and the step's metrics.
fn step(
    alg: &AlgorithmConfig,
    rows: &[TrainRow],
    options: TrainerOptions,
) -> (trinity_model::Decoder, trinity_trainer::StepMetrics) {
    let mut t = trainer(tiny_model(11, Kind::Float), alg, 1e-2, options);
    let metrics = t.train_step(rows).unwrap();
    (t.into_policy(), metrics)
}

/// With μ = −1e9 every token of a negative-advantage row fails the filter, so Clip_B and Clip_V must train
/// exactly as grpo_verl on the same rows with those rows' tokens masked out; with the filter off (default μ on
/// this batch clips nothing) they train differently from that, which shows the comparison can tell.
#[test]
fn clipped_tokens_leave_the_losses() {
    let rows = rows();
    let mut masked = rows.clone();
    for (k, row) in masked.iter_mut().enumerate() {
        if k % 2 == 1 {
            row.action_mask.iter_mut().for_each(|m| *m = false);
        }
    }
    let (want, _) = step(&clip("grpo_verl", json!({})), &masked, TrainerOptions::default());
    for (name, fn_args) in [("clipb", json!({"mu": -1e9})), ("clipv", json!({"mu": -1e9, "max_frac": 1.0}))] {
        let (got, m) = step(&clip(name, fn_args), &rows, TrainerOptions::default());
        assert_eq!(m["advantage/frac_clipped_neg"], 1.0, "{name}: {m:?}");
        assert_eq!(m["advantage/frac_clipped_pos"], 0.0, "{name}");
        let diff = max_param_diff(&got, &want);
        assert!(diff < 1e-6, "{name} trained apart from the masked grpo_verl step by {diff}");
    }
    let (unfiltered, m) = step(&clip("clipb", json!({})), &rows, TrainerOptions::default());
    assert_eq!(m["advantage/frac_clipped"], 0.0);
    assert!(max_param_diff(&unfiltered, &want) > 1e-4, "the comparison cannot tell clipped tokens from kept ones");
}

/// Clip_B's signal uses the rollout logprobs (Trinity's `rollout_log_probs`) whether or not old logprobs are
/// recomputed: E[S] is the same both ways and equals e^ℓ·(H + ℓ) over the trained tokens with ℓ the rows' own
/// logprobs and H the policy's entropy. Clip_V's σ_D comes from the statistics the trainer computed, and is
/// positive on a random model.
#[test]
fn clipb_reads_the_rollout_logprobs_and_the_policy_entropy() {
    let rows = rows();
    let model = tiny_model(11, Kind::Float);
    let all: Vec<usize> = (0..rows.len()).collect();
    let stats = trinity_trainer::policy_stats::response_stats(&model, &rows, &all, 1.0, 64, false).unwrap();
    let (mut sum, mut n) = (0.0, 0.0);
    for (i, row) in rows.iter().enumerate() {
        for (t, &lp) in row.logprobs.iter().enumerate() {
            let h = stats.entropy.double_value(&[i as i64, t as i64]);
            sum += f64::from(lp).exp() * (h + f64::from(lp));
            n += 1.0;
        }
    }
    let want = sum / n;
    let alg = clip("clipb", json!({}));
    let (_, bypass) = step(&alg, &rows, TrainerOptions::default());
    let recompute = TrainerOptions { recompute_old_logprobs: true, ..TrainerOptions::default() };
    let (_, recomputed) = step(&alg, &rows, recompute);
    for m in [&bypass, &recomputed] {
        assert!((m["advantage/ES"] - want).abs() < 1e-5, "ES {} vs {want}", m["advantage/ES"]);
    }
    let (_, v) = step(&clip("clipv", json!({})), &rows, TrainerOptions::default());
    assert!(v["advantage/stdD"] > 0.0, "{v:?}");
}
