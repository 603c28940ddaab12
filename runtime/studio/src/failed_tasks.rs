//! A run's failed tasks (`failed_tasks.jsonl`, `<explorer>_failed_tasks.jsonl`, written by the explorer: one line
//! per task that failed for good, with its step, phase, task, workflow, attempts, error and row), paged like the
//! experiences: the index keeps each line's offset, step and phase, and a page reads its lines back.

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::tail::{IndexEntry, LineIndex, read_object_at};

/// What the index keeps of one failure.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    step: u64,
    phase: Box<str>,
}

/// The fields of a line the index reads.
#[derive(Deserialize)]
struct Light {
    step: u64,
    #[serde(default)]
    phase: Option<String>,
    /// Required, so that a line of some other file is not taken for a failure.
    #[serde(rename = "error")]
    _error: IgnoredAny,
}

impl IndexEntry for Failure {
    type Filter = FailedFilter;

    fn parse(text: &[u8]) -> Option<Failure> {
        let light: Light = serde_json::from_slice(text).ok()?;
        Some(Failure { step: light.step, phase: light.phase.unwrap_or_else(|| "explore".into()).into_boxed_str() })
    }

    fn step(&self) -> u64 {
        self.step
    }

    fn kept_by(&self, filter: &FailedFilter) -> bool {
        filter.step.is_none_or(|step| self.step == step)
            && filter.phase.as_deref().is_none_or(|phase| &*self.phase == phase)
    }
}

/// Which failures a page shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FailedFilter {
    pub step: Option<u64>,
    /// `explore` or `eval`.
    pub phase: Option<String>,
}

/// One step with failures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailedStep {
    pub step: u64,
    pub failed: usize,
}

/// The index of one failed-task file.
pub type FailedTaskIndex = LineIndex<Failure>;

impl LineIndex<Failure> {
    /// Every step with failures and how many, in step order.
    pub fn steps(&self) -> Vec<FailedStep> {
        self.step_counts().into_iter().map(|(step, failed)| FailedStep { step, failed }).collect()
    }

    /// The failures `filter` keeps: how many, and the records of `limit` of them from the `offset`-th on, read
    /// from the file.
    pub fn page(&self, filter: &FailedFilter, offset: usize, limit: usize) -> std::io::Result<(usize, Vec<Value>)> {
        self.read_page(filter, offset, limit, |file, line| {
            read_object_at(file, line.offset, line.len).map(Value::Object)
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::rollouts::tests::write;

    /// A line as the explorer writes one (`trinity_rft`'s `failed_tasks.rs`).
    pub(crate) fn failure(step: u64, index: usize, phase: &str) -> String {
        let value = serde_json::json!({
            "step": step, "phase": phase, "task": format!("math#{index}"), "taskset": "math", "index": index,
            "workflow": "math_workflow", "reward_fn": "math_reward", "attempts": 2,
            "error": format!("task math#{index}: the row has no prompt field `prompt`"), "model_version": step - 1,
            "time": 1_700_000_000, "row": {"question": format!("q{index}")},
        });
        format!("{value}\n")
    }

    #[test]
    fn pages_by_step_and_phase_and_waits_for_a_torn_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("failed_tasks.jsonl");
        let last = failure(3, 5, "explore");
        let (head, tail) = last.split_at(30);
        let text = failure(1, 0, "explore")
            + &failure(1, 1, "explore")
            + "{\"not\": \"a failure\"}\n"
            + &failure(2, 4, "eval")
            + head;
        write(&path, &text);
        let mut index = FailedTaskIndex::new(&path);
        index.refresh().unwrap();
        assert_eq!((index.len(), index.skipped()), (3, 1));
        assert_eq!(index.steps(), [FailedStep { step: 1, failed: 2 }, FailedStep { step: 2, failed: 1 }]);
        let (total, rows) = index.page(&FailedFilter { step: Some(1), phase: None }, 1, 5).unwrap();
        assert_eq!(total, 2);
        assert_eq!(rows[0]["task"], "math#1");
        assert_eq!(rows[0]["row"]["question"], "q1");
        assert!(rows[0]["error"].as_str().unwrap().contains("no prompt field"));
        let eval = FailedFilter { step: None, phase: Some("eval".into()) };
        assert_eq!(index.page(&eval, 0, 5).unwrap().0, 1);
        write(&path, tail);
        index.refresh().unwrap();
        let (total, rows) = index.page(&FailedFilter::default(), 3, 5).unwrap();
        assert_eq!((total, rows[0]["index"].as_u64()), (4, Some(5)));
    }
}
