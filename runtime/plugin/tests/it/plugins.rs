//! The example plugins load, declare who they are, work, and register like built-ins.

use std::collections::BTreeMap;

use serde_json::{Map, json};
use trinity_buffer::{Eid, Experience};
use trinity_plugin::{Plugin, PluginKind, PluginLimits, RewardTask};
use trinity_reward::RewardInput;

use crate::support::wasm;

#[test]
fn gsm8k_reward_scores_a_batch_and_registers_by_name() {
    let plugin = trinity_plugin::load(&wasm("gsm8k_reward"), PluginLimits::default()).unwrap();
    let info = plugin.info().clone();
    assert_eq!((info.name.as_str(), info.kind, info.version.as_str()), ("gsm8k_reward", PluginKind::Reward, "0.1.0"));
    let Plugin::Reward(reward) = &plugin else { panic!("not a reward") };
    let tasks = [
        RewardTask { truth: Some("so #### 72".into()), ..RewardTask::default() },
        RewardTask { truth: Some("5".into()), ..RewardTask::default() },
    ];
    let scores = reward.score(&tasks, &[(0, "#### 72"), (0, "71"), (1, "\\boxed{5}")]).unwrap();
    let accuracy: Vec<f64> = scores.iter().map(|s| s["accuracy"]).collect();
    assert_eq!(accuracy, [1.0, 0.0, 1.0]);

    trinity_plugin::register(&plugin, false).unwrap();
    assert!(trinity_reward::names().contains(&"gsm8k_reward".to_owned()));
    let args = Map::new();
    let input = RewardInput { response: "#### 3", truth: Some("3"), prompt: None, args: &args, response_tokens: None };
    assert_eq!(trinity_reward::score("gsm8k_reward", &input).unwrap()["accuracy"], 1.0);
    let group = trinity_reward::score_group("gsm8k_reward", None, &[input, input]).unwrap();
    assert_eq!(group.len(), 2);
    // One name, one registration.
    let error = trinity_plugin::register(&plugin, true).unwrap_err().to_string();
    assert!(error.contains("already registered"), "{error}");
    assert!(trinity_plugin::registered().iter().any(|p| p.name == "gsm8k_reward"));
}

#[test]
fn the_operator_drops_zero_variance_groups() {
    let plugin = trinity_plugin::load(&wasm("zero_variance_filter"), PluginLimits::default()).unwrap();
    let Plugin::Operator(operator) = &plugin else { panic!("not an operator") };
    let experience = |task, run, reward| {
        let mut e = Experience::single_turn(Eid { batch: 1, task, run, step: 0 }, vec![1, 2, 3], 1, vec![0.0; 2]);
        e.reward = reward;
        e
    };
    let batch = [experience(0, 0, 1.0), experience(0, 1, 1.0), experience(1, 0, 0.0), experience(1, 1, 1.0)];
    let out = operator.transform(&batch, &Map::new()).unwrap();
    let kept: Vec<(u64, u64)> = out.experiences.iter().map(|e| (e.eid.task, e.eid.run)).collect();
    assert_eq!(kept, [(1, 0), (1, 1)]);
    assert_eq!(out.metrics, BTreeMap::from([("dropped_groups".into(), 1.0), ("kept_groups".into(), 1.0)]));
    let mut args = Map::new();
    args.insert("threshold".into(), json!("high"));
    let error = operator.transform(&batch, &args).unwrap_err().to_string();
    assert!(error.contains("threshold"), "{error}");
}

#[test]
fn the_workflow_declares_itself() {
    let plugin = trinity_plugin::load(&wasm("frozen_lake"), PluginLimits::default()).unwrap();
    assert_eq!(plugin.info().kind, PluginKind::Workflow);
    assert_eq!(plugin.info().name, "frozen_lake");
}
