//! Advantage functions: from rewards (and values, teacher logprobs, …) to per-token advantages and returns.
//!
//! Two families, as in Trinity-RFT. *Group* advantages (grpo, opmd, asymre, reinforce, rec, step_wise_grpo) run
//! on the explorer side as the last experience-pipeline operator, read each row's scalar `reward` and group rows
//! by `group_id`; they may drop groups (std_threshold) or duplicate them. *Trainer-side* advantages (ppo, rloo,
//! grpo_verl, reinforceplusplus, remax, on_policy_distill, jsd, …) run in the trainer on
//! `token_level_rewards`, after the KL reward penalty.

use std::fmt;

use tch::Tensor;

use crate::args::{ArgSpec, Args};
use crate::batch::Batch;
use crate::error::AlgorithmError;
use crate::metrics::Metrics;

pub mod asymre;
pub mod asymre_verl;
pub mod clipb;
pub mod clipv;
pub mod gigpo;
pub mod grpo;
pub mod grpo_verl;
pub mod jsd;
pub mod on_policy_distill;
pub mod opmd;
pub mod opmd_verl;
pub mod ppo;
pub mod rec;
pub mod reinforce;
pub mod reinforce_plus_plus;
pub mod remax;
pub mod rloo;
pub mod step_wise_grpo;

/// What an advantage function produces.
#[derive(Debug)]
pub struct AdvantageOutput {
    /// Per-token advantages, rows × tokens, in input row order.
    pub advantages: Tensor,
    /// Per-token returns (critic targets).
    pub returns: Tensor,
    /// Metrics under the names the function reports.
    pub metrics: Metrics,
    /// The rows that go on to training, as indices into the input, in Trinity-RFT's output order (grouped);
    /// rows of dropped groups are absent and duplicated groups repeat. `None`: every row, in input order.
    pub rows: Option<Vec<i64>>,
    /// The narrowed training mask (rows × tokens, input row order) when the function filters tokens out of the
    /// losses, as Trinity-RFT's clipb and clipv rewrite `response_mask`; `None`: the batch's `action_mask`.
    pub action_mask: Option<Tensor>,
}

impl AdvantageOutput {
    /// Advantages that are also the critic's returns (outcome estimators), for every row in input order, with
    /// the batch's own training mask.
    pub fn outcome(advantages: Tensor, metrics: Metrics) -> AdvantageOutput {
        AdvantageOutput { returns: advantages.copy(), advantages, metrics, rows: None, action_mask: None }
    }
}

/// Per-token statistics of the policy before the update that a trainer-side advantage function reads. They
/// cost the trainer a pass through the whole output head, so it computes them only for a function that asks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PolicyStats {
    /// The entropy H of the next-token distribution ([`Batch::entropy`]).
    pub entropy: bool,
    /// `necs` ([`Batch::necs`]): Σ_v p_v²·(H + log p_v), the distribution's own expectation of the entropy
    /// discriminator p·(H + log p) (see [`clipv`]).
    pub necs: bool,
}

impl PolicyStats {
    /// Whether any statistic is asked for.
    pub fn any(self) -> bool {
        self.entropy || self.necs
    }
}

/// An advantage function built from its arguments.
///
/// `Send` because the RFT loop runs each train step on a thread of its own.
pub trait AdvantageFn: fmt::Debug + Send {
    /// Computes advantages for `batch`; the batch's `logprob` is never read.
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError>;

    /// The policy statistics `compute` reads, which the trainer then puts in the batch (none by default).
    fn policy_stats(&self) -> PolicyStats {
        PolicyStats::default()
    }
}

/// A registered advantage function.
#[derive(Debug)]
pub struct AdvantageFnEntry {
    pub name: &'static str,
    /// Accepted arguments with their defaults.
    pub args: &'static [ArgSpec],
    /// Trinity-RFT's `compute_in_trainer()`: false for group advantages run by the explorer's pipeline.
    pub compute_in_trainer: bool,
    pub build: fn(&Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError>,
}

inventory::collect!(AdvantageFnEntry);

/// Unbiased standard deviation of a small set of values, computed in `f32` as `torch.std` on a float tensor.
pub(crate) fn std_f32(values: &[f32]) -> f32 {
    let t = Tensor::from_slice(values);
    t.std(true).double_value(&[]) as f32
}

/// Mean in `f32`, as `torch.mean` on a float tensor.
pub(crate) fn mean_f32(values: &[f32]) -> f32 {
    let t = Tensor::from_slice(values);
    t.mean(tch::Kind::Float).double_value(&[]) as f32
}

/// Broadcasts one score per row over that row's action mask: `score_i · m_i`.
pub(crate) fn broadcast_rows(scores: &[f32], mask: &Tensor) -> Tensor {
    Tensor::from_slice(scores).unsqueeze(-1) * mask
}

/// The output of a group-relative advantage: one score per row broadcast over its action tokens (returns equal
/// advantages), the per-group metrics aggregated under `group_advantages/`, and the rows in group order (as
/// Trinity-RFT concatenates its groups).
pub(crate) fn group_output(
    scores: &[f32],
    mask: &Tensor,
    groups: &[Vec<usize>],
    per_group: &[Vec<(&'static str, f64)>],
) -> AdvantageOutput {
    let advantages = broadcast_rows(scores, mask);
    let rows = groups.iter().flatten().map(|&i| i as i64).collect();
    let metrics = crate::metrics::aggregate_groups(per_group, "group_advantages");
    AdvantageOutput { rows: Some(rows), ..AdvantageOutput::outcome(advantages, metrics) }
}
