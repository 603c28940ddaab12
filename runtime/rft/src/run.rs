//! `trinity run`: a resolved config's mode, composed of the [`crate::explorer`], [`crate::trainer`] and
//! [`crate::synchronizer`] components (see [`crate::modes`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use trinity_buffer::ReplayBuffer;
use trinity_collective::DistEnv;
use trinity_config::{Config, Mode};

use crate::data_parallel::{self, Leader};
use crate::error::RftError;
use crate::modes;
use crate::trainer::Rank0;

/// What a finished run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSummary {
    /// The experiment directory (`<checkpoint_root_dir>/<project>/[<group>/]<name>`).
    pub job_dir: PathBuf,
    /// The checkpoint the run resumed from, if any.
    pub resumed_from: Option<u64>,
    /// Train steps completed in all (including those before a resume).
    pub train_steps: u64,
}

/// The experiment directory of a config: `<checkpoint_root_dir>/<project>/[<group>/]<name>`, or, when
/// `continue_from_checkpoint` is false and that directory is not empty, the same with `_<YYYYmmddHHMMSS>`
/// appended to the name (Trinity-RFT's rule: a fresh start never mixes with an old run). Modes `explore`, `train`
/// and `bench` are never renamed: they work in a directory another process shares (the other half of an async run,
/// or the run whose checkpoints a bench evaluates). Call it once per run.
pub fn job_dir(config: &Config) -> PathBuf {
    let mut dir = PathBuf::from(&config.checkpoint_root_dir).join(&config.project);
    if !config.group.is_empty() {
        dir.push(&config.group);
    }
    let plain = dir.join(&config.name);
    let occupied = std::fs::read_dir(&plain).is_ok_and(|mut entries| entries.next().is_some());
    let shared = matches!(config.mode, Mode::Explore | Mode::Train | Mode::Bench | Mode::Serve);
    if config.continue_from_checkpoint || !occupied || shared {
        return plain;
    }
    dir.join(format!("{}_{}", config.name, timestamp(std::time::SystemTime::now())))
}

/// Checks what only the run's own components can check, so that `--dry-run` refuses it as the run would: the
/// replay buffer's priority function and its arguments and the eval workflows an external model can run.
pub fn check_components(config: &Config) -> Result<(), RftError> {
    if let Some(buffer) = &config.buffer.trainer_input.experience_buffer
        && buffer.replay_buffer.enable
    {
        ReplayBuffer::from_config(&buffer.replay_buffer, buffer.capacity, config.explorer.rollout_model.seed)?;
    }
    if config.model.external_model.enable {
        check_external_workflows(config)?;
    }
    if config.algorithm.enable_router_replay {
        check_router_replay(config)?;
    }
    Ok(())
}

/// `algorithm.enable_router_replay` needs a mixture-of-experts policy: refused (at `--dry-run` too) when the
/// model's config.json or GGUF header describes a dense one. A model that cannot be read is left to the load,
/// which names what is wrong with it.
fn check_router_replay(config: &Config) -> Result<(), RftError> {
    let path = Path::new(&config.model.model_path);
    let model = if path.is_dir() {
        trinity_model::ModelConfig::from_file(&path.join("config.json"))
    } else {
        trinity_model::GgufFile::open(path).and_then(|gguf| trinity_model::ModelConfig::from_gguf(&gguf))
    };
    match model {
        Ok(model) if model.moe.is_none() => Err(RftError::Setting {
            key: "algorithm.enable_router_replay",
            message: format!(
                "the model at {} is {:?}, which has no mixture-of-experts layer, so there is no routing to record or \
                 replay; set it to false, or train a mixture-of-experts model (Qwen3-MoE)",
                path.display(),
                model.family
            ),
        }),
        _ => Ok(()),
    }
}

/// With `model.external_model`, every eval taskset's workflow must be a built-in that only sends messages and
/// reads text (the explorer's runner refuses the others task by task; this says so before the run starts).
fn check_external_workflows(config: &Config) -> Result<(), RftError> {
    for (i, taskset) in config.buffer.explorer_input.eval_tasksets.iter().enumerate() {
        // The runner's default for a taskset that names none.
        let workflow = taskset.default_workflow_type.as_deref().unwrap_or("simple_workflow");
        if trinity_explorer::runs_on_external_model(workflow) && !trinity_explorer::is_plugin_workflow(workflow) {
            continue;
        }
        let what = if trinity_explorer::is_plugin_workflow(workflow) {
            "is a plugin, whose calls into the model may need its tokens"
        } else {
            "reads the model's tokens (token ids, logprobs, a tokenizer or a chat template) or calls another model"
        };
        return Err(RftError::Setting {
            key: "buffer.explorer_input.eval_tasksets",
            message: format!(
                "eval taskset `{}` (eval_tasksets[{i}]) runs `{workflow}`, which {what}, and model.external_model \
                 returns text only; use one of {} (default_eval_workflow_type or the taskset's \
                 default_workflow_type), or evaluate a local model",
                taskset.name,
                trinity_explorer::external_model_workflows().join(", ")
            ),
        });
    }
    Ok(())
}

/// The launcher's description of this process (torchrun's environment), when a launcher started it: `None` for
/// one process. A partial or wrong environment is an error naming the variable.
pub fn launched() -> Result<Option<DistEnv>, RftError> {
    Ok(DistEnv::from_env()?.filter(|env| env.world_size > 1))
}

/// Runs a resolved config in its mode, writing to `job_dir` (see [`job_dir`]). Started by a launcher with a world
/// size above one (see [`launched`]), the process is one rank of a data-parallel run ([`crate::data_parallel`]):
/// rank 0 runs the mode and writes to `job_dir`, the others train with it and write nothing.
pub fn run(config: &Config, job_dir: &Path) -> Result<RunSummary, RftError> {
    let threads = libtorch_threads();
    let Some(env) = launched()? else {
        return run_mode(config, job_dir, threads, None);
    };
    data_parallel::check_mode(config, &env)?;
    let (store, group, device) = data_parallel::join(config, &env)?;
    if env.rank != 0 {
        return data_parallel::follow(config, &env, store, group, device, threads);
    }
    let leader = Arc::new(Leader::new(store, env.world_size));
    let result = run_mode(config, job_dir, threads, Some(Rank0 { leader: leader.clone(), group, device }));
    leader.finish(result.as_ref().map(|_| ()).map_err(ToString::to_string));
    result
}

fn run_mode(config: &Config, job_dir: &Path, threads: usize, dp: Option<Rank0>) -> Result<RunSummary, RftError> {
    trinity_explorer::set_agent_environment(config.explorer.environment());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| RftError::Unsupported(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(async {
        match config.mode {
            Mode::Both | Mode::Colocate => modes::both::run(config, job_dir, threads, dp).await,
            Mode::Explore => modes::explore::run(config, job_dir, threads).await,
            Mode::Train => modes::train::run(config, job_dir, threads, dp).await,
            Mode::Bench => modes::bench::run(config, job_dir, threads).await,
            Mode::Serve => modes::serve::run(config, job_dir, threads).await,
        }
    })
}

/// The libtorch threads each pool of the run gets: what libtorch would use, taken once from this thread, which
/// then keeps one (see [`crate::models`]).
fn libtorch_threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(trinity_model::hand_over_threads)
}

/// `YYYYmmddHHMMSS` in UTC, as Trinity-RFT suffixes a renamed experiment.
fn timestamp(time: std::time::SystemTime) -> String {
    let seconds = time.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = trinity_model::civil_from_days(days as i64);
    format!("{year:04}{month:02}{day:02}{:02}{:02}{:02}", rest / 3600, rest % 3600 / 60, rest % 60)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn timestamps_are_utc_calendar_time() {
        let at = |s: u64| timestamp(std::time::UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "19700101000000");
        assert_eq!(at(951_782_400), "20000229000000", "leap day");
        assert_eq!(at(1_700_000_000), "20231114221320");
    }
}
