//! `trinity run`: load a config, then run its mode.

use std::path::Path;

use anyhow::{Context, Result};
use trinity_config::Mode;
use trinity_studio::RunRecord;

use crate::cli::{LogLevel, RunArgs};
use crate::logging;
use crate::plugins;
use crate::registry::Registry;

pub(crate) fn run(log_level: LogLevel, args: RunArgs) -> Result<()> {
    let registry = Registry::builtin();
    let cwd = std::env::current_dir().context("cannot read the working directory")?;
    let env = |var: &str| std::env::var(var).ok();
    let options = trinity_config::LoadOptions { overrides: &args.overrides, env: &env, catalog: &registry, cwd: &cwd };
    // Plugins first: they register the names the config's resolution checks.
    let mut specs: Vec<_> = args.plugins.iter().map(|path| plugins::spec_for(path)).collect();
    specs.extend(trinity_config::plugin_entries(&args.config, options)?);
    plugins::load(&specs)?;
    let loaded = trinity_config::load_file(&args.config, options)?;
    check(&loaded, &args.config)?;
    check_python_workflows(&loaded.config)?;
    let config = &loaded.config;
    let log_level = effective_level(log_level, &config.log.level);
    if args.dry_run {
        let _guard = logging::init(log_level, None)?;
        for note in loaded.notes.iter().chain(loaded.stages.iter().flat_map(|s| &s.notes)) {
            tracing::warn!("{note}");
        }
        print!("{}", loaded.dry_run_yaml());
        return Ok(());
    }
    // Under a launcher, rank 0 runs the mode and writes the run's files; the other ranks only train with it.
    let launched = trinity_rft::launched()?;
    if let Some(env) = &launched
        && !loaded.stages.is_empty()
    {
        anyhow::bail!(
            "{}: a staged config does not run data-parallel, but the launcher started {} processes; run each stage \
             as a config of its own under the launcher, or the staged config as one process",
            args.config.display(),
            env.world_size
        );
    }
    let job_dir = trinity_rft::job_dir(config);
    if let Some(env) = launched.as_ref().filter(|env| env.rank != 0) {
        let _guard = logging::init(log_level, None)?;
        tracing::info!(
            "config {}: rank {} of {}; rank 0 writes the run's checkpoints, metrics and log",
            args.config.display(),
            env.rank,
            env.world_size
        );
        trinity_rft::run(config, &job_dir).with_context(|| format!("rank {} of {}", env.rank, env.world_size))?;
        return Ok(());
    }
    // The processes of one run (an explorer and a trainer apart, a bench) write their own log files and status
    // records.
    let role = match config.mode {
        Mode::Explore => config.explorer.name.clone(),
        Mode::Train => config.trainer.name.clone(),
        Mode::Bench => "bench".to_owned(),
        _ => "trinity".to_owned(),
    };
    let _guard = logging::init(log_level, Some((&job_dir.join("log"), &format!("{role}.log"))))?;
    let mut record = RunRecord::for_config(config, &args.config, &role, !loaded.stages.is_empty());
    if let Err(error) = record.write(&job_dir) {
        tracing::warn!("the studio will not see this run's status: {error}");
    }
    crate::progress::install();
    let result = run_job(&loaded, &args, &job_dir, &registry, launched.as_ref());
    crate::progress::finish();
    if let Err(error) = record.finish(&job_dir, result.as_ref().err().map(crate::report::chain)) {
        tracing::warn!("the studio will not see how this run ended: {error}");
    }
    result
}

/// Everything `trinity run` checks before it starts; `--dry-run` and the studio's config validation call it too,
/// so all three refuse the same configs.
pub(crate) fn check(loaded: &trinity_config::Loaded, path: &Path) -> Result<()> {
    loaded.check_runnable()?;
    let configs: Vec<&trinity_config::Config> = match loaded.stages.is_empty() {
        true => vec![&loaded.config],
        false => loaded.stages.iter().map(|s| &s.config).collect(),
    };
    for config in configs {
        trinity_rft::check_components(config).with_context(|| path.display().to_string())?;
    }
    Ok(())
}

/// Runs rank 0's (or the only process's) job once logging and the status record are in place.
fn run_job(
    loaded: &trinity_config::Loaded,
    args: &RunArgs,
    job_dir: &Path,
    registry: &Registry,
    launched: Option<&trinity_collective::DistEnv>,
) -> Result<()> {
    let config = &loaded.config;
    for note in &loaded.notes {
        tracing::warn!("{note}");
    }
    if let Some(env) = launched {
        tracing::info!(
            "data parallel: {} ranks from the launcher (cluster.node_num × gpu_per_node = {} describe Trinity-RFT's \
             Ray cluster and do not size this job)",
            env.world_size,
            config.cluster.node_num * config.cluster.gpu_per_node
        );
    }
    tracing::info!("config {} → {}", args.config.display(), job_dir.display());
    if !loaded.stages.is_empty() {
        let summaries =
            trinity_rft::run_stages(loaded, job_dir, registry).with_context(|| format!("run {}", job_dir.display()))?;
        tracing::info!(
            "finished {} stages; each stage's metrics are in {}/<stage>/monitor",
            summaries.len(),
            job_dir.display()
        );
        return Ok(());
    }
    let summary = trinity_rft::run(config, job_dir).with_context(|| format!("run {}", job_dir.display()))?;
    match config.mode {
        Mode::Explore | Mode::Bench => tracing::info!("finished; metrics in {}", job_dir.join("monitor").display()),
        _ => tracing::info!(
            "finished after {} train steps; metrics in {}",
            summary.train_steps,
            job_dir.join("monitor").display()
        ),
    }
    Ok(())
}

/// The config's `log.level` applies unless `--log-level` asked for something other than its default (`info`);
/// `RUST_LOG` wins over both (see [`logging::init`]).
fn effective_level(flag: LogLevel, config_level: &str) -> LogLevel {
    if flag != LogLevel::Info {
        return flag;
    }
    match config_level.to_uppercase().as_str() {
        "DEBUG" => LogLevel::Debug,
        "WARNING" | "WARN" => LogLevel::Warn,
        "ERROR" => LogLevel::Error,
        _ => LogLevel::Info,
    }
}

/// Makes Python workflow names (dotted paths, and names in Trinity-RFT's registry that trinity lacks) run as
/// Python workflows and imports each one the config names, so that a missing interpreter, Trinity-RFT install
/// or package is a `--dry-run` error naming the import and the pip line rather than a failure of every task.
fn check_python_workflows(config: &trinity_config::Config) -> Result<()> {
    trinity_pyworkflow::install(&config.model.model_path);
    trinity_pyworkflow::configure(config)?;
    let input = &config.buffer.explorer_input;
    let mut names: Vec<&str> = input
        .tasksets
        .iter()
        .chain(&input.eval_tasksets)
        .filter_map(|taskset| taskset.default_workflow_type.as_deref())
        .filter(|name| trinity_pyworkflow::is_python_workflow_name(name))
        .collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        trinity_pyworkflow::check(name)?;
    }
    Ok(())
}
