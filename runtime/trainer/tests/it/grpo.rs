use serde_json::json;
use tch::{Kind, Tensor};
use trinity_algorithm::Batch;
use trinity_algorithm::registry::{self, Kind as Component};
use trinity_config::algorithm::OptimizerConfig;
use trinity_trainer::{ActivationRecompute, Components, MicroBatching, TrainRow, Trainer, TrainerOptions};

use crate::{algorithm, max_param_diff, next_token_probs, tiny_model, trainer};

const PROMPT: [i64; 2] = [1, 2];
const TARGET: i64 = 7;
const GROUP: usize = 16;

/// Samples `GROUP` one-token responses from the policy, rewards the target token, and turns the rewards into
/// advantages with the `grpo` component, as the explorer's pipeline would. The draws come from `rng`, not from
/// libtorch's global generator, which the tests running beside this one on other threads also draw from.
fn rollout(probs: &Tensor, rng: &mut u64) -> Vec<TrainRow> {
    let cdf: Vec<f64> = Vec::<f64>::try_from(probs.to_kind(Kind::Double).cumsum(0, Kind::Double)).unwrap();
    let samples: Vec<i64> = (0..GROUP)
        .map(|_| {
            // xorshift64*: a fixed stream per test run.
            *rng ^= *rng >> 12;
            *rng ^= *rng << 25;
            *rng ^= *rng >> 27;
            let u = (rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
            let total = cdf.last().copied().unwrap_or(1.0);
            cdf.iter().position(|&c| c > u * total).unwrap_or(cdf.len() - 1) as i64
        })
        .collect();
    let logp = probs.log();
    let rewards: Vec<f64> = samples.iter().map(|&s| if s == TARGET { 1.0 } else { 0.0 }).collect();
    let mut batch = Batch::new(Tensor::ones([GROUP as i64, 1], (Kind::Float, tch::Device::Cpu)));
    batch.reward = Some(rewards.clone());
    batch.group_id = Some(vec!["task-0".to_owned(); GROUP]);
    let resolved = registry::resolve_args(Component::AdvantageFn, "grpo", json!({}).as_object()).unwrap();
    let (grpo, in_trainer) = registry::advantage_fn("grpo", &resolved).unwrap();
    assert!(!in_trainer);
    let adv = grpo.compute(&batch).unwrap().advantages;
    samples
        .iter()
        .enumerate()
        .map(|(i, &s)| TrainRow {
            tokens: vec![PROMPT[0], PROMPT[1], s],
            prompt_length: 2,
            action_mask: vec![true],
            logprobs: vec![logp.double_value(&[s]) as f32],
            reward: Some(rewards[i] as f32),
            advantages: Some(vec![adv.double_value(&[i as i64, 0]) as f32]),
            group_id: Some("task-0".into()),
            ..TrainRow::default()
        })
        .collect()
}

#[test]
fn grpo_raises_the_expected_reward() {
    let mut t = trainer(tiny_model(2, Kind::Float), &algorithm("grpo", |_| {}), 2e-2, TrainerOptions::default());
    assert!(t.reference().is_some(), "grpo uses a reference model for its k2 KL loss");
    // Without a KL loss nothing reads the reference logprobs, so there is no reference model to score.
    let no_kl = algorithm("grpo", |a| a.kl_loss_fn = Some("none".into()));
    assert!(trainer(tiny_model(2, Kind::Float), &no_kl, 2e-2, TrainerOptions::default()).reference().is_none());
    // DPO's loss reads them itself.
    let dpo = algorithm("dpo", |_| {});
    assert!(trainer(tiny_model(2, Kind::Float), &dpo, 2e-2, TrainerOptions::default()).reference().is_some());
    let mut rng = 11u64;
    let before = next_token_probs(t.policy(), &PROMPT).double_value(&[TARGET]);
    let mut last = None;
    for _ in 0..12 {
        let probs = next_token_probs(t.policy(), &PROMPT);
        let rows = rollout(&probs, &mut rng);
        last = Some(t.train_step(&rows).unwrap());
    }
    let after = next_token_probs(t.policy(), &PROMPT).double_value(&[TARGET]);
    assert!(after > 0.5 && after > 4.0 * before, "p(target) {before} -> {after}");
    let m = last.unwrap();
    for key in ["actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/kl_loss", "actor/entropy", "actor/lr"] {
        assert!(m.get(key).is_some_and(|v| v.is_finite()), "{key} missing in {m:?}");
    }
}

/// Rows that arrive with rewards and group ids but no advantages get them from the preset's group function
/// in the trainer.
#[test]
fn group_advantages_are_computed_when_rows_bring_none() {
    let alg = algorithm("grpo", |a| a.advantage_fn_args = crate::args(json!({"std_threshold": 0.0})));
    let mut t = trainer(tiny_model(2, Kind::Float), &alg, 1e-3, TrainerOptions::default());
    let probs = next_token_probs(t.policy(), &PROMPT);
    let mut rows = rollout(&probs, &mut 5);
    for (i, r) in rows.iter_mut().enumerate() {
        r.advantages = None;
        r.reward = Some((i % 2) as f32);
    }
    // A second group with equal rewards is dropped by std_threshold: only the first group trains.
    let mut flat = rows[0].clone();
    flat.group_id = Some("task-1".into());
    flat.reward = Some(1.0);
    rows.push(flat.clone());
    rows.push(flat);
    let m = t.train_step(&rows).unwrap();
    assert_eq!(m["perf/rows"], GROUP as f64);
    assert!(m.contains_key("group_advantages/reward_mean/mean"), "{m:?}");
}

/// `ppo_mini_batch_size` and `ppo_epochs` are several optimizer steps in one train step: 16 rows in mini-batches
/// of 4 over 2 epochs must move the policy exactly as 8 one-mini-batch train steps on the same rows in the same
/// order do (constant learning rate, advantages and old logprobs fixed by the rollout).
#[test]
fn mini_batches_and_epochs_are_optimizer_steps_within_one_train_step() {
    let alg = algorithm("grpo", |_| {});
    // Every trainer starts from copies of one model: tests run in parallel and share libtorch's generator, so two
    // seeded constructions are not guaranteed the same weights.
    let base = tiny_model(3, Kind::Float);
    let copy = || {
        let mut model = tiny_model(3, Kind::Float);
        model.copy_weights_from(&base).unwrap();
        model
    };
    let mut rows = rollout(&next_token_probs(&base, &PROMPT), &mut 5);
    // Advantages of both signs whatever was sampled, so that every optimizer step moves the policy.
    for (i, row) in rows.iter_mut().enumerate() {
        row.advantages = Some(vec![if i % 3 == 0 { 1.0 } else { -0.5 }]);
    }
    let options = TrainerOptions { ppo_epochs: 2, mini_batch_rows: Some(4), ..TrainerOptions::default() };
    let mut batched = trainer(copy(), &alg, 1e-2, options);
    let metrics = batched.train_step(&rows).unwrap();
    assert_eq!(metrics.get("actor/optimizer_steps"), Some(&8.0));

    let mut stepwise = trainer(copy(), &alg, 1e-2, TrainerOptions::default());
    for _epoch in 0..2 {
        for chunk in rows.chunks(4) {
            stepwise.train_step(chunk).unwrap();
        }
    }
    let diff = max_param_diff(batched.policy(), stepwise.policy());
    let moved = max_param_diff(batched.policy(), &base);
    assert!(moved > 1e-3, "the policy moved by {moved}");
    assert!(diff < 1e-5 * moved.max(1.0), "mini-batched and step-wise policies differ by {diff}");

    // One mini-batch and one epoch is the plain train step.
    let mut whole = trainer(copy(), &alg, 1e-2, TrainerOptions::default());
    let options = TrainerOptions { mini_batch_rows: Some(rows.len()), ..TrainerOptions::default() };
    let mut explicit = trainer(copy(), &alg, 1e-2, options);
    whole.train_step(&rows).unwrap();
    assert_eq!(explicit.train_step(&rows).unwrap().get("actor/optimizer_steps"), Some(&1.0));
    assert_eq!(max_param_diff(whole.policy(), explicit.policy()), 0.0);
}

/// `rollout_correction.bypass_mode: false`: the PPO ratio is taken against the policy's own logprobs before the
/// update, so rollout logprobs that are off (here by a constant) no longer enter it.
#[test]
fn recomputed_old_logprobs_replace_the_rollout_ones() {
    let alg = algorithm("grpo", |_| {});
    let base = tiny_model(4, Kind::Float);
    let copy = || {
        let mut model = tiny_model(4, Kind::Float);
        model.copy_weights_from(&base).unwrap();
        model
    };
    let mut rows = rollout(&next_token_probs(&base, &PROMPT), &mut 5);
    for (i, row) in rows.iter_mut().enumerate() {
        row.advantages = Some(vec![if i % 2 == 0 { 1.0 } else { -1.0 }]);
        row.logprobs = vec![row.logprobs[0] - 2.0];
    }
    let mut bypass = trainer(copy(), &alg, 1e-3, TrainerOptions::default());
    let off = bypass.train_step(&rows).unwrap()["actor/ppo_kl"];
    let options = TrainerOptions { recompute_old_logprobs: true, ..TrainerOptions::default() };
    let mut recompute = trainer(copy(), &alg, 1e-3, options);
    let on = recompute.train_step(&rows).unwrap()["actor/ppo_kl"];
    assert!(off.abs() > 1.0, "rollout logprobs 2 nats off give ppo_kl {off}");
    assert!(on.abs() < 1e-5, "the policy against itself gives ppo_kl {on}");
}

/// GRPO with an entropy term, so that a comparison of two ways to train covers the entropy's gradient too.
fn grpo_with_entropy() -> trinity_config::algorithm::AlgorithmConfig {
    algorithm("grpo", |a| {
        a.entropy_loss_fn_args = crate::args(json!({"entropy_coef": 0.01}));
    })
}

/// Twelve rows over two prompts of 3 and 5 tokens, with responses of 1 to 4 tokens and advantages of both signs.
fn two_prompt_rows() -> Vec<TrainRow> {
    (0..12usize)
        .map(|k| {
            let prompt: Vec<i64> = if k % 3 == 0 { vec![1, 2, 3] } else { vec![4, 5, 6, 7, 8] };
            let response: Vec<i64> = (0..1 + k % 4).map(|t| ((k + 3 * t) % 15) as i64 + 1).collect();
            let mut row = TrainRow::sft(&prompt, &response);
            row.logprobs = vec![-1.5; response.len()];
            row.advantages = Some(vec![if k % 2 == 0 { 1.0 } else { -0.7 }; response.len()]);
            row
        })
        .collect()
}

/// Micro-batches run together in one pass ([`TrainerOptions::pass_tokens`]) train exactly as they do one at a
/// time: each keeps its own token-mean loss and weight, entropy and KL terms included, and the metrics are the
/// same. One micro-batch of all rows trains the same too (the weights make every micro-batch count its tokens in
/// the whole batch's token mean), while a step without one of the rows does not, which shows the comparison can
/// tell.
#[test]
fn micro_batches_in_one_pass_train_as_they_do_one_at_a_time() {
    let alg = grpo_with_entropy();
    let rows = two_prompt_rows();
    let run_on = |rows: &[TrainRow], micro_batching: MicroBatching, pass_tokens: Option<usize>| {
        let options = TrainerOptions { micro_batching, pass_tokens, ..TrainerOptions::default() };
        // eps 1 makes AdamW's first update ≈ lr · gradient: the parameters then compare the gradients themselves,
        // where a small eps would blow the rounding of near-zero entries up to ± lr.
        let adam = OptimizerConfig { lr: 0.1, eps: 1.0, weight_decay: 0.0, ..OptimizerConfig::default() };
        let components = Components::from_config(&alg).unwrap();
        let mut t = Trainer::new(tiny_model(6, Kind::Float), components, &adam, options).unwrap();
        let m = t.train_step(rows).unwrap();
        (t, m)
    };
    let run = |micro_batching: MicroBatching, pass_tokens: Option<usize>| run_on(&rows, micro_batching, pass_tokens);
    let (apart, m_apart) = run(MicroBatching::TokenBudget(16), None);
    let (joined, m_joined) = run(MicroBatching::TokenBudget(16), Some(1 << 20));
    assert!(m_apart["perf/micro_batches"] >= 4.0, "{m_apart:?}");
    assert_eq!(m_apart["perf/micro_batches"], m_joined["perf/micro_batches"]);
    for key in ["actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/loss", "actor/grad_norm"] {
        let (a, b) = (m_apart[key], m_joined[key]);
        assert!((a - b).abs() <= 1e-5 * a.abs().max(1e-3), "{key}: {a} apart, {b} in one pass");
    }
    let diff = max_param_diff(apart.policy(), joined.policy());
    assert!(diff < 1e-7, "{diff}");
    let (whole, m_whole) = run(MicroBatching::TokenBudget(1 << 20), None);
    assert_eq!(m_whole["perf/micro_batches"], 1.0);
    for key in ["actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/loss", "actor/grad_norm"] {
        let (a, b) = (m_apart[key], m_whole[key]);
        assert!((a - b).abs() <= 1e-5 * a.abs().max(1e-3), "{key}: {a} apart, {b} as one micro-batch");
    }
    let whole_diff = max_param_diff(apart.policy(), whole.policy());
    assert!(whole_diff < 1e-7, "{whole_diff}");
    let (fewer, _) = run_on(&rows[..rows.len() - 1], MicroBatching::TokenBudget(16), None);
    let fewer_diff = max_param_diff(apart.policy(), fewer.policy());
    assert!(fewer_diff > 1e-4, "{fewer_diff}");
}

/// Layers recomputed in the backward (`enable_gradient_checkpointing`, forced on for every pass) train exactly as
/// layers kept: the same metrics and the same parameters after a step, in fp32 and in bf16 (whose attention
/// takes its training path in both runs of a recomputed layer).
#[test]
fn recomputed_layers_train_as_kept_layers() {
    let (alg, rows) = (grpo_with_entropy(), two_prompt_rows());
    for kind in [Kind::Float, Kind::BFloat16] {
        let run = |activation_recompute: ActivationRecompute| {
            let options = TrainerOptions { activation_recompute, ..TrainerOptions::default() };
            let adam = OptimizerConfig { lr: 0.1, eps: 1.0, weight_decay: 0.0, ..OptimizerConfig::default() };
            let components = Components::from_config(&alg).unwrap();
            let mut t = Trainer::new(tiny_model(6, kind), components, &adam, options).unwrap();
            let m = t.train_step(&rows).unwrap();
            (t, m)
        };
        let (kept, m_kept) = run(ActivationRecompute::Never);
        let (recomputed, m_recomputed) = run(ActivationRecompute::Always);
        assert!(recomputed.policy().recomputes_activations() && !kept.policy().recomputes_activations());
        for key in ["actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/loss", "actor/grad_norm"] {
            let (a, b) = (m_kept[key], m_recomputed[key]);
            assert!((a - b).abs() <= 1e-6 * a.abs().max(1e-3), "{kind:?} {key}: {a} kept, {b} recomputed");
        }
        let diff = max_param_diff(kept.policy(), recomputed.policy());
        assert!(diff < 1e-7, "{kind:?}: {diff}");
    }
}
