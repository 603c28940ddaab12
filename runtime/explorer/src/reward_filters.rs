//! Trinity-RFT's reward filters (`trinity/buffer/operators/filters/reward_filter.py`), with its names, arguments
//! and metric names:
//!
//! * `reward_filter` (`threshold` 0.0): keeps experiences with reward ≥ threshold; `filtered_count`.
//! * `reward_std_filter` (`threshold` 0.0): drops whole groups of fewer than 2 runs or whose population standard
//!   deviation of rewards is ≤ threshold (groups that teach a group-relative advantage nothing); `filtered_count`.
//! * `invalid_reward_filter`: drops experiences whose reward is NaN; `filtered_count`.
//! * `dapo_dynamic_sampling` (`metric_key` "accuracy", `correct_threshold` 0.0): DAPO's dynamic sampling
//!   (arXiv:2503.14476 §3.2) — keeps a group only when some but not all runs are correct; a run is correct when
//!   its `metric_key` metric (else its reward) is > `correct_threshold`; groups of fewer than 2 runs are
//!   dropped; `filtered_count`, `dropped_all_correct`, `dropped_all_wrong` (in experiences).
//! * `mask_response_truncated`: DAPO's overlong filtering — a response cut at the length limit keeps its place
//!   in the batch but no token of it is trained (action mask all false); `masked_truncated_count`.

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use trinity_buffer::{Experience, TruncateStatus};

use crate::operator::{ExperienceOperator, OperatorEntry, OperatorOutput, groups, number_arg};

fn output(experiences: Vec<Experience>, metrics: &[(&str, f64)]) -> OperatorOutput {
    let metrics: BTreeMap<String, f64> = metrics.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
    OperatorOutput { experiences, metrics, ..OperatorOutput::default() }
}

#[derive(Debug)]
struct RewardFilter;

impl ExperienceOperator for RewardFilter {
    fn apply(&self, experiences: &[Experience], args: &Map<String, Value>) -> Result<OperatorOutput, String> {
        let threshold = number_arg(args, "threshold", 0.0)?;
        let kept: Vec<Experience> = experiences.iter().filter(|e| e.reward >= threshold).cloned().collect();
        let filtered = (experiences.len() - kept.len()) as f64;
        Ok(output(kept, &[("filtered_count", filtered)]))
    }
}

/// Population standard deviation (NumPy's `np.std`).
fn std(values: &[f64]) -> f64 {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt()
}

#[derive(Debug)]
struct RewardStdFilter;

impl ExperienceOperator for RewardStdFilter {
    fn apply(&self, experiences: &[Experience], args: &Map<String, Value>) -> Result<OperatorOutput, String> {
        let threshold = number_arg(args, "threshold", 0.0)?;
        let mut kept = Vec::with_capacity(experiences.len());
        for group in groups(experiences) {
            let rewards: Vec<f64> = group.iter().map(|e| e.reward).collect();
            if group.len() >= 2 && std(&rewards) > threshold {
                kept.extend(group.into_iter().cloned());
            }
        }
        let filtered = (experiences.len() - kept.len()) as f64;
        Ok(output(kept, &[("filtered_count", filtered)]))
    }
}

#[derive(Debug)]
struct InvalidRewardFilter;

impl ExperienceOperator for InvalidRewardFilter {
    fn apply(&self, experiences: &[Experience], _args: &Map<String, Value>) -> Result<OperatorOutput, String> {
        let kept: Vec<Experience> = experiences.iter().filter(|e| !e.reward.is_nan()).cloned().collect();
        let filtered = (experiences.len() - kept.len()) as f64;
        Ok(output(kept, &[("filtered_count", filtered)]))
    }
}

#[derive(Debug)]
struct DapoDynamicSampling;

impl ExperienceOperator for DapoDynamicSampling {
    fn apply(&self, experiences: &[Experience], args: &Map<String, Value>) -> Result<OperatorOutput, String> {
        let metric_key = match args.get("metric_key") {
            None | Some(Value::Null) => "accuracy",
            Some(Value::String(key)) => key.as_str(),
            Some(other) => return Err(format!("args.metric_key must be a string, found {other}")),
        };
        let threshold = number_arg(args, "correct_threshold", 0.0)?;
        let correct = |e: &Experience| e.metrics.get(metric_key).copied().unwrap_or(e.reward) > threshold;
        let (mut kept, mut all_correct, mut all_wrong) = (Vec::new(), 0usize, 0usize);
        for group in groups(experiences) {
            if group.len() < 2 {
                continue;
            }
            let right = group.iter().filter(|e| correct(e)).count();
            if right == 0 {
                all_wrong += group.len();
            } else if right == group.len() {
                all_correct += group.len();
            } else {
                kept.extend(group.into_iter().cloned());
            }
        }
        let filtered = (experiences.len() - kept.len()) as f64;
        Ok(output(
            kept,
            &[
                ("filtered_count", filtered),
                ("dropped_all_correct", all_correct as f64),
                ("dropped_all_wrong", all_wrong as f64),
            ],
        ))
    }
}

#[derive(Debug)]
struct MaskResponseTruncated;

impl ExperienceOperator for MaskResponseTruncated {
    fn apply(&self, experiences: &[Experience], _args: &Map<String, Value>) -> Result<OperatorOutput, String> {
        let mut masked = 0usize;
        let out: Vec<Experience> = experiences
            .iter()
            .cloned()
            .map(|mut e| {
                if e.truncate_status == Some(TruncateStatus::ResponseTruncated) {
                    e.action_mask.iter_mut().for_each(|m| *m = false);
                    masked += 1;
                }
                e
            })
            .collect();
        Ok(output(out, &[("masked_truncated_count", masked as f64)]))
    }
}

inventory::submit! {
    OperatorEntry { name: "reward_filter", description: "keep experiences with reward >= threshold", build: || Box::new(RewardFilter) }
}
inventory::submit! {
    OperatorEntry {
        name: "reward_std_filter",
        description: "drop groups whose reward std is <= threshold (or with one run)",
        build: || Box::new(RewardStdFilter),
    }
}
inventory::submit! {
    OperatorEntry { name: "invalid_reward_filter", description: "drop experiences whose reward is NaN", build: || Box::new(InvalidRewardFilter) }
}
inventory::submit! {
    OperatorEntry {
        name: "dapo_dynamic_sampling",
        description: "DAPO dynamic sampling: keep groups with some but not all runs correct",
        build: || Box::new(DapoDynamicSampling),
    }
}
inventory::submit! {
    OperatorEntry {
        name: "mask_response_truncated",
        description: "DAPO overlong filtering: train no token of a response cut at the length limit",
        build: || Box::new(MaskResponseTruncated),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use trinity_buffer::Eid;

    /// Experiences of groups `task`, with the given rewards, in order.
    fn batch(groups: &[(u64, &[f64])]) -> Vec<Experience> {
        let mut out = Vec::new();
        for (task, rewards) in groups {
            for (run, reward) in rewards.iter().enumerate() {
                let eid = Eid { batch: 1, task: *task, run: run as u64, step: 0 };
                let mut e = Experience::single_turn(eid, vec![1, 2, 3, 4], 2, vec![0.0; 2]);
                e.reward = *reward;
                out.push(e);
            }
        }
        out
    }

    fn args(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    fn rewards(out: &OperatorOutput) -> Vec<f64> {
        out.experiences.iter().map(|e| e.reward).collect()
    }

    #[test]
    fn reward_filter_keeps_rewards_at_or_above_the_threshold() {
        let out = RewardFilter.apply(&batch(&[(0, &[-1.0, 0.0, 0.5])]), &Map::new()).unwrap();
        assert_eq!(rewards(&out), [0.0, 0.5]);
        assert_eq!(out.metrics["filtered_count"], 1.0);
        let out = RewardFilter.apply(&batch(&[(0, &[0.2, 0.5])]), &args(json!({"threshold": 0.3}))).unwrap();
        assert_eq!(rewards(&out), [0.5]);
        assert!(RewardFilter.apply(&[], &args(json!({"threshold": "x"}))).is_err());
    }

    #[test]
    fn reward_std_filter_drops_flat_and_single_groups() {
        // std of [1, 0] is 0.5; of [1, 1] is 0; a one-run group always goes.
        let input = batch(&[(0, &[1.0, 0.0]), (1, &[1.0, 1.0]), (2, &[0.3])]);
        let out = RewardStdFilter.apply(&input, &Map::new()).unwrap();
        assert_eq!(rewards(&out), [1.0, 0.0]);
        assert_eq!(out.metrics["filtered_count"], 3.0);
        let out = RewardStdFilter.apply(&input, &args(json!({"threshold": 0.5}))).unwrap();
        assert!(out.experiences.is_empty());
    }

    #[test]
    fn invalid_reward_filter_drops_nan() {
        let out = InvalidRewardFilter.apply(&batch(&[(0, &[f64::NAN, 1.0])]), &Map::new()).unwrap();
        assert_eq!(rewards(&out), [1.0]);
        assert_eq!(out.metrics["filtered_count"], 1.0);
    }

    #[test]
    fn dapo_dynamic_sampling_keeps_mixed_groups_by_accuracy() {
        let mut input = batch(&[(0, &[1.0, -1.0]), (1, &[1.0, 1.0]), (2, &[-1.0, -1.0, -1.0]), (3, &[1.0])]);
        // The metric wins over the reward: group 0's first run has a shaped reward but accuracy -1.
        input[0].metrics.insert("accuracy".into(), -1.0);
        input[1].metrics.insert("accuracy".into(), 1.0);
        let out = DapoDynamicSampling.apply(&input, &Map::new()).unwrap();
        assert_eq!(out.experiences.iter().map(|e| e.eid.task).collect::<Vec<_>>(), [0, 0]);
        assert_eq!(out.metrics["dropped_all_correct"], 2.0);
        assert_eq!(out.metrics["dropped_all_wrong"], 3.0);
        assert_eq!(out.metrics["filtered_count"], 6.0);
        // With accuracy 0/1 rewards, a threshold of 0.5 separates them the same way.
        let input = batch(&[(0, &[1.0, 0.0]), (1, &[0.0, 0.0])]);
        let out = DapoDynamicSampling.apply(&input, &args(json!({"correct_threshold": 0.5}))).unwrap();
        assert_eq!(rewards(&out), [1.0, 0.0]);
    }

    #[test]
    fn truncated_responses_are_masked_not_dropped() {
        let mut input = batch(&[(0, &[1.0, 0.0])]);
        input[1].truncate_status = Some(TruncateStatus::ResponseTruncated);
        let out = MaskResponseTruncated.apply(&input, &Map::new()).unwrap();
        assert_eq!(out.experiences.len(), 2);
        assert_eq!(out.experiences[0].action_mask, [true, true]);
        assert_eq!(out.experiences[1].action_mask, [false, false]);
        assert_eq!(out.metrics["masked_truncated_count"], 1.0);
    }
}
