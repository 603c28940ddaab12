//! What an explore step or an evaluation reports about its rollouts (Trinity-RFT's names).
//!
//! Besides rewards and lengths, the numbers workflows attach to experiences (`Experience::metrics`: reward
//! components, `judge_success`, `kl_divergence`, a game's `turns`, ...) reach the step's metrics the way
//! Trinity-RFT gathers them: averaged over a task's rollouts first, then summarised over the step's tasks as
//! `<prefix>/<key>/<stat>`. A judge that never answers in its format shows as `rollout/judge_success/mean` 0, not
//! only as rewards of 0.

use std::collections::BTreeMap;

use trinity_buffer::Experience;
use trinity_explorer::RunReport;
use trinity_monitor::Metrics;

/// Which summaries of the task-level workflow metrics a report carries (Trinity-RFT's `gather_metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stats {
    /// Explore steps: mean, max and min over the step's tasks.
    Rollout,
    /// Evaluations: the mean; with `monitor.detailed_stats` also std, max and min.
    Eval { detailed: bool },
}

impl Stats {
    fn kept(self) -> &'static [Stat] {
        match self {
            Stats::Rollout => &[Stat::Mean, Stat::Max, Stat::Min],
            Stats::Eval { detailed: false } => &[Stat::Mean],
            Stats::Eval { detailed: true } => &[Stat::Mean, Stat::Std, Stat::Max, Stat::Min],
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Stat {
    Mean,
    Std,
    Max,
    Min,
}

/// Mean, population std, max and min of a list; the mean and std of an empty list are 0.
#[derive(Debug, Clone, Copy)]
struct Summary {
    mean: f64,
    std: f64,
    max: f64,
    min: f64,
}

impl Summary {
    fn of(values: &[f64]) -> Summary {
        let n = values.len().max(1) as f64;
        let mean = values.iter().sum::<f64>() / n;
        Summary {
            mean,
            std: (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt(),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
        }
    }

    fn get(&self, stat: Stat) -> (&'static str, f64) {
        match stat {
            Stat::Mean => ("mean", self.mean),
            Stat::Std => ("std", self.std),
            Stat::Max => ("max", self.max),
            Stat::Min => ("min", self.min),
        }
    }
}

/// Reward and length statistics of a batch, under `prefix/`.
pub(crate) fn rollout_metrics(prefix: &str, report: &RunReport, stats: Stats) -> Metrics {
    let rewards: Vec<f64> = report.experiences().map(|e| e.reward).collect();
    // An external model's experiences hold no tokens; their lengths come from the reply's usage.
    let lengths: Vec<f64> = report.experiences().map(trinity_explorer::response_tokens).collect();
    let mut metrics = Metrics::new();
    let reward = Summary::of(&rewards);
    metrics.insert(format!("{prefix}/reward_mean"), reward.mean);
    metrics.insert(format!("{prefix}/reward_std"), reward.std);
    metrics.insert(format!("{prefix}/reward_max"), reward.max);
    metrics.insert(format!("{prefix}/reward_min"), reward.min);
    metrics.insert(format!("{prefix}/response_length_mean"), Summary::of(&lengths).mean);
    metrics.insert(format!("{prefix}/failed_tasks"), report.failures.len() as f64);
    metrics.insert(format!("{prefix}/retries"), f64::from(report.retries));
    metrics.extend(workflow_metrics(prefix, &report.groups, stats));
    metrics
}

/// The workflows' own per-experience numbers: each key averaged within a task (over the rollouts that report it),
/// then summarised over the tasks that report it.
fn workflow_metrics(prefix: &str, groups: &[Vec<Experience>], stats: Stats) -> Metrics {
    let mut per_task: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for group in groups {
        let mut sums: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
        for (key, value) in group.iter().flat_map(|e| e.metrics.iter()) {
            let entry = sums.entry(key.as_str()).or_default();
            entry.0 += value;
            entry.1 += 1;
        }
        for (key, (sum, count)) in sums {
            per_task.entry(key).or_default().push(sum / count as f64);
        }
    }
    let mut metrics = Metrics::new();
    for (key, values) in per_task {
        let summary = Summary::of(&values);
        for &stat in stats.kept() {
            let (name, value) = summary.get(stat);
            metrics.insert(format!("{prefix}/{key}/{name}"), value);
        }
    }
    metrics
}

/// A rollout counts as accurate when its `accuracy` reward component is 1 (math rewards), or, for rewards
/// without one (countdown's `score`), when its total reward reaches 1.
pub(crate) fn is_accurate(experience: &Experience) -> bool {
    match experience.metrics.get("accuracy") {
        Some(accuracy) => *accuracy >= 1.0,
        None => experience.reward >= 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn experience(reward: f64, metrics: &[(&str, f64)]) -> Experience {
        let mut e = Experience::single_turn(Default::default(), vec![1, 2, 3], 1, vec![0.0, 0.0]);
        e.reward = reward;
        e.metrics = metrics.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        e
    }

    fn report(groups: Vec<Vec<Experience>>) -> RunReport {
        RunReport { groups, failures: Vec::new(), retries: 0 }
    }

    #[test]
    fn workflow_metrics_average_within_a_task_then_summarise_over_tasks() {
        // Task A: judge_success 1 and 0 → 0.5; task B: 1 → 1.0. `turns` only in task B.
        let groups = vec![
            vec![experience(1.0, &[("judge_success", 1.0)]), experience(0.0, &[("judge_success", 0.0)])],
            vec![experience(0.5, &[("judge_success", 1.0), ("turns", 3.0)])],
        ];
        let m = rollout_metrics("rollout", &report(groups), Stats::Rollout);
        assert_eq!(m["rollout/judge_success/mean"], 0.75);
        assert_eq!(m["rollout/judge_success/max"], 1.0);
        assert_eq!(m["rollout/judge_success/min"], 0.5);
        assert_eq!(m["rollout/turns/mean"], 3.0);
        assert!(!m.contains_key("rollout/judge_success/std"), "explore steps report mean, max and min");
        assert_eq!(m["rollout/reward_mean"], 0.5);
    }

    #[test]
    fn evaluations_report_the_mean_and_detailed_stats_add_the_spread() {
        let groups = vec![vec![experience(1.0, &[("accuracy", 1.0)])], vec![experience(0.0, &[("accuracy", 0.0)])]];
        let plain = rollout_metrics("eval/set", &report(groups.clone()), Stats::Eval { detailed: false });
        assert_eq!(plain["eval/set/accuracy/mean"], 0.5);
        assert!(!plain.contains_key("eval/set/accuracy/std"));
        let detailed = rollout_metrics("eval/set", &report(groups), Stats::Eval { detailed: true });
        assert_eq!(detailed["eval/set/accuracy/std"], 0.5);
        assert_eq!(detailed["eval/set/accuracy/max"], 1.0);
        assert_eq!(detailed["eval/set/accuracy/min"], 0.0);
    }
}
