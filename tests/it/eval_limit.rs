//! An evaluation whose task hangs: as Trinity-RFT 0.6.0's scheduler bounds the wait for an eval batch by
//! `explorer.max_timeout × (max_retry_times + 1)`, the evaluation stops there, cancels the task (its agent program
//! is killed) and reports the metrics of the tasks done, with how many came back and how many were cut off.

use std::time::Duration;

use serde_json::Value;

use crate::support::{grpo_run_config, openai_python, stderr, tiny_model_dir, trinity, workspace_root};

#[test]
fn an_evaluation_past_its_limit_reports_the_tasks_done() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tasks.jsonl"), "{\"prompt\": \"1+1\", \"response\": \"2\"}\n").unwrap();
    // One task at a time: the two quick ones are done long before the limit, the third hangs.
    let evals = "{\"prompt\": \"ab0\"}\n{\"prompt\": \"ab1\"}\n{\"prompt\": \"hang 2\"}\n";
    std::fs::write(dir.path().join("evals.jsonl"), evals).unwrap();
    let script = workspace_root().join("tests/fixtures/agents/hang_on_row_agent.py");
    let config = format!(
        "{}    eval_tasksets:
      - name: evals
        path: evals.jsonl
        default_workflow_type: agent_process_workflow
        workflow_args:
          command: [\"{}\", \"{}\"]
  batch_size: 1
  total_steps: 1
explorer:
  max_timeout: 8
  max_retry_times: 0
  runner_per_model: 1
  eval_on_startup: true
  rollout_model:
    dtype: float32
    enable_openai_api: true
    enable_history: true
monitor:
  monitor_type: jsonl
",
        grpo_run_config(&tiny_model_dir(), 128).replace("  batch_size: 2\n", ""),
        openai_python().display(),
        script.display(),
    );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    let log = stderr(&output);
    assert!(output.status.success(), "{log}");
    let metrics: Vec<Value> = std::fs::read_to_string(dir.path().join("ckpt/p/n/monitor/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let evals: Vec<&Value> = metrics.iter().filter(|m| m.get("eval/evals/finished_task_count").is_some()).collect();
    assert_eq!(evals.len(), 2, "at the start and after the step: {metrics:?}");
    for eval in evals {
        assert_eq!(eval["eval/evals/finished_task_count"], 2.0, "{eval}");
        assert_eq!(eval["eval/evals/cancelled_tasks"], 1.0, "{eval}");
        assert_eq!(eval["eval/evals/failed_tasks"], 0.0, "a task cut off is not a failure: {eval}");
        assert_eq!(eval["eval/evals/reward_mean"], 1.0, "the done tasks' rewards: {eval}");
    }
    assert!(log.contains("2 of 3 tasks done within the batch's limit of 8 s"), "{log}");
    // The hanging program of each evaluation was started and killed with its task.
    let pids: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|name| Some(name.strip_prefix("hang_")?.strip_suffix(".pid")?.to_owned()))
        .collect();
    assert_eq!(pids.len(), 2, "{pids:?}");
    for pid in &pids {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !gone(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(gone(pid), "the agent program {pid} of a cancelled task outlived it");
    }
}

/// Whether process `pid` is gone (or a zombie nobody waits for any more).
fn gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}
