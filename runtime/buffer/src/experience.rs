//! One rollout turned into training data.
//!
//! Invariants (checked by [`Experience::validate`], which stores call before accepting an experience):
//! `prompt_length <= tokens.len()`; the per-response-token arrays (`logprobs`, `action_mask`,
//! `token_level_rewards`, `advantages`, `returns`, `teacher_logprobs`) all have `tokens.len() - prompt_length`
//! entries, and `routed_experts`, when present, one row for each of the `tokens.len() - 1` tokens read. Keeping
//! the check at the store boundary means a bad workflow is caught where it wrote the
//! experience, not deep inside the trainer.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{BufferError, Result};
use crate::routed_experts::RoutedExperts;

/// Which rollout an experience comes from (Trinity's `EID` without the random suffix: these four numbers are
/// unique within a run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Eid {
    /// Explore step (batch) the task was drawn in.
    pub batch: u64,
    /// Task index within the batch's tasks (or the row index for eval).
    pub task: u64,
    /// Run index within the task's group (`0..repeat_times`).
    pub run: u64,
    /// Step within a multi-step workflow (0 otherwise).
    pub step: u64,
}

impl Eid {
    /// `batch/task/run/step`, as Trinity prints uids.
    pub fn uid(&self) -> String {
        format!("{}/{}/{}/{}", self.batch, self.task, self.run, self.step)
    }

    /// `batch/task`: the group of runs of one task, over which group advantages are computed.
    pub fn tid(&self) -> String {
        format!("{}/{}", self.batch, self.task)
    }
}

/// Why a sequence was cut short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TruncateStatus {
    /// The prompt alone exceeded the limit; the experience is a masked-out placeholder.
    PromptTruncated,
    /// The response hit `max_tokens` / `max_model_len`.
    ResponseTruncated,
}

/// One experience: prompt + response tokens with what the trainer needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Experience {
    pub eid: Eid,
    /// Group id: experiences with the same id are runs of the same task (defaults to `eid.tid()`).
    pub group_id: String,
    /// Prompt then response token ids.
    pub tokens: Vec<u32>,
    /// Number of prompt tokens at the start of `tokens`.
    pub prompt_length: usize,
    /// Sampling logprobs of the response tokens.
    pub logprobs: Vec<f32>,
    /// Which response tokens the model generated (false for tool / environment tokens in multi-turn runs).
    pub action_mask: Vec<bool>,
    /// Sum of the reward function's components.
    pub reward: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_level_rewards: Option<Vec<f32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advantages: Option<Vec<f32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub returns: Option<Vec<f32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher_logprobs: Option<Vec<f32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate_status: Option<TruncateStatus>,
    /// Free-form facts (taskset id, row index, use count, ...).
    #[serde(default)]
    pub info: Map<String, Value>,
    /// Numbers reported per experience (reward components, env rounds, ...), averaged into step metrics.
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_text: Option<String>,
    /// Version of the weights that generated the response (the synchronizer's counter); used for staleness.
    pub model_version: u64,
    /// The experts a mixture-of-experts rollout routed every token it read to (`tokens.len() - 1` rows), for
    /// routing replay (`algorithm.enable_router_replay`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routed_experts: Option<RoutedExperts>,
}

impl Experience {
    /// A single-turn experience: every response token is model-generated, no reward yet.
    pub fn single_turn(eid: Eid, tokens: Vec<u32>, prompt_length: usize, logprobs: Vec<f32>) -> Experience {
        let response_len = tokens.len().saturating_sub(prompt_length);
        Experience {
            eid,
            group_id: eid.tid(),
            tokens,
            prompt_length,
            logprobs,
            action_mask: vec![true; response_len],
            reward: 0.0,
            token_level_rewards: None,
            advantages: None,
            returns: None,
            teacher_logprobs: None,
            truncate_status: None,
            info: Map::new(),
            metrics: BTreeMap::new(),
            prompt_text: None,
            response_text: None,
            model_version: 0,
            routed_experts: None,
        }
    }

    /// Number of response tokens.
    pub fn response_length(&self) -> usize {
        self.tokens.len().saturating_sub(self.prompt_length)
    }

    /// Checks the length invariants in the module docs.
    pub fn validate(&self) -> Result<()> {
        let fail = |problem: String| BufferError::InvalidExperience { uid: self.eid.uid(), problem };
        if self.prompt_length > self.tokens.len() {
            return Err(fail(format!("prompt_length {} exceeds the {} tokens", self.prompt_length, self.tokens.len())));
        }
        let n = self.response_length();
        let check = |name: &str, len: Option<usize>| match len {
            Some(len) if len != n => Err(fail(format!("{name} has {len} entries for {n} response tokens"))),
            _ => Ok(()),
        };
        check("logprobs", Some(self.logprobs.len()))?;
        check("action_mask", Some(self.action_mask.len()))?;
        check("token_level_rewards", self.token_level_rewards.as_ref().map(Vec::len))?;
        check("advantages", self.advantages.as_ref().map(Vec::len))?;
        check("returns", self.returns.as_ref().map(Vec::len))?;
        check("teacher_logprobs", self.teacher_logprobs.as_ref().map(Vec::len))?;
        if !self.reward.is_finite() {
            return Err(fail(format!("reward is {}", self.reward)));
        }
        if let Some(routed) = &self.routed_experts {
            let read = self.tokens.len().saturating_sub(1);
            if !routed.is_well_formed() || routed.tokens() != read {
                return Err(fail(format!(
                    "routed_experts holds {} ids of {} layers × top {} for {} tokens; want one row for each of the \
                     {read} tokens the model read (all but the last)",
                    routed.ids.len(),
                    routed.layers,
                    routed.top_k,
                    self.tokens.len()
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_turn_masks_every_response_token() {
        let exp =
            Experience::single_turn(Eid { batch: 2, task: 1, run: 3, step: 0 }, vec![1, 2, 3, 4, 5], 3, vec![-0.5; 2]);
        assert_eq!(exp.action_mask, vec![true, true]);
        assert_eq!(exp.group_id, "2/1");
        assert_eq!(exp.eid.uid(), "2/1/3/0");
        exp.validate().unwrap();
    }

    #[test]
    fn validate_names_the_bad_field() {
        let mut exp = Experience::single_turn(Eid::default(), vec![1, 2, 3], 1, vec![0.0; 2]);
        exp.advantages = Some(vec![1.0]);
        let text = exp.validate().unwrap_err().to_string();
        assert!(text.contains("advantages has 1 entries for 2 response tokens"), "{text}");
        exp.advantages = None;
        exp.prompt_length = 9;
        assert!(exp.validate().unwrap_err().to_string().contains("prompt_length 9"));
        exp.prompt_length = 1;
        exp.reward = f64::NAN;
        assert!(exp.validate().is_err());
    }

    #[test]
    fn round_trips_through_json() {
        let mut exp = Experience::single_turn(Eid::default(), vec![1, 2, 3], 1, vec![-0.25, -1.5]);
        exp.reward = 1.1;
        exp.advantages = Some(vec![0.5, 0.5]);
        exp.metrics.insert("accuracy".into(), 1.0);
        exp.truncate_status = Some(TruncateStatus::ResponseTruncated);
        exp.model_version = 3;
        let text = serde_json::to_string(&exp).unwrap();
        assert!(text.contains("\"response_truncated\""));
        let back: Experience = serde_json::from_str(&text).unwrap();
        assert_eq!(back, exp);
    }

    #[test]
    fn routed_experts_need_a_row_for_every_token_read() {
        let mut exp = Experience::single_turn(Eid::default(), vec![1, 2, 3, 4], 2, vec![0.0; 2]);
        exp.routed_experts = Some(RoutedExperts { layers: 2, top_k: 2, ids: vec![1; 12] });
        exp.validate().unwrap();
        let back: Experience = serde_json::from_str(&serde_json::to_string(&exp).unwrap()).unwrap();
        assert_eq!(back, exp);
        exp.routed_experts = Some(RoutedExperts { layers: 2, top_k: 2, ids: vec![1; 16] });
        let text = exp.validate().unwrap_err().to_string();
        assert!(text.contains("routed_experts") && text.contains("3 tokens the model read"), "{text}");
    }
}
