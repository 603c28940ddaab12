//! What an explore step or an evaluation reports about its rollouts (Trinity-RFT's names).

use trinity_buffer::Experience;
use trinity_explorer::RunReport;
use trinity_monitor::Metrics;

/// Reward and length statistics of a batch, under `prefix/`.
pub(crate) fn rollout_metrics(prefix: &str, report: &RunReport) -> Metrics {
    let rewards: Vec<f64> = report.experiences().map(|e| e.reward).collect();
    // An external model's experiences hold no tokens; their lengths come from the reply's usage.
    let lengths: Vec<f64> = report.experiences().map(trinity_explorer::response_tokens).collect();
    let mut metrics = Metrics::new();
    let n = rewards.len().max(1) as f64;
    let mean = rewards.iter().sum::<f64>() / n;
    let variance = rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n;
    metrics.insert(format!("{prefix}/reward_mean"), mean);
    metrics.insert(format!("{prefix}/reward_std"), variance.sqrt());
    metrics.insert(format!("{prefix}/reward_max"), rewards.iter().copied().fold(f64::NEG_INFINITY, f64::max));
    metrics.insert(format!("{prefix}/reward_min"), rewards.iter().copied().fold(f64::INFINITY, f64::min));
    metrics.insert(format!("{prefix}/response_length_mean"), lengths.iter().sum::<f64>() / n);
    metrics.insert(format!("{prefix}/failed_tasks"), report.failures.len() as f64);
    metrics.insert(format!("{prefix}/retries"), f64::from(report.retries));
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
