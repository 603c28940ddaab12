//! Mode `bench`: evaluates saved weights on the eval tasksets — the base model (`explorer.eval_on_startup`) and
//! every `global_step_N` checkpoint of the job in order, or only the latest (`explorer.bench_on_latest_checkpoint`).
//!
//! One engine loads each checkpoint's `hf/` weights in place. Metrics go under `bench/` to `monitor/bench/`, at
//! the checkpoint's step (0 for the base model). What was evaluated is recorded in `bench_meta.json` after each
//! evaluation (written atomically), so running the same command again evaluates only what is new: checkpoints a trainer wrote since,
//! or those a killed bench did not reach.
//!
//! With `model.external_model` the evaluated model is an OpenAI-compatible endpoint instead: it has no weights
//! here and no checkpoints to walk, so it is evaluated once, as step 0, with the same workflows, rewards and
//! metrics (config resolution refuses the keys that would ask for more).
//!
//! A step is recorded only when it was evaluated: an eval taskset whose every task failed stops the bench with
//! the first failure, and neither its metrics nor `bench_meta.json` change.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use trinity_checkpoint::CheckpointDir;
use trinity_config::Config;
use trinity_monitor::Monitor;

use crate::error::RftError;
use crate::explorer::{Explorer, ExplorerRole};
use crate::json_file;
use crate::models;
use crate::run::RunSummary;

/// `bench_meta.json`: the steps evaluated so far (0 = the base model).
#[derive(Debug, Default, Serialize, Deserialize)]
struct BenchMeta {
    evaluated: BTreeSet<u64>,
}

/// Runs a resolved config in mode `bench` over the checkpoints in `job_dir`.
pub(crate) async fn run(config: &Config, job_dir: &Path, threads: usize) -> Result<RunSummary, RftError> {
    let meta_path = job_dir.join("bench_meta.json");
    let mut meta: BenchMeta = json_file::read(&meta_path)?.unwrap_or_default();
    let checkpoints = CheckpointDir::open(job_dir)?.list()?;
    let mut todo: Vec<(u64, Option<PathBuf>)> = Vec::new();
    if config.explorer.eval_on_startup {
        todo.push((0, None));
    }
    let external = config.model.external_model.enable;
    let chosen = match config.explorer.bench_on_latest_checkpoint {
        // An external model's weights are behind its endpoint: this job's checkpoints are not its own.
        _ if external => Vec::new(),
        true => checkpoints.last().into_iter().collect::<Vec<_>>(),
        false => checkpoints.iter().collect(),
    };
    if external && !checkpoints.is_empty() {
        tracing::warn!(
            "bench {}: the {} checkpoints here are not evaluated: the evaluated model is model.external_model",
            job_dir.display(),
            checkpoints.len()
        );
    }
    todo.extend(chosen.into_iter().map(|c| (c.step, Some(c.path.join("hf")))));
    todo.retain(|(step, _)| !meta.evaluated.contains(step));
    if todo.is_empty() {
        tracing::info!(
            "bench {}: nothing new to evaluate ({} checkpoints, evaluated before: {:?})",
            job_dir.display(),
            checkpoints.len(),
            meta.evaluated
        );
        return Ok(RunSummary { job_dir: job_dir.to_owned(), resumed_from: None, train_steps: 0 });
    }
    tracing::info!(
        "bench {}: evaluating {}",
        job_dir.display(),
        todo.iter()
            .map(|(s, _)| if *s == 0 { "the base model".to_owned() } else { format!("step {s}") })
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut explorer = if external {
        // `todo` is the endpoint at step 0 alone: no weights are ever loaded into it.
        Explorer::start_external(config)?
    } else {
        let base = PathBuf::from(&config.model.model_path);
        let device = models::device(&base)?;
        Explorer::start(config, &base, device, threads, ExplorerRole::EvaluateOnly, None)?
    };
    let mut monitor =
        Monitor::open_run(&job_dir.join("monitor").join("bench"), &super::monitor_spec(config, &config.explorer.name))?;
    for (step, weights) in todo {
        let started = Instant::now();
        if let Some(dir) = &weights {
            explorer.load_weights_from_dir(dir, step).await?;
        }
        let mut metrics = explorer.benchmark("bench", step).await?;
        metrics.insert("time/bench_s".into(), started.elapsed().as_secs_f64());
        monitor.record(step, &metrics)?;
        let accuracies: Vec<String> = metrics
            .iter()
            .filter(|(k, _)| k.ends_with("/accuracy"))
            .map(|(k, v)| format!("{} {v:.3}", k.trim_start_matches("bench/").trim_end_matches("/accuracy")))
            .collect();
        tracing::info!("bench step {step}: {}", accuracies.join(", "));
        meta.evaluated.insert(step);
        json_file::write(&meta_path, &meta)?;
    }
    Ok(RunSummary { job_dir: job_dir.to_owned(), resumed_from: None, train_steps: 0 })
}
