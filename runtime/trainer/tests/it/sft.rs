use tch::Kind;
use trinity_config::algorithm::LossAggMode;
use trinity_trainer::{MicroBatching, TrainRow, TrainerOptions};

use crate::{algorithm, max_param_diff, tiny_model, trainer};

#[test]
fn sft_drives_the_loss_on_a_fixed_sequence_toward_zero() {
    for kind in [Kind::Float, Kind::BFloat16] {
        let mut t = trainer(tiny_model(0, kind), &algorithm("sft", |_| {}), 1e-2, TrainerOptions::default());
        assert!(t.reference().is_none() && t.critic().is_none());
        let rows = vec![TrainRow::sft(&[1, 2, 3], &[4, 9, 6, 12, 8])];
        let first = t.train_step(&rows).unwrap();
        let mut last = first.clone();
        for _ in 0..40 {
            last = t.train_step(&rows).unwrap();
        }
        let (start, end) = (first["actor/sft_loss"], last["actor/sft_loss"]);
        assert!(start > 2.0, "{kind:?}: a random model starts near ln 16, got {start}");
        assert!(end < 0.05, "{kind:?}: loss {start} -> {end}");
        assert_eq!(t.global_step(), 41);
        assert!(last["actor/grad_norm"].is_finite() && last["perf/tokens_per_s"] > 0.0);
    }
}

/// With a per-sequence aggregation, Trinity's loss scale (rows in micro / rows in step) makes gradient
/// accumulation over micro-batches equal to one big batch.
#[test]
fn micro_batches_accumulate_to_the_full_batch_update() {
    let alg = algorithm("sft", |a| {
        a.loss_agg_mode = Some(LossAggMode::SeqMeanTokenSum);
        a.policy_loss_fn_args = crate::args(serde_json::json!({"loss_agg_mode": "seq-mean-token-sum"}));
    });
    let rows = vec![
        TrainRow::sft(&[1, 2, 3], &[4, 5]),
        TrainRow::sft(&[7], &[8, 9, 10, 11]),
        TrainRow::sft(&[3, 3], &[2]),
        TrainRow::sft(&[5, 6, 7, 8], &[9, 10, 11]),
    ];
    // One pass per micro-batch: the accumulation itself is under test.
    let run = |how: MicroBatching| {
        let options = TrainerOptions { micro_batching: how, pass_tokens: None, ..TrainerOptions::default() };
        let mut t = trainer(tiny_model(1, Kind::Float), &alg, 1e-3, options);
        let m = t.train_step(&rows).unwrap();
        (t, m)
    };
    let (one, m1) = run(MicroBatching::TokenBudget(1 << 20));
    let (many, m4) = run(MicroBatching::TokenBudget(8));
    assert_eq!((m1["perf/micro_batches"], m4["perf/micro_batches"]), (1.0, 4.0));
    assert!((m1["actor/grad_norm"] - m4["actor/grad_norm"]).abs() < 1e-4 * m1["actor/grad_norm"], "{m1:?} {m4:?}");
    // Adam's first step divides each gradient element by its own magnitude, so the fp32 rounding of elements near
    // zero (passes of other shapes sum in other orders) shows in the weights at up to a few thousandths of the
    // learning rate (1e-3 here); a wrong accumulation moves them by a good part of it.
    assert!(max_param_diff(one.policy(), many.policy()) < 5e-6);
    let (rows1, _) = run(MicroBatching::Rows(1));
    assert!(max_param_diff(one.policy(), rows1.policy()) < 5e-6);
}

#[test]
fn malformed_rows_are_errors_naming_the_row() {
    let mut t = trainer(tiny_model(0, Kind::Float), &algorithm("sft", |_| {}), 1e-2, TrainerOptions::default());
    let mut bad = TrainRow::sft(&[1], &[2, 3]);
    bad.action_mask.pop();
    let err = t.train_step(&[TrainRow::sft(&[1], &[2]), bad]).unwrap_err().to_string();
    assert!(err.contains("row 1") && err.contains("action_mask"), "{err}");
    assert_eq!(t.global_step(), 0);
}
