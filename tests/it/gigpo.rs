//! GiGPO on trinity's step-wise FrozenLake through the binary: the workflow's turns carry the anchor states
//! gigpo groups by, so a step has anchor groups of more than one turn (every run starts on the same tile) and
//! trains on every turn.

use crate::support::{stderr, tiny_model_dir, trinity};

#[test]
fn gigpo_finds_anchor_groups_in_step_wise_frozen_lake() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tasks.jsonl"), "{\"prompt\": \"lake\"}\n{\"prompt\": \"lake 2\"}\n").unwrap();
    let config = format!(
        "project: p
name: gigpo
checkpoint_root_dir: ./ckpt
algorithm:
  algorithm_type: gigpo
  repeat_times: 3
model:
  model_path: {}
  max_model_len: 4096
  max_response_tokens: 1500
buffer:
  batch_size: 1
  total_steps: 2
  explorer_input:
    taskset:
      path: tasks.jsonl
      rollout_args:
        max_tokens: 1500
      workflow_args:
        desc: [SF, FG]
        agent_max_steps: 3
    default_workflow_type: step_wise_frozen_lake_workflow
monitor:
  monitor_type: jsonl
synchronizer:
  sync_method: memory
",
        tiny_model_dir().display()
    );
    std::fs::write(dir.path().join("gigpo.yaml"), config).unwrap();
    let output = trinity(dir.path(), &["run", "--config", "gigpo.yaml"]);
    let log = stderr(&output);
    assert!(output.status.success(), "{log}");
    for step in [1, 2] {
        assert!(log.contains(&format!("step {step}: gigpo anchor groups of more than one turn: ")), "{log}");
    }
    let metrics = std::fs::read_to_string(dir.path().join("ckpt/p/gigpo/monitor/metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = metrics.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for step in [1, 2] {
        let line = lines
            .iter()
            .find(|l| l["step"] == step && l.get("train/perf/rows").is_some())
            .unwrap_or_else(|| panic!("no train metrics at step {step}: {lines:?}"));
        let key =
            |k: &str| line.as_object().unwrap().iter().find(|(name, _)| name.ends_with(k)).map(|(_, v)| v.clone());
        let gt1 = key("gigpo/anchor_groups_size_gt1").and_then(|v| v.as_f64());
        assert!(gt1.is_some_and(|n| n >= 1.0), "step {step}: the runs' first turns share a state: {line}");
        let rows = line["train/perf/rows"].as_f64().unwrap();
        assert!(rows >= 3.0, "step {step}: one row per turn of three runs: {line}");
    }
}
