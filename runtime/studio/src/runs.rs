//! The runs under a checkpoint root, found by walking it.
//!
//! A run directory is `<root>/<project>/[<group>/]<name>/` (a staged run adds `<stage>/` below it): a directory
//! with a `monitor/` or `status/` folder, an experiences file or a checkpoint. The walk stops at a run
//! directory, except below a staged run (`stage_meta.json`), whose stages are runs of their own, and never
//! enters the folders a run keeps inside (checkpoints, buffer, logs). A run's id is its path relative to the
//! root with `/` separators; ids from a request are checked to stay inside the root.

use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use crate::error::StudioError;
use crate::run_record::{RunRecord, RunStatus, combined_status};

/// How deep below the root a run directory may be: project / group / name / stage.
const MAX_DEPTH: usize = 4;

/// Folders inside a run directory that are never runs.
const RUN_PARTS: &[&str] = &["monitor", "status", "log", "buffer", "sync", "hf", "tensorboard"];

/// What the runs table shows of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSummary {
    pub id: String,
    pub project: String,
    pub group: String,
    pub name: String,
    pub mode: Option<String>,
    pub status: RunStatus,
    pub error: Option<String>,
    /// The highest step with metrics.
    pub steps_done: Option<u64>,
    pub total_steps: Option<u64>,
    /// The last `rollout/reward_mean`.
    pub last_reward: Option<f64>,
    /// The last eval accuracy (`eval/<taskset>/accuracy`), with its metric name.
    pub eval_accuracy: Option<f64>,
    pub eval_metric: Option<String>,
    pub model: Option<String>,
    /// Complete checkpoints (`global_step_N` with `meta.json`).
    pub checkpoints: Vec<u64>,
    /// Seconds since the Unix epoch of the newest metrics (or the run directory).
    pub updated_at: Option<u64>,
    /// The processes' records (roles, pids, configs).
    pub records: Vec<RunRecord>,
}

/// Every run directory under `root`, as ids, sorted.
pub fn find_runs(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    walk(root, root, 0, &mut found);
    found.sort();
    found
}

fn walk(root: &Path, dir: &Path, depth: usize, found: &mut Vec<String>) {
    if depth > MAX_DEPTH {
        return;
    }
    let staged = dir.join("stage_meta.json").is_file();
    if depth > 0 && is_run(dir) {
        found.push(id_of(root, dir));
        if !staged {
            return;
        }
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut children: Vec<PathBuf> = entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            !name.starts_with('.') && !name.starts_with("global_step_") && !RUN_PARTS.contains(&&*name)
        })
        .map(|entry| entry.path())
        .collect();
    children.sort();
    for child in children {
        walk(root, &child, depth + 1, found);
    }
}

fn is_run(dir: &Path) -> bool {
    dir.join("monitor").is_dir()
        || dir.join(crate::run_record::STATUS_DIR).is_dir()
        || !experience_files(dir).is_empty()
        || !failed_task_files(dir).is_empty()
        || !checkpoints(dir).is_empty()
}

fn id_of(root: &Path, dir: &Path) -> String {
    let relative = dir.strip_prefix(root).unwrap_or(dir);
    relative.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/")
}

/// The directory of run `id`, checked to be a directory inside `root` (no `..`, no absolute path, no link out).
pub fn run_dir(root: &Path, id: &str) -> Result<PathBuf, StudioError> {
    let unknown = || StudioError::UnknownRun { id: id.to_owned(), root: root.to_owned() };
    let relative = Path::new(id);
    if id.is_empty() || !relative.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(unknown());
    }
    let dir = root.join(relative);
    let (Ok(real_root), Ok(real_dir)) = (root.canonicalize(), dir.canonicalize()) else { return Err(unknown()) };
    if !real_dir.starts_with(&real_root) || !real_dir.is_dir() {
        return Err(unknown());
    }
    Ok(dir)
}

/// The metrics files of a run: `monitor/metrics.jsonl`, then each role's `monitor/<role>/metrics.jsonl`.
pub fn metrics_files(dir: &Path) -> Vec<PathBuf> {
    let monitor = dir.join("monitor");
    let mut files = vec![monitor.join("metrics.jsonl")];
    if let Ok(entries) = std::fs::read_dir(&monitor) {
        let mut roles: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("metrics.jsonl")).collect();
        roles.sort();
        files.extend(roles);
    }
    files.retain(|file| file.is_file());
    files
}

/// The planned steps of a run, from the `plan.json` its monitors wrote (the largest, over roles).
pub fn planned_steps(dir: &Path) -> Option<u64> {
    let monitor = dir.join("monitor");
    let mut plans = vec![monitor.join("plan.json")];
    if let Ok(entries) = std::fs::read_dir(&monitor) {
        plans.extend(entries.flatten().map(|e| e.path().join("plan.json")));
    }
    plans
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .filter_map(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .filter_map(|plan| plan.get("total_steps").and_then(serde_json::Value::as_u64))
        .max()
}

/// The experiences files of a run (file names): `experiences.jsonl` (modes both / colocate) first, then each
/// explorer's or server's `<name>_experiences.jsonl`.
pub fn experience_files(dir: &Path) -> Vec<String> {
    files_named(dir, "experiences.jsonl")
}

/// The failed-task files of a run (file names): `failed_tasks.jsonl` first, then each explorer's
/// `<name>_failed_tasks.jsonl`.
pub fn failed_task_files(dir: &Path) -> Vec<String> {
    files_named(dir, "failed_tasks.jsonl")
}

/// The files of `dir` named `base` or `<prefix>_<base>`, `base` first.
fn files_named(dir: &Path, base: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let suffix = format!("_{base}");
    let mut files: Vec<String> = entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_file()))
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name == base || name.ends_with(&suffix))
        .collect();
    files.sort_by_key(|name| (name != base, name.clone()));
    files
}

/// The steps of the complete checkpoints of a run.
pub fn checkpoints(dir: &Path) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut steps: Vec<u64> = entries
        .flatten()
        .filter_map(|entry| {
            let step = entry.file_name().to_string_lossy().strip_prefix("global_step_")?.parse().ok()?;
            entry.path().join("meta.json").is_file().then_some(step)
        })
        .collect();
    steps.sort_unstable();
    steps
}

/// Project, group and name of a run: from its record when there is one, else from its id (first part the
/// project, last the name, the rest the group).
pub fn names_of(id: &str, records: &[RunRecord]) -> (String, String, String) {
    if let Some(record) = records.first() {
        return (record.project.clone(), record.group.clone(), record.name.clone());
    }
    let parts: Vec<&str> = id.split('/').collect();
    match parts.as_slice() {
        [name] => (String::new(), String::new(), (*name).to_owned()),
        [project, middle @ .., name] => ((*project).to_owned(), middle.join("/"), (*name).to_owned()),
        [] => (String::new(), String::new(), String::new()),
    }
}

/// Seconds since the Unix epoch when `path` was last modified.
pub fn modified(path: &Path) -> Option<u64> {
    let time = std::fs::metadata(path).ok()?.modified().ok()?;
    time.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs())
}

/// The status of a run from its records.
pub fn status_of(records: &[RunRecord]) -> (RunStatus, Option<String>) {
    let error = records.iter().find_map(RunRecord::effective_error);
    (combined_status(records), error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkdir(path: &Path) {
        std::fs::create_dir_all(path).unwrap();
    }

    #[test]
    fn finds_runs_at_any_depth_and_the_stages_of_a_staged_run() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        mkdir(&root.join("p/n/monitor"));
        mkdir(&root.join("p/n/global_step_2"));
        std::fs::write(root.join("p/n/global_step_2/meta.json"), "{}").unwrap();
        mkdir(&root.join("p/g/n2/status"));
        mkdir(&root.join("q/staged/status"));
        std::fs::write(root.join("q/staged/stage_meta.json"), "{}").unwrap();
        mkdir(&root.join("q/staged/sft/monitor"));
        mkdir(&root.join("q/staged/grpo/monitor"));
        std::fs::write(root.join("q/async.txt"), "").unwrap();
        mkdir(&root.join("r/only_experiences"));
        std::fs::write(root.join("r/only_experiences/explorer_experiences.jsonl"), "").unwrap();
        mkdir(&root.join("empty/project"));
        assert_eq!(
            find_runs(root),
            ["p/g/n2", "p/n", "q/staged", "q/staged/grpo", "q/staged/sft", "r/only_experiences"]
        );
        assert_eq!(checkpoints(&root.join("p/n")), [2]);
        assert_eq!(names_of("p/g/n2", &[]), ("p".into(), "g".into(), "n2".into()));
        assert_eq!(experience_files(&root.join("r/only_experiences")), ["explorer_experiences.jsonl"]);
        std::fs::write(root.join("r/only_experiences/b_failed_tasks.jsonl"), "").unwrap();
        std::fs::write(root.join("r/only_experiences/failed_tasks.jsonl"), "").unwrap();
        assert_eq!(failed_task_files(&root.join("r/only_experiences")), ["failed_tasks.jsonl", "b_failed_tasks.jsonl"]);
    }

    #[test]
    fn ids_cannot_leave_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        mkdir(&root.join("p/n"));
        mkdir(&dir.path().join("outside"));
        assert!(run_dir(&root, "p/n").is_ok());
        for id in ["", "../outside", "/etc", "p/../../outside", "p/missing"] {
            let error = run_dir(&root, id).unwrap_err();
            assert!(matches!(error, StudioError::UnknownRun { .. }), "{id}: {error}");
        }
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(dir.path().join("outside"), root.join("p/link")).unwrap();
            assert!(run_dir(&root, "p/link").is_err(), "a link out of the root is refused");
        }
    }

    #[test]
    fn the_plan_of_each_role_counts() {
        let dir = tempfile::tempdir().unwrap();
        mkdir(&dir.path().join("monitor/trainer"));
        assert_eq!(planned_steps(dir.path()), None);
        std::fs::write(dir.path().join("monitor/trainer/plan.json"), r#"{"total_steps": 12}"#).unwrap();
        std::fs::write(dir.path().join("monitor/plan.json"), r#"{"total_steps": null}"#).unwrap();
        assert_eq!(planned_steps(dir.path()), Some(12));
    }
}
