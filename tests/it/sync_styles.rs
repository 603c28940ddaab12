//! Trinity-RFT 0.6.0's synchronizer keys in a run: separate `explorer_sync_interval` and `trainer_sync_interval`
//! (the explorer syncs where 0.6.0's explorer does and takes the weights the plan gives each sync), and
//! `sync_style: fully_async` with `explorer.max_inflight_batches` (the explorer takes weights as soon as the
//! trainer publishes them).

use serde_json::Value;

use crate::support::{grpo_run_config, openai_python, spawn_run, stderr, tiny_model_dir, trinity, workspace_root};

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

#[test]
fn fully_async_in_one_process_takes_every_published_version_with_batches_in_flight() {
    // Two batches in flight: explore steps 1 and 2 run before train step 1, whose weights step 3 samples with.
    let dir = run_dir(3, "synchronizer:\n  sync_style: fully_async\n");
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = dir.path().join("ckpt/p/n");
    assert_eq!(per_step(&job.join("monitor/metrics.jsonl"), "rollout/model_version"), [0.0, 0.0, 1.0]);
    let log = std::fs::read_to_string(job.join("log/trinity.log")).unwrap();
    assert!(log.contains("sync_style fully_async: up to 2 batches in flight"), "{log}");
}

#[test]
fn fully_async_refuses_eval_tasksets() {
    let dir = run_dir(3, "synchronizer:\n  sync_style: fully_async\n");
    let config = std::fs::read_to_string(dir.path().join("config.yaml")).unwrap().replace(
        "      path: tasks.jsonl\n  batch_size: 1\n",
        "      path: tasks.jsonl\n    eval_tasksets:\n      - name: e\n        path: tasks.jsonl\n  batch_size: 1\n",
    );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let output = trinity(dir.path(), &["run", "--config", "config.yaml", "--dry-run"]);
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("buffer.explorer_input.eval_tasksets") && err.contains("`fully_async`"), "{err}");
}

/// An explorer (mode `explore`) and a trainer (mode `train`) over one SQLite buffer, `steps` one-task steps of an
/// agent that thinks `AGENT_SLEEP` seconds per rollout, fully asynchronous.
fn fully_async_pair(steps: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..steps).map(|i| format!("{{\"prompt\": \"ab{i}\", \"response\": \"{i}\"}}\n")).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
    let script = workspace_root().join("tests/fixtures/agents/slow_agent.py");
    let config = |mode: &str| {
        format!(
            "project: p
name: n
mode: {mode}
checkpoint_root_dir: ./ckpt
algorithm:
  algorithm_type: grpo
  repeat_times: 2
model:
  model_path: {}
  max_model_len: 64
  max_response_tokens: 4
buffer:
  batch_size: 1
  train_batch_size: 2
  explorer_input:
    taskset:
      path: tasks.jsonl
      default_workflow_type: agent_process_workflow
      workflow_args:
        command: [\"{}\", \"{}\"]
  trainer_input:
    experience_buffer:
      name: exp
      storage_type: queue
      path: 'sqlite:///exp.db'
synchronizer:
  sync_method: checkpoint
  sync_style: fully_async
  sync_timeout: 120
explorer:
  eval_on_startup: false
  runner_per_model: 4
  max_inflight_batches: 2
  env_vars:
    AGENT_SLEEP: 6
  rollout_model:
    dtype: float32
    enable_openai_api: true
    enable_history: true
monitor:
  monitor_type: jsonl
",
            tiny_model_dir().display(),
            openai_python().display(),
            script.display(),
        )
    };
    std::fs::write(dir.path().join("explorer.yaml"), config("explore")).unwrap();
    std::fs::write(dir.path().join("trainer.yaml"), config("train")).unwrap();
    dir
}

#[test]
fn a_fully_async_explorer_takes_the_trainers_weights_while_its_batches_run() {
    let dir = fully_async_pair(3);
    let trainer = spawn_run(dir.path(), "trainer.yaml");
    let explorer = spawn_run(dir.path(), "explorer.yaml");
    for (child, what) in [(explorer, "explorer"), (trainer, "trainer")] {
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{what} failed:\n{}", stderr(&output));
    }
    let job = dir.path().join("ckpt/p/n");
    let versions = per_step(&job.join("monitor/explorer/metrics.jsonl"), "rollout/model_version");
    assert_eq!(versions.len(), 3, "{versions:?}");
    assert_eq!(versions[..2], [0.0, 0.0], "steps 1 and 2 ran at once on the base weights: {versions:?}");
    assert!(versions[2] >= 1.0, "step 3 ran while train step 1 published its weights: {versions:?}");
    let inflight = per_step(&job.join("monitor/explorer/metrics.jsonl"), "explorer/inflight_batches");
    assert_eq!(inflight[0], 2.0, "step 1 finished with step 2 in flight: {inflight:?}");
    // Published weights were loaded while step 3 ran (the trainer may have published steps 1 and 2 between two
    // looks, so the first version loaded is either).
    let log = std::fs::read_to_string(job.join("log/explorer.log")).unwrap();
    let loaded = log.find("now samples with the trainer's weights of step ").unwrap_or_else(|| panic!("{log}"));
    let step_3 = log.find("explore step 3:").unwrap_or_else(|| panic!("{log}"));
    assert!(loaded < step_3, "{log}");
    let experiences = std::fs::read_to_string(job.join("explorer_experiences.jsonl")).unwrap();
    assert_eq!(experiences.lines().count(), 6);
    let trainer_log = std::fs::read_to_string(job.join("log/trainer.log")).unwrap();
    for step in 1..=3 {
        assert!(trainer_log.contains(&format!("weights of step {step} published")), "{trainer_log}");
    }
}

#[test]
fn an_explorer_apart_syncs_at_its_own_interval_while_the_trainer_publishes_at_its_own() {
    // Explorer every 2 steps (fixed: it waits), trainer every step: the trainer publishes after train steps 1-4,
    // the explorer syncs once, before explore step 3, with the weights of step 2, and ignores the others.
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..4).map(|i| format!("{{\"prompt\": \"ab{i}\", \"response\": \"{i}\"}}\n")).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
    let config = |mode: &str| {
        format!(
            "mode: {mode}\n{}  train_batch_size: 2
  trainer_input:
    experience_buffer:
      name: exp
      storage_type: queue
      path: 'sqlite:///exp.db'
synchronizer:
  sync_method: checkpoint
  sync_timeout: 120
  explorer_sync_interval: 2
  trainer_sync_interval: 1
explorer:
  eval_on_startup: false
monitor:
  monitor_type: jsonl
",
            grpo_run_config(&tiny_model_dir(), 64).replace("  batch_size: 2\n", "").replace(
                "    taskset:\n      path: tasks.jsonl\n",
                "    taskset:\n      path: tasks.jsonl\n  batch_size: 1\n"
            ),
        )
    };
    std::fs::write(dir.path().join("explorer.yaml"), config("explore")).unwrap();
    std::fs::write(dir.path().join("trainer.yaml"), config("train")).unwrap();
    let trainer = spawn_run(dir.path(), "trainer.yaml");
    let explorer = spawn_run(dir.path(), "explorer.yaml");
    for (child, what) in [(explorer, "explorer"), (trainer, "trainer")] {
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{what} failed:\n{}", stderr(&output));
    }
    let job = dir.path().join("ckpt/p/n");
    assert_eq!(per_step(&job.join("monitor/explorer/metrics.jsonl"), "rollout/model_version"), [0.0, 0.0, 2.0, 2.0]);
    assert_eq!(per_step(&job.join("monitor/explorer/metrics.jsonl"), "explorer/synced"), [0.0, 0.0, 1.0, 0.0]);
    let trainer_log = std::fs::read_to_string(job.join("log/trainer.log")).unwrap();
    for step in 1..=4 {
        assert!(trainer_log.contains(&format!("weights of step {step} published")), "{trainer_log}");
    }
    assert!(trainer_log.contains("sync every 1 step(s)"), "{trainer_log}");
}
