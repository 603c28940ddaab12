//! Asynchronous RL as Trinity-RFT runs it: `trinity run` of an explorer config (`mode: explore`) and of a trainer
//! config (`mode: train`) as two processes sharing a buffer and the checkpoint directory, started in either order,
//! killed with SIGKILL and started again; and two explorers feeding one trainer through PostgreSQL.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use crate::support::{spawn_run, stderr, tiny_model_dir};

/// Explore steps of 2 tasks × 4 rollouts: 8 experiences each, one train step each.
const TASKS_PER_STEP: usize = 2;

/// A directory with `explorer.yaml` and `trainer.yaml` for `steps` explore steps over one buffer `buffer_path`.
/// `sync` goes into `synchronizer:` of both, `trainer_extra` and `explorer_extra` at the top level.
fn pair_dir(
    steps: usize,
    buffer_path: &str,
    sync: &str,
    trainer_extra: &str,
    explorer_extra: &str,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let rows: String =
        (0..TASKS_PER_STEP * steps).map(|i| format!("{{\"prompt\": \"ab{i}\", \"response\": \"{i}\"}}\n")).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
    let common = |mode: &str, taskset: bool| {
        let taskset = if taskset {
            "  explorer_input:\n    taskset:\n      path: tasks.jsonl\n    default_workflow_type: simple_workflow\n    default_reward_fn_type: math_reward\n"
        } else {
            ""
        };
        format!(
            "project: p
name: async
mode: {mode}
checkpoint_root_dir: ./ckpt
algorithm:
  algorithm_type: grpo
  repeat_times: 4
model:
  model_path: {model}
  max_model_len: 40
  max_response_tokens: 6
buffer:
  batch_size: {TASKS_PER_STEP}
  train_batch_size: 8
{taskset}  trainer_input:
    experience_buffer:
      name: exp
      storage_type: queue
      path: '{buffer_path}'
synchronizer:
  sync_method: checkpoint
  sync_timeout: 120
{sync}explorer:
  eval_on_startup: false
  runner_per_model: 4
monitor:
  monitor_type: jsonl
",
            model = tiny_model_dir().display()
        )
    };
    let trainer_taskset = !trainer_extra.contains("#no-taskset");
    std::fs::write(dir.path().join("trainer.yaml"), format!("{}{trainer_extra}", common("train", trainer_taskset)))
        .unwrap();
    std::fs::write(dir.path().join("explorer.yaml"), format!("{}{explorer_extra}", common("explore", true))).unwrap();
    dir
}

fn finish(child: Child, what: &str) {
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{what} failed:\n{}", stderr(&output));
}

fn job(dir: &Path) -> PathBuf {
    dir.join("ckpt/p/async")
}

fn steps_in(metrics: &Path) -> Vec<u64> {
    std::fs::read_to_string(metrics)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|row| row["step"].as_u64())
        .collect()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(240);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The buffer's ledger: each explore step stored once, every experience trained exactly once and committed.
fn assert_each_experience_trained_once(db: &Path, explore_steps: i64, train_steps: i64) {
    let db = rusqlite::Connection::open(db).unwrap();
    let count = |sql: &str| db.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    assert_eq!(count("SELECT COUNT(*) FROM explore_steps"), explore_steps, "explore steps stored");
    assert_eq!(count("SELECT COUNT(*) FROM experiences"), 8 * explore_steps, "no experience stored twice");
    assert_eq!(count("SELECT COUNT(*) FROM experiences WHERE consumed != 1"), 0, "every experience trained");
    assert_eq!(count("SELECT COUNT(*) FROM experiences WHERE committed != 1"), 0, "and committed with a checkpoint");
    assert_eq!(count("SELECT COUNT(DISTINCT train_step) FROM experiences"), train_steps);
    assert_eq!(count("SELECT MAX(c) FROM (SELECT COUNT(*) AS c FROM experiences GROUP BY train_step)"), 8);
}

#[test]
fn an_async_pair_runs_whichever_process_starts_first() {
    // Trainer first, fixed sync every 2 steps with the explorer one step ahead.
    let dir = pair_dir(6, "sqlite:///exp.db", "  sync_interval: 2\n  sync_offset: 1\n", "", "");
    let trainer = spawn_run(dir.path(), "trainer.yaml");
    std::thread::sleep(Duration::from_millis(500));
    let explorer = spawn_run(dir.path(), "explorer.yaml");
    finish(explorer, "explorer");
    finish(trainer, "trainer");
    let job = job(dir.path());
    assert_eq!(steps_in(&job.join("monitor/trainer/metrics.jsonl")), (1..=6).collect::<Vec<_>>());
    assert_eq!(steps_in(&job.join("monitor/explorer/metrics.jsonl")), (1..=6).collect::<Vec<_>>());
    assert_each_experience_trained_once(&job.join("buffer/exp.db"), 6, 6);
    let log = std::fs::read_to_string(job.join("log/explorer.log")).unwrap();
    assert!(log.contains("now samples with the trainer's weights of step 2"), "{log}");

    // Explorer first, explorer-driven sync: it asks the trainer for weights, which answers once it runs.
    let dir = pair_dir(4, "sqlite:///exp.db", "  sync_interval: 2\n  sync_style: explorer_driven\n", "", "");
    let explorer = spawn_run(dir.path(), "explorer.yaml");
    let job = self::job(dir.path());
    wait_for("the explorer's sync request", || job.join("sync/request_explorer.json").exists());
    let trainer = spawn_run(dir.path(), "trainer.yaml");
    finish(explorer, "explorer");
    finish(trainer, "trainer");
    assert_each_experience_trained_once(&job.join("buffer/exp.db"), 4, 4);
    assert_eq!(steps_in(&job.join("monitor/trainer/metrics.jsonl")), [1, 2, 3, 4]);
}

#[test]
fn kill_9_of_either_process_then_the_same_command_loses_and_repeats_nothing() {
    const STEPS: u64 = 16;
    let dir = pair_dir(
        STEPS as usize,
        "sqlite:///exp.db",
        "  sync_interval: 2\n  sync_offset: 1\n",
        "trainer:\n  save_interval: 3\n",
        "",
    );
    let job = job(dir.path());
    let trainer_metrics = job.join("monitor/trainer/metrics.jsonl");
    let explorer_metrics = job.join("monitor/explorer/metrics.jsonl");
    let checkpoints = || {
        std::fs::read_dir(&job)
            .map(|d| {
                d.filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().starts_with("global_step_")))
                    .count()
            })
            .unwrap_or(0)
    };
    let mut trainer = spawn_run(dir.path(), "trainer.yaml");
    let mut explorer = spawn_run(dir.path(), "explorer.yaml");
    // Kill the trainer past its first checkpoint, with trained steps after it that must be trained again.
    wait_for("the trainer past a checkpoint", || checkpoints() >= 1 && steps_in(&trainer_metrics).len() >= 4);
    trainer.kill().unwrap();
    trainer.wait().unwrap();
    let trained_before = steps_in(&trainer_metrics).len();
    trainer = spawn_run(dir.path(), "trainer.yaml");
    // Kill the explorer a few steps later, then start it again.
    let explored = steps_in(&explorer_metrics).len();
    wait_for("the explorer to go on", || steps_in(&explorer_metrics).len() >= explored + 2);
    explorer.kill().unwrap();
    explorer.wait().unwrap();
    explorer = spawn_run(dir.path(), "explorer.yaml");
    finish(explorer, "explorer");
    finish(trainer, "trainer");

    // No explore step was explored twice: each step reported once, in order; the buffer holds each once.
    let explore_steps = steps_in(&explorer_metrics);
    let mut unique = explore_steps.clone();
    unique.dedup();
    assert_eq!(explore_steps, unique, "an explore step was explored twice: {explore_steps:?}");
    assert_each_experience_trained_once(&job.join("buffer/exp.db"), STEPS as i64, STEPS as i64);
    // The restarted trainer went on from its checkpoint: its steps after the kill repeat the uncheckpointed ones.
    let trained = steps_in(&trainer_metrics);
    assert!(trained.len() > trained_before && *trained.last().unwrap() == STEPS, "{trained:?}");
    let log = std::fs::read_to_string(job.join("log/trainer.log")).unwrap();
    assert!(log.contains("resuming from"), "{log}");
    assert!(job.join(format!("global_step_{STEPS}/hf/model.safetensors")).exists());
}

#[test]
fn two_explorers_feed_one_trainer_through_postgresql() {
    let server = trinity_buffer::testing::PgServer::shared().unwrap_or_else(|e| panic!("{e}"));
    // Trainer-driven sync: explorers never wait, they take the newest weights at their sync points. The trainer
    // carries no taskset, so it trains until both explorers have finished.
    let dir = pair_dir(3, &server.url(), "  sync_interval: 1\n  sync_style: trainer_driven\n", "#no-taskset\n", "");
    let explorer = std::fs::read_to_string(dir.path().join("explorer.yaml")).unwrap();
    let explorer_b = explorer.replacen("explorer:\n", "explorer:\n  name: explorer_b\n", 1);
    assert_ne!(explorer, explorer_b);
    std::fs::write(dir.path().join("explorer_b.yaml"), explorer_b).unwrap();
    // The trainer knows the explorers that have registered in the buffer: on a loaded machine one explorer could
    // finish its three steps before the other had started, and the trainer would rightly end after those. A
    // launcher that starts both is modelled by registering both first (each registers itself again at start).
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
        let store = trinity_buffer::PgStore::connect(&server.url(), "exp").await.unwrap();
        for name in ["explorer", "explorer_b"] {
            store.set_producer(name, trinity_buffer::ProducerState::Running).await.unwrap();
        }
    });
    let trainer = spawn_run(dir.path(), "trainer.yaml");
    let a = spawn_run(dir.path(), "explorer.yaml");
    let b = spawn_run(dir.path(), "explorer_b.yaml");
    finish(a, "explorer");
    finish(b, "explorer_b");
    finish(trainer, "trainer");
    let job = job(dir.path());
    assert_eq!(steps_in(&job.join("monitor/explorer/metrics.jsonl")), [1, 2, 3]);
    assert_eq!(steps_in(&job.join("monitor/explorer_b/metrics.jsonl")), [1, 2, 3]);
    // 2 explorers × 3 steps × 8 experiences, 8 a train step.
    assert_eq!(steps_in(&job.join("monitor/trainer/metrics.jsonl")), (1..=6).collect::<Vec<_>>());
    let log = std::fs::read_to_string(job.join("log/trainer.log")).unwrap();
    assert!(log.contains("every explorer has finished"), "{log}");
}
