//! A step's loss and update do not depend on how its rows are cut into micro-batches: on rows of unequal length,
//! micro-batches of 1 and of 4 rows train as one micro-batch of all rows does, for every `loss_agg_mode`, with the
//! SFT loss and with GRPO's policy loss plus its entropy and KL terms.

use serde_json::json;
use tch::Kind;
use trinity_config::algorithm::{AlgorithmConfig, LossAggMode};
use trinity_trainer::{MicroBatching, TrainRow, TrainerOptions};

use crate::{algorithm, args, max_param_diff, tiny_model, trainer, uneven_rows};

const STEPS: usize = 3;
const LR: f64 = 2e-3;

const MODES: [LossAggMode; 4] = [
    LossAggMode::TokenMean,
    LossAggMode::SeqMeanTokenSum,
    LossAggMode::SeqMeanTokenMean,
    LossAggMode::SeqMeanTokenSumNorm,
];

/// `algorithm_type` with `mode` everywhere (the config layer copies it into the policy loss's arguments), and for
/// GRPO an entropy bonus and a KL loss strong enough to count.
fn with_mode(algorithm_type: &str, mode: LossAggMode) -> AlgorithmConfig {
    algorithm(algorithm_type, |a| {
        a.loss_agg_mode = Some(mode);
        let mut policy_args = a.policy_loss_fn_args.clone().unwrap_or_default();
        policy_args.insert("loss_agg_mode".into(), json!(mode.name()));
        a.policy_loss_fn_args = Some(policy_args);
        if algorithm_type == "grpo" {
            a.entropy_loss_fn_args = args(json!({"entropy_coef": 0.01}));
            a.kl_loss_fn_args = args(json!({"kl_coef": 0.1}));
        }
    })
}

/// Trains `STEPS` steps on `rows` with micro-batches of `micro` rows; returns the trainer and step 1's metrics.
fn train(
    alg: &AlgorithmConfig,
    rows: &[TrainRow],
    micro: usize,
    pass_tokens: Option<usize>,
) -> (trinity_trainer::Trainer, trinity_trainer::StepMetrics) {
    let options =
        TrainerOptions { micro_batching: MicroBatching::Rows(micro), pass_tokens, ..TrainerOptions::default() };
    let mut t = trainer(tiny_model(5, Kind::Float), alg, LR, options);
    let first = t.train_step(rows).unwrap();
    for _ in 1..STEPS {
        t.train_step(rows).unwrap();
    }
    (t, first)
}

fn check(algorithm_type: &str, loss_metric: &str, with_advantages: bool) {
    let rows = uneven_rows(8, with_advantages);
    let init = tiny_model(5, Kind::Float);
    for mode in MODES {
        let name = mode.name();
        let alg = with_mode(algorithm_type, mode);
        let (whole, m_whole) = train(&alg, &rows, rows.len(), None);
        let moved = max_param_diff(&init, whole.policy());
        assert!(moved > 1e-3, "{name}: parameters moved only {moved}");
        // Micro-batches of 1 and 4 rows, each its own pass and (4 rows) two micro-batches sharing a pass.
        for (micro, pass_tokens) in [(1, None), (4, None), (4, Some(1 << 20))] {
            let (t, m) = train(&alg, &rows, micro, pass_tokens);
            let ratio = max_param_diff(whole.policy(), t.policy()) / moved;
            println!(
                "{algorithm_type} {name} micro {micro} passes {pass_tokens:?}: step-1 loss {:.8} vs {:.8} \
                 (diff {:.2e}), final weights differ by {:.2}% of what training moved them",
                m["actor/loss"],
                m_whole["actor/loss"],
                (m["actor/loss"] - m_whole["actor/loss"]).abs(),
                100.0 * ratio
            );
            for key in ["actor/loss", loss_metric] {
                let (a, b) = (m[key], m_whole[key]);
                // 1e-6, relative above 1: near seq-mean-token-sum-norm's loss of ~10 one fp32 step is 1e-6.
                let tolerance = 1e-6 * b.abs().max(1.0);
                assert!((a - b).abs() <= tolerance, "{name} micro {micro}: step-1 {key} {a} vs one micro-batch's {b}");
            }
            assert!(ratio <= 0.02, "{name} micro {micro}: final weights differ by {ratio} of what training moved them");
        }
    }
}

#[test]
fn sft_micro_batches_of_one_and_four_rows_train_as_one_micro_batch() {
    check("sft", "actor/sft_loss", false);
}

#[test]
fn grpo_micro_batches_of_one_and_four_rows_train_as_one_micro_batch() {
    check("grpo", "actor/pg_loss", true);
}
