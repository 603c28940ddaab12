//! Taskset readers: rows from JSONL, JSON, Parquet files and Hugging Face dataset directories.
//!
//! Every reader loads the whole taskset at start-up and fails there, naming the file and the line or row, if
//! any row is malformed: a taskset that loads never fails later in the run. Rows are JSON objects
//! ([`Row`]); row order is file order, files of a split in name order (`train-00000-of-00002` before
//! `train-00001-of-00002`), so row indices — and therefore selector positions in checkpoints — are stable.

pub mod hf_dir;
pub mod json;
pub mod jsonl;
pub mod parquet;

use std::path::{Path, PathBuf};

use trinity_config::buffer::{BufferConfig, StorageType, TasksetConfig};

use crate::error::{BufferError, Result};
use crate::task::{Row, Task};

/// Reads every row of a taskset path: a `.jsonl`, `.json` or `.parquet` file, or a dataset directory laid out
/// as `huggingface-cli download` leaves it (see [`hf_dir::split_files`]).
pub fn read_rows(path: &Path, subset_name: Option<&str>, split: &str) -> Result<Vec<Row>> {
    if path.is_dir() {
        let mut rows = Vec::new();
        for file in hf_dir::split_files(path, subset_name, split)? {
            rows.extend(read_file(&file)?);
        }
        return Ok(rows);
    }
    read_file(path)
}

/// Reads one file by its extension.
pub fn read_file(path: &Path) -> Result<Vec<Row>> {
    match extension(path).as_deref() {
        Some("jsonl") | Some("ndjson") => jsonl::read(path),
        Some("json") => json::read(path),
        Some("parquet") => parquet::read(path),
        _ if !path.exists() => Err(BufferError::Io {
            path: path.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
        }),
        _ => Err(BufferError::UnsupportedFile { path: path.to_owned() }),
    }
}

/// Loads the resolved config's eval tasksets (`buffer.explorer_input.eval_tasksets`), in order; an
/// evaluation runs [`Taskset::all_tasks`] of each.
pub fn load_eval_tasksets(buffer: &BufferConfig) -> Result<Vec<Taskset>> {
    buffer.explorer_input.eval_tasksets.iter().enumerate().map(|(i, config)| Taskset::load(config, i, true)).collect()
}

pub(crate) fn extension(path: &Path) -> Option<String> {
    path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase)
}

/// A loaded taskset: its config and rows.
#[derive(Debug, Clone)]
pub struct Taskset {
    pub config: TasksetConfig,
    pub rows: Vec<Row>,
    /// Position among the explorer's training (or eval) tasksets, stamped on its tasks.
    pub taskset_id: usize,
    pub is_eval: bool,
}

impl Taskset {
    /// Loads the rows of a resolved taskset config. Empty tasksets are errors: nothing could be explored.
    pub fn load(config: &TasksetConfig, taskset_id: usize, is_eval: bool) -> Result<Taskset> {
        if config.storage_type != StorageType::File {
            return Err(BufferError::UnsupportedStorage {
                taskset: config.name.clone(),
                storage: format!("{:?}", config.storage_type).to_lowercase(),
            });
        }
        let path = PathBuf::from(&config.path);
        let rows = read_rows(&path, config.subset_name.as_deref(), &config.split)?;
        Taskset::from_rows(config, rows, taskset_id, is_eval, &path)
    }

    /// A taskset over rows already in memory (tests, generated tasks).
    pub fn from_rows(
        config: &TasksetConfig,
        rows: Vec<Row>,
        taskset_id: usize,
        is_eval: bool,
        path: &Path,
    ) -> Result<Taskset> {
        if rows.is_empty() {
            return Err(BufferError::EmptyTaskset { taskset: config.name.clone(), path: path.to_owned() });
        }
        let taskset = Taskset { config: config.clone(), rows, taskset_id, is_eval };
        // Build every task once so that a bad per-row override fails at load time, not mid-run.
        for index in 0..taskset.len() {
            taskset.task(index)?;
        }
        Ok(taskset)
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The task of row `index` (wrapped into range, so selectors never index out of bounds).
    pub fn task(&self, index: usize) -> Result<Task> {
        let index = index % self.rows.len().max(1);
        let raw = self.rows.get(index).cloned().unwrap_or_default();
        Task::from_row(&self.config, self.taskset_id, index, raw, self.is_eval)
    }

    /// Every task once, in row order: what an evaluation runs.
    pub fn all_tasks(&self) -> Result<Vec<Task>> {
        (0..self.len()).map(|i| self.task(i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_extensions_and_missing_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("rows.csv");
        std::fs::write(&csv, "a,b\n").unwrap();
        assert!(matches!(read_file(&csv), Err(BufferError::UnsupportedFile { .. })));
        let missing = dir.path().join("nope.txt");
        let text = read_rows(&missing, None, "train").unwrap_err().to_string();
        assert!(text.contains("nope.txt"), "{text}");
    }

    #[test]
    fn sql_tasksets_are_refused_with_the_taskset_name() {
        let config = TasksetConfig { name: "t".into(), storage_type: StorageType::Sql, ..Default::default() };
        let text = Taskset::load(&config, 0, false).unwrap_err().to_string();
        assert!(text.contains("`t`") && text.contains("sql"), "{text}");
    }
}
