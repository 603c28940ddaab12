//! `rollout_correction` in decoupled mode (`bypass_mode: false`): the recomputed old logprobs are compared with
//! the rollout's, and the update changes as veRL's formulas predict.

use tch::{Kind, Tensor};
use trinity_config::algorithm::OptimizerConfig;
use trinity_config::verl::{NumberOrText, RolloutCorrection};
use trinity_model::Decoder;
use trinity_trainer::{Components, TrainRow, Trainer, TrainerOptions};

use crate::{algorithm, max_param_diff, tiny_model, uneven_rows};

/// The policy's logprobs of each response token of `row` at temperature 1 (what the trainer recomputes).
fn policy_logprobs(model: &Decoder, row: &TrainRow) -> Vec<f32> {
    tch::no_grad(|| {
        let ids = Tensor::from_slice(&row.tokens).view([1, -1]);
        let hidden = model.forward_hidden(&ids, None).unwrap();
        let logp = model.logits(&hidden).unwrap().to_kind(Kind::Float).log_softmax(-1, Kind::Float);
        let p = row.prompt_length;
        (p..row.tokens.len()).map(|t| logp.double_value(&[0, t as i64 - 1, row.tokens[t]]) as f32).collect()
    })
}

/// Trains one step of GRPO's PPO loss with recomputed old logprobs and `correction`, from the same weights.
fn train(rows: &[TrainRow], correction: Option<RolloutCorrection>) -> (Trainer, trinity_trainer::StepMetrics) {
    let options = TrainerOptions {
        recompute_old_logprobs: true,
        rollout_correction: correction.map(|c| c.settings().unwrap()),
        ..TrainerOptions::default()
    };
    // eps 1 makes AdamW's first update a function of each entry's gradient alone, so equal parameters after the
    // step mean equal gradients.
    let adam = OptimizerConfig { lr: 0.1, eps: 1.0, weight_decay: 0.0, ..OptimizerConfig::default() };
    let components = Components::from_config(&algorithm("grpo", |_| {})).unwrap();
    let mut t = Trainer::new(tiny_model(6, Kind::Float), components, &adam, options).unwrap();
    let m = t.train_step(rows).unwrap();
    (t, m)
}

fn decoupled(edit: impl FnOnce(&mut RolloutCorrection)) -> RolloutCorrection {
    let mut c = RolloutCorrection { bypass_mode: false, rollout_is: None, ..RolloutCorrection::default() };
    edit(&mut c);
    c
}

/// Rows whose rollout logprobs are the policy's minus `delta(row, token)`, so log r = ℓ_old − ℓ_roll = delta.
fn rows_off_by(delta: impl Fn(usize, usize) -> f32) -> Vec<TrainRow> {
    let model = tiny_model(6, Kind::Float);
    let mut rows = uneven_rows(8, true);
    for (i, row) in rows.iter_mut().enumerate() {
        row.logprobs = policy_logprobs(&model, row).iter().enumerate().map(|(t, lp)| lp - delta(i, t)).collect();
    }
    rows
}

/// Token IS with threshold 2: each token's policy-loss term is multiplied by w = min(e^{log r}, 2). At the first
/// update the PPO ratio is 1 and unclipped, so −A·ratio·w has the gradient of −(A·w)·ratio: training on advantages
/// A·w without correction must give the same parameters, and training on A alone must not.
#[test]
fn token_importance_weights_scale_each_tokens_policy_gradient() {
    let delta = |i: usize, t: usize| 0.3 * ((i + 2 * t) % 5) as f32 - 0.6 + if (i, t) == (5, 0) { 1.5 } else { 0.0 };
    let rows = rows_off_by(delta);
    let (corrected, m) = train(&rows, Some(decoupled(|c| c.rollout_is = Some("token".into()))));
    let mut scaled = rows.clone();
    for (i, row) in scaled.iter_mut().enumerate() {
        let adv = row.advantages.as_mut().unwrap();
        for (t, a) in adv.iter_mut().enumerate() {
            // Every |log r| ≤ 0.6 but (5, 0)'s −0.6 + 1.5 = 0.9, whose e^0.9 = 2.46 is truncated to 2.
            *a *= delta(i, t).exp().min(2.0);
        }
    }
    let (by_advantage, _) = train(&scaled, None);
    let diff = max_param_diff(corrected.policy(), by_advantage.policy());
    assert!(diff < 1e-6, "weighted loss vs weighted advantages: {diff}");
    let (plain, _) = train(&rows, None);
    let unweighted = max_param_diff(corrected.policy(), plain.policy());
    assert!(unweighted > 1e-4, "the weights change the update: {unweighted}");
    // (5, 0) is the one trained token above the threshold; the maximum is reported before truncation.
    let trained: f64 = rows.iter().map(|r| r.action_mask.iter().filter(|&&m| m).count() as f64).sum();
    let high = m["rollout_corr/rollout_is_ratio_fraction_high"];
    assert!((high - 1.0 / trained).abs() < 1e-6, "{high} vs 1/{trained}");
    assert!((m["rollout_corr/rollout_is_max"] - 0.9f64.exp()).abs() < 1e-5, "{m:?}");
}

/// Sequence rejection (`seq_sum_k1` within ratio bounds [0.5, 2]): a row whose summed log ratio is outside
/// [−ln 2, ln 2] leaves the loss and its denominator, so the step trains as one on the kept rows alone.
#[test]
fn rejected_responses_train_as_if_they_were_not_there() {
    // Rows 1, 4 and 6 are 0.4 nats a token off: their sums pass ln 2 = 0.69 when they have two tokens or more.
    let rows = rows_off_by(|i, _| if [1, 4, 6].contains(&i) { 0.4 } else { 0.01 });
    let rejected: Vec<usize> = [1, 4, 6]
        .into_iter()
        .filter(|&i| {
            let trained: Vec<f32> = rows[i].action_mask.iter().map(|&m| if m { 0.4 } else { 0.0 }).collect();
            trained.iter().sum::<f32>() > 2f32.ln()
        })
        .collect();
    assert!(!rejected.is_empty());
    let rs = decoupled(|c| {
        c.rollout_rs = Some("seq_sum_k1".into());
        c.rollout_rs_threshold = Some(NumberOrText::Text("0.5_2.0".into()));
    });
    let (corrected, m) = train(&rows, Some(rs));
    let kept: Vec<TrainRow> =
        rows.iter().enumerate().filter(|(i, _)| !rejected.contains(i)).map(|(_, r)| r.clone()).collect();
    let (subset, _) = train(&kept, None);
    let diff = max_param_diff(corrected.policy(), subset.policy());
    assert!(diff < 1e-6, "rejection vs leaving the rows out: {diff}");
    let (plain, _) = train(&rows, None);
    assert!(max_param_diff(corrected.policy(), plain.policy()) > 1e-4);
    let fraction = rejected.len() as f64 / rows.len() as f64;
    assert!((m["rollout_corr/rollout_rs_seq_masked_fraction"] - fraction).abs() < 1e-6, "{m:?}");
}

/// Every response rejected: nothing trains (no NaN, no update), and the metrics say so.
#[test]
fn rejecting_everything_leaves_the_policy_unchanged() {
    let rows = rows_off_by(|_, _| 1.0);
    let rs = decoupled(|c| {
        c.rollout_rs = Some("token_k2".into());
        c.rollout_rs_threshold = Some(NumberOrText::Number(0.1));
    });
    let (corrected, m) = train(&rows, Some(rs));
    assert_eq!(max_param_diff(corrected.policy(), &tiny_model(6, Kind::Float)), 0.0);
    assert!((m["rollout_corr/rollout_rs_masked_fraction"] - 1.0).abs() < 1e-6, "{m:?}");
    assert!(m["actor/pg_loss"].is_finite() && m["actor/grad_norm"] == 0.0, "{m:?}");
}

/// Rollout logprobs equal to the policy's (what bypass mode amounts to): weight 1, nothing rejected, the same
/// update as no correction at all.
#[test]
fn matching_logprobs_change_nothing() {
    let rows = rows_off_by(|_, _| 0.0);
    let full = decoupled(|c| {
        c.rollout_is = Some("sequence".into());
        c.rollout_rs = Some("token_k1,seq_mean_k3".into());
        c.rollout_rs_threshold = Some(NumberOrText::Text("0.5_2.0,0.01".into()));
    });
    let (corrected, m) = train(&rows, Some(full));
    let (plain, _) = train(&rows, None);
    assert!(max_param_diff(corrected.policy(), plain.policy()) < 1e-6);
    assert!(m["rollout_corr/kl"].abs() < 1e-5 && m["rollout_corr/rollout_rs_masked_fraction"] == 0.0, "{m:?}");
}
