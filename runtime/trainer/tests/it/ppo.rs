use tch::Kind;
use trinity_trainer::{ActivationRecompute, TrainRow, TrainerOptions};

use crate::{algorithm, max_param_diff, tiny_model, trainer};

fn rows() -> Vec<TrainRow> {
    (0..6)
        .map(|i| {
            let response = [3 + i, 4, 5 + i % 3];
            let mut r = TrainRow::sft(&[1, 2 + i % 2], &response);
            r.logprobs = vec![-2.7; 3];
            r.reward = Some(if i % 2 == 0 { 1.0 } else { -0.5 });
            r
        })
        .collect()
}

#[test]
fn ppo_with_critic_runs_and_the_value_loss_falls() {
    let alg = algorithm("ppo", |_| {});
    let mut t = trainer(tiny_model(4, Kind::Float), &alg, 5e-3, TrainerOptions::default());
    assert!(t.critic().is_some() && t.reference().is_some());
    let rows = rows();
    let first = t.train_step(&rows).unwrap();
    let mut last = first.clone();
    for _ in 0..15 {
        last = t.train_step(&rows).unwrap();
    }
    let (start, end) = (first["critic/vf_loss"], last["critic/vf_loss"]);
    assert!(end < 0.5 * start, "vf_loss {start} -> {end}");
    for key in ["actor/pg_loss", "actor/kl_loss", "critic/vf_clipfrac", "critic/grad_norm", "actor/grad_norm"] {
        assert!(last.get(key).is_some_and(|v| v.is_finite()), "{key} missing in {last:?}");
    }
}

/// `critic_warmup: 3`: steps 1 and 2 train only the critic (veRL updates the actor once `critic_warmup <=
/// global_steps`), step 3 trains both, from the critic the warm-up trained.
#[test]
fn critic_warmup_trains_only_the_critic_until_its_step() {
    let alg = algorithm("ppo", |_| {});
    let options = TrainerOptions { critic_warmup: 3, ..TrainerOptions::default() };
    let mut t = trainer(tiny_model(4, Kind::Float), &alg, 5e-3, options);
    let start = tiny_model(4, Kind::Float);
    let rows = rows();
    for step in 1..=2 {
        let head = t.critic().unwrap().value_head().0.copy();
        let metrics = t.train_step(&rows).unwrap();
        assert_eq!(max_param_diff(t.policy(), &start), 0.0, "step {step} moved the actor");
        assert!(!t.critic().unwrap().value_head().0.equal(&head), "step {step} left the critic");
        assert_eq!(metrics["actor/updated"], 0.0);
        assert!(!metrics.contains_key("actor/pg_loss"), "{metrics:?}");
    }
    let metrics = t.train_step(&rows).unwrap();
    assert!(max_param_diff(t.policy(), &start) > 0.0, "step 3 updates the actor");
    assert_eq!(metrics["actor/updated"], 1.0);
    assert!(metrics["actor/pg_loss"].is_finite());
    // Without a critic the warm-up has nothing to warm: GRPO updates the actor from the first step.
    let grpo = algorithm("grpo", |_| {});
    let options = TrainerOptions { critic_warmup: 3, ..TrainerOptions::default() };
    let mut g = trainer(tiny_model(4, Kind::Float), &grpo, 5e-3, options);
    let mut rows = rows;
    for r in &mut rows {
        r.advantages = Some(vec![r.reward.unwrap_or(0.0); r.response_length()]);
    }
    assert_eq!(g.train_step(&rows).unwrap()["actor/updated"], 1.0);
    assert!(max_param_diff(g.policy(), &start) > 0.0);
}

#[test]
fn critic_state_round_trips() {
    let alg = algorithm("ppo", |_| {});
    let mut a = trainer(tiny_model(4, Kind::Float), &alg, 5e-3, TrainerOptions::default());
    a.train_step(&rows()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    a.save_state(dir.path()).unwrap();
    let mut b = trainer(tiny_model(5, Kind::Float), &alg, 5e-3, TrainerOptions::default());
    b.load_state(dir.path(), a.global_step()).unwrap();
    let (wa, wb) = (a.critic().unwrap().value_head().0, b.critic().unwrap().value_head().0);
    assert!(wa.equal(wb));
    assert_eq!(b.global_step(), 1);
    assert_eq!(b.critic().unwrap().optimizer().step_count(), 1);
}

#[test]
fn the_value_head_is_drawn_from_the_seed() {
    let alg = algorithm("ppo", |_| {});
    let head = |seed: u64, torch_seed: i64| {
        // libtorch's global generator moved differently before each trainer: the head must not depend on it.
        tch::manual_seed(torch_seed);
        let t = trainer(tiny_model(4, Kind::Float), &alg, 5e-3, TrainerOptions { seed, ..TrainerOptions::default() });
        t.critic().unwrap().value_head().0.copy()
    };
    let (a, b, c) = (head(7, 1), head(7, 2), head(8, 1));
    assert!(a.equal(&b), "same seed, same head");
    assert!(!a.equal(&c), "another seed, another head");
    let std = f64::try_from(a.std(true)).unwrap();
    assert!((0.01..0.03).contains(&std), "normal(0, 0.02) weights, got std {std}");
}

/// The critic honours its own `enable_gradient_checkpointing`: recomputed, its backbone trains as kept.
#[test]
fn a_recomputed_critic_trains_as_a_kept_one() {
    let alg = algorithm("ppo", |_| {});
    let run = |critic_activation_recompute: ActivationRecompute| {
        let options = TrainerOptions { critic_activation_recompute, ..TrainerOptions::default() };
        let mut t = trainer(tiny_model(4, Kind::Float), &alg, 5e-3, options);
        let m = t.train_step(&rows()).unwrap();
        (t, m)
    };
    let (kept, m_kept) = run(ActivationRecompute::Never);
    let (recomputed, m_recomputed) = run(ActivationRecompute::Always);
    let (a, b) = (kept.critic().unwrap(), recomputed.critic().unwrap());
    assert!(b.decoder().recomputes_activations() && !a.decoder().recomputes_activations());
    let (ka, kb) = (m_kept["critic/vf_loss"], m_recomputed["critic/vf_loss"]);
    assert!((ka - kb).abs() <= 1e-6 * ka.abs(), "vf_loss {ka} kept, {kb} recomputed");
    let diff = max_param_diff(a.decoder(), b.decoder());
    assert!(diff < 1e-7 && diff.is_finite(), "{diff}");
    assert!(max_param_diff(a.decoder(), &tiny_model(4, Kind::Float)) > 0.0, "the critic must have trained");
}
