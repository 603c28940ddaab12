//! `grpo`: group-relative advantages (Trinity-RFT's `GRPOGroupedAdvantage`), run on the explorer side.
//!
//! Per task group G of n rows with rewards R:
//! * n = 1: μ = 0, σ = 1 (the group is dropped when `std_threshold` is set);
//! * n > 1: with `rank_penalty` p, R̃_j = R_j·(1 − rank_j·p) where rank_j = argsort(argsort(mean_t ℓ_old,j))/n
//!   (the mean over the row's response: up to its last action token);
//!   μ = mean(R̃), σ = std(R̃) (unbiased); with `std_threshold` the group is dropped when σ ≤ threshold;
//! * A_j = (R_j − μ)/(σ + ε) — the *unpenalized* R_j in the numerator, as Trinity-RFT does; with
//!   `std_cal_level = "batch"` σ is the std of all rewards of the batch (1 when the batch has one row).
//!
//! `duplicate_experiences` (with `std_threshold` only) refills dropped groups with copies of randomly chosen
//! surviving groups (Polaris), drawing with libtorch's global generator like Trinity-RFT's `torch.randint`.
//! Metrics: `group_advantages/reward_mean/{mean,max,min}`, `…/reward_std/…` and `filtered_count`.

use tch::{Kind, Tensor};

use crate::advantage::{AdvantageFn, AdvantageFnEntry, AdvantageOutput, broadcast_rows, mean_f32, std_f32};
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::{Batch, group_rows, tensor_to_vec};
use crate::error::AlgorithmError;
use crate::metrics::aggregate_groups;

const NAME: &str = "grpo";

const ARGS: &[ArgSpec] = &[
    arg("epsilon", ArgDefault::Float(1e-6)),
    arg("std_threshold", ArgDefault::Null),
    arg("duplicate_experiences", ArgDefault::Bool(false)),
    arg("rank_penalty", ArgDefault::Null),
    arg("std_cal_level", ArgDefault::Str("group")),
];

#[derive(Debug)]
struct Grpo {
    epsilon: f32,
    std_threshold: Option<f32>,
    duplicate_experiences: bool,
    rank_penalty: Option<f32>,
    batch_std: bool,
}

fn build(args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    Ok(Box::new(Grpo {
        epsilon: args.f64("epsilon")? as f32,
        std_threshold: args.opt_f64("std_threshold")?.map(|v| v as f32),
        duplicate_experiences: args.bool("duplicate_experiences")?,
        rank_penalty: args.opt_f64("rank_penalty")?.map(|v| v as f32),
        batch_std: args.choice("std_cal_level", &["group", "batch"])? == "batch",
    }))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: false, build } }

/// `argsort(argsort(x))`: the ascending rank of each entry (ties broken by position).
fn ranks(x: &[f32]) -> Vec<f32> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut rank = vec![0f32; x.len()];
    for (r, &i) in order.iter().enumerate() {
        rank[i] = r as f32;
    }
    rank
}

/// The mean rollout logprob of each row over its response, which (as an Experience holds it, unpadded)
/// runs to the last action token and includes environment tokens inside it; a row without action tokens
/// averages the whole padded row.
fn response_means(old: &Tensor, mask: &Tensor) -> Vec<f64> {
    let len = mask.size().get(1).copied().unwrap_or(0) as usize;
    let (old, mask) = (tensor_to_vec(old), tensor_to_vec(mask));
    old.chunks(len.max(1))
        .zip(mask.chunks(len.max(1)))
        .map(|(lp, m)| {
            let end = m.iter().rposition(|&v| v > 0.0).map_or(lp.len(), |last| last + 1);
            let row: Vec<f32> = lp[..end].iter().map(|&v| v as f32).collect();
            f64::from(mean_f32(&row))
        })
        .collect()
}

/// Picks `count` indices in `0..n` with libtorch's global generator (`torch.randint(0, n, (count,))`).
pub(crate) fn randint(n: usize, count: usize) -> Vec<i64> {
    if count == 0 || n == 0 {
        return Vec::new();
    }
    let t = Tensor::randint_low(0, n as i64, [count as i64], (Kind::Int64, tch::Device::Cpu));
    Vec::<i64>::try_from(&t).unwrap_or_default()
}

impl AdvantageFn for Grpo {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let rewards: Vec<f32> = batch.row_rewards(NAME)?.into_iter().map(|r| r as f32).collect();
        let groups = group_rows(batch.groups(NAME)?);
        let mean_logprob = match self.rank_penalty {
            Some(_) => {
                let old = batch.need("old_logprob", &batch.old_logprob, "grpo with rank_penalty")?;
                response_means(old, &batch.action_mask)
            }
            None => Vec::new(),
        };
        let batch_std =
            if self.batch_std { Some(if rewards.len() <= 1 { 1.0 } else { std_f32(&rewards) }) } else { None };

        let mut scores = vec![0f32; rewards.len()];
        let mut kept_groups: Vec<&Vec<usize>> = Vec::new();
        let mut per_group = Vec::with_capacity(groups.len());
        let mut filtered = 0usize;
        for group in &groups {
            let (mean, std, keep) = if group.len() == 1 {
                (0f32, 1f32, self.std_threshold.is_none())
            } else {
                let mut r: Vec<f32> = group.iter().map(|&i| rewards[i]).collect();
                if let Some(p) = self.rank_penalty {
                    let lp: Vec<f32> = group.iter().map(|&i| mean_logprob[i] as f32).collect();
                    let n = group.len() as f32;
                    for (rj, rank) in r.iter_mut().zip(ranks(&lp)) {
                        *rj *= 1.0 - (rank / n) * p;
                    }
                }
                let (mean, std) = (mean_f32(&r), std_f32(&r));
                (mean, std, self.std_threshold.is_none_or(|thr| std > thr))
            };
            if keep {
                let denom = batch_std.unwrap_or(std) + self.epsilon;
                for &i in group {
                    scores[i] = (rewards[i] - mean) / denom;
                }
                kept_groups.push(group);
            } else {
                filtered += group.len();
            }
            per_group.push(vec![("reward_mean", f64::from(mean)), ("reward_std", f64::from(std))]);
        }

        let mut rows: Vec<i64> = kept_groups.iter().flat_map(|g| g.iter().map(|&i| i as i64)).collect();
        let dropped = groups.len() - kept_groups.len();
        if self.duplicate_experiences && self.std_threshold.is_some() && dropped > 0 && !kept_groups.is_empty() {
            for pick in randint(kept_groups.len(), dropped) {
                rows.extend(kept_groups[pick as usize].iter().map(|&i| i as i64));
            }
        }
        let mut metrics = aggregate_groups(&per_group, "group_advantages");
        metrics.insert("filtered_count".into(), filtered as f64);
        let advantages = broadcast_rows(&scores, &batch.action_mask);
        Ok(AdvantageOutput { rows: Some(rows), ..AdvantageOutput::outcome(advantages, metrics) })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("advantage_grpo");
    }

    #[test]
    fn duplicates_refill_dropped_groups() {
        use crate::testing::{eval_json, json};
        // Group b has zero std and is dropped; duplicating a surviving group keeps four rows in the loss, so the
        // summed SFT loss over rows (seq-mean-token-sum × rows) counts one surviving group twice.
        let out = eval_json(json!({
            "advantage_fn": "grpo", "advantage_fn_args": {"std_threshold": 0.0, "duplicate_experiences": true},
            "policy_loss_fn": "sft", "loss_agg_mode": "seq-mean-token-sum", "seed": 3,
            "batch": {"group_id": ["a", "a", "b", "b"], "reward": [1.0, 0.0, 1.0, 1.0],
                      "logprob": [[-1.0], [-3.0], [-5.0], [-7.0]], "action_mask": [[1], [1], [1], [1]]}
        }));
        assert_eq!(out["metrics"]["filtered_count"], 2.0);
        assert!((out["pg_loss"].as_f64().unwrap() - 2.0).abs() < 1e-6, "{out}");
        assert_eq!(out["grad_logprob"][2][0], 0.0);
        assert!((out["grad_logprob"][0][0].as_f64().unwrap() + 0.5).abs() < 1e-6);
    }

    #[test]
    fn ranks_are_ascending() {
        assert_eq!(super::ranks(&[0.3, -1.0, 2.0]), vec![1.0, 0.0, 2.0]);
    }
}
