//! `rec`: the REC family's group advantage (Trinity-RFT's `RECGroupedAdvantage`), explorer side.
//!
//! Per task group of N rows: pos_j = [R_j ≥ mean(R)]. With `drop = "balance"` and more negatives than
//! positives, (#neg − #pos) randomly chosen negatives are dropped (their A = 0; libtorch's global generator, as
//! Trinity-RFT's `torch.randperm`). Over the kept rows: μ = mean, σ = population std (≤ 1 kept row: μ = 0,
//! σ = 1). A = R − μ, or (R − μ)/(σ + ε) with `std_normalize`.
//! Metrics: `group_advantages/{drop_balance,reward_mean,reward_std}/{mean,max,min}`.
//!
//! Trinity-RFT bug fixed here: a group of one row raises `NameError` there (`rewards` is only bound for N > 1).
//! We treat it like every other group with ≤ 1 kept row: μ = 0, σ = 1, so A = R (or R/(1 + ε)).

use tch::{Kind, Tensor};

use crate::advantage::{AdvantageFn, AdvantageFnEntry, AdvantageOutput, group_output, mean_f32};
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::{Batch, group_rows};
use crate::error::AlgorithmError;

const NAME: &str = "rec";

const ARGS: &[ArgSpec] = &[
    arg("epsilon", ArgDefault::Float(1e-6)),
    arg("std_normalize", ArgDefault::Bool(false)),
    arg("drop", ArgDefault::Null),
];

#[derive(Debug)]
struct Rec {
    epsilon: f32,
    std_normalize: bool,
    balance: bool,
}

fn build(args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    let balance = match args.opt_str("drop")? {
        None => false,
        Some("balance") => true,
        Some(other) => return Err(args.invalid("drop", format!("must be null or \"balance\", got `{other}`"))),
    };
    Ok(Box::new(Rec {
        epsilon: args.f64("epsilon")? as f32,
        std_normalize: args.opt_bool("std_normalize")?.unwrap_or(false),
        balance,
    }))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: false, build } }

/// A random permutation of `0..n` from libtorch's global generator.
fn randperm(n: usize) -> Vec<i64> {
    let t = Tensor::randperm(n as i64, (Kind::Int64, tch::Device::Cpu));
    Vec::<i64>::try_from(&t).unwrap_or_default()
}

impl AdvantageFn for Rec {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let rewards: Vec<f32> = batch.row_rewards(NAME)?.into_iter().map(|r| r as f32).collect();
        let groups = group_rows(batch.groups(NAME)?);
        let mut scores = vec![0f32; rewards.len()];
        let mut per_group = Vec::new();
        for group in &groups {
            let n = group.len();
            let r: Vec<f32> = group.iter().map(|&i| rewards[i]).collect();
            let first_mean = if n == 1 { 0.0 } else { mean_f32(&r) };
            let is_pos: Vec<bool> = r.iter().map(|&x| x >= first_mean).collect();
            let pos = is_pos.iter().filter(|&&p| p).count();
            let neg = n - pos;
            let mut keep = vec![true; n];
            let mut drop_frac = 0.0;
            if self.balance && neg > pos {
                let extra = neg - pos;
                let neg_idx: Vec<usize> = (0..n).filter(|&j| !is_pos[j]).collect();
                for p in randperm(neg_idx.len()).into_iter().take(extra) {
                    keep[neg_idx[p as usize]] = false;
                }
                drop_frac = extra as f64 / n.max(1) as f64;
            }
            let kept: Vec<f32> = (0..n).filter(|&j| keep[j]).map(|j| r[j]).collect();
            let (mean, std) = if kept.len() <= 1 {
                (0f32, 1f32)
            } else {
                let mean = mean_f32(&kept);
                (mean, Tensor::from_slice(&kept).std(false).double_value(&[]) as f32)
            };
            for (j, &i) in group.iter().enumerate() {
                scores[i] = match (keep[j], self.std_normalize) {
                    (false, _) => 0.0,
                    (true, false) => r[j] - mean,
                    (true, true) => (r[j] - mean) / (std + self.epsilon),
                };
            }
            per_group.push(vec![
                ("drop_balance", drop_frac),
                ("reward_mean", f64::from(mean)),
                ("reward_std", f64::from(std)),
            ]);
        }
        Ok(group_output(&scores, &batch.action_mask, &groups, &per_group))
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{eval_json, json};

    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("advantage_rec");
    }

    #[test]
    fn group_of_one_gets_its_reward() {
        let out = eval_json(json!({
            "advantage_fn": "rec",
            "batch": {"group_id": ["a", "b", "b"], "reward": [0.7, 1.0, 0.0], "action_mask": [[1, 1], [1, 0], [1, 1]]}
        }));
        let adv = &out["advantages"];
        assert!((adv[0][0].as_f64().unwrap() - 0.7).abs() < 1e-6);
        assert!((adv[1][0].as_f64().unwrap() - 0.5).abs() < 1e-6);
        assert_eq!(adv[1][1].as_f64().unwrap(), 0.0);
    }

    #[test]
    fn balance_drops_extra_negatives() {
        let out = eval_json(json!({
            "advantage_fn": "rec", "advantage_fn_args": {"drop": "balance"},
            "batch": {"group_id": ["g", "g", "g", "g"], "reward": [1.0, 0.0, 0.0, 0.0], "action_mask": [[1], [1], [1], [1]]}
        }));
        let zeros = (0..4).filter(|&i| out["advantages"][i][0].as_f64().unwrap() == 0.0).count();
        assert_eq!(zeros, 2, "{out}");
        assert_eq!(out["metrics"]["group_advantages/drop_balance/mean"].as_f64().unwrap(), 0.5);
    }
}
