//! How many train steps a `mode: train` run takes.
//!
//! Trinity-RFT's trainer in mode `train` stops after `trainer.total_steps`; else after `buffer.total_steps`
//! (copied onto its input); else when its input runs out. For SFT and DPO the input is the dataset, read
//! `buffer.total_epochs` times. For RL it is the buffer the explorers fill, which never runs out by itself; when
//! the trainer's config carries the training tasksets, the steps are what the explorers will produce from them,
//! `floor(Σ rows × total_epochs × repeat_times / train_batch_size)` (experiences explored, in whole batches).
//! Otherwise the run has no count: the trainer stops when every explorer has finished, or when no batch arrives
//! within the buffer's `max_read_timeout`.
//!
//! Counting rows means reading the tasksets or the dataset, which the buffer crate does (and which depends on this
//! crate), so the count comes in two parts: [`TrainSteps::of`] says what decides, and the run reads rows only when
//! it is [`TrainSteps::FromRows`].

use crate::buffer::StorageType;
use crate::config::Config;

/// What decides the number of train steps of a `mode: train` run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainSteps {
    /// A count the config gives; `key` is `trainer.total_steps` or `buffer.total_steps`.
    Given { steps: u64, key: &'static str },
    /// Counted from rows: the run reads the row count of each input [`RowsOf`] names and calls
    /// [`TrainSteps::count`].
    FromRows { rows_of: RowsOf, total_epochs: u32, repeat_times: u32, train_batch_size: u32 },
    /// No count: the trainer stops when every explorer has finished or `max_read_timeout` passes without a batch.
    Unbounded,
}

/// Whose rows a [`TrainSteps::FromRows`] count reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowsOf {
    /// Each training taskset of `buffer.explorer_input.tasksets`, in order (RL: the explorers' tasks).
    Tasksets,
    /// The dataset of `buffer.trainer_input.experience_buffer` (SFT, DPO).
    Dataset,
}

impl TrainSteps {
    /// What decides the train steps of `config` (resolved) in mode `train`.
    pub fn of(config: &Config) -> TrainSteps {
        if let Some(steps) = config.trainer.total_steps {
            return TrainSteps::Given { steps, key: "trainer.total_steps" };
        }
        if let Some(steps) = config.buffer.total_steps {
            return TrainSteps::Given { steps, key: "buffer.total_steps" };
        }
        let buffer = &config.buffer;
        let dataset =
            buffer.trainer_input.experience_buffer.as_ref().is_some_and(|b| b.storage_type == StorageType::File);
        let from_rows = |rows_of, repeat_times| TrainSteps::FromRows {
            rows_of,
            total_epochs: buffer.total_epochs,
            repeat_times,
            train_batch_size: buffer.train_batch_size,
        };
        if dataset {
            // One row, one training example: a DPO row holds its chosen and rejected pair.
            from_rows(RowsOf::Dataset, 1)
        } else if buffer.explorer_input.tasksets.is_empty() {
            TrainSteps::Unbounded
        } else {
            from_rows(RowsOf::Tasksets, config.algorithm.resolved.repeat_times)
        }
    }

    /// The step limit, given the row count of each input [`RowsOf`] names (ignored unless
    /// [`TrainSteps::FromRows`]); `None` when unbounded. A last partial batch is never trained, so inputs too small
    /// for one batch give 0.
    pub fn count(self, rows: &[u64]) -> Option<u64> {
        match self {
            TrainSteps::Given { steps, .. } => Some(steps),
            TrainSteps::FromRows { total_epochs, repeat_times, train_batch_size, .. } => {
                let experiences: u128 =
                    rows.iter().map(|&r| u128::from(r) * u128::from(total_epochs) * u128::from(repeat_times)).sum();
                let steps = experiences / u128::from(train_batch_size.max(1));
                Some(u64::try_from(steps).unwrap_or(u64::MAX))
            }
            TrainSteps::Unbounded => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::catalog::AnyName;
    use crate::{LoadOptions, load_str};

    fn resolved(text: &str) -> Config {
        let env = |_: &str| None;
        let options = LoadOptions { overrides: &[], env: &env, catalog: &AnyName, cwd: Path::new("/work") };
        load_str(text, Path::new("c.yaml"), options).unwrap_or_else(|e| panic!("{e}")).config
    }

    /// An RL trainer (mode train) over a shared buffer; `extra` adds top-level lines, `buffer` lines under `buffer:`.
    fn trainer(buffer: &str, extra: &str) -> Config {
        resolved(&format!(
            "mode: train\nalgorithm:\n  repeat_times: 4\nmodel:\n  model_path: /m\n  max_model_len: 64\nbuffer:\n  \
             train_batch_size: 10\n  total_epochs: 2\n{buffer}  trainer_input:\n    experience_buffer:\n      \
             path: sqlite:///x.db\n{extra}"
        ))
    }

    const TWO_TASKSETS: &str = "  explorer_input:\n    tasksets:\n      - path: /a.jsonl\n      - path: /b.jsonl\n";

    #[test]
    fn trainer_total_steps_wins_then_buffer_total_steps() {
        let both = trainer(&format!("  total_steps: 7\n{TWO_TASKSETS}"), "trainer:\n  total_steps: 3\n");
        assert_eq!(TrainSteps::of(&both), TrainSteps::Given { steps: 3, key: "trainer.total_steps" });
        let buffer = trainer(&format!("  total_steps: 7\n{TWO_TASKSETS}"), "");
        assert_eq!(TrainSteps::of(&buffer), TrainSteps::Given { steps: 7, key: "buffer.total_steps" });
        assert_eq!(TrainSteps::of(&buffer).count(&[]), Some(7));
    }

    #[test]
    fn tasksets_give_the_explored_experiences_in_whole_batches() {
        let config = trainer(TWO_TASKSETS, "");
        let steps = TrainSteps::of(&config);
        assert_eq!(
            steps,
            TrainSteps::FromRows { rows_of: RowsOf::Tasksets, total_epochs: 2, repeat_times: 4, train_batch_size: 10 }
        );
        // (3 + 4) rows × 2 epochs × 4 repeats = 56 experiences: 5 whole batches of 10.
        assert_eq!(steps.count(&[3, 4]), Some(5));
        assert_eq!(steps.count(&[1]), Some(0), "fewer experiences than one batch train nothing");
    }

    #[test]
    fn without_tasksets_or_counts_the_trainer_is_unbounded() {
        let config = trainer("", "");
        assert_eq!(TrainSteps::of(&config), TrainSteps::Unbounded);
        assert_eq!(TrainSteps::of(&config).count(&[100]), None);
    }

    #[test]
    fn sft_counts_dataset_rows_per_epoch() {
        let config = resolved(
            "mode: train\nalgorithm:\n  algorithm_type: sft\nmodel:\n  model_path: /m\n  max_model_len: 64\nbuffer:\n  \
             train_batch_size: 4\n  total_epochs: 3\n  trainer_input:\n    experience_buffer:\n      storage_type: file\n      \
             path: /sft.jsonl\n",
        );
        let steps = TrainSteps::of(&config);
        assert_eq!(
            steps,
            TrainSteps::FromRows { rows_of: RowsOf::Dataset, total_epochs: 3, repeat_times: 1, train_batch_size: 4 }
        );
        assert_eq!(steps.count(&[10]), Some(7), "floor(10 × 3 / 4)");
    }
}
