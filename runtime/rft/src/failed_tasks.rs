//! The run's record of failed tasks (`failed_tasks.jsonl` beside `experiences.jsonl`): one JSON line per task
//! that failed for good, with the step, the task (taskset, row index, the row itself), the workflow, the
//! attempts and the last error.
//!
//! `rollout/failed_tasks` only counts them; a person looking at a run wants to know which rows fail and why (a
//! missing field, a reward that throws, a plugin that traps), and the studio shows them from this file. Lines are
//! appended a step at a time and synced like experiences, so after a crash the file holds every step whose
//! record returned plus at most one partial last line, which readers skip.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;
use trinity_buffer::Row;
use trinity_explorer::TaskFailure;

use crate::error::RftError;

/// A row larger than this (serialized) is not copied into the record, only its size: the record is about why a
/// task failed, and a huge context would make the file (and the studio's page) heavy for little.
const ROW_LIMIT: usize = 64 * 1024;

/// Where in a step the task failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum FailurePhase {
    /// A task of the step's training batch.
    Explore,
    /// A task of an eval taskset, evaluated after the step.
    Eval,
}

/// One line of the file.
#[derive(Debug, Serialize)]
struct Record<'a> {
    step: u64,
    phase: FailurePhase,
    /// `taskset#index`.
    task: &'a str,
    taskset: &'a str,
    index: usize,
    workflow: &'a str,
    reward_fn: Option<&'a str>,
    attempts: u32,
    error: String,
    /// The weights the attempts sampled with.
    model_version: u64,
    /// Seconds since the Unix epoch.
    time: u64,
    row: Option<&'a Row>,
    #[serde(skip_serializing_if = "Option::is_none")]
    row_bytes: Option<usize>,
}

/// An open, append-only failed-task file.
#[derive(Debug)]
pub(crate) struct FailedTaskLog {
    path: PathBuf,
    file: File,
}

impl FailedTaskLog {
    /// Opens `path` for appending, creating it on first use.
    pub(crate) fn open(path: &Path) -> Result<FailedTaskLog, RftError> {
        let io = |source| RftError::Io { path: path.to_owned(), source };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| RftError::Io { path: parent.to_owned(), source })?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path).map_err(io)?;
        Ok(FailedTaskLog { path: path.to_owned(), file })
    }

    /// Appends the failures of one step (nothing when there are none) and makes them durable.
    pub(crate) fn record(
        &mut self,
        step: u64,
        phase: FailurePhase,
        model_version: u64,
        failures: &[TaskFailure],
    ) -> Result<(), RftError> {
        if failures.is_empty() {
            return Ok(());
        }
        let time = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut text = Vec::new();
        for failure in failures {
            let task = &failure.source;
            let row_bytes = serde_json::to_vec(&task.raw).map_or(0, |bytes| bytes.len());
            let record = Record {
                step,
                phase,
                task: &failure.task,
                taskset: &task.taskset,
                index: task.index,
                workflow: &failure.workflow,
                reward_fn: task.reward_fn.as_deref(),
                attempts: failure.attempts,
                error: failure.error.to_string(),
                model_version,
                time,
                row: (row_bytes <= ROW_LIMIT).then_some(&task.raw),
                row_bytes: (row_bytes > ROW_LIMIT).then_some(row_bytes),
            };
            serde_json::to_writer(&mut text, &record).map_err(|e| {
                RftError::Unsupported(format!("{}: cannot encode {}: {e}", self.path.display(), failure.task))
            })?;
            text.push(b'\n');
        }
        let io = |source| RftError::Io { path: self.path.clone(), source };
        // One write per step: a reader never sees the lines of a step interleaved with another writer's.
        self.file.write_all(&text).map_err(io)?;
        self.file.sync_data().map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use trinity_buffer::Task;
    use trinity_explorer::ExplorerError;

    use super::*;

    fn failure(index: usize, row: Value) -> TaskFailure {
        let task = Task {
            taskset: "math".into(),
            taskset_id: 0,
            index,
            batch_id: 3,
            is_eval: false,
            raw: row.as_object().cloned().unwrap(),
            workflow: None,
            reward_fn: Some("math_reward".into()),
            workflow_args: Default::default(),
            reward_fn_args: Default::default(),
            format: Default::default(),
            rollout_args: Default::default(),
            repeat_times: 2,
        };
        let error = ExplorerError::Task { task: format!("math#{index}"), message: "the row has no prompt".into() };
        TaskFailure {
            task: format!("math#{index}"),
            workflow: "math_workflow".into(),
            attempts: 2,
            error,
            source: task,
        }
    }

    #[test]
    fn each_failure_is_one_line_appended_across_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/failed_tasks.jsonl");
        let mut log = FailedTaskLog::open(&path).unwrap();
        log.record(1, FailurePhase::Explore, 0, &[]).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "", "a step without failures writes nothing");
        log.record(3, FailurePhase::Explore, 2, &[failure(4, json!({"question": "1+1"})), failure(7, json!({}))])
            .unwrap();
        drop(log);
        let huge = json!({"question": "x".repeat(ROW_LIMIT)});
        FailedTaskLog::open(&path).unwrap().record(4, FailurePhase::Eval, 3, &[failure(0, huge)]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<Value> = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
        assert_eq!(lines.len(), 3);
        let first = &lines[0];
        assert_eq!((first["step"].as_u64(), first["phase"].as_str()), (Some(3), Some("explore")));
        assert_eq!((first["task"].as_str(), first["index"].as_u64()), (Some("math#4"), Some(4)));
        assert_eq!(
            (first["workflow"].as_str(), first["reward_fn"].as_str()),
            (Some("math_workflow"), Some("math_reward"))
        );
        assert_eq!((first["attempts"].as_u64(), first["model_version"].as_u64()), (Some(2), Some(2)));
        assert!(first["error"].as_str().unwrap().contains("the row has no prompt"), "{first}");
        assert_eq!(first["row"], json!({"question": "1+1"}));
        assert!(first.get("row_bytes").is_none());
        assert_eq!(lines[2]["phase"], "eval");
        assert_eq!(lines[2]["row"], Value::Null, "a huge row is left out");
        assert!(lines[2]["row_bytes"].as_u64().unwrap() > ROW_LIMIT as u64);
    }
}
