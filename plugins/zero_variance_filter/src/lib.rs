//! `zero_variance_filter`: drops groups whose rewards all match, as a trinity operator plugin.
//!
//! A group (the rollouts of one task) where every reward is the same gives every rollout a zero group advantage:
//! it costs a training step's compute and teaches nothing. Groups whose reward standard deviation is at most
//! `args.threshold` (default 0) are dropped. Metrics: `dropped_groups`, `kept_groups`.

use trinity_plugin_sdk::wasm::operator::{ExperienceView, Operator, OperatorOutput, groups, keep, metric};
use trinity_plugin_sdk::wasm::serde_json::{Map, Value};

struct ZeroVarianceFilter;

impl Operator for ZeroVarianceFilter {
    const NAME: &'static str = "zero_variance_filter";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    const DESCRIPTION: &'static str = "drop groups whose rewards have zero variance";

    fn apply(experiences: &[ExperienceView], args: &Map<String, Value>) -> Result<OperatorOutput, String> {
        let threshold = match args.get("threshold") {
            None | Some(Value::Null) => 0.0,
            Some(value) => value.as_f64().ok_or("args.threshold must be a number")?,
        };
        let (mut kept, mut dropped) = (Vec::new(), 0.0);
        let all = groups(experiences);
        for group in &all {
            let rewards: Vec<f64> = group.iter().map(|&i| experiences[i].reward).collect();
            if std_dev(&rewards) <= threshold {
                dropped += 1.0;
            } else {
                kept.extend(group.iter().map(|&i| keep(i)));
            }
        }
        let metrics = vec![metric("dropped_groups", dropped), metric("kept_groups", all.len() as f64 - dropped)];
        Ok(OperatorOutput { experiences: kept, metrics })
    }
}

trinity_plugin_sdk::export_operator!(ZeroVarianceFilter);

/// Population standard deviation.
fn std_dev(values: &[f64]) -> f64 {
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(group: &str, reward: f64) -> ExperienceView {
        ExperienceView {
            uid: format!("{group}/{reward}"),
            group_id: group.to_owned(),
            reward,
            prompt_length: 3,
            response_length: 2,
            action_tokens: 2,
            prompt_text: None,
            response_text: None,
            metrics: Vec::new(),
            info: "{}".to_owned(),
        }
    }

    #[test]
    fn drops_only_flat_groups() {
        let batch = [view("a", 1.0), view("b", 0.0), view("a", 1.0), view("b", 1.0)];
        let out = ZeroVarianceFilter::apply(&batch, &Map::new()).unwrap();
        let sources: Vec<u32> = out.experiences.iter().map(|u| u.source).collect();
        assert_eq!(sources, [1, 3]);
        assert_eq!(out.metrics[0].value, 1.0);
    }

    #[test]
    fn a_bad_threshold_is_an_error() {
        let mut args = Map::new();
        args.insert("threshold".into(), Value::String("x".into()));
        assert!(ZeroVarianceFilter::apply(&[], &args).is_err());
    }
}
