//! `trinity run` in mode `both` on a tiny model the repository ships (two-layer Llama, own tokenizer).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{grpo_run_config, stderr, tiny_model_dir, trinity};

/// A directory with a tiny-model GRPO config (2 tasks × 2 rollouts per step, `steps` steps of tasks) and its
/// task file. `buffer` goes inside `buffer:` (indented two spaces), `extra` at the top level.
fn tiny_run_dir(steps: usize, buffer: &str, extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..2 * steps).map(|i| format!("{{\"prompt\": \"ab{i}\", \"response\": \"{i}\"}}\n")).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
    let config = format!(
        "{}    default_workflow_type: simple_workflow
{buffer}{extra}",
        grpo_run_config(&tiny_model_dir(), 40)
    );
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    dir
}

#[test]
fn a_grpo_run_writes_metrics_checkpoints_and_a_log() {
    let dir = tiny_run_dir(2, "", "monitor:\n  monitor_type: tensorboard\n");
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
    // Every phase of a step is measured: the time/* parts add up to the step's wall time.
    for line in metrics.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        let step_s = row["time/step_s"].as_f64().expect("time/step_s");
        let parts: f64 = row
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.starts_with("time/") && *k != "time/step_s")
            .map(|(_, v)| v.as_f64().unwrap())
            .sum();
        assert!((step_s - parts).abs() <= 0.1 * step_s + 0.05, "time/* sum {parts} vs step {step_s}: {line}");
    }
}

/// A tiny-model GRPO config with a SQLite experience buffer and a checkpoint every 3 steps.
fn sqlite_run_dir(steps: usize) -> tempfile::TempDir {
    let buffer = "  trainer_input:
    experience_buffer:
      name: experiences
      storage_type: sql
      path: sqlite:///experiences.db
";
    tiny_run_dir(steps, buffer, "trainer:\n  save_interval: 3\n")
}

fn metric_steps(job: &Path) -> Vec<u64> {
    std::fs::read_to_string(job.join("monitor/metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|row| row["step"].as_u64())
        .collect()
}

fn checkpoints(job: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(job)
        .map(|entries| {
            entries.filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("global_step_")?.parse().ok()).collect()
        })
        .unwrap_or_default();
    steps.sort();
    steps
}

#[test]
fn kill_9_mid_run_then_the_same_command_resumes_without_losing_experiences() {
    const STEPS: u64 = 24;
    let dir = sqlite_run_dir(STEPS as usize);
    let job = dir.path().join("ckpt/p/n");
    let mut child = Command::new(env!("CARGO_BIN_EXE_trinity"))
        .current_dir(dir.path())
        .args(["run", "--config", "config.yaml"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill once a checkpoint exists and the run has trained past it, so that there is work after the
    // checkpoint (consumed rows, explored steps) that the rerun must recover rather than lose or repeat.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let done = child.try_wait().unwrap();
        assert!(done.is_none(), "the run finished before it could be killed; make it longer");
        let past = checkpoints(&job).last().is_some_and(|&c| metric_steps(&job).iter().any(|&s| s >= c + 2));
        if past {
            break;
        }
        assert!(Instant::now() < deadline, "no progress: {:?}", metric_steps(&job));
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before = metric_steps(&job);
    let killed_at = *before.last().unwrap();

    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let log = std::fs::read_to_string(job.join("log/trinity.log")).unwrap();
    let resumed = log
        .lines()
        .find_map(|l| l.split("resuming from ").nth(1))
        .and_then(|p| p.trim().rsplit("global_step_").next()?.parse::<u64>().ok())
        .expect("the rerun resumes from a checkpoint");
    assert!(resumed + 2 <= killed_at, "resumed from {resumed}, killed after step {killed_at}");

    // Step numbers continue from the checkpoint, each once: the steps the first run recorded after it were
    // dropped when the rerun started over from there.
    assert!(before.iter().any(|&s| s > resumed), "{before:?}");
    assert_eq!(metric_steps(&job), (1..=STEPS).collect::<Vec<_>>());
    assert!(log.contains(&format!("after step {resumed}, which this run redoes")), "{log}");
    // Every checkpoint is complete.
    for step in checkpoints(&job) {
        let ckpt = job.join(format!("global_step_{step}"));
        assert!(ckpt.join("meta.json").exists() && ckpt.join("hf/model.safetensors").exists(), "{ckpt:?}");
    }
    // The buffer: each explore step stored once (nothing explored twice), every row trained exactly once, and
    // each train step trained on its 4 rows.
    let db = rusqlite::Connection::open(job.join("buffer/experiences.db")).unwrap();
    let count = |sql: &str| db.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    assert_eq!(count("SELECT COUNT(*) FROM explore_steps"), STEPS as i64);
    assert_eq!(count("SELECT COUNT(*) FROM experiences"), 4 * STEPS as i64);
    assert_eq!(count("SELECT COUNT(*) FROM experiences WHERE consumed != 1"), 0);
    assert_eq!(count("SELECT COUNT(DISTINCT train_step) FROM experiences"), STEPS as i64);
    assert_eq!(count("SELECT COUNT(DISTINCT uid) FROM experiences"), 4 * STEPS as i64);
}

#[test]
fn a_damaged_latest_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before() {
    // `max_checkpoints_to_keep: 0` keeps them all (Trinity-RFT 0.6.0's default).
    let dir = tiny_run_dir(3, "", "trainer:\n  save_interval: 1\n  max_checkpoints_to_keep: 0\n");
    let job = dir.path().join("ckpt/p/n");
    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(checkpoints(&job), [1, 2, 3]);
    let weights = job.join("global_step_3/hf/model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();

    let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let log = std::fs::read_to_string(job.join("log/trinity.log")).unwrap();
    assert!(log.contains("skipping checkpoint global_step_3") && log.contains("hf/model.safetensors has"), "{log}");
    assert!(log.contains("global_step_2"), "{log}");
    assert_eq!(checkpoints(&job), [1, 2, 3], "step 3 was trained and saved again");
    assert_eq!(std::fs::read(job.join("global_step_3.damaged-0/hf/model.safetensors")).unwrap().len(), bytes.len() / 2);
    assert_eq!(std::fs::read(&weights).unwrap().len(), bytes.len());
    assert_eq!(metric_steps(&job), [1, 2, 3]);
}

#[test]
fn every_sync_method_runs_and_checkpoint_sync_goes_through_disk() {
    for method in ["memory", "checkpoint", "nccl"] {
        let dir = sqlite_run_dir(2);
        let mut config = std::fs::read_to_string(dir.path().join("config.yaml")).unwrap();
        config.push_str(&format!("synchronizer:\n  sync_method: {method}\n"));
        std::fs::write(dir.path().join("config.yaml"), config).unwrap();
        let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
        assert!(output.status.success(), "{method}: {}", stderr(&output));
        let job = dir.path().join("ckpt/p/n");
        assert_eq!(metric_steps(&job), [1, 2], "{method}");
        let synced = job.join("sync/latest.json");
        assert_eq!(synced.exists(), method == "checkpoint", "{method}: {synced:?}");
        assert_eq!(job.join("sync/weights_2.safetensors").exists(), method == "checkpoint", "{method}");
    }
}

/// Trinity-RFT truncates a prompt to `max_prompt_tokens` only with `enable_prompt_truncation`; without it vLLM
/// takes the whole prompt while it leaves room in `max_model_len` (a multi-turn workflow's growing history, as
/// Trinity's FrozenLake has). Task 1's prompt (32 tokens rendered) is over `max_prompt_tokens` (24) and within
/// `max_model_len` (40): sampled without truncation, masked placeholders with it.
#[test]
fn a_prompt_over_max_prompt_tokens_is_sampled_without_truncation_and_a_placeholder_with_it() {
    for (truncation, placeholders) in [(false, 0), (true, 2)] {
        let dir = tiny_run_dir(1, "", "");
        let long = "ab".repeat(8);
        let rows =
            format!("{{\"prompt\": \"ab0\", \"response\": \"0\"}}\n{{\"prompt\": \"{long}\", \"response\": \"1\"}}\n");
        std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
        let config = std::fs::read_to_string(dir.path().join("config.yaml")).unwrap().replace(
            "  max_response_tokens: 6\n",
            &format!("  max_response_tokens: 6\n  max_prompt_tokens: 24\n  enable_prompt_truncation: {truncation}\n"),
        );
        std::fs::write(dir.path().join("config.yaml"), config).unwrap();
        let output = trinity(dir.path(), &["run", "--config", "config.yaml"]);
        assert!(output.status.success(), "truncation {truncation}: {}", stderr(&output));
        let job = dir.path().join("ckpt/p/n");
        let metrics = std::fs::read_to_string(job.join("monitor/metrics.jsonl")).unwrap();
        let step: serde_json::Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
        assert_eq!(step["rollout/failed_tasks"], 0.0, "truncation {truncation}: {step}");
        let experiences: Vec<serde_json::Value> = std::fs::read_to_string(job.join("experiences.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(experiences.len(), 4, "2 tasks × 2 runs");
        let masked = experiences.iter().filter(|e| e["truncate_status"] == "prompt_truncated").count();
        assert_eq!(masked, placeholders, "truncation {truncation}");
        if !truncation {
            let long_prompts = experiences.iter().filter(|e| e["prompt_length"] == 32).count();
            assert_eq!(long_prompts, 2, "the whole 32-token prompt was sampled: {experiences:?}");
        }
    }
}
