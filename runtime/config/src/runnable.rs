//! What `trinity run` cannot run yet although the config is valid.
//!
//! One function, called by the run and by `--dry-run` alike, so a dry run refuses exactly what the run would
//! refuse, with the same message. Work that brings a mode or feature (issue 15: modes and stages) relaxes the
//! matching check here and nowhere else.

use crate::Loaded;
use crate::buffer::StorageType;
use crate::config::Mode;
use crate::error::ConfigError;

impl Loaded {
    /// Refuses what the run cannot do yet, naming the key, why, and what to do instead.
    pub fn check_runnable(&self) -> Result<(), ConfigError> {
        let config = &self.config;
        let refuse = |key: &str, message: String| ConfigError::NotRunnable {
            origin: self.source.origin(key),
            key: key.to_owned(),
            message,
        };
        if !config.stages.is_empty() {
            return Err(refuse(
                "stages",
                "`stages` (each stage starting from the previous one's weights) are not supported yet (issue 15); \
                 run each stage's config on its own"
                    .to_owned(),
            ));
        }
        if !matches!(config.mode, Mode::Both | Mode::Colocate) {
            return Err(refuse(
                "mode",
                format!(
                    "mode `{}` is not supported yet (issue 15); modes `both` and `colocate` run (explorer and \
                     trainer in one process)",
                    config.mode.name()
                ),
            ));
        }
        let input = &config.buffer.explorer_input;
        let tasksets = input
            .tasksets
            .iter()
            .map(|t| ("tasksets", t))
            .chain(input.eval_tasksets.iter().map(|t| ("eval_tasksets", t)));
        for (i, (list, taskset)) in tasksets.enumerate() {
            let index = if list == "tasksets" { i } else { i - input.tasksets.len() };
            let key = format!("buffer.explorer_input.{list}[{index}]");
            if taskset.storage_type == StorageType::Sql {
                return Err(refuse(
                    &format!("{key}.storage_type"),
                    format!(
                        "taskset `{}`: `sql` tasksets are not read yet; export the rows to a JSONL file and use `file`",
                        taskset.name
                    ),
                ));
            }
        }
        Ok(())
    }
}
