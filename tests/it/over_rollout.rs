//! `explorer.over_rollout` (Trinity-RFT 0.6.0) in a run: a train step ends once enough of its tasks are done,
//! `wait_after_min` later, cancelling the task that hangs (its agent program is killed), and the run trains on
//! the rest; a config that combines it with `sync_style: fixed` is refused naming the keys.

use std::time::Duration;

use serde_json::Value;

use crate::support::{grpo_run_config, openai_python, stderr, tiny_model_dir, trinity, workspace_root};

/// Two steps of three tasks; the second task of each step hangs.
fn over_rollout_dir(sync_style: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..6)
        .map(|i| {
            let prompt = if i % 3 == 1 { format!("hang {i}") } else { format!("ab{i}") };
            format!("{{\"prompt\": \"{prompt}\", \"response\": \"{i}\"}}\n")
        })
        .collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
    let script = workspace_root().join("tests/fixtures/agents/hang_on_row_agent.py");
    let config = format!(
        "{}      default_workflow_type: agent_process_workflow
      workflow_args:
        command: [\"{}\", \"{}\"]
  batch_size: 3
explorer:
  max_timeout: 3000
  eval_on_startup: false
  over_rollout:
    ratio: 0.34
    wait_after_min: 1
  rollout_model:
    dtype: float32
    enable_openai_api: true
    enable_history: true
synchronizer:
  sync_style: {sync_style}
monitor:
  monitor_type: jsonl
",
        grpo_run_config(&tiny_model_dir(), 128).replace("  batch_size: 2\n", ""),
        openai_python().display(),
        script.display(),
    );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    dir
}

/// Whether process `pid` is gone (or a zombie nobody waits for any more).
fn gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn a_step_whose_slowest_task_hangs_ends_without_it() {
    let dir = over_rollout_dir("trainer_driven");
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = dir.path().join("ckpt/p/n");
    let metrics: Vec<Value> = std::fs::read_to_string(job.join("monitor/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(metrics.len(), 2, "both steps trained: {metrics:?}");
    for step in &metrics {
        assert_eq!(step["rollout/finished_task_count"], 2.0, "{step}");
        assert_eq!(step["rollout/cancelled_tasks"], 1.0, "{step}");
        assert_eq!(step["rollout/failed_tasks"], 0.0, "a cancelled task is not a failure: {step}");
    }
    let experiences = std::fs::read_to_string(job.join("experiences.jsonl")).unwrap();
    assert_eq!(experiences.lines().count(), 2 * 2 * 2, "2 steps × 2 finished tasks × 2 rollouts");
    assert!(!experiences.contains("hang"), "no experience of a cancelled task");
    let log = std::fs::read_to_string(job.join("log/trinity.log")).unwrap();
    assert!(log.contains("over-rollout: 2 of 3 tasks done"), "{log}");
    // Every hanging program was started (two rollouts of each hanging task) and killed with its task.
    let pids: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|name| Some(name.strip_prefix("hang_")?.strip_suffix(".pid")?.to_owned()))
        .collect();
    assert_eq!(pids.len(), 4, "{pids:?}");
    for pid in &pids {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !gone(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(gone(pid), "the agent program {pid} of a cancelled task outlived it");
    }
}

#[test]
fn over_rollout_with_the_fixed_sync_style_is_refused_naming_the_keys() {
    let dir = over_rollout_dir("fixed");
    let output = trinity(dir.path(), &["run", "--config", "config.yaml", "--dry-run"]);
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("explorer.over_rollout") && err.contains("synchronizer.sync_style `fixed`"), "{err}");
    assert!(!dir.path().join("ckpt/p/n/monitor").exists());
}
