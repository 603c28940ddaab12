//! `trinity run` in mode `both` on a tiny model the repository ships (two-layer Llama, own tokenizer).

use crate::support::{stderr, trinity, workspace_root};

#[test]
fn a_grpo_run_writes_metrics_checkpoints_and_a_log() {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..4).map(|i| format!("{{\"prompt\": \"ab{i}\", \"response\": \"{i}\"}}\n")).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
    let model = workspace_root().join("runtime/model/tests/fixtures/tiny/llama_tied");
    let config = format!(
        "project: p
name: n
checkpoint_root_dir: ./ckpt
algorithm:
  algorithm_type: grpo
  repeat_times: 2
model:
  model_path: {}
  max_model_len: 40
  max_response_tokens: 6
buffer:
  batch_size: 2
  explorer_input:
    taskset:
      path: tasks.jsonl
    default_workflow_type: simple_workflow
monitor:
  monitor_type: tensorboard
",
        model.display()
    );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = dir.path().join("ckpt/p/n");
    let metrics = std::fs::read_to_string(job.join("monitor/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2, "two steps:\n{metrics}");
    assert!(metrics.contains("\"train/pg_loss\""), "{metrics}");
    assert!(job.join("global_step_2/hf/model.safetensors").exists());
    assert!(std::fs::read_dir(job.join("monitor/tensorboard")).unwrap().count() == 1);
    let log = std::fs::read_to_string(job.join("log/trinity.log")).unwrap();
    assert!(log.contains("finished after 2 train steps"), "{log}");
}
