//! Routing replay ([`trinity_trainer::router_replay`]) on a tiny random Qwen3-MoE: the policy computes with the
//! experts its rollout chose, even where its own router now prefers others.

use tch::{Device, Kind, Tensor};
use trinity_model::{Decoder, ModelConfig, RandomWeights};
use trinity_trainer::batch::PaddedInputs;
use trinity_trainer::{RoutedExperts, TrainRow, TrainerOptions};

use crate::{VOCAB, algorithm, trainer, uneven_rows};

/// Layer 0 sparse (4 experts, top 2), layer 1 dense; seeded.
fn moe_model(seed: i64) -> Decoder {
    moe_model_with(seed, |_| {})
}

fn moe_model_with(seed: i64, edit: impl FnOnce(&mut trinity_model::MoeConfig)) -> Decoder {
    let _generator = crate::GLOBAL_GENERATOR.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    tch::manual_seed(seed);
    let mut config = ModelConfig { vocab_size: VOCAB, max_position_embeddings: 64, ..ModelConfig::tiny_moe() };
    edit(config.moe.as_mut().unwrap());
    Decoder::load(config, &mut RandomWeights, Kind::Float, Device::Cpu).unwrap()
}

/// The experts `model` routes `tokens` to, `[T, L, k]` flat.
fn own_experts(model: &Decoder, tokens: &[i64]) -> Vec<u16> {
    let ids = Tensor::from_slice(tokens).view([1, -1]);
    let routed = tch::no_grad(|| model.forward_hidden_routed(&ids, None, None, false)).unwrap();
    Vec::<i64>::try_from(routed.experts.reshape([-1])).unwrap().into_iter().map(|e| e as u16).collect()
}

/// GRPO rows carrying the experts `rollout` routed every token but the last to, as the engine records them.
fn routed_rows(rollout: &Decoder) -> Vec<TrainRow> {
    let mut rows = uneven_rows(8, true);
    for row in &mut rows {
        let read = &row.tokens[..row.tokens.len() - 1];
        row.routed_experts = Some(RoutedExperts { layers: 1, top_k: 2, ids: own_experts(rollout, read) });
    }
    rows
}

/// Negates the sparse layer's router: each token's two favourite experts of four become its two least liked.
fn flip_router(model: &Decoder) {
    tch::no_grad(|| {
        for (name, mut p) in model.named_parameters().unwrap() {
            if name.ends_with("mlp.gate.weight") {
                let _ = p.neg_();
            }
        }
    });
}

#[test]
fn the_policy_computes_with_the_rollouts_experts_where_its_router_disagrees() {
    let rollout = moe_model(5);
    let rows = routed_rows(&rollout);
    let policy = moe_model(5);
    flip_router(&policy);
    let all: Vec<usize> = (0..rows.len()).collect();
    // Its own router now picks other experts at every token.
    for row in &rows {
        let own = own_experts(&policy, &row.tokens[..row.tokens.len() - 1]);
        let rolled = &row.routed_experts.as_ref().unwrap().ids;
        let same = own.chunks(2).zip(rolled.chunks(2)).filter(|(a, b)| a.iter().any(|e| b.contains(e))).count();
        assert_eq!(same, 0, "the flipped router shares no expert with the rollout's at any token");
    }

    let replayed = PaddedInputs::with_replay(&rows, &all, Device::Cpu, true).unwrap();
    assert!(!replayed.shares_prompts(), "replay runs the full rows");
    let forced = replayed.replayed_experts().expect("the rows carry routing");
    let hidden = tch::no_grad(|| replayed.hidden(&policy)).unwrap();
    let own = tch::no_grad(|| PaddedInputs::new(&rows, &all, Device::Cpu).unwrap().hidden(&policy)).unwrap();
    let p = rows.iter().map(|r| r.prompt_length).max().unwrap();
    for (b, row) in rows.iter().enumerate() {
        // The experts forced at the row's tokens are the rollout's, token by token.
        let start = (p - row.prompt_length) as i64;
        let read = row.tokens.len() as i64 - 1;
        let at_tokens = forced.get(b as i64).narrow(0, start, read).reshape([-1]);
        let at_tokens: Vec<u16> = Vec::<i64>::try_from(at_tokens).unwrap().into_iter().map(|e| e as u16).collect();
        assert_eq!(&at_tokens, &row.routed_experts.as_ref().unwrap().ids, "row {b}");
        // And the hidden states are the policy's forward with exactly those experts (this row alone).
        let ids = Tensor::from_slice(&row.tokens).view([1, -1]);
        let mut replay = at_tokens.iter().map(|&e| i64::from(e)).collect::<Vec<_>>();
        replay.extend([0, 1]);
        let replay = Tensor::from_slice(&replay).view([1, -1, 1, 2]);
        let alone = tch::no_grad(|| policy.forward_hidden_routed(&ids, None, Some(&replay), false)).unwrap();
        let n = row.response_length() as i64;
        let want = alone.hidden.get(0).narrow(0, row.prompt_length as i64 - 1, n);
        let got = hidden.get(b as i64).narrow(0, 0, n);
        assert!((&got - &want).abs().max().double_value(&[]) < 1e-5, "row {b}");
        let mine = own.get(b as i64).narrow(0, 0, n);
        assert!((&mine - &want).abs().max().double_value(&[]) > 1e-3, "row {b}: its own experts give other states");
    }
}

#[test]
fn a_replayed_grpo_step_trains_and_refuses_rows_without_routing() {
    let rollout = moe_model(6);
    let rows = routed_rows(&rollout);
    let policy = moe_model(6);
    flip_router(&policy);
    let options = TrainerOptions { router_replay: true, recompute_old_logprobs: true, ..TrainerOptions::default() };
    let grpo = algorithm("grpo", |_| {});
    let mut t = trainer(policy, &grpo, 1e-2, options.clone());
    // The old logprobs are recomputed with the rollout's experts too.
    let m = t.train_step(&rows).unwrap();
    for key in ["actor/pg_loss", "actor/ppo_kl", "actor/kl_loss", "actor/entropy"] {
        assert!(m.get(key).is_some_and(|v| v.is_finite()), "{key} missing in {m:?}");
    }
    let mut missing = rows.clone();
    missing[3].routed_experts = None;
    let err = t.train_step(&missing).unwrap_err().to_string();
    assert!(err.contains("row 3") && err.contains("enable_router_replay"), "{err}");

    let mut dense = trainer(crate::tiny_model(1, Kind::Float), &grpo, 1e-2, options);
    let err = dense.train_step(&rows).unwrap_err().to_string();
    assert!(err.contains("enable_router_replay") && err.contains("no mixture-of-experts"), "{err}");
}

#[test]
fn replay_changes_the_update_when_the_router_disagrees() {
    // The same rows and flipped policy, trained with and without replay: the routing the gradient flows through
    // differs, so the updated weights do.
    let rollout = moe_model(7);
    let rows = routed_rows(&rollout);
    let grpo = algorithm("grpo", |a| a.kl_loss_fn = Some("none".into()));
    let run = |replay: bool| {
        let policy = moe_model(7);
        flip_router(&policy);
        let options = TrainerOptions { router_replay: replay, ..TrainerOptions::default() };
        let mut t = trainer(policy, &grpo, 1e-2, options);
        t.train_step(&rows).unwrap();
        t.into_policy()
    };
    let (with, without) = (run(true), run(false));
    assert!(crate::max_param_diff(&with, &without) > 1e-4);
}

/// The router's weights, flat.
fn router(model: &Decoder) -> Tensor {
    let params = model.named_parameters().unwrap();
    params.into_iter().find(|(n, _)| n.ends_with("mlp.gate.weight")).unwrap().1.detach().copy()
}

#[test]
fn the_load_balancing_loss_trains_the_router_when_the_model_config_asks_for_it() {
    // Every advantage 0 and no KL or entropy term: the policy loss has no gradient, so whatever moves the router
    // is the load-balancing loss.
    let mut rows = uneven_rows(8, true);
    for row in &mut rows {
        row.advantages = Some(vec![0.0; row.response_length()]);
    }
    let grpo = algorithm("grpo", |a| {
        a.kl_loss_fn = Some("none".into());
        a.entropy_loss_fn = Some("none".into());
    });
    let run = |output_router_logits: bool| {
        let policy = moe_model_with(8, |moe| {
            moe.output_router_logits = output_router_logits;
            moe.router_aux_loss_coef = 0.5;
        });
        let before = router(&policy);
        let all: Vec<usize> = (0..rows.len()).collect();
        let inputs = PaddedInputs::with_routing(&rows, &all, Device::Cpu, false, true).unwrap();
        let want = tch::no_grad(|| inputs.hidden_routed(&policy)).unwrap().1.unwrap().double_value(&[]);
        // The gradient the step should take: 0.5 × ∇(load-balancing loss), alone.
        let twin = moe_model_with(8, |moe| moe.output_router_logits = output_router_logits);
        (inputs.hidden_routed(&twin).unwrap().1.unwrap() * 0.5).backward();
        let norm: f64 = twin
            .named_parameters()
            .unwrap()
            .iter()
            .filter(|(_, p)| p.grad().defined())
            .map(|(_, p)| p.grad().pow_tensor_scalar(2).sum(Kind::Double).double_value(&[]))
            .sum::<f64>()
            .sqrt();
        let mut t = trainer(policy, &grpo, 1e-2, TrainerOptions::default());
        let m = t.train_step(&rows).unwrap();
        let moved = (router(t.policy()) - before).abs().max().double_value(&[]);
        (m.get("actor/router_aux_loss").copied(), want, moved, (m.get("actor/grad_norm").copied(), norm))
    };
    let (logged, want, moved, (grad_norm, norm)) = run(true);
    let logged = logged.expect("the loss is logged");
    // One pass holds the whole mini-batch: the logged value is the batch's loss (2 experts of 4: at least 1).
    assert!((logged - want).abs() < 1e-5 && want >= 1.0, "{logged} vs {want}");
    let grad_norm = grad_norm.expect("grad_norm");
    assert!(norm > 0.0 && (grad_norm - norm).abs() < 1e-5 * norm.max(1.0), "step's gradient {grad_norm} vs {norm}");
    assert!(moved > 1e-4, "the router trains: {moved}");
    let (logged, _, moved, _) = run(false);
    assert!(logged.is_none());
    assert_eq!(moved, 0.0, "without it nothing has gradient");
}
