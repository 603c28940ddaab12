//! Each mode of `trinity run` as a composition of the explorer, the trainer and the synchronizer.
//!
//! | mode | explorer | trainer | weights move by |
//! |---|---|---|---|
//! | `both`, `colocate` | this process | this process | in-place copy (or the weight store) |
//! | `explore` | this process | another process | the weight store the trainer publishes to |
//! | `train` | another process (RL), none (SFT, DPO) | this process | the weight store |
//! | `bench` | this process (evaluation only) | none | each checkpoint's `hf/` weights |
//! | `serve` | an agent program through the OpenAI API | another process (mode `train`) | the weight store |

pub(crate) mod bench;
pub(crate) mod both;
pub(crate) mod explore;
pub(crate) mod serve;
pub(crate) mod train;

use std::path::Path;

use trinity_buffer::ExperienceBuffer;
use trinity_config::Config;

use crate::error::RftError;

/// What the run's monitor needs: its sink and, for a hosted service (wandb, mlflow, swanlab), the names
/// Trinity-RFT files the run under — `role` is the explorer's or trainer's name (`both` in mode `both`).
pub(crate) fn monitor_spec(config: &Config, role: &str) -> trinity_monitor::MonitorSpec {
    trinity_monitor::MonitorSpec {
        monitor_type: config.monitor.monitor_type.clone(),
        monitor_args: config.monitor.monitor_args.clone(),
        project: config.project.clone(),
        group: config.group.clone(),
        name: config.name.clone(),
        role: role.to_owned(),
        // A config always serializes (string keys, finite numbers); the service then gets none rather than fail.
        config: serde_json::to_value(config).unwrap_or_default(),
    }
}

/// Opens the run's experience buffer for a process that shares it with others (modes `explore` and `train`),
/// claiming as `trainer.name`. It must outlive the process: SQLite on one machine, PostgreSQL across machines.
pub(crate) async fn shared_buffer(config: &Config, job_dir: &Path, mode: &str) -> Result<ExperienceBuffer, RftError> {
    let buffer_config = config.buffer.trainer_input.experience_buffer.clone().unwrap_or_default();
    let buffer = ExperienceBuffer::open(&buffer_config, &job_dir.join("buffer"))
        .await?
        .with_consumer(&config.trainer.name)
        .with_room_timeout(std::time::Duration::from_secs(config.synchronizer.sync_timeout));
    if !buffer.is_persistent() {
        return Err(RftError::Setting {
            key: "buffer.trainer_input.experience_buffer.path",
            message: format!(
                "mode `{mode}` shares experiences with another process: use a `sqlite:///…` (one machine) or \
                 `postgresql://…` (several) path"
            ),
        });
    }
    Ok(buffer)
}
