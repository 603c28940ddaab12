//! `status/<role>.json` in a run directory: which process runs it, with which config, and how it ended.
//!
//! Metric files say what a run measured, not whether it is still alive, how it ended or what it runs. `trinity run`
//! writes one record per process when it starts (`running`, with its pid) and rewrites it when it ends (`finished`,
//! or `failed` with the error); processes of one run (an explorer and a trainer apart, a bench) write their own
//! role's file, so they never overwrite each other. A process killed before it could write its end leaves
//! `running` behind: readers check that the pid is still a `trinity` process before believing it
//! ([`RunRecord::effective_status`]). Records are written to a temporary file and renamed, so a reader never sees
//! half of one.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use trinity_config::Config;

use crate::error::StudioError;

/// The folder of a run directory that holds the records.
pub const STATUS_DIR: &str = "status";

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Finished,
    Failed,
    /// No record (a run written by an older trinity, or one of a staged run's stages).
    Unknown,
}

/// One process's record of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// `trinity` (modes both / colocate / stages), the explorer's or trainer's name, or `bench`.
    pub role: String,
    pub status: RunStatus,
    pub pid: u32,
    /// The config file the run was started with.
    pub config: String,
    pub project: String,
    pub group: String,
    pub name: String,
    /// The config's mode (`both`, `explore`, ...), or `stages` for a staged config.
    pub mode: String,
    pub model_path: String,
    /// Seconds since the Unix epoch.
    pub started_at: u64,
    #[serde(default)]
    pub ended_at: Option<u64>,
    /// Why a failed run failed (the error the command printed).
    #[serde(default)]
    pub error: Option<String>,
}

impl RunRecord {
    /// The record of this process starting `config` (read from `config_path`) as `role`; `staged` for a config
    /// with `stages`.
    pub fn for_config(config: &Config, config_path: &Path, role: &str, staged: bool) -> RunRecord {
        let mode = match staged {
            true => "stages".to_owned(),
            false => serde_json::to_value(config.mode)
                .ok()
                .and_then(|value| value.as_str().map(str::to_owned))
                .unwrap_or_else(|| format!("{:?}", config.mode).to_lowercase()),
        };
        let config_path = std::path::absolute(config_path).unwrap_or_else(|_| config_path.to_owned());
        RunRecord {
            role: role.to_owned(),
            status: RunStatus::Running,
            pid: std::process::id(),
            config: config_path.display().to_string(),
            project: config.project.clone(),
            group: config.group.clone(),
            name: config.name.clone(),
            mode,
            model_path: config.model.model_path.clone(),
            started_at: now(),
            ended_at: None,
            error: None,
        }
    }

    /// Writes the record into `<job_dir>/status/<role>.json`.
    pub fn write(&self, job_dir: &Path) -> Result<(), StudioError> {
        let dir = job_dir.join(STATUS_DIR);
        std::fs::create_dir_all(&dir).map_err(StudioError::io(&dir))?;
        let path = dir.join(format!("{}.json", self.role));
        let partial = dir.join(format!(".{}.json.partial", self.role));
        let text = serde_json::to_string_pretty(self).map_err(|e| StudioError::Host(e.to_string()))?;
        std::fs::write(&partial, text).map_err(StudioError::io(&partial))?;
        std::fs::rename(&partial, &path).map_err(StudioError::io(&path))
    }

    /// Marks the record ended (`finished`, or `failed` with `error`) and writes it.
    pub fn finish(&mut self, job_dir: &Path, error: Option<String>) -> Result<(), StudioError> {
        self.status = if error.is_some() { RunStatus::Failed } else { RunStatus::Finished };
        self.ended_at = Some(now());
        self.error = error;
        self.write(job_dir)
    }

    /// Every record of a run directory, by role; unreadable files are skipped (a record being replaced right
    /// now is readable again a moment later).
    pub fn read_all(job_dir: &Path) -> Vec<RunRecord> {
        let Ok(entries) = std::fs::read_dir(job_dir.join(STATUS_DIR)) else { return Vec::new() };
        let mut records: Vec<RunRecord> = entries
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|e| e == "json"))
            .filter_map(|path| serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok())
            .collect();
        records.sort_by(|a, b| a.role.cmp(&b.role));
        records
    }

    /// The status to believe: a `running` record whose process is gone was killed (or crashed) before it could
    /// write its end, so it counts as failed.
    pub fn effective_status(&self) -> RunStatus {
        match self.status {
            RunStatus::Running if !process_alive(self.pid) => RunStatus::Failed,
            status => status,
        }
    }

    /// The error to show: the recorded one, or what a vanished process means.
    pub fn effective_error(&self) -> Option<String> {
        match (self.status, self.effective_status()) {
            (RunStatus::Running, RunStatus::Failed) => {
                Some(format!("process {} ended without recording how (killed, or crashed)", self.pid))
            }
            _ => self.error.clone(),
        }
    }
}

/// The status of a run from its records: running while any process runs, failed if any failed, finished when all
/// finished.
pub fn combined_status(records: &[RunRecord]) -> RunStatus {
    let statuses: Vec<RunStatus> = records.iter().map(RunRecord::effective_status).collect();
    if statuses.is_empty() {
        RunStatus::Unknown
    } else if statuses.contains(&RunStatus::Running) {
        RunStatus::Running
    } else if statuses.contains(&RunStatus::Failed) {
        RunStatus::Failed
    } else {
        RunStatus::Finished
    }
}

/// Whether `pid` is a live `trinity` process. Pids are reused, so the program of the process's command line must be
/// `trinity`; without `/proc` (not Linux) the record is believed.
fn process_alive(pid: u32) -> bool {
    let proc = Path::new("/proc");
    if !proc.is_dir() {
        return true;
    }
    let cmdline: PathBuf = proc.join(pid.to_string()).join("cmdline");
    match std::fs::read(cmdline) {
        Ok(bytes) => {
            let program = bytes.split(|b| *b == 0).next().unwrap_or_default();
            String::from_utf8_lossy(program).rsplit('/').next() == Some("trinity")
        }
        Err(_) => false,
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn record(role: &str, status: RunStatus, pid: u32) -> RunRecord {
        RunRecord {
            role: role.to_owned(),
            status,
            pid,
            config: "/x/config.yaml".to_owned(),
            project: "p".to_owned(),
            group: String::new(),
            name: "n".to_owned(),
            mode: "both".to_owned(),
            model_path: "/models/tiny".to_owned(),
            started_at: 1,
            ended_at: None,
            error: None,
        }
    }

    #[test]
    fn records_round_trip_and_end_with_their_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut started = record("trinity", RunStatus::Running, 1);
        started.write(dir.path()).unwrap();
        assert_eq!(RunRecord::read_all(dir.path()), [started.clone()]);
        started.finish(dir.path(), Some("run: out of memory".into())).unwrap();
        let read = RunRecord::read_all(dir.path());
        assert_eq!(read[0].status, RunStatus::Failed);
        assert_eq!(read[0].error.as_deref(), Some("run: out of memory"));
        assert!(read[0].ended_at.is_some());
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path().join(STATUS_DIR)).unwrap().count(), 1);
    }

    #[test]
    fn a_running_record_of_a_vanished_process_counts_as_failed() {
        // Pid 0 is never a user process, and this test binary's program is not `trinity`.
        let gone = record("explorer", RunStatus::Running, 0);
        assert_eq!(gone.effective_status(), RunStatus::Failed);
        assert!(gone.effective_error().unwrap().contains("without recording"), "{:?}", gone.effective_error());
        let mine = record("trainer", RunStatus::Running, std::process::id());
        assert_eq!(mine.effective_status(), RunStatus::Failed, "a pid that is not trinity's is not believed");
        let finished = record("trinity", RunStatus::Finished, 0);
        assert_eq!(finished.effective_status(), RunStatus::Finished);
    }

    #[test]
    fn the_run_status_combines_its_processes() {
        let finished = record("a", RunStatus::Finished, 0);
        let failed = record("b", RunStatus::Failed, 0);
        assert_eq!(combined_status(&[]), RunStatus::Unknown);
        assert_eq!(combined_status(std::slice::from_ref(&finished)), RunStatus::Finished);
        assert_eq!(combined_status(&[finished, failed]), RunStatus::Failed);
    }
}
