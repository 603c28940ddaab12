//! What an explore step or an evaluation reports about its rollouts (Trinity-RFT's names).
//!
//! Besides rewards and lengths, the numbers workflows attach to experiences (`Experience::metrics`: reward
//! components, `judge_success`, `kl_divergence`, a game's `turns`, ...) reach the step's metrics the way
//! Trinity-RFT gathers them: averaged over a task's rollouts first, then summarised over the step's tasks as
//! `<prefix>/<key>/<stat>`. A judge that never answers in its format shows as `rollout/judge_success/mean` 0, not
//! only as rewards of 0.
//!
//! Trinity-RFT 0.6.0's aggregation suffixes (`trinity/utils/metrics.py`): a key written `name:sum`, `name:max`,
//! `name:min` or `name:last` is reduced that way within a task and again over the tasks, and reported once as
//! `<prefix>/<name>/<sum|max|min|last>`; `name:mean`, a key without a suffix, or one with an unknown suffix
//! (kept as part of the name) is averaged as above.

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

/// How a workflow metric is combined (Trinity-RFT 0.6.0's `AggType`), from its key's suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Aggregation {
    Mean,
    Sum,
    Max,
    Min,
    Last,
}

impl Aggregation {
    /// `name:agg` → (name, agg); no suffix, `:mean` or an unknown suffix (which stays in the name) is a mean.
    fn parse(key: &str) -> (&str, Aggregation) {
        let Some((name, suffix)) = key.rsplit_once(':') else { return (key, Aggregation::Mean) };
        match suffix {
            "mean" => (name, Aggregation::Mean),
            "sum" => (name, Aggregation::Sum),
            "max" => (name, Aggregation::Max),
            "min" => (name, Aggregation::Min),
            "last" => (name, Aggregation::Last),
            _ => (key, Aggregation::Mean),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Aggregation::Mean => "mean",
            Aggregation::Sum => "sum",
            Aggregation::Max => "max",
            Aggregation::Min => "min",
            Aggregation::Last => "last",
        }
    }

    /// Combines `values` (in rollout, then task, order; never empty).
    fn reduce(self, values: &[f64]) -> f64 {
        match self {
            Aggregation::Mean => values.iter().sum::<f64>() / values.len().max(1) as f64,
            Aggregation::Sum => values.iter().sum(),
            Aggregation::Max => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            Aggregation::Min => values.iter().copied().fold(f64::INFINITY, f64::min),
            Aggregation::Last => values.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// The workflows' own per-experience numbers: each key combined within a task (over the rollouts that report it;
/// a mean unless its suffix says otherwise), then over the tasks that report it.
fn workflow_metrics(prefix: &str, groups: &[Vec<Experience>], stats: Stats) -> Metrics {
    let mut per_task: BTreeMap<(&str, Aggregation), Vec<f64>> = BTreeMap::new();
    for group in groups {
        let mut values: BTreeMap<(&str, Aggregation), Vec<f64>> = BTreeMap::new();
        for (key, value) in group.iter().flat_map(|e| e.metrics.iter()) {
            values.entry(Aggregation::parse(key)).or_default().push(*value);
        }
        for (key, values) in values {
            per_task.entry(key).or_default().push(key.1.reduce(&values));
        }
    }
    let mut metrics = Metrics::new();
    for ((key, aggregation), values) in per_task {
        if aggregation != Aggregation::Mean {
            metrics.insert(format!("{prefix}/{key}/{}", aggregation.label()), aggregation.reduce(&values));
            continue;
        }
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
        RunReport { groups, ..RunReport::default() }
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

    /// Trinity-RFT 0.6.0's suffixes: reduced within each task, then over the tasks, reported once by their kind.
    #[test]
    fn suffixed_metrics_are_reduced_by_their_kind_within_and_over_tasks() {
        let groups = vec![
            vec![
                experience(1.0, &[("calls:sum", 2.0), ("depth:max", 1.0), ("version:last", 3.0), ("x:mean", 1.0)]),
                experience(0.0, &[("calls:sum", 3.0), ("depth:max", 4.0), ("version:last", 4.0), ("x:mean", 0.0)]),
            ],
            vec![experience(0.5, &[("calls:sum", 1.0), ("depth:min", 2.0), ("version:last", 5.0), ("a:b", 7.0)])],
        ];
        for stats in [Stats::Rollout, Stats::Eval { detailed: false }] {
            let m = rollout_metrics("rollout", &report(groups.clone()), stats);
            assert_eq!(m["rollout/calls/sum"], 6.0, "(2 + 3) + 1");
            assert_eq!(m["rollout/depth/max"], 4.0);
            assert_eq!(m["rollout/depth/min"], 2.0);
            assert_eq!(m["rollout/version/last"], 5.0, "the last task's last run");
            assert_eq!(m["rollout/x/mean"], 0.5, "`:mean` is the plain average");
            assert_eq!(m["rollout/a:b/mean"], 7.0, "an unknown suffix stays in the name");
            assert!(!m.keys().any(|k| k.contains("calls:sum") || k == "rollout/calls/mean"), "{m:?}");
        }
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
