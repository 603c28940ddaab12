//! Trinity-RFT 0.6.0's synchronizer keys in a run: separate `explorer_sync_interval` and `trainer_sync_interval`
//! (the explorer syncs where 0.6.0's explorer does and takes the weights the plan gives each sync), and
//! `sync_style: fully_async` with `explorer.max_inflight_batches` (the explorer takes weights as soon as the
//! trainer publishes them).

use serde_json::Value;

use crate::support::{grpo_run_config, stderr, tiny_model_dir, trinity};

/// A mode `both` run over `steps` one-task steps, with `extra` appended (top-level sections).
fn run_dir(steps: usize, extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..steps).map(|i| format!("{{\"prompt\": \"ab{i}\", \"response\": \"{i}\"}}\n")).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
    let config = format!(
        "{}  batch_size: 1
explorer:
  eval_on_startup: false
monitor:
  monitor_type: jsonl
{extra}",
        grpo_run_config(&tiny_model_dir(), 64).replace("  batch_size: 2\n", ""),
    );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    dir
}

/// Each recorded step's value of `key`, in step order.
fn per_step(metrics_file: &std::path::Path, key: &str) -> Vec<f64> {
    std::fs::read_to_string(metrics_file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|row| row[key].as_f64().unwrap_or_else(|| panic!("{key} in {row}")))
        .collect()
}

#[test]
fn separate_sync_intervals_sync_where_trinity_rft_does() {
    // The explorer syncs after explore steps 3 and 6 (0.6.0's `(n − offset) % explorer_sync_interval == 0`); the
    // trainer publishes every 2 train steps, so the first sync takes the weights of step 2.
    let dir = run_dir(6, "synchronizer:\n  explorer_sync_interval: 3\n  trainer_sync_interval: 2\n");
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = dir.path().join("ckpt/p/n");
    assert_eq!(per_step(&job.join("monitor/metrics.jsonl"), "rollout/model_version"), [0.0, 0.0, 0.0, 2.0, 2.0, 2.0]);
    let log = std::fs::read_to_string(job.join("log/trinity.log")).unwrap();
    let loads: Vec<&str> = log.lines().filter(|l| l.contains("samples with the trainer's weights of step")).collect();
    assert_eq!(loads.len(), 2, "after train step 2 and at the end (step 6): {loads:?}");
    assert!(loads[0].contains("step 2 ") && loads[1].contains("step 6 "), "{loads:?}");
    assert!(log.contains("explorer syncs every 3 step(s), trainer every 2"), "{log}");
}

#[test]
fn an_explorer_interval_below_the_trainers_is_refused_in_one_process() {
    let dir = run_dir(4, "synchronizer:\n  explorer_sync_interval: 1\n  trainer_sync_interval: 2\n");
    let output = trinity(dir.path(), &["run", "--config", "config.yaml", "--dry-run"]);
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(
        err.contains("synchronizer.explorer_sync_interval")
            && err.contains("below synchronizer.trainer_sync_interval 2"),
        "{err}"
    );
}
