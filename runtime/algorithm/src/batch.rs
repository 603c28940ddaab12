//! A training batch as the algorithm components see it: padded rows × response tokens, plus per-row fields.
//!
//! Field names are Trinity-RFT's (`logprob`, `old_logprob`, `ref_logprob`, `action_mask`, …). Every token field
//! has the shape of `action_mask`; every row field has one entry per row. [`Batch::from_json`] checks both, so
//! the tensor code after it never sees a ragged or mismatched input.

use serde::Deserialize;
use serde_json::{Map, Value};
use tch::{Device, Kind, Tensor};

use crate::error::AlgorithmError;

/// Rows of padded response tokens with the fields the components read.
#[derive(Debug)]
pub struct Batch {
    /// The current policy's logprobs (the tensor gradients flow to); absent when only advantages are needed.
    pub logprob: Option<Tensor>,
    /// Logprobs of the policy that sampled the rows (the rollout logprobs by default).
    pub old_logprob: Option<Tensor>,
    /// The rollout engine's logprobs (Trinity's `rollout_log_probs`) when `old_logprob` holds the policy's own,
    /// recomputed before the update (`rollout_correction.bypass_mode: false`); `None` when they are the same.
    pub rollout_logprob: Option<Tensor>,
    /// The reference model's logprobs.
    pub ref_logprob: Option<Tensor>,
    /// 1 for tokens the model produced and is trained on, 0 for padding and environment tokens.
    pub action_mask: Tensor,
    pub advantages: Option<Tensor>,
    /// Per-token rewards (veRL's `token_level_scores` before any KL penalty).
    pub token_level_rewards: Option<Tensor>,
    /// Critic values (PPO).
    pub values: Option<Tensor>,
    /// Per-token entropy of the current policy.
    pub entropy: Option<Tensor>,
    /// The teacher's logprobs of the sampled tokens (on-policy distillation, JSD).
    pub teacher_logprob: Option<Tensor>,
    /// A per-token quantity the Clip_V advantage compares with e^ℓ·(H + ℓ) (Trinity's `necs`, which its entropy
    /// example's patched actor computes; see [`crate::advantage::clipv`]).
    pub necs: Option<Tensor>,
    /// One scalar reward per row.
    pub reward: Option<Vec<f64>>,
    /// The task group of each row (Trinity's `eid.tid`).
    pub group_id: Option<Vec<String>>,
    /// The run of each row within its task (Trinity's `eid.rid`), for multi-step advantages.
    pub run_id: Option<Vec<String>>,
    /// The training step of each row (MIX-CHORD's μ schedule).
    pub step: Option<Vec<i64>>,
    /// The step of each row within its run (Trinity's `eid.step`), for multi-step advantages (gigpo).
    pub run_step: Option<Vec<i64>>,
    /// Each row's experience `info` (Trinity's `experience.info`), for advantages that read keys a workflow
    /// writes there (gigpo's step reward and anchor state).
    pub info: Option<Vec<Map<String, Value>>>,
    /// Rows that come from the expert (SFT) dataset in MIX algorithms.
    pub expert_mask: Option<Vec<bool>>,
    /// Per-row reward baselines (ReMax).
    pub reward_baselines: Option<Vec<f64>>,
}

/// The JSON layout of a batch in `trinity algorithm eval` input.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchJson {
    pub group_id: Option<Vec<Value>>,
    pub run_id: Option<Vec<Value>>,
    pub step: Option<Vec<i64>>,
    pub run_step: Option<Vec<i64>>,
    pub info: Option<Vec<Map<String, Value>>>,
    pub reward: Option<Vec<f64>>,
    pub logprob: Option<Vec<Vec<f64>>>,
    pub old_logprob: Option<Vec<Vec<f64>>>,
    pub rollout_logprob: Option<Vec<Vec<f64>>>,
    pub ref_logprob: Option<Vec<Vec<f64>>>,
    pub action_mask: Option<Vec<Vec<f64>>>,
    pub advantages: Option<Vec<Vec<f64>>>,
    pub token_level_rewards: Option<Vec<Vec<f64>>>,
    pub values: Option<Vec<Vec<f64>>>,
    pub entropy: Option<Vec<Vec<f64>>>,
    pub teacher_logprob: Option<Vec<Vec<f64>>>,
    pub necs: Option<Vec<Vec<f64>>>,
    pub expert_mask: Option<Vec<bool>>,
    pub reward_baselines: Option<Vec<f64>>,
}

/// Builds a float tensor of shape rows × len from nested rows, checking the shape.
fn matrix(field: &str, data: &[Vec<f64>], rows: usize, len: usize) -> Result<Tensor, AlgorithmError> {
    if data.len() != rows {
        return Err(AlgorithmError::field(
            field,
            format!("has {} rows, expected {rows} (the rows of action_mask)", data.len()),
        ));
    }
    let mut flat = Vec::with_capacity(rows * len);
    for (i, row) in data.iter().enumerate() {
        if row.len() != len {
            return Err(AlgorithmError::field(
                field,
                format!(
                    "row {i} has {} tokens, expected {len} (rows must be padded to the length of action_mask)",
                    row.len()
                ),
            ));
        }
        flat.extend(row.iter().map(|&v| v as f32));
    }
    Ok(Tensor::from_slice(&flat).view([rows as i64, len as i64]))
}

fn per_row<T: Clone>(field: &str, data: Option<&Vec<T>>, rows: usize) -> Result<Option<Vec<T>>, AlgorithmError> {
    match data {
        None => Ok(None),
        Some(v) if v.len() == rows => Ok(Some(v.clone())),
        Some(v) => Err(AlgorithmError::field(field, format!("has {} entries, expected one per row ({rows})", v.len()))),
    }
}

fn ids(field: &str, data: Option<&Vec<Value>>, rows: usize) -> Result<Option<Vec<String>>, AlgorithmError> {
    let Some(values) = per_row(field, data, rows)? else { return Ok(None) };
    values
        .into_iter()
        .map(|v| match v {
            Value::String(s) => Ok(s),
            Value::Number(n) => Ok(n.to_string()),
            other => Err(AlgorithmError::field(field, format!("ids must be strings or numbers, got {other}"))),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

impl Batch {
    /// Checks shapes and builds the tensors; `action_mask` fixes the shape every token field must have.
    pub fn from_json(json: &BatchJson) -> Result<Self, AlgorithmError> {
        let mask = json.action_mask.as_ref().ok_or(AlgorithmError::MissingField {
            component: "every algorithm component".into(),
            field: "action_mask",
        })?;
        let rows = mask.len();
        if rows == 0 {
            return Err(AlgorithmError::field("action_mask", "the batch has no rows"));
        }
        let len = mask[0].len();
        if mask.iter().flatten().any(|&v| v != 0.0 && v != 1.0) {
            return Err(AlgorithmError::field("action_mask", "entries must be 0 or 1"));
        }
        let action_mask = matrix("action_mask", mask, rows, len)?;
        let token = |field: &str, data: &Option<Vec<Vec<f64>>>| -> Result<Option<Tensor>, AlgorithmError> {
            data.as_ref().map(|d| matrix(field, d, rows, len)).transpose()
        };
        Ok(Batch {
            logprob: token("logprob", &json.logprob)?,
            old_logprob: token("old_logprob", &json.old_logprob)?,
            rollout_logprob: token("rollout_logprob", &json.rollout_logprob)?,
            ref_logprob: token("ref_logprob", &json.ref_logprob)?,
            advantages: token("advantages", &json.advantages)?,
            token_level_rewards: token("token_level_rewards", &json.token_level_rewards)?,
            values: token("values", &json.values)?,
            entropy: token("entropy", &json.entropy)?,
            teacher_logprob: token("teacher_logprob", &json.teacher_logprob)?,
            necs: token("necs", &json.necs)?,
            action_mask,
            reward: per_row("reward", json.reward.as_ref(), rows)?,
            group_id: ids("group_id", json.group_id.as_ref(), rows)?,
            run_id: ids("run_id", json.run_id.as_ref(), rows)?,
            step: per_row("step", json.step.as_ref(), rows)?,
            run_step: per_row("run_step", json.run_step.as_ref(), rows)?,
            info: per_row("info", json.info.as_ref(), rows)?,
            expert_mask: per_row("expert_mask", json.expert_mask.as_ref(), rows)?,
            reward_baselines: per_row("reward_baselines", json.reward_baselines.as_ref(), rows)?,
        })
    }

    /// A batch of `action_mask` only, for building batches in code.
    pub fn new(action_mask: Tensor) -> Self {
        Batch {
            logprob: None,
            old_logprob: None,
            rollout_logprob: None,
            ref_logprob: None,
            action_mask: action_mask.to_kind(Kind::Float),
            advantages: None,
            token_level_rewards: None,
            values: None,
            entropy: None,
            teacher_logprob: None,
            necs: None,
            reward: None,
            group_id: None,
            run_id: None,
            step: None,
            run_step: None,
            info: None,
            expert_mask: None,
            reward_baselines: None,
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.action_mask.size().first().copied().unwrap_or(0) as usize
    }

    /// Padded response length.
    pub fn len(&self) -> usize {
        self.action_mask.size().get(1).copied().unwrap_or(0) as usize
    }

    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows() == 0
    }

    /// A token field the component cannot do without.
    pub fn need<'a>(
        &self,
        field: &'static str,
        value: &'a Option<Tensor>,
        component: &str,
    ) -> Result<&'a Tensor, AlgorithmError> {
        value.as_ref().ok_or_else(|| AlgorithmError::MissingField { component: component.to_owned(), field })
    }

    /// The rows at `index` (in that order, repeats allowed); autograd links them back to this batch.
    pub fn select_rows(&self, index: &[i64]) -> Batch {
        let idx = Tensor::from_slice(index);
        let t = |x: &Option<Tensor>| x.as_ref().map(|x| x.index_select(0, &idx));
        fn pick<T: Clone>(v: &Option<Vec<T>>, index: &[i64]) -> Option<Vec<T>> {
            v.as_ref().map(|v| index.iter().map(|&i| v[i as usize].clone()).collect())
        }
        Batch {
            logprob: t(&self.logprob),
            old_logprob: t(&self.old_logprob),
            rollout_logprob: t(&self.rollout_logprob),
            ref_logprob: t(&self.ref_logprob),
            action_mask: self.action_mask.index_select(0, &idx),
            advantages: t(&self.advantages),
            token_level_rewards: t(&self.token_level_rewards),
            values: t(&self.values),
            entropy: t(&self.entropy),
            teacher_logprob: t(&self.teacher_logprob),
            necs: t(&self.necs),
            reward: pick(&self.reward, index),
            group_id: pick(&self.group_id, index),
            run_id: pick(&self.run_id, index),
            step: pick(&self.step, index),
            run_step: pick(&self.run_step, index),
            info: pick(&self.info, index),
            expert_mask: pick(&self.expert_mask, index),
            reward_baselines: pick(&self.reward_baselines, index),
        }
    }

    /// The scalar reward of every row: `reward` if given, else the row sums of `token_level_rewards`.
    pub fn row_rewards(&self, component: &str) -> Result<Vec<f64>, AlgorithmError> {
        if let Some(r) = &self.reward {
            return Ok(r.clone());
        }
        let tlr = self.need("reward", &self.token_level_rewards, component)?;
        let sums = tlr.sum_dim_intlist(-1, false, Kind::Float);
        Ok(tensor_to_vec(&sums))
    }

    /// Per-token rewards as veRL builds `token_level_scores`: `token_level_rewards` if given, else each row's
    /// reward placed on its last action token (a row with no action token gets none, as its last attended
    /// token lies in the prompt).
    pub fn token_level_scores(&self, component: &str) -> Result<Tensor, AlgorithmError> {
        if let Some(t) = &self.token_level_rewards {
            return Ok(t.shallow_clone());
        }
        let reward = self
            .reward
            .as_ref()
            .ok_or(AlgorithmError::MissingField { component: component.to_owned(), field: "reward" })?;
        let (rows, len) = (self.rows(), self.len());
        let mask = tensor_to_vec(&self.action_mask.view([-1]));
        let mut scores = vec![0f32; rows * len];
        for (i, &r) in reward.iter().enumerate() {
            if let Some(last) = (0..len).rev().find(|&t| mask[i * len + t] > 0.0) {
                scores[i * len + last] = r as f32;
            }
        }
        Ok(Tensor::from_slice(&scores).view([rows as i64, len as i64]))
    }

    /// The group of every row (`group_id`), required by group advantages.
    pub fn groups(&self, component: &str) -> Result<&[String], AlgorithmError> {
        self.group_id
            .as_deref()
            .ok_or(AlgorithmError::MissingField { component: component.to_owned(), field: "group_id" })
    }
}

/// A float tensor's entries as `f64`, flattened.
pub(crate) fn tensor_to_vec(t: &Tensor) -> Vec<f64> {
    let flat = t.to_kind(Kind::Double).to_device(Device::Cpu).contiguous().view([-1]);
    Vec::<f64>::try_from(&flat).unwrap_or_default()
}

/// A rows × len float tensor as nested rows.
pub(crate) fn tensor_to_rows(t: &Tensor) -> Vec<Vec<f64>> {
    let size = t.size();
    let len = size.get(1).copied().unwrap_or(0) as usize;
    let flat = tensor_to_vec(t);
    if len == 0 {
        return vec![Vec::new(); size.first().copied().unwrap_or(0) as usize];
    }
    flat.chunks(len).map(<[f64]>::to_vec).collect()
}

/// Groups row indices by id, groups in order of first appearance (Trinity's `group_by`).
pub(crate) fn group_rows(ids: &[String]) -> Vec<Vec<usize>> {
    let mut order: Vec<&str> = Vec::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        match order.iter().position(|g| *g == id.as_str()) {
            Some(g) => groups[g].push(i),
            None => {
                order.push(id);
                groups.push(vec![i]);
            }
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<Batch, AlgorithmError> {
        let json: BatchJson = serde_json::from_value(v).unwrap();
        Batch::from_json(&json)
    }

    #[test]
    fn ragged_and_mismatched_rows_are_errors() {
        let err = parse(json!({"action_mask": [[1, 1], [1]]})).unwrap_err().to_string();
        assert!(err.contains("action_mask") && err.contains("row 1"), "{err}");
        let err = parse(json!({"action_mask": [[1, 1]], "logprob": [[0.1, 0.2, 0.3]]})).unwrap_err().to_string();
        assert!(err.contains("logprob") && err.contains("expected 2"), "{err}");
        let err = parse(json!({"action_mask": [[1, 1]], "reward": [1.0, 2.0]})).unwrap_err().to_string();
        assert!(err.contains("reward"), "{err}");
        let err = parse(json!({"logprob": [[0.1]]})).unwrap_err().to_string();
        assert!(err.contains("action_mask"), "{err}");
    }

    #[test]
    fn reward_lands_on_last_action_token() {
        let b = parse(json!({"action_mask": [[1, 1, 0], [0, 0, 0]], "reward": [2.0, 3.0]})).unwrap();
        let s = tensor_to_rows(&b.token_level_scores("t").unwrap());
        assert_eq!(s, vec![vec![0.0, 2.0, 0.0], vec![0.0, 0.0, 0.0]]);
    }

    #[test]
    fn groups_keep_first_appearance_order() {
        let ids: Vec<String> = ["b", "a", "b", "c", "a"].iter().map(|s| s.to_string()).collect();
        assert_eq!(group_rows(&ids), vec![vec![0, 2], vec![1, 4], vec![3]]);
    }
}
