//! Metrics as components report them: flat names to numbers, and Trinity-RFT's `aggregate_metrics` over groups.

use std::collections::BTreeMap;

/// Metric name → value, sorted by name so output is stable.
pub type Metrics = BTreeMap<String, f64>;

/// Trinity-RFT's `aggregate_metrics(per_group, prefix)` for plain (mean-type) keys: each key becomes
/// `{prefix}/{key}/mean`, `/max` and `/min` over the groups that report it.
pub fn aggregate_groups(per_group: &[Vec<(&'static str, f64)>], prefix: &str) -> Metrics {
    let mut values: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for group in per_group {
        for (key, value) in group {
            values.entry(key).or_default().push(*value);
        }
    }
    let mut out = Metrics::new();
    for (key, vals) in values {
        let mean = vals.iter().sum::<f64>() / vals.len() as f64;
        let max = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let min = vals.iter().copied().fold(f64::INFINITY, f64::min);
        out.insert(format!("{prefix}/{key}/mean"), mean);
        out.insert(format!("{prefix}/{key}/max"), max);
        out.insert(format!("{prefix}/{key}/min"), min);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_max_min_per_key() {
        let m = aggregate_groups(&[vec![("reward_mean", 1.0)], vec![("reward_mean", 3.0)]], "group_advantages");
        assert_eq!(m["group_advantages/reward_mean/mean"], 2.0);
        assert_eq!(m["group_advantages/reward_mean/max"], 3.0);
        assert_eq!(m["group_advantages/reward_mean/min"], 1.0);
        assert!(aggregate_groups(&[], "p").is_empty());
    }
}
