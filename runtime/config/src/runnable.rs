//! What `trinity run` cannot run yet although the config is valid.
//!
//! One function, called by the run and by `--dry-run` alike, so a dry run refuses exactly what the run would
//! refuse, with the same message. Work that brings a mode or feature (issue 15: modes and stages) relaxes the
//! matching check here and nowhere else.

use crate::Loaded;
use crate::algorithm::mix_expert_rows;
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
        self.check_train_batch_size(&refuse)?;
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

    /// In modes `both` and `colocate` train step `s` trains explore step `s`'s experiences (plus the expert rows of
    /// sample strategy `mix`), so `buffer.train_batch_size` must be what that makes: a trainer that reads
    /// fixed-size batches whatever the explore steps produced is the decoupled trainer of issue 15.
    fn check_train_batch_size(&self, refuse: &dyn Fn(&str, String) -> ConfigError) -> Result<(), ConfigError> {
        let config = &self.config;
        if !matches!(config.mode, Mode::Both | Mode::Colocate) {
            return Ok(());
        }
        let buffer = &config.buffer;
        let explored = u64::from(buffer.batch_size) * u64::from(config.algorithm.repeat_times.unwrap_or(1));
        let total = u64::from(buffer.train_batch_size);
        let (expert, note) = match mix_expert_rows(&config.algorithm, buffer.train_batch_size) {
            Some((expert, ratio)) => {
                (expert, format!(" and {expert} expert rows (ceil(expert_data_ratio {ratio} × train_batch_size))"))
            }
            None => (0, String::new()),
        };
        if total.saturating_sub(expert) == explored {
            return Ok(());
        }
        Err(refuse(
            "buffer.train_batch_size",
            format!(
                "{total} experiences per train step, but in mode `{}` a train step trains one explore step's \
                 experiences (batch_size {} × repeat_times {} = {explored}){note}; set train_batch_size to match, or \
                 leave it unset (a trainer that reads batches of any size from the buffer comes with mode `train`, \
                 issue 15)",
                config.mode.name(),
                buffer.batch_size,
                config.algorithm.repeat_times.unwrap_or(1),
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::catalog::AnyName;
    use crate::error::ConfigError;
    use crate::{LoadOptions, Loaded, load_str};

    fn load(extra: &str) -> Loaded {
        load_with(extra, "")
    }

    /// A mode-both config with two tasks of four rollouts per step; `algorithm` and `buffer` get extra lines.
    fn load_with(algorithm: &str, buffer: &str) -> Loaded {
        let text = format!(
            "algorithm:\n  repeat_times: 4\n{algorithm}model:\n  model_path: /m\n  max_model_len: 64\nbuffer:\n  \
             batch_size: 2\n{buffer}  explorer_input:\n    taskset:\n      path: /t.jsonl\n"
        );
        let env = |_: &str| None;
        let options = LoadOptions { overrides: &[], env: &env, catalog: &AnyName, cwd: Path::new("/work") };
        load_str(&text, Path::new("c.yaml"), options).unwrap_or_else(|e| panic!("{e}"))
    }

    fn with_train_batch(loaded: Loaded, size: u32) -> Loaded {
        let mut loaded = loaded;
        loaded.config.buffer.train_batch_size = size;
        loaded
    }

    #[test]
    fn train_batch_size_is_one_explore_step_in_mode_both() {
        assert!(with_train_batch(load(""), 8).check_runnable().is_ok());
        let error = with_train_batch(load(""), 7).check_runnable().unwrap_err();
        assert!(
            matches!(&error, ConfigError::NotRunnable { key, message, .. }
                if key == "buffer.train_batch_size" && message.contains("batch_size 2 × repeat_times 4 = 8")),
            "{error}"
        );
    }

    #[test]
    fn mix_adds_its_expert_rows_to_the_explore_step() {
        let mix = "  sample_strategy: mix\n  sample_strategy_args:\n    expert_data_ratio: 0.2\n";
        let sft = "  trainer_input:\n    auxiliary_buffers:\n      sft_dataset:\n        storage_type: file\n        \
                   path: /sft.jsonl\n";
        let load = |extra: &str| load_with(extra, sft);
        // ceil(0.2 · 10) = 2 expert rows beside the 8 rollouts.
        assert!(with_train_batch(load(mix), 10).check_runnable().is_ok());
        let error = with_train_batch(load(mix), 8).check_runnable().unwrap_err();
        assert!(error.to_string().contains("2 expert rows"), "{error}");
    }
}
