//! Data-parallel runs through the `trinity` binary: `trinity launch` of two ranks trains as one process does (mode
//! `train` on a dataset, mode `both` with PPO), a killed rank ends the other with a named error, and two "machines"
//! (network namespaces joined by a veth pair) train together over a real interface.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use tch::Tensor;

use crate::support::{stderr, tiny_model_dir};

pub(crate) const STEPS: u64 = 3;

/// A mode-train SFT config: 3 steps of 4 rows, one row per micro-batch (so two ranks' micro-batches are one
/// process's), fp32, a learning rate that moves the weights well past the tolerance.
pub(crate) fn sft_config(dir: &Path, steps: u64, extra: &str) -> String {
    let rows: String = (0..8)
        .map(|i| {
            format!(
                "{{\"messages\": [{{\"role\": \"user\", \"content\": \"ab{i}\"}}, {{\"role\": \"assistant\", \"content\": \"{}\"}}]}}\n",
                "c".repeat(1 + i % 3)
            )
        })
        .collect();
    std::fs::write(dir.join("data.jsonl"), rows).unwrap();
    format!(
        "project: p
name: dp
mode: train
checkpoint_root_dir: ./ckpt
algorithm:
  algorithm_type: sft
  optimizer:
    lr: 2e-3
model:
  model_path: {}
  max_model_len: 48
buffer:
  train_batch_size: 4
  trainer_input:
    experience_buffer:
      name: data
      storage_type: file
      path: data.jsonl
      format:
        prompt_type: messages
        messages_key: messages
trainer:
  total_steps: {steps}
  save_interval: {steps}
  dtype: float32
  use_dynamic_bsz: false
synchronizer:
  sync_timeout: 20
monitor:
  monitor_type: jsonl
{extra}",
        tiny_model_dir().display()
    )
}

/// A mode-both GRPO config with an entropy bonus, so the weights move whatever the rewards (a random tiny model
/// earns none). PPO would do too, but its critic's fresh value head is drawn at random, differently in every run.
fn grpo_config(dir: &Path) -> String {
    let rows: String = (0..2 * STEPS).map(|i| format!("{{\"prompt\": \"ab{i}\", \"response\": \"{i}\"}}\n")).collect();
    std::fs::write(dir.join("tasks.jsonl"), rows).unwrap();
    format!(
        "project: p
name: dp
checkpoint_root_dir: ./ckpt
algorithm:
  algorithm_type: grpo
  repeat_times: 2
  entropy_loss_fn_args:
    entropy_coef: 0.5
  optimizer:
    lr: 2e-3
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
trainer:
  save_interval: {STEPS}
  dtype: float32
  use_dynamic_bsz: false
synchronizer:
  sync_timeout: 20
explorer:
  eval_on_startup: false
monitor:
  monitor_type: jsonl
",
        tiny_model_dir().display()
    )
}

pub(crate) fn trinity_command(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trinity"));
    command.current_dir(dir).env_remove("RUST_LOG");
    for var in ["WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE", "GROUP_RANK"] {
        command.env_remove(var);
    }
    command
}

pub(crate) fn succeed(output: Output, what: &str) {
    assert!(output.status.success(), "{what} failed:\n{}", stderr(&output));
}

/// Runs `c.yaml` in `dir` as one process with one libtorch thread (as each launched rank gets on this 2-core
/// machine); `what` names it when it fails.
pub(crate) fn run_one(dir: &Path, what: &str) {
    let output = trinity_command(dir).env("OMP_NUM_THREADS", "1").args(["run", "--config", "c.yaml"]).output().unwrap();
    succeed(output, what);
}

/// Runs `c.yaml` in `dir` as two ranks through `trinity launch`; `what` names it when it fails.
pub(crate) fn launch_two(dir: &Path, what: &str) {
    let output = trinity_command(dir)
        .env("OMP_NUM_THREADS", "1")
        .args(["launch", "--nproc-per-node", "2", "--master-port", "0", "--", "run", "--config", "c.yaml"])
        .output()
        .unwrap();
    succeed(output, what);
}

/// The trainer's log of the run in `dir`.
pub(crate) fn trainer_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("ckpt/p/dp/log/trainer.log")).unwrap()
}

/// One process (one libtorch thread, as each launched rank gets on this 2-core machine) and two launched ranks
/// run `config` in directories of their own; returns both.
pub(crate) fn one_and_two(config: impl Fn(&Path) -> String) -> (tempfile::TempDir, tempfile::TempDir) {
    let one = tempfile::tempdir().unwrap();
    std::fs::write(one.path().join("c.yaml"), config(one.path())).unwrap();
    run_one(one.path(), "one process");
    let two = tempfile::tempdir().unwrap();
    std::fs::write(two.path().join("c.yaml"), config(two.path())).unwrap();
    launch_two(two.path(), "trinity launch of two ranks");
    (one, two)
}

pub(crate) fn weights(dir: &Path, step: u64) -> BTreeMap<String, Tensor> {
    let file = dir.join(format!("ckpt/p/dp/global_step_{step}/hf/model.safetensors"));
    Tensor::read_safetensors(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display())).into_iter().collect()
}

pub(crate) fn base_weights() -> BTreeMap<String, Tensor> {
    Tensor::read_safetensors(tiny_model_dir().join("model.safetensors")).unwrap().into_iter().collect()
}

/// Two ranks' final weights equal one process's within 1e-5 (relative to each tensor's largest value), and the
/// run moved them well beyond that.
pub(crate) fn assert_same_training(one: &Path, two: &Path, metrics: &str) {
    let (a, b, base) = (weights(one, STEPS), weights(two, STEPS), base_weights());
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let (mut worst, mut moved) = (0f64, 0f64);
    for (name, x) in &a {
        let y = &b[name];
        let scale = x.abs().max().double_value(&[]).max(1e-6);
        let diff = (x - y).abs().max().double_value(&[]);
        worst = worst.max(diff / scale);
        assert!(diff <= 1e-5 * scale, "`{name}`: two ranks differ from one process by {diff} (scale {scale})");
        if let Some(start) = base.get(name) {
            moved = moved.max((x - start.to_kind(x.kind())).abs().max().double_value(&[]));
        }
    }
    assert!(moved > 1e-3, "the weights moved only {moved}: the comparison would prove nothing");
    println!("worst relative difference {worst:.2e}, largest move {moved:.2e}");
    // Rank 0 alone wrote the metrics: one line per step.
    let lines = std::fs::read_to_string(two.join("ckpt/p/dp").join(metrics)).unwrap();
    assert_eq!(lines.lines().count() as u64, STEPS, "{lines}");
}

#[test]
fn two_launched_ranks_train_a_dataset_as_one_process_does() {
    let (one, two) = one_and_two(|dir| sft_config(dir, STEPS, ""));
    assert_same_training(one.path(), two.path(), "monitor/trainer/metrics.jsonl");
    let log = trainer_log(two.path());
    assert!(log.contains("data parallel: 2 ranks from the launcher"), "{log}");
    // `trainer_strategy: fsdp2` (the default, Trinity-RFT 0.6.0's; `fsdp` the same) shards the parameters, the
    // gradients and the optimizer state (ZeRO stage 3, `tests/it/zero3.rs`).
    assert!(log.contains("sharded data parallel: ZeRO stage 3 over 2 ranks"), "{log}");
}

/// `trainer.optimizer_offload: true`: two sharded ranks keep AdamW's state in host memory (here the parameters' own
/// memory, so the path and not the placement differs) and train as one process does; the start says where the
/// state is.
#[test]
fn two_launched_ranks_with_optimizer_offload_train_as_one_process_does() {
    let offload = |dir: &Path| {
        sft_config(dir, STEPS, "").replace("  dtype: float32\n", "  dtype: float32\n  optimizer_offload: true\n")
    };
    let (one, two) = one_and_two(offload);
    assert_same_training(one.path(), two.path(), "monitor/trainer/metrics.jsonl");
    let log = trainer_log(two.path());
    assert!(log.contains("sharded data parallel: ZeRO stage 3 over 2 ranks"), "{log}");
    assert!(log.contains("in host memory (optimizer_offload)"), "{log}");
}

/// A checkpoint of two sharded ranks (ZeRO-3: each rank holds half of the parameters and of AdamW's moments; rank 0
/// gathers them to save) is a whole one: one process resumes from it and trains on as the uninterrupted one process does.
#[test]
fn one_process_resumes_from_two_sharded_ranks_checkpoint_as_if_it_had_run_all_along() {
    let whole = tempfile::tempdir().unwrap();
    std::fs::write(whole.path().join("c.yaml"), sft_config(whole.path(), STEPS, "")).unwrap();
    run_one(whole.path(), "one process, uninterrupted");

    let split = tempfile::tempdir().unwrap();
    std::fs::write(split.path().join("c.yaml"), sft_config(split.path(), STEPS - 1, "")).unwrap();
    launch_two(split.path(), "two sharded ranks");
    std::fs::write(split.path().join("c.yaml"), sft_config(split.path(), STEPS, "")).unwrap();
    run_one(split.path(), "one process resuming");
    let log = trainer_log(split.path());
    assert!(log.contains(&format!("global_step_{}", STEPS - 1)) && log.contains("resuming from"), "{log}");
    assert_same_training(whole.path(), split.path(), "monitor/trainer/metrics.jsonl");
}

#[test]
fn two_launched_ranks_run_mode_both_as_one_process_does() {
    let (one, two) = one_and_two(grpo_config);
    assert_same_training(one.path(), two.path(), "monitor/metrics.jsonl");
    // Rank 0 explored alone, sampling what the one process sampled.
    let responses = |dir: &Path| -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(dir.join("ckpt/p/dp/experiences.jsonl")).unwrap();
        text.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["tokens"].clone()).collect()
    };
    assert_eq!(responses(one.path()), responses(two.path()));
}

/// Starts rank `rank` of 2 as torchrun would (the environment only), with stderr captured.
fn start_rank(dir: &Path, rank: usize, port: u16) -> Child {
    trinity_command(dir)
        .env("OMP_NUM_THREADS", "1")
        .envs([
            ("WORLD_SIZE", "2".to_owned()),
            ("RANK", rank.to_string()),
            ("LOCAL_RANK", rank.to_string()),
            ("MASTER_ADDR", "127.0.0.1".to_owned()),
            ("MASTER_PORT", port.to_string()),
        ])
        .args(["run", "--config", "c.yaml"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn killing_one_rank_ends_the_other_with_a_named_error_within_sync_timeout() {
    for killed in [1, 0] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("c.yaml"), sft_config(dir.path(), 2_000, "")).unwrap();
        let port = free_port();
        let mut ranks = [start_rank(dir.path(), 0, port), start_rank(dir.path(), 1, port)];
        let metrics = dir.path().join("ckpt/p/dp/monitor/trainer/metrics.jsonl");
        let deadline = Instant::now() + Duration::from_secs(120);
        while std::fs::read_to_string(&metrics).unwrap_or_default().lines().count() < 2 {
            assert!(Instant::now() < deadline, "no train step within two minutes");
            assert!(ranks.iter_mut().all(|r| r.try_wait().unwrap().is_none()), "a rank ended early");
            std::thread::sleep(Duration::from_millis(20));
        }
        ranks[killed].kill().unwrap(); // SIGKILL
        let killed_at = Instant::now();
        ranks[killed].wait().unwrap();
        let survivor = ranks.into_iter().nth(1 - killed).unwrap();
        let output = survivor.wait_with_output().unwrap();
        let took = killed_at.elapsed();
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "rank {} after rank {killed} died:\n{err}", 1 - killed);
        assert!(took < Duration::from_secs(20), "rank {} took {took:?} to fail", 1 - killed);
        assert!(!err.contains("panicked"), "{err}");
        // Where the survivor notices depends on where the kill lands: in a collective of the train step (the
        // collective's error, naming the step and, on rank 1, rank 0), or at the store while it waits for rank 0's
        // next step. Either way the error says data parallelism failed, and rank 1 says which rank it lost.
        let named: &[&str] = if killed == 1 { &["data parallel"] } else { &["rank 1 of 2: data parallel", "rank 0"] };
        for phrase in named {
            assert!(
                err.contains(phrase),
                "rank {} after rank {killed} died, stderr lacks {phrase:?}:\n{err}",
                1 - killed
            );
        }
        println!("rank {killed} killed: the other failed after {took:?}: {}", err.lines().last().unwrap_or(""));
    }
}

/// Two network namespaces joined by a veth pair: two "machines" with addresses of their own, so that the job's
/// traffic really crosses an interface. Removed when dropped.
struct Namespaces {
    names: [String; 2],
}

fn ip(args: &[&str]) {
    let output = Command::new("ip").args(args).output().unwrap_or_else(|e| {
        panic!("this test needs iproute2's `ip` to build network namespaces (CI runs as root on Linux): {e}")
    });
    assert!(
        output.status.success(),
        "`ip {}` failed: {}; this test needs root and network namespaces (`ip netns`), which CI's machine has",
        args.join(" "),
        stderr(&output)
    );
}

impl Namespaces {
    fn new() -> Namespaces {
        let id = std::process::id() % 100_000;
        let names = [format!("trdp{id}a"), format!("trdp{id}b")];
        let made = Namespaces { names: names.clone() };
        let (a, b) = (&names[0], &names[1]);
        ip(&["netns", "add", a]);
        ip(&["netns", "add", b]);
        ip(&["link", "add", &format!("v{id}a"), "type", "veth", "peer", "name", &format!("v{id}b")]);
        for (ns, end, address) in [(a, "a", "10.217.0.1/24"), (b, "b", "10.217.0.2/24")] {
            let dev = format!("v{id}{end}");
            ip(&["link", "set", &dev, "netns", ns]);
            ip(&["-n", ns, "addr", "add", address, "dev", &dev]);
            ip(&["-n", ns, "link", "set", &dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        made
    }

    /// Bytes the interface of namespace `i` received so far.
    fn received(&self, i: usize) -> u64 {
        let id = std::process::id() % 100_000;
        let end = if i == 0 { "a" } else { "b" };
        let output = Command::new("ip")
            .args(["netns", "exec", &self.names[i], "cat", &format!("/sys/class/net/v{id}{end}/statistics/rx_bytes")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).trim().parse().unwrap_or(0)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

#[test]
fn two_machines_in_network_namespaces_train_over_a_veth_pair() {
    let nets = Namespaces::new();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("c.yaml"), sft_config(dir.path(), STEPS, "")).unwrap();
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_trinity"));
    let node = |rank: usize| {
        let mut command = Command::new("ip");
        command
            .current_dir(dir.path())
            .env_remove("RUST_LOG")
            .env("OMP_NUM_THREADS", "1")
            .args(["netns", "exec", &nets.names[rank]])
            .arg(&binary)
            .args(["launch", "--nnodes", "2", "--node-rank", &rank.to_string()])
            .args(["--master-addr", "10.217.0.1", "--master-port", "29517", "--", "run", "--config", "c.yaml"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        command.spawn().unwrap()
    };
    let before = nets.received(1);
    let (zero, one) = (node(0), node(1));
    let (zero, one) = (zero.wait_with_output().unwrap(), one.wait_with_output().unwrap());
    succeed(zero, "node 0");
    succeed(one, "node 1");
    // Node 1 received rank 0's whole state (the tiny model's weights and more) over its interface.
    let model_bytes = std::fs::metadata(tiny_model_dir().join("model.safetensors")).unwrap().len();
    let received = nets.received(1) - before;
    assert!(received > model_bytes, "node 1's interface received {received} bytes, the model has {model_bytes}");
    let lines = std::fs::read_to_string(dir.path().join("ckpt/p/dp/monitor/trainer/metrics.jsonl")).unwrap();
    assert_eq!(lines.lines().count() as u64, STEPS, "{lines}");
}

/// The explorer and trainer configs of an asynchronous pair with `nccl` sync: 5 explore steps of 2 tasks × 4
/// rollouts, one train step each, sync after every step.
fn nccl_pair_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..10).map(|i| format!("{{\"prompt\": \"ab{i}\", \"response\": \"{i}\"}}\n")).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), rows).unwrap();
    for mode in ["explore", "train"] {
        let config = format!(
            "project: p
name: dp
mode: {mode}
checkpoint_root_dir: ./ckpt
algorithm:
  algorithm_type: grpo
  repeat_times: 4
model:
  model_path: {}
  max_model_len: 40
  max_response_tokens: 6
buffer:
  batch_size: 2
  train_batch_size: 8
  explorer_input:
    taskset:
      path: tasks.jsonl
    default_workflow_type: simple_workflow
    default_reward_fn_type: math_reward
  trainer_input:
    experience_buffer:
      name: exp
      storage_type: queue
      path: sqlite:///exp.db
trainer:
  dtype: float32
synchronizer:
  sync_method: nccl
  sync_interval: 1
  sync_timeout: 60
explorer:
  eval_on_startup: false
  runner_per_model: 4
monitor:
  monitor_type: jsonl
",
            tiny_model_dir().display()
        );
        std::fs::write(dir.path().join(format!("{mode}.yaml")), config).unwrap();
    }
    dir
}

#[test]
fn two_trainer_ranks_and_an_explorer_process_sync_weights_over_a_process_group() {
    let dir = nccl_pair_dir();
    let trainer = trinity_command(dir.path())
        .args(["launch", "--nproc-per-node", "2", "--master-port", "0", "--", "run", "--config", "train.yaml"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let explorer = trinity_command(dir.path())
        .env("OMP_NUM_THREADS", "1")
        .args(["run", "--config", "explore.yaml"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    succeed(explorer.wait_with_output().unwrap(), "the explorer");
    succeed(trainer.wait_with_output().unwrap(), "the two trainer ranks");
    let job = dir.path().join("ckpt/p/dp");
    // Each explore step sampled with the weights of the train step before it: the version stamps advance.
    let db = rusqlite::Connection::open(job.join("buffer/exp.db")).unwrap();
    let mut query = db
        .prepare("SELECT train_step, MIN(model_version), MAX(model_version) FROM experiences GROUP BY train_step")
        .unwrap();
    let versions: Vec<(i64, i64, i64)> =
        query.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().map(Result::unwrap).collect();
    assert_eq!(versions, (1..=5).map(|s| (s, s - 1, s - 1)).collect::<Vec<_>>());
    // Every version went over the process group: no weight file was written, and the explorer says so.
    let log = std::fs::read_to_string(job.join("log/explorer.log")).unwrap();
    for step in 1..=4 {
        let line = format!("now samples with the trainer's weights of step {step} (received over the process group)");
        assert!(log.contains(&line), "the explorer's log lacks {line:?}:\n{log}");
    }
    assert!(!log.contains("failed"), "{log}");
    let files: Vec<String> = std::fs::read_dir(job.join("sync"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    // Only the final weights, published after the explorer finished, go to a file (for whoever comes later).
    assert!(
        !(1..=4).any(|s| files.contains(&format!("weights_{s}.safetensors"))),
        "weights went through files: {files:?}"
    );
    let trainer_log = std::fs::read_to_string(job.join("log/trainer.log")).unwrap();
    assert!(trainer_log.contains("sent over the process group"), "{trainer_log}");
}
