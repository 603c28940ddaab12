//! A run's experiences file (`experiences.jsonl`, `<explorer>_experiences.jsonl`), browsed by step and task group
//! without ever holding it in memory.
//!
//! The index keeps, per experience, where its line starts and the few fields filters and group statistics need
//! (step, task, run, group, reward, truncation, response length): tens of bytes instead of the tokens, logprobs
//! and texts of a line that may take kilobytes. It is built by streaming the file once and then extended with the
//! lines appended since (`tail::Tail`); a page of rows reads just those lines again from
//! their offsets. A malformed line is counted and skipped; a partial last line waits until it is complete.

use std::collections::BTreeMap;
use std::fs::File;

use serde::de::{IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::tail::{IndexEntry, Indexed, LineIndex, read_object_at};

/// What the index keeps of one experience.
#[derive(Debug, Clone, PartialEq)]
pub struct Experience {
    step: u64,
    task: u64,
    run: u64,
    group: Box<str>,
    reward: f64,
    truncated: bool,
    response_tokens: usize,
}

/// The parts of an experience line the index reads; serde skips the rest without building it.
#[derive(Deserialize)]
struct Light {
    eid: LightEid,
    #[serde(default)]
    group_id: Option<String>,
    #[serde(default)]
    reward: f64,
    #[serde(default)]
    truncate_status: Option<String>,
    #[serde(default)]
    prompt_length: usize,
    #[serde(default)]
    tokens: Count,
}

#[derive(Deserialize)]
struct LightEid {
    #[serde(default)]
    batch: u64,
    #[serde(default)]
    task: u64,
    #[serde(default)]
    run: u64,
}

/// The length of a JSON array, counted without keeping its elements.
#[derive(Default)]
struct Count(usize);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Count, D::Error> {
        struct Counter;
        impl<'de> Visitor<'de> for Counter {
            type Value = Count;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
                let mut n = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(Count(n))
            }
        }
        deserializer.deserialize_seq(Counter)
    }
}

/// Which experiences a page shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    pub step: Option<u64>,
    pub group: Option<String>,
    pub reward_min: Option<f64>,
    pub reward_max: Option<f64>,
    /// `Some(true)`: only truncated responses; `Some(false)`: only complete ones.
    pub truncated: Option<bool>,
}

impl IndexEntry for Experience {
    type Filter = Filter;

    fn parse(text: &[u8]) -> Option<Experience> {
        let light: Light = serde_json::from_slice(text).ok()?;
        Some(Experience {
            step: light.eid.batch,
            task: light.eid.task,
            run: light.eid.run,
            group: light.group_id.unwrap_or_else(|| format!("{}/{}", light.eid.batch, light.eid.task)).into_boxed_str(),
            reward: light.reward,
            truncated: light.truncate_status.is_some(),
            response_tokens: light.tokens.0.saturating_sub(light.prompt_length),
        })
    }

    fn step(&self) -> u64 {
        self.step
    }

    fn kept_by(&self, filter: &Filter) -> bool {
        filter.step.is_none_or(|step| self.step == step)
            && filter.group.as_deref().is_none_or(|group| &*self.group == group)
            && filter.reward_min.is_none_or(|min| self.reward >= min)
            && filter.reward_max.is_none_or(|max| self.reward <= max)
            && filter.truncated.is_none_or(|truncated| self.truncated == truncated)
    }
}

/// One explore step in the file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepCount {
    pub step: u64,
    pub experiences: usize,
}

/// The runs of one task in a step, summarised.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupSummary {
    pub group: String,
    pub task: u64,
    pub experiences: usize,
    pub reward_mean: f64,
    pub reward_min: f64,
    pub reward_max: f64,
    pub truncated: usize,
}

/// The index of one experiences file.
pub type ExperienceIndex = LineIndex<Experience>;

impl LineIndex<Experience> {
    /// Every step in the file with its number of experiences, in step order.
    pub fn steps(&self) -> Vec<StepCount> {
        self.step_counts().into_iter().map(|(step, experiences)| StepCount { step, experiences }).collect()
    }

    /// The experiences `filter` keeps: how many, and the rows of `limit` of them from the `offset`-th on, read
    /// from the file.
    pub fn page(&self, filter: &Filter, offset: usize, limit: usize) -> std::io::Result<(usize, Vec<Value>)> {
        self.read_page(filter, offset, limit, read_row)
    }

    /// The groups of `step`, best mean reward first.
    pub fn groups(&self, step: u64) -> Vec<GroupSummary> {
        let mut groups: BTreeMap<&str, GroupSummary> = BTreeMap::new();
        for entry in self.entries().filter(|entry| entry.step == step) {
            let group = groups.entry(&*entry.group).or_insert_with(|| GroupSummary {
                group: entry.group.to_string(),
                task: entry.task,
                experiences: 0,
                reward_mean: 0.0,
                reward_min: f64::INFINITY,
                reward_max: f64::NEG_INFINITY,
                truncated: 0,
            });
            group.experiences += 1;
            group.reward_mean += entry.reward;
            group.reward_min = group.reward_min.min(entry.reward);
            group.reward_max = group.reward_max.max(entry.reward);
            group.truncated += usize::from(entry.truncated);
        }
        let mut groups: Vec<GroupSummary> = groups.into_values().collect();
        for group in &mut groups {
            group.reward_mean /= group.experiences as f64;
        }
        groups.sort_by(|a, b| b.reward_mean.total_cmp(&a.reward_mean).then(a.task.cmp(&b.task)));
        groups
    }
}

/// One experience line read again from its offset, shaped for the page: the response's tokens beside their
/// logprobs and advantages, the run coordinates, and the reward with its components.
fn read_row(file: &mut File, line: &Indexed<Experience>) -> std::io::Result<Value> {
    let mut full = read_object_at(file, line.offset, line.len)?;
    let entry = &line.entry;
    let tokens: Vec<Value> = match full.remove("tokens") {
        Some(Value::Array(tokens)) => tokens,
        _ => Vec::new(),
    };
    let prompt_length = full.get("prompt_length").and_then(Value::as_u64).unwrap_or(0) as usize;
    let response_tokens: Vec<Value> = tokens.get(prompt_length.min(tokens.len())..).unwrap_or_default().to_vec();
    let mut row = Map::new();
    row.insert("uid".into(), format!("{}/{}/{}", entry.step, entry.task, entry.run).into());
    row.insert("step".into(), entry.step.into());
    row.insert("task".into(), entry.task.into());
    row.insert("run".into(), entry.run.into());
    row.insert("group".into(), entry.group.to_string().into());
    row.insert("prompt_tokens".into(), prompt_length.into());
    row.insert("response_tokens".into(), Value::Array(response_tokens));
    for key in [
        "reward",
        "metrics",
        "advantages",
        "logprobs",
        "action_mask",
        "token_level_rewards",
        "truncate_status",
        "model_version",
        "prompt_text",
        "response_text",
        "info",
    ] {
        row.insert(key.into(), full.remove(key).unwrap_or(Value::Null));
    }
    Ok(Value::Object(row))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Write;
    use std::path::Path;

    use super::*;

    /// An experience line as `JsonlWriter` writes one (the fields the studio reads, and a few it passes on).
    pub(crate) fn line(step: u64, task: u64, run: u64, reward: f64, truncated: bool) -> String {
        let mut value = serde_json::json!({
            "eid": {"batch": step, "task": task, "run": run, "step": 0},
            "group_id": format!("{step}/{task}"),
            "tokens": [1, 2, 3, 10 + run, 11, 12],
            "prompt_length": 3,
            "logprobs": [-0.1, -2.0, -0.5],
            "action_mask": [true, true, true],
            "reward": reward,
            "advantages": [0.5, 0.5, 0.5],
            "info": {},
            "metrics": {"accuracy": reward},
            "prompt_text": format!("prompt {task}"),
            "response_text": format!("answer {run}"),
            "model_version": step - 1,
        });
        if truncated {
            value["truncate_status"] = "response_truncated".into();
        }
        format!("{value}\n")
    }

    pub(crate) fn write(path: &Path, text: &str) {
        std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap().write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn pages_filter_and_read_rows_from_their_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("experiences.jsonl");
        let mut text = String::new();
        for step in 1..=3 {
            for task in 0..2 {
                for run in 0..2 {
                    text += &line(step, task, run, (task * 2 + run) as f64 / 4.0, run == 1 && task == 0);
                }
            }
        }
        write(&path, &text);
        let mut index = ExperienceIndex::new(&path);
        index.refresh().unwrap();
        assert_eq!(index.len(), 12);
        assert_eq!(index.steps(), (1..=3).map(|step| StepCount { step, experiences: 4 }).collect::<Vec<_>>());
        let (total, rows) = index.page(&Filter { step: Some(2), ..Filter::default() }, 1, 2).unwrap();
        assert_eq!(total, 4);
        assert_eq!(rows.iter().map(|r| r["uid"].as_str().unwrap()).collect::<Vec<_>>(), ["2/0/1", "2/1/0"]);
        assert_eq!(rows[0]["response_tokens"], serde_json::json!([11, 11, 12]));
        assert_eq!(rows[0]["truncate_status"], "response_truncated");
        assert_eq!(rows[0]["response_text"], "answer 1");
        let high = Filter { reward_min: Some(0.5), ..Filter::default() };
        let (total, rows) = index.page(&high, 0, 100).unwrap();
        assert_eq!(total, 6);
        assert!(rows.iter().all(|r| r["reward"].as_f64().unwrap() >= 0.5));
        let truncated = Filter { truncated: Some(true), reward_max: Some(0.3), ..Filter::default() };
        assert_eq!(index.page(&truncated, 0, 100).unwrap().0, 3);
    }

    #[test]
    fn groups_rank_by_mean_reward() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("experiences.jsonl");
        write(&path, &(line(1, 0, 0, 0.0, false) + &line(1, 0, 1, 1.0, true) + &line(1, 1, 0, 1.0, false)));
        let mut index = ExperienceIndex::new(&path);
        index.refresh().unwrap();
        let groups = index.groups(1);
        assert_eq!(groups.iter().map(|g| g.group.as_str()).collect::<Vec<_>>(), ["1/1", "1/0"]);
        assert_eq!((groups[1].reward_mean, groups[1].reward_min, groups[1].reward_max), (0.5, 0.0, 1.0));
        assert_eq!(groups[1].truncated, 1);
        assert!(index.groups(9).is_empty());
    }

    #[test]
    fn grows_with_the_file_and_skips_what_is_not_an_experience() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("experiences.jsonl");
        let second = line(1, 0, 1, 1.0, false);
        let (head, tail) = second.split_at(20);
        write(&path, &(line(1, 0, 0, 0.0, false) + "{not json\n" + head));
        let mut index = ExperienceIndex::new(&path);
        index.refresh().unwrap();
        assert_eq!((index.len(), index.skipped()), (1, 1));
        write(&path, tail);
        index.refresh().unwrap();
        assert_eq!(index.len(), 2);
        let (_, rows) = index.page(&Filter::default(), 1, 1).unwrap();
        assert_eq!(rows[0]["uid"], "1/0/1");
    }
}
