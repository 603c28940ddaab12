//! `pass_rate_calculator`: each row's pass rate in this step — the mean reward of its runs — reported to the
//! task selectors (Trinity-RFT's `PassRateCalculator`, the feedback of BOTS's `difficulty_based` selector).
//!
//! Rows are identified by the experience's `info.task_index` (`{"taskset_id", "index"}`, stamped by the runner
//! on every experience, as Trinity stamps `exp.info["task_index"]`). Experiences pass through unchanged. Metrics
//! over the rows' pass rates pr (Trinity's names): `selection/valid_ratio` (0 < pr < 1),
//! `selection/strict_valid_ratio` (1/16 + 1e-3 < pr < 15/16 − 1e-3), `selection/<1_ratio`, `selection/>0_ratio`,
//! `selection/<15_16_ratio`, `selection/>1_16_ratio`.

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use trinity_buffer::Experience;
use trinity_buffer::selector::PassRates;

use crate::operator::{ExperienceOperator, OperatorEntry, OperatorOutput};

/// The `(taskset_id, index)` an experience's `info.task_index` names.
pub(crate) fn task_index(experience: &Experience) -> Option<(usize, usize)> {
    let index = experience.info.get("task_index")?.as_object()?;
    let number = |key: &str| index.get(key).and_then(Value::as_u64).and_then(|n| usize::try_from(n).ok());
    Some((number("taskset_id")?, number("index")?))
}

/// One taskset's rows in order of first appearance, and each row's rewards.
#[derive(Debug, Default)]
struct Rows {
    order: Vec<usize>,
    rewards: BTreeMap<usize, Vec<f64>>,
}

#[derive(Debug)]
struct PassRateCalculator;

impl ExperienceOperator for PassRateCalculator {
    fn apply(&self, experiences: &[Experience], _args: &Map<String, Value>) -> Result<OperatorOutput, String> {
        let mut tasksets: BTreeMap<usize, Rows> = BTreeMap::new();
        for experience in experiences {
            let (taskset_id, index) = task_index(experience).ok_or_else(|| {
                format!("experience {} has no info.task_index {{taskset_id, index}}", experience.eid.uid())
            })?;
            let rows = tasksets.entry(taskset_id).or_default();
            let runs = rows.rewards.entry(index).or_default();
            if runs.is_empty() {
                rows.order.push(index);
            }
            runs.push(experience.reward);
        }
        let mut feedback = Vec::with_capacity(tasksets.len());
        let mut all = Vec::new();
        for (taskset_id, Rows { order, rewards }) in tasksets {
            let values: Vec<f64> =
                order.iter().map(|i| rewards[i].iter().sum::<f64>() / rewards[i].len() as f64).collect();
            all.extend_from_slice(&values);
            feedback.push(PassRates { taskset_id, indices: order, values });
        }
        let ratio = |keep: &dyn Fn(f64) -> bool| {
            if all.is_empty() { 0.0 } else { all.iter().filter(|&&pr| keep(pr)).count() as f64 / all.len() as f64 }
        };
        let (low, high) = (1.0 / 16.0 + 1e-3, 15.0 / 16.0 - 1e-3);
        let metrics = BTreeMap::from([
            ("selection/valid_ratio".to_owned(), ratio(&|pr| 0.0 < pr && pr < 1.0)),
            ("selection/strict_valid_ratio".to_owned(), ratio(&|pr| low < pr && pr < high)),
            ("selection/<1_ratio".to_owned(), ratio(&|pr| pr < 1.0)),
            ("selection/>0_ratio".to_owned(), ratio(&|pr| pr > 0.0)),
            ("selection/<15_16_ratio".to_owned(), ratio(&|pr| pr < high)),
            ("selection/>1_16_ratio".to_owned(), ratio(&|pr| pr > low)),
        ]);
        Ok(OperatorOutput { experiences: experiences.to_vec(), metrics, selector_feedback: feedback })
    }
}

inventory::submit! {
    OperatorEntry {
        name: "pass_rate_calculator",
        description: "each row's mean reward this step, fed back to the difficulty_based task selector",
        build: || Box::new(PassRateCalculator),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use trinity_buffer::Eid;

    fn experience(taskset_id: usize, index: usize, reward: f64) -> Experience {
        let eid = Eid { batch: 1, task: index as u64, run: 0, step: 0 };
        let mut e = Experience::single_turn(eid, vec![1, 2, 3], 1, vec![0.0; 2]);
        e.reward = reward;
        e.info.insert("task_index".into(), json!({"taskset_id": taskset_id, "index": index}));
        e
    }

    #[test]
    fn pass_rates_per_taskset_and_row() {
        let input = [
            experience(0, 7, 1.0),
            experience(0, 7, 0.0),
            experience(1, 2, 1.0),
            experience(0, 3, 0.0),
            experience(0, 7, 1.0),
            experience(1, 2, 1.0),
        ];
        let out = PassRateCalculator.apply(&input, &Map::new()).unwrap();
        assert_eq!(out.experiences, input);
        assert_eq!(
            out.selector_feedback,
            [
                PassRates { taskset_id: 0, indices: vec![7, 3], values: vec![2.0 / 3.0, 0.0] },
                PassRates { taskset_id: 1, indices: vec![2], values: vec![1.0] },
            ]
        );
        // Rows' pass rates: 2/3, 0, 1.
        assert_eq!(out.metrics["selection/valid_ratio"], 1.0 / 3.0);
        assert_eq!(out.metrics["selection/strict_valid_ratio"], 1.0 / 3.0);
        assert_eq!(out.metrics["selection/<1_ratio"], 2.0 / 3.0);
        assert_eq!(out.metrics["selection/>0_ratio"], 2.0 / 3.0);
        assert_eq!(out.metrics["selection/<15_16_ratio"], 2.0 / 3.0);
        assert_eq!(out.metrics["selection/>1_16_ratio"], 2.0 / 3.0);
    }

    #[test]
    fn an_experience_without_its_row_is_an_error() {
        let mut e = experience(0, 1, 1.0);
        e.info.remove("task_index");
        assert!(PassRateCalculator.apply(&[e], &Map::new()).unwrap_err().contains("task_index"));
    }
}
