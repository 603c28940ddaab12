//! The explorer-side experience pipeline, as Trinity-RFT's `ExperiencePipeline` runs it on each explore step's
//! experiences before they enter the buffer: the configured operators (`data_processor.experience_pipeline`),
//! then the group advantage of grpo-like algorithms. The explorer runs it on every explore step; serve mode on
//! every batch an agent commits.

use tch::{Kind, Tensor};
use trinity_algorithm::Batch;
use trinity_algorithm::advantage::AdvantageFn;
use trinity_algorithm::metrics::Metrics;
use trinity_algorithm::registry::{self, Kind as ComponentKind};
use trinity_buffer::Experience;
use trinity_config::Config;
use trinity_trainer::Components;

use crate::error::RftError;

/// The operators and the group advantage of a run.
#[derive(Debug)]
pub(crate) struct ExperiencePipeline {
    operators: Vec<(String, serde_json::Map<String, serde_json::Value>)>,
    advantage: Option<Box<dyn AdvantageFn>>,
}

/// What the pipeline made of a batch: the experiences for the buffer, metrics, and the pass rates an operator
/// measured for the task selectors.
#[derive(Debug, Default)]
pub(crate) struct PipelineOutput {
    pub experiences: Vec<Experience>,
    pub metrics: Metrics,
    pub selector_feedback: Vec<trinity_buffer::selector::PassRates>,
}

impl ExperiencePipeline {
    pub(crate) fn from_config(config: &Config) -> Result<ExperiencePipeline, RftError> {
        let components = Components::from_config(&config.algorithm)?;
        let operators = &config.data_processor.experience_pipeline.operators;
        Ok(ExperiencePipeline {
            operators: operators.iter().map(|op| (op.name.clone(), op.args.clone())).collect(),
            advantage: explorer_side_advantage(config, &components)?,
        })
    }

    /// Runs the operators, then the group advantage. An operator that fails is skipped for this batch and counted,
    /// never fatal, as in Trinity-RFT.
    pub(crate) async fn process(&self, experiences: Vec<Experience>) -> Result<PipelineOutput, RftError> {
        let operated = Self::run_operators(self.operators(), experiences).await;
        self.advantages(operated)
    }

    /// The configured operators (name, args), for [`Self::run_operators`].
    pub(crate) fn operators(&self) -> Vec<(String, serde_json::Map<String, serde_json::Value>)> {
        self.operators.clone()
    }

    /// Runs `operators` off the async runtime (an operator plugin may block until its deadline).
    pub(crate) async fn run_operators(
        operators: Vec<(String, serde_json::Map<String, serde_json::Value>)>,
        experiences: Vec<Experience>,
    ) -> PipelineOutput {
        if operators.is_empty() {
            return PipelineOutput { experiences, ..PipelineOutput::default() };
        }
        let output = trinity_explorer::apply_pipeline_blocking(operators, experiences).await;
        PipelineOutput {
            experiences: output.experiences,
            metrics: output.metrics,
            selector_feedback: output.selector_feedback,
        }
    }

    /// The group advantage over what the operators kept.
    pub(crate) fn advantages(&self, operated: PipelineOutput) -> Result<PipelineOutput, RftError> {
        let PipelineOutput { mut experiences, metrics, selector_feedback } = operated;
        let mut out = PipelineOutput { metrics, selector_feedback, ..PipelineOutput::default() };
        if let Some(advantage) = &self.advantage {
            let (with_advantages, metrics) = apply_group_advantage(advantage.as_ref(), experiences)?;
            experiences = with_advantages;
            out.metrics.extend(metrics.into_iter().map(|(k, v)| (format!("pipeline/{k}"), v)));
        }
        out.experiences = experiences;
        Ok(out)
    }
}

/// The advantage function the explorer's pipeline runs (group advantages), if the algorithm has one there.
fn explorer_side_advantage(config: &Config, components: &Components) -> Result<Option<Box<dyn AdvantageFn>>, RftError> {
    if components.compute_advantage_in_trainer {
        return Ok(None);
    }
    let Some(name) = config.algorithm.advantage_fn.as_deref() else {
        return Ok(None);
    };
    if components.advantage.is_none() {
        return Ok(None);
    }
    let args = registry::resolve_args(ComponentKind::AdvantageFn, name, config.algorithm.advantage_fn_args.as_ref())?;
    let (function, in_trainer) = registry::advantage_fn(name, &args)?;
    Ok(if in_trainer { None } else { Some(function) })
}

/// Computes advantages for one explore step's experiences (whole groups) and writes them into the
/// experiences. Rows the advantage function drops (e.g. `std_threshold` groups) are removed; duplicated rows
/// are repeated, as the function's output order says.
pub fn apply_group_advantage(
    advantage: &dyn AdvantageFn,
    experiences: Vec<Experience>,
) -> Result<(Vec<Experience>, Metrics), RftError> {
    if experiences.is_empty() {
        return Ok((experiences, Metrics::new()));
    }
    let width = experiences.iter().map(Experience::response_length).max().unwrap_or(0).max(1);
    let mut mask = Vec::with_capacity(experiences.len() * width);
    for experience in &experiences {
        let mut row: Vec<f32> = experience.action_mask.iter().map(|&m| if m { 1.0 } else { 0.0 }).collect();
        row.resize(width, 0.0);
        mask.extend(row);
    }
    let rows = experiences.len() as i64;
    let action_mask = Tensor::from_slice(&mask).reshape([rows, width as i64]);
    let batch = Batch {
        logprob: None,
        old_logprob: None,
        rollout_logprob: None,
        ref_logprob: None,
        action_mask,
        advantages: None,
        token_level_rewards: None,
        values: None,
        entropy: None,
        teacher_logprob: None,
        necs: None,
        reward: Some(experiences.iter().map(|e| e.reward).collect()),
        group_id: Some(experiences.iter().map(|e| e.eid.tid()).collect()),
        run_id: Some(experiences.iter().map(|e| format!("{}/{}", e.eid.tid(), e.eid.run)).collect()),
        step: Some(experiences.iter().map(|e| e.eid.batch as i64).collect()),
        run_step: Some(experiences.iter().map(|e| e.eid.step as i64).collect()),
        info: Some(experiences.iter().map(|e| e.info.clone()).collect()),
        expert_mask: None,
        reward_baselines: None,
    };
    let output = advantage.compute(&batch)?;
    let advantages = output.advantages.to_kind(Kind::Float);
    let order: Vec<usize> = match &output.rows {
        Some(rows) => rows.iter().map(|&r| r as usize).collect(),
        None => (0..experiences.len()).collect(),
    };
    // `advantages` is in input row order (the `AdvantageOutput` contract) while `order` lists the rows that go on,
    // dropped groups absent and duplicated ones repeated: each kept experience reads its own source row.
    let mut out = Vec::with_capacity(order.len());
    for &row in &order {
        let Some(source) = experiences.get(row) else {
            return Err(RftError::Pipeline(format!("advantage function returned row {row} of {}", experiences.len())));
        };
        let mut experience = source.clone();
        let length = experience.response_length();
        let values = Vec::<f32>::try_from(advantages.get(row as i64).narrow(0, 0, length as i64))
            .map_err(|e| RftError::Pipeline(e.to_string()))?;
        experience.advantages = Some(values);
        out.push(experience);
    }
    Ok((out, output.metrics))
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, Value, json};
    use trinity_algorithm::registry::{self, Kind as ComponentKind};
    use trinity_buffer::Eid;

    use super::*;

    /// One experience of task `task` in explore step 1 with `response` tokens and reward `reward`.
    fn experience(task: u64, run: u64, response: usize, reward: f64) -> Experience {
        let eid = Eid { batch: 1, task, run, step: 0 };
        let mut experience = Experience::single_turn(eid, vec![7; 2 + response], 2, vec![-0.5; response]);
        experience.reward = reward;
        experience
    }

    fn grpo(args: Value) -> Box<dyn AdvantageFn> {
        let args: Map<String, Value> = serde_json::from_value(args).unwrap();
        let resolved = registry::resolve_args(ComponentKind::AdvantageFn, "grpo", Some(&args)).unwrap();
        registry::advantage_fn("grpo", &resolved).unwrap().0
    }

    /// `(task, run, first advantage)` of every experience the pipeline keeps, in output order.
    fn kept_advantages(experiences: &[Experience], advantage: &dyn AdvantageFn) -> Vec<(u64, u64, f32)> {
        let (kept, _) = apply_group_advantage(advantage, experiences.to_vec()).unwrap();
        kept.iter().map(|e| (e.eid.task, e.eid.run, e.advantages.as_ref().unwrap()[0])).collect()
    }

    #[test]
    fn a_dropped_group_leaves_every_kept_experience_its_own_advantages() {
        // Task 0 has equal rewards (std 0) and is dropped by `std_threshold`; tasks 1 and 2 survive. Before the fix
        // the survivors read the advantages of rows 0..4 — task 0's zeros and task 1's — by output position.
        let experiences = vec![
            experience(0, 0, 3, 1.0),
            experience(0, 1, 3, 1.0),
            experience(1, 0, 2, 0.0),
            experience(1, 1, 4, 1.0),
            experience(2, 0, 5, 1.0),
            experience(2, 1, 1, 0.0),
        ];
        let advantage = grpo(json!({"std_threshold": 0.0}));
        let (kept, metrics) = apply_group_advantage(advantage.as_ref(), experiences.clone()).unwrap();
        assert_eq!(metrics.get("filtered_count"), Some(&2.0));
        let ids: Vec<(u64, u64)> = kept.iter().map(|e| (e.eid.task, e.eid.run)).collect();
        assert_eq!(ids, vec![(1, 0), (1, 1), (2, 0), (2, 1)]);
        for experience in &kept {
            let values = experience.advantages.as_ref().unwrap();
            assert_eq!(values.len(), experience.response_length(), "{:?}", experience.eid);
            let sign = if experience.reward > 0.5 { 1.0 } else { -1.0 };
            assert!(values.iter().all(|&a| a * sign > 0.5), "{:?}: {values:?}", experience.eid);
            assert!(values.iter().all(|&a| a == values[0]), "one advantage per response: {values:?}");
        }
    }

    #[test]
    fn reordered_groups_keep_their_own_advantages() {
        // An operator may hand over groups interleaved; GRPO returns its rows grouped ([0, 2, 1, 3] here), so the
        // second kept experience (row 2, rewarded) used to read row 1's negative advantage.
        let experiences = vec![
            experience(0, 0, 3, 0.0),
            experience(1, 0, 2, 0.0),
            experience(0, 1, 3, 1.0),
            experience(1, 1, 4, 1.0),
        ];
        let advantage = grpo(json!({}));
        let kept = kept_advantages(&experiences, advantage.as_ref());
        let order: Vec<(u64, u64)> = kept.iter().map(|&(task, run, _)| (task, run)).collect();
        assert_eq!(order, vec![(0, 0), (0, 1), (1, 0), (1, 1)]);
        for (task, run, value) in kept {
            let source = experiences.iter().find(|e| e.eid.task == task && e.eid.run == run).unwrap();
            assert_eq!(value > 0.0, source.reward > 0.5, "task {task} run {run}: {value}");
        }
    }

    #[test]
    fn duplicated_groups_may_outnumber_the_input() {
        // A dropped group of two is replaced by a copy of the surviving group of three: six rows out of five in.
        // Indexing the advantages by output position used to run past the batch and panic.
        let experiences = vec![
            experience(0, 0, 2, 1.0),
            experience(0, 1, 2, 1.0),
            experience(1, 0, 3, 0.0),
            experience(1, 1, 3, 1.0),
            experience(1, 2, 1, 0.0),
        ];
        let advantage = grpo(json!({"std_threshold": 0.0, "duplicate_experiences": true}));
        let kept = kept_advantages(&experiences, advantage.as_ref());
        assert_eq!(kept.len(), 6);
        for (task, run, value) in kept {
            assert_eq!(task, 1, "only the surviving group, twice");
            assert_eq!(value > 0.0, run == 1, "run {run}: {value}");
        }
    }

    #[test]
    fn gigpo_reads_each_experience_step_and_info() {
        // Task 0, two runs of two steps given in reverse step order, rewards only on run 0's step 1; the step-0
        // experiences share anchor state `s`. Sorted by `eid.step`, run 0's last step has reward 1 (episode returns
        // 1, 0 → A_E = ±0.5) and both its steps return 1 (anchor `s`: 1 vs 0 → A_S = ±0.5), as 0.6.0's
        // `GiGPOAdvantageFn` computes; in batch order run 0 would end on reward 0.
        let mut experiences = Vec::new();
        for (run, step, reward) in [(0, 1, 1.0), (0, 0, 0.0), (1, 1, 0.0), (1, 0, 0.0)] {
            let mut e = experience(0, run, 2, reward);
            e.eid.step = step;
            if step == 0 {
                e.info.insert("env_state_hash".to_owned(), json!("s"));
            }
            experiences.push(e);
        }
        let args = registry::resolve_args(ComponentKind::AdvantageFn, "gigpo", None).unwrap();
        let gigpo = registry::advantage_fn("gigpo", &args).unwrap().0;
        let kept = kept_advantages(&experiences, gigpo.as_ref());
        let want = [0.5, 1.0, -0.5, -1.0];
        assert_eq!(kept.len(), 4);
        for ((_, _, got), want) in kept.iter().zip(want) {
            assert!((f64::from(*got) - want).abs() < 1e-5, "{kept:?}");
        }
    }
}
