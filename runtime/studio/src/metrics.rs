//! A run's `metrics.jsonl`, read incrementally while the run appends to it.
//!
//! The file is parsed once and then only its new bytes are read on each refresh, so a page that polls every few
//! seconds costs a `stat` and the lines written since. Only complete lines count: a line the run is writing
//! right now (no newline yet) waits for the next refresh. A malformed line is skipped and remembered with its
//! line number (a crash can leave one, and a person may have edited the file); it never hides the other steps. A
//! file that shrank or was replaced (another inode) is read again from the start.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

/// A line that could not be read as a step's metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SkippedLine {
    pub line: usize,
    pub reason: String,
}

/// At most this many skipped lines are remembered (their count is always exact).
const SKIPPED_KEPT: usize = 20;

#[derive(Debug, Clone)]
struct Row {
    step: u64,
    /// (name index, value); `NaN` where the file has `null` (a NaN or infinite value when it was written).
    values: Vec<(usize, f64)>,
}

/// One metrics file and what was parsed of it so far.
#[derive(Debug)]
pub struct MetricsLog {
    path: PathBuf,
    /// Every byte before this offset was parsed (it always ends a line).
    consumed: u64,
    identity: Option<(u64, u64)>,
    lines: usize,
    names: Vec<String>,
    index: HashMap<String, usize>,
    rows: Vec<Row>,
    skipped: Vec<SkippedLine>,
    skipped_count: usize,
}

impl MetricsLog {
    pub fn new(path: &Path) -> MetricsLog {
        MetricsLog {
            path: path.to_owned(),
            consumed: 0,
            identity: None,
            lines: 0,
            names: Vec::new(),
            index: HashMap::new(),
            rows: Vec::new(),
            skipped: Vec::new(),
            skipped_count: 0,
        }
    }

    /// Reads what was appended since the last refresh (everything, the first time or after the file was
    /// replaced). An error (the file is gone) leaves what was parsed untouched.
    pub fn refresh(&mut self) -> std::io::Result<()> {
        let mut file = std::fs::File::open(&self.path)?;
        let meta = file.metadata()?;
        let identity = identity(&meta);
        if identity != self.identity || meta.len() < self.consumed {
            let path = std::mem::take(&mut self.path);
            *self = MetricsLog::new(&path);
            self.identity = identity;
        }
        if meta.len() == self.consumed {
            return Ok(());
        }
        file.seek(SeekFrom::Start(self.consumed))?;
        let mut fresh = Vec::with_capacity((meta.len() - self.consumed) as usize);
        file.take(meta.len() - self.consumed).read_to_end(&mut fresh)?;
        let Some(end) = fresh.iter().rposition(|b| *b == b'\n') else { return Ok(()) };
        for line in fresh[..end].split(|b| *b == b'\n') {
            self.lines += 1;
            self.parse_line(line);
        }
        self.consumed += end as u64 + 1;
        Ok(())
    }

    fn parse_line(&mut self, line: &[u8]) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let row = match serde_json::from_slice::<Value>(line) {
            Ok(Value::Object(object)) => object,
            Ok(_) => return self.skip("not a JSON object".to_owned()),
            Err(error) => return self.skip(format!("not JSON: {error}")),
        };
        let Some(step) = row.get("step").and_then(Value::as_u64) else {
            return self.skip("no `step` number".to_owned());
        };
        let mut values = Vec::with_capacity(row.len());
        for (name, value) in row {
            if name == "step" {
                continue;
            }
            let value = match value {
                Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
                Value::Null => f64::NAN,
                // A metric is a number; anything else (a string someone wrote by hand) is not plotted.
                _ => continue,
            };
            let next = self.names.len();
            let index = *self.index.entry(name.clone()).or_insert(next);
            if index == next {
                self.names.push(name);
            }
            values.push((index, value));
        }
        self.rows.push(Row { step, values });
    }

    fn skip(&mut self, reason: String) {
        self.skipped_count += 1;
        if self.skipped.len() < SKIPPED_KEPT {
            self.skipped.push(SkippedLine { line: self.lines, reason });
        }
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn skipped(&self) -> (&[SkippedLine], usize) {
        (&self.skipped, self.skipped_count)
    }

    /// The highest step recorded.
    pub fn max_step(&self) -> Option<u64> {
        self.rows.iter().map(|row| row.step).max()
    }

    /// The last finite value of `name`, with its step.
    pub fn last(&self, name: &str) -> Option<(u64, f64)> {
        let index = *self.index.get(name)?;
        self.rows
            .iter()
            .rev()
            .find_map(|row| row.values.iter().find(|(i, v)| *i == index && v.is_finite()).map(|(_, v)| (row.step, *v)))
    }
}

#[cfg(unix)]
fn identity(meta: &std::fs::Metadata) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    Some((meta.dev(), meta.ino()))
}

#[cfg(not(unix))]
fn identity(_: &std::fs::Metadata) -> Option<(u64, u64)> {
    None
}

/// The reward metrics a run may have, most telling first: what the explorer's rollouts earned, or for a run that
/// only trains, the mean reward of the batches it read from the buffer.
const REWARDS: [&str; 2] = ["rollout/reward_mean", "buffer/reward_mean"];

/// The metrics the Curves page opens on, of a run whose metrics have `names`: its reward (the first of
/// [`REWARDS`] it has) and every taskset's accuracy, `eval/<taskset>/accuracy` (and `bench/<taskset>/accuracy` of
/// mode `bench`, whose whole result they are). An accuracy is a whole metric, not a workflow's
/// `eval/<taskset>/accuracy/mean` reward component, so the taskset is one path segment.
pub fn headline<S: AsRef<str>>(names: &[S]) -> Vec<String> {
    let has = |wanted: &str| names.iter().any(|name| name.as_ref() == wanted);
    let reward = REWARDS.into_iter().find(|name| has(name)).map(str::to_owned);
    let mut accuracies: Vec<String> = names
        .iter()
        .map(AsRef::as_ref)
        .filter(|name| {
            let Some((prefix, rest)) = name.split_once('/') else { return false };
            let taskset = rest.strip_suffix("/accuracy").unwrap_or("");
            matches!(prefix, "eval" | "bench") && !taskset.is_empty() && !taskset.contains('/')
        })
        .map(str::to_owned)
        .collect();
    accuracies.sort();
    accuracies.dedup();
    reward.into_iter().chain(accuracies).collect()
}

/// Metric series aligned on one step axis, as a chart takes them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Series {
    pub steps: Vec<u64>,
    /// One value per step (`null` where the step has none), by metric name.
    pub values: BTreeMap<String, Vec<Option<f64>>>,
}

/// The series of `names` over several files of one run (`monitor/metrics.jsonl` and each role's), aligned on
/// the union of their steps. A step recorded twice (a resumed run records its first step again) keeps the later
/// value.
pub fn series(logs: &[&MetricsLog], names: &[String]) -> Series {
    let mut by_step: BTreeMap<u64, HashMap<&str, f64>> = BTreeMap::new();
    for log in logs {
        let wanted: HashMap<usize, &str> =
            names.iter().filter_map(|name| Some((*log.index.get(name)?, name.as_str()))).collect();
        for row in &log.rows {
            let slot = by_step.entry(row.step).or_default();
            for (index, value) in &row.values {
                if let Some(name) = wanted.get(index) {
                    slot.insert(*name, *value);
                }
            }
        }
    }
    let steps: Vec<u64> = by_step.keys().copied().collect();
    let values = names
        .iter()
        .map(|name| {
            let column =
                by_step.values().map(|row| row.get(name.as_str()).copied().filter(|v| v.is_finite())).collect();
            (name.clone(), column)
        })
        .collect();
    Series { steps, values }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn append(path: &Path, text: &str) {
        std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap().write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn reads_appended_lines_and_waits_for_a_partial_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        append(&path, "{\"step\": 1, \"rollout/reward_mean\": 0.5, \"x\": null}\n{\"step\": 2, \"rollout/rew");
        let mut log = MetricsLog::new(&path);
        log.refresh().unwrap();
        assert_eq!(log.max_step(), Some(1));
        assert_eq!(log.names(), ["rollout/reward_mean", "x"]);
        append(&path, "ard_mean\": 0.75}\n");
        log.refresh().unwrap();
        assert_eq!(log.last("rollout/reward_mean"), Some((2, 0.75)));
        // `x` is null (NaN when written): it exists but has no finite value.
        assert_eq!(log.last("x"), None);
        assert_eq!(log.skipped().1, 0);
    }

    #[test]
    fn a_malformed_line_is_skipped_with_its_number() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        append(&path, "{\"step\": 1, \"a\": 1}\n{\"step\": 2, \"a\":\n[1]\n{\"a\": 3}\n\n{\"step\": 5, \"a\": 5}\n");
        let mut log = MetricsLog::new(&path);
        log.refresh().unwrap();
        let (skipped, count) = log.skipped();
        assert_eq!(count, 3);
        assert_eq!(skipped.iter().map(|s| s.line).collect::<Vec<_>>(), [2, 3, 4]);
        assert!(skipped[2].reason.contains("step"), "{skipped:?}");
        let series = series(&[&log], &["a".to_owned()]);
        assert_eq!(series.steps, [1, 5]);
        assert_eq!(series.values["a"], [Some(1.0), Some(5.0)]);
    }

    #[test]
    fn a_replaced_file_is_read_again_and_a_deleted_one_keeps_what_was_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        append(&path, "{\"step\": 1, \"a\": 1}\n{\"step\": 2, \"a\": 2}\n");
        let mut log = MetricsLog::new(&path);
        log.refresh().unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(log.refresh().is_err());
        assert_eq!(log.max_step(), Some(2));
        append(&path, "{\"step\": 7, \"b\": 1}\n");
        log.refresh().unwrap();
        assert_eq!(log.max_step(), Some(7));
        assert_eq!(log.names(), ["b"]);
    }

    #[test]
    fn series_of_several_files_align_on_their_steps() {
        let dir = tempfile::tempdir().unwrap();
        let explorer = dir.path().join("explorer.jsonl");
        let trainer = dir.path().join("trainer.jsonl");
        append(&explorer, "{\"step\": 1, \"rollout/reward_mean\": 0.1}\n{\"step\": 2, \"rollout/reward_mean\": 0.2}\n");
        append(&trainer, "{\"step\": 2, \"train/loss\": 0.9}\n{\"step\": 3, \"train/loss\": 0.8}\n");
        let mut logs = [MetricsLog::new(&explorer), MetricsLog::new(&trainer)];
        for log in &mut logs {
            log.refresh().unwrap();
        }
        let names = ["rollout/reward_mean".to_owned(), "train/loss".to_owned(), "absent".to_owned()];
        let series = series(&[&logs[0], &logs[1]], &names);
        assert_eq!(series.steps, [1, 2, 3]);
        assert_eq!(series.values["rollout/reward_mean"], [Some(0.1), Some(0.2), None]);
        assert_eq!(series.values["train/loss"], [None, Some(0.9), Some(0.8)]);
        assert_eq!(series.values["absent"], [None, None, None]);
    }

    #[test]
    fn the_headline_is_the_reward_then_each_taskset_accuracy() {
        let names = [
            "train/pg_loss",
            "eval/sums/accuracy",
            "eval/sums/accuracy/mean",
            "eval/addition/accuracy",
            "buffer/reward_mean",
            "rollout/reward_mean",
            "eval/accuracy",
            "eval/a/b/accuracy",
        ];
        assert_eq!(headline(&names), ["rollout/reward_mean", "eval/addition/accuracy", "eval/sums/accuracy"]);
        // A run that only trains has its buffer's reward; a bench run has only accuracies.
        assert_eq!(headline(&["buffer/reward_mean", "train/pg_loss"]), ["buffer/reward_mean"]);
        assert_eq!(headline(&["bench/gsm8k/accuracy", "bench/gsm8k/reward_mean"]), ["bench/gsm8k/accuracy"]);
        assert!(headline(&["train/pg_loss"]).is_empty());
    }
}
