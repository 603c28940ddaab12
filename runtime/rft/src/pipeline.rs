//! The explorer-side experience pipeline: group advantages of grpo-like algorithms, computed per explore step
//! as Trinity-RFT's `ExperiencePipeline` does, before the experiences enter the buffer.

use tch::{Kind, Tensor};
use trinity_algorithm::Batch;
use trinity_algorithm::advantage::AdvantageFn;
use trinity_algorithm::metrics::Metrics;
use trinity_buffer::Experience;

use crate::error::RftError;

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
        ref_logprob: None,
        action_mask,
        advantages: None,
        token_level_rewards: None,
        values: None,
        entropy: None,
        teacher_logprob: None,
        reward: Some(experiences.iter().map(|e| e.reward).collect()),
        group_id: Some(experiences.iter().map(|e| e.eid.tid()).collect()),
        run_id: Some(experiences.iter().map(|e| format!("{}/{}", e.eid.tid(), e.eid.run)).collect()),
        step: Some(experiences.iter().map(|e| e.eid.batch as i64).collect()),
        expert_mask: None,
        reward_baselines: None,
    };
    let output = advantage.compute(&batch)?;
    let advantages = output.advantages.to_kind(Kind::Float);
    let order: Vec<usize> = match &output.rows {
        Some(rows) => rows.iter().map(|&r| r as usize).collect(),
        None => (0..experiences.len()).collect(),
    };
    let mut out = Vec::with_capacity(order.len());
    for (position, &row) in order.iter().enumerate() {
        let Some(source) = experiences.get(row) else {
            return Err(RftError::Pipeline(format!("advantage function returned row {row} of {}", experiences.len())));
        };
        let mut experience = source.clone();
        let length = experience.response_length();
        let values = Vec::<f32>::try_from(advantages.get(position as i64).narrow(0, 0, length as i64))
            .map_err(|e| RftError::Pipeline(e.to_string()))?;
        experience.advantages = Some(values);
        out.push(experience);
    }
    Ok((out, output.metrics))
}
