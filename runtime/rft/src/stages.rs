//! Multi-stage runs (`stages:`), with Trinity-RFT's semantics: the stages run in order, each in its own directory
//! `<job>/<stage_name>/` as a run of its own mode, and each starts from the previous stage's latest checkpoint
//! (its Hugging Face weights). Which stage is running is recorded in `<job>/stage_meta.json` before it starts, so
//! the same command run again skips the finished stages and resumes the interrupted one from its own checkpoints.
//! Each stage's config is resolved by the config crate ([`trinity_config::Loaded::stages`]): a section a stage
//! sets replaces the top-level section whole.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use trinity_checkpoint::CheckpointDir;
use trinity_config::{Catalog, Loaded};

use crate::error::RftError;
use crate::json_file;
use crate::run::{RunSummary, run};

/// `stage_meta.json`: the stage running (or, past the last index, all done).
#[derive(Debug, Default, Serialize, Deserialize)]
struct StageMeta {
    latest_stage: usize,
}

/// Runs every stage of `loaded` under `job_dir` (the top-level experiment directory), resuming where an earlier
/// run of the same command stopped. `catalog` re-resolves a stage whose model is the previous stage's checkpoint.
pub fn run_stages(loaded: &Loaded, job_dir: &Path, catalog: &dyn Catalog) -> Result<Vec<RunSummary>, RftError> {
    let meta_path = job_dir.join("stage_meta.json");
    let mut meta: StageMeta = json_file::read(&meta_path)?.unwrap_or_default();
    let count = loaded.stages.len();
    if meta.latest_stage >= count {
        tracing::info!("all {count} stages of {} have finished", job_dir.display());
        return Ok(Vec::new());
    }
    if meta.latest_stage > 0 {
        tracing::info!(
            "stages 1..={} have finished: continuing with stage {} (`{}`)",
            meta.latest_stage,
            meta.latest_stage + 1,
            loaded.stages[meta.latest_stage].name
        );
    }
    let mut summaries = Vec::new();
    for index in meta.latest_stage..count {
        let name = &loaded.stages[index].name;
        let stage = match index {
            0 => loaded.stages[0].clone(),
            _ => {
                let previous = &loaded.stages[index - 1].name;
                let weights = latest_weights(&job_dir.join(previous))?.ok_or_else(|| {
                    RftError::Unsupported(format!(
                        "stage `{name}` starts from stage `{previous}`'s weights, but {} has no checkpoint",
                        job_dir.join(previous).display()
                    ))
                })?;
                tracing::info!("stage `{name}` starts from {}", weights.display());
                loaded
                    .stage_with_model_path(index, &weights.display().to_string(), catalog)
                    .map_err(|e| RftError::Unsupported(e.to_string()))?
            }
        };
        for note in &stage.notes {
            tracing::warn!("{note}");
        }
        meta.latest_stage = index;
        json_file::write(&meta_path, &meta)?;
        tracing::info!("stage {}/{count} `{name}`: mode `{}`", index + 1, stage.config.mode.name());
        summaries.push(run(&stage.config, &job_dir.join(name))?);
    }
    meta.latest_stage = count;
    json_file::write(&meta_path, &meta)?;
    Ok(summaries)
}

/// The Hugging Face weights of the latest intact checkpoint in `dir`.
fn latest_weights(dir: &Path) -> Result<Option<PathBuf>, RftError> {
    if !dir.exists() {
        return Ok(None);
    }
    Ok(crate::trainer::intact_latest(&CheckpointDir::open(dir)?)?.map(|c| c.path.join("hf")))
}
