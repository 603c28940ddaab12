//! `cargo xtask bench async`: the same GRPO work as one process (mode `both`) and as an explorer/trainer pair (modes
//! `explore` + `train`, `examples/async/`), run one after the other on this machine, with wall time, rollout tokens
//! explored and tokens trained per second, and the last held-out accuracy of each.
//!
//! The work is `examples/async/`'s: SmolLM2-135M-Instruct, 4 addition tasks × 8 rollouts a step, 32 experiences a
//! train step, sync every step with the explorer one step ahead (`sync_offset: 1`), eval every 5 steps. Mode both
//! runs the explorer's config with `mode: both` and the trainer's batch, so both runs make the same steps with the
//! same staleness; only the process layout differs.
//!
//! The pair's two processes share the machine's cores: each gets `pair_threads` libtorch threads (default half the
//! cores, through `OMP_NUM_THREADS`, as a user splitting one machine would). Two processes with a thread per core
//! each oversubscribe the CPU, and libtorch's OpenMP barriers then wait on preempted workers: measured here with 2
//! cores, a train step went from 11-13 s to 36-62 s.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::setup::Deps;
use crate::{cargo, step, target_dir};

pub(crate) fn bench(root: &Path, deps: &Deps, steps: usize, pair_threads: Option<usize>) -> Result<()> {
    let pair_threads = pair_threads.unwrap_or(num_threads() / 2).max(1);
    cargo(root, deps, "release build", &["build", "--release", "--locked", "--bin", "trinity"])?;
    let trinity = target_dir(root).join("release").join("trinity");
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let checkpoints = target_dir(root).join("bench-async").join(stamp.to_string());
    let run = |config: &str, extra: &[String]| {
        let mut command = Command::new(&trinity);
        command
            .current_dir(root)
            .env("TRINITY_SMOLLM2_GGUF", deps.smollm2_gguf())
            .env("TRINITY_CHECKPOINT_ROOT_DIR", &checkpoints)
            .args(["run", "--config", config, "--set", &format!("buffer.total_steps={steps}")])
            .args(extra.iter().flat_map(|s| ["--set", s.as_str()]));
        command
    };
    let both = ["mode=both", "name=both", "buffer.train_batch_size=32", "trainer.save_interval=10"].map(String::from);
    let mut one = run("examples/async/explorer.yaml", &both);
    let (both_s, pair_s) = (
        timed("bench async: mode both (one process)", || wait(one.spawn()?, "mode both"))?,
        timed("bench async: modes explore + train (two processes)", || {
            let name = ["name=pair".to_owned()];
            let threads = pair_threads.to_string();
            let trainer = run("examples/async/trainer.yaml", &name).env("OMP_NUM_THREADS", &threads).spawn()?;
            let explorer = run("examples/async/explorer.yaml", &name).env("OMP_NUM_THREADS", &threads).spawn()?;
            wait(explorer, "explorer")?;
            wait(trainer, "trainer")
        })?,
    );
    let project = checkpoints.join("async");
    let both = Summary::read(&[project.join("both/monitor/metrics.jsonl")], both_s)?;
    let pair = Summary::read(
        &[project.join("pair/monitor/explorer/metrics.jsonl"), project.join("pair/monitor/trainer/metrics.jsonl")],
        pair_s,
    )?;
    println!(
        "\n{steps} steps of 4 tasks × 8 rollouts, SmolLM2-135M, {} CPU threads; the pair: {pair_threads} thread(s) each",
        num_threads()
    );
    println!("{:<32} {:>9} {:>16} {:>16} {:>14}", "", "wall s", "explored tok/s", "trained tok/s", "last eval acc");
    for (name, s) in [("mode both (one process)", &both), ("explore + train (two processes)", &pair)] {
        println!(
            "{name:<32} {:>9.1} {:>16.1} {:>16.1} {:>14}",
            s.wall_s,
            s.explored_tokens / s.wall_s,
            s.trained_tokens / s.wall_s,
            s.last_accuracy.map_or("-".to_owned(), |a| format!("{a:.3}"))
        );
    }
    println!("pair / both wall time: {:.2}", pair.wall_s / both.wall_s);
    println!("runs: {}", project.display());
    Ok(())
}

fn timed(name: &str, body: impl FnOnce() -> Result<()>) -> Result<f64> {
    let started = Instant::now();
    step(name, body)?;
    Ok(started.elapsed().as_secs_f64())
}

fn wait(mut child: std::process::Child, what: &str) -> Result<()> {
    let status = child.wait()?;
    if !status.success() {
        bail!("{what} exited with {status}");
    }
    Ok(())
}

fn num_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// What a run's metrics files add up to.
struct Summary {
    wall_s: f64,
    /// Response tokens sampled by explore steps (`perf/rollout_tokens_per_s × time/explore_s`).
    explored_tokens: f64,
    /// Tokens of the rows train steps trained (`perf/train_tokens_per_s × time/train_s`).
    trained_tokens: f64,
    last_accuracy: Option<f64>,
}

impl Summary {
    fn read(files: &[PathBuf], wall_s: f64) -> Result<Summary> {
        let mut summary = Summary { wall_s, explored_tokens: 0.0, trained_tokens: 0.0, last_accuracy: None };
        for file in files {
            let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
            for line in text.lines() {
                let row: serde_json::Value = serde_json::from_str(line)?;
                let get = |key: &str| row.get(key).and_then(serde_json::Value::as_f64);
                if let (Some(rate), Some(seconds)) = (get("perf/rollout_tokens_per_s"), get("time/explore_s")) {
                    summary.explored_tokens += rate * seconds;
                }
                if let (Some(rate), Some(seconds)) = (get("perf/train_tokens_per_s"), get("time/train_s")) {
                    summary.trained_tokens += rate * seconds;
                }
                if let Some(accuracy) = get("eval/addition-eval/accuracy") {
                    summary.last_accuracy = Some(accuracy);
                }
            }
        }
        Ok(summary)
    }
}
