//! `gigpo`: Group-in-Group Policy Optimization (Trinity-RFT 0.6.0's `GiGPOAdvantageFn`, arXiv:2505.10978) for
//! multi-step agents, run on the explorer side.
//!
//! Each row is one step of a run (`run_id`) of a task (`group_id`); `run_step` (Trinity's `eid.step`) orders a
//! run's rows, ties in batch order. It is required: a batch without it (the trainer's rows) does not say which
//! step ends a run. `info` is optional (absent: every row's info is empty). Per run, the immediate rewards r_t are the rows'
//! `info[step_reward_key]` when any row of the run has that key (0 for rows without it), else 0 on every step
//! but the last, which gets the row's `reward`. The discounted return of step t is R_t = Σ_{k≥t} γ^{k−t}·r_k.
//!
//! * Episode level: over a task's runs, A_E = (R(τ) − μ)/(F + ε) with R(τ) = Σ_t r_t, μ the mean and F the
//!   unbiased std (`fnorm: std`) or 1 (`fnorm: none`, the default); a task with one run has μ = 0, F = 1.
//! * Step level: rows whose `info[env_state_hash_key]` is set (not null) are bucketed by that value across the
//!   whole batch (anchor states); within a bucket of two or more, A_S = (R_t − μ)/(F + ε) likewise; rows in a
//!   bucket of one or without the key get A_S = 0.
//! * A = (A_E + ω·A_S)·m, returns = A; every row is kept, in input order.
//!
//! Metrics: `gigpo/episode_reward_mean/{mean,max,min}` and `gigpo/episode_reward_std/…` over tasks (μ and F as
//! used, so F = 1 under `fnorm: none`), `gigpo/anchor_groups_total`, `gigpo/anchor_groups_size_gt1`,
//! `gigpo/anchor_group_hit_ratio`, `gigpo/mean_abs_A_E`, `gigpo/mean_abs_A_S` and `experience_count`.
//!
//! The workflow must write the two `info` keys, as Trinity's `step_wise_alfworld_workflow` does; of trinity's
//! built-in workflows `step_wise_frozen_lake_workflow` writes them (with any other the step level is empty and
//! A = A_E).

use serde_json::Value;

use crate::advantage::{AdvantageFn, AdvantageFnEntry, AdvantageOutput, broadcast_rows, mean_f32, std_f32};
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::{Batch, group_rows};
use crate::error::AlgorithmError;
use crate::metrics::aggregate_groups;

const NAME: &str = "gigpo";

const ARGS: &[ArgSpec] = &[
    arg("omega", ArgDefault::Float(1.0)),
    arg("gamma", ArgDefault::Float(1.0)),
    arg("fnorm", ArgDefault::Str("none")),
    arg("epsilon", ArgDefault::Float(1e-6)),
    arg("step_reward_key", ArgDefault::Str("step_reward")),
    arg("env_state_hash_key", ArgDefault::Str("env_state_hash")),
];

#[derive(Debug)]
struct Gigpo {
    omega: f64,
    gamma: f64,
    std_norm: bool,
    epsilon: f32,
    step_reward_key: String,
    env_state_hash_key: String,
}

fn build(args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    Ok(Box::new(Gigpo {
        omega: args.f64("omega")?,
        gamma: args.f64("gamma")?,
        std_norm: args.choice("fnorm", &["std", "none"])? == "std",
        epsilon: args.f64("epsilon")? as f32,
        step_reward_key: args.str("step_reward_key")?.to_owned(),
        env_state_hash_key: args.str("env_state_hash_key")?.to_owned(),
    }))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: false, build } }

/// Discounted returns R_t = r_t + γ·R_{t+1}, in Python's double precision.
fn discounted_returns(rewards: &[f64], gamma: f64) -> Vec<f64> {
    let mut out = vec![0.0; rewards.len()];
    let mut running = 0.0;
    for t in (0..rewards.len()).rev() {
        running = rewards[t] + gamma * running;
        out[t] = running;
    }
    out
}

impl Gigpo {
    /// Trinity's `_normalize` in `f32`: the scores, μ and F (μ = 0, F = 1 for one value).
    fn normalize(&self, values: &[f64]) -> (Vec<f64>, f64, f64) {
        let v: Vec<f32> = values.iter().map(|&x| x as f32).collect();
        let (mean, denom) = match v.len() {
            1 => (0f32, 1f32),
            _ => (mean_f32(&v), if self.std_norm { std_f32(&v) } else { 1.0 }),
        };
        let scores = v.iter().map(|&x| f64::from((x - mean) / (denom + self.epsilon))).collect();
        (scores, f64::from(mean), f64::from(denom))
    }

    /// A row's immediate reward from its `info`, as Python's `float(info.get(key, 0.0))`.
    fn step_reward(&self, info: Option<&serde_json::Map<String, Value>>, row: usize) -> Result<f64, AlgorithmError> {
        match info.and_then(|i| i.get(&self.step_reward_key)) {
            None => Ok(0.0),
            Some(Value::Number(n)) => Ok(n.as_f64().unwrap_or(0.0)),
            Some(Value::Bool(b)) => Ok(f64::from(u8::from(*b))),
            Some(Value::String(s)) if s.trim().parse::<f64>().is_ok() => Ok(s.trim().parse().unwrap_or(0.0)),
            Some(other) => Err(AlgorithmError::field(
                "info",
                format!("row {row}: `{}` must be a number, got {other}", self.step_reward_key),
            )),
        }
    }
}

impl AdvantageFn for Gigpo {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let rewards = batch.row_rewards(NAME)?;
        let tasks = batch.groups(NAME)?;
        let runs =
            batch.run_id.as_deref().ok_or(AlgorithmError::MissingField { component: NAME.into(), field: "run_id" })?;
        let order = batch
            .run_step
            .as_deref()
            .ok_or(AlgorithmError::MissingField { component: NAME.into(), field: "run_step" })?;
        let info = |i: usize| batch.info.as_ref().map(|v| &v[i]);
        let n = batch.rows();

        let mut a_e = vec![0f64; n];
        let mut discounted = vec![0f64; n];
        let mut per_task = Vec::new();
        for task in group_rows(tasks) {
            let ids: Vec<String> = task.iter().map(|&i| runs[i].clone()).collect();
            let task_runs: Vec<Vec<usize>> =
                group_rows(&ids).into_iter().map(|run| run.into_iter().map(|j| task[j]).collect()).collect();
            let mut episode_returns = Vec::with_capacity(task_runs.len());
            for run in &task_runs {
                let mut steps = run.clone();
                steps.sort_by_key(|&i| order[i]);
                let has_key = steps.iter().any(|&i| info(i).is_some_and(|m| m.contains_key(&self.step_reward_key)));
                let r: Vec<f64> = if has_key {
                    steps.iter().map(|&i| self.step_reward(info(i), i)).collect::<Result<_, _>>()?
                } else {
                    (0..steps.len()).map(|k| if k + 1 == steps.len() { rewards[steps[k]] } else { 0.0 }).collect()
                };
                for (&i, d) in steps.iter().zip(discounted_returns(&r, self.gamma)) {
                    discounted[i] = d;
                }
                episode_returns.push(r.iter().sum::<f64>());
            }
            let (scores, mean, denom) = self.normalize(&episode_returns);
            per_task.push(vec![("episode_reward_mean", mean), ("episode_reward_std", denom)]);
            for (run, score) in task_runs.iter().zip(scores) {
                for &i in run {
                    a_e[i] = score;
                }
            }
        }

        // Anchor states across the whole batch, in order of first appearance; a null hash is no anchor.
        let mut keys: Vec<String> = Vec::new();
        let mut buckets: Vec<Vec<usize>> = Vec::new();
        for i in 0..n {
            let Some(hash) = info(i).and_then(|m| m.get(&self.env_state_hash_key)).filter(|v| !v.is_null()) else {
                continue;
            };
            let key = match hash {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            match keys.iter().position(|k| *k == key) {
                Some(b) => buckets[b].push(i),
                None => {
                    keys.push(key);
                    buckets.push(vec![i]);
                }
            }
        }
        let mut a_s = vec![0f64; n];
        let shared: Vec<&Vec<usize>> = buckets.iter().filter(|b| b.len() >= 2).collect();
        for bucket in &shared {
            let returns: Vec<f64> = bucket.iter().map(|&i| discounted[i]).collect();
            for (&i, score) in bucket.iter().zip(self.normalize(&returns).0) {
                a_s[i] = score;
            }
        }

        let combined: Vec<f32> = (0..n).map(|i| (a_e[i] + self.omega * a_s[i]) as f32).collect();
        let advantages = broadcast_rows(&combined, &batch.action_mask);
        let mut metrics = aggregate_groups(&per_task, "gigpo");
        let (total, hits) = (buckets.len(), shared.len());
        metrics.insert("gigpo/anchor_groups_total".into(), total as f64);
        metrics.insert("gigpo/anchor_groups_size_gt1".into(), hits as f64);
        metrics.insert("gigpo/anchor_group_hit_ratio".into(), if total > 0 { hits as f64 / total as f64 } else { 0.0 });
        metrics.insert("gigpo/mean_abs_A_E".into(), a_e.iter().map(|a| a.abs()).sum::<f64>() / n as f64);
        metrics.insert("gigpo/mean_abs_A_S".into(), a_s.iter().map(|a| a.abs()).sum::<f64>() / n as f64);
        metrics.insert("experience_count".into(), n as f64);
        Ok(AdvantageOutput::outcome(advantages, metrics))
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{assert_close as close, eval_err, eval_json, json};

    /// Task t1 has three runs (two steps, one, two; run 0's rows out of step order) whose first steps share
    /// anchor state s0; task t2 one run of one step. Rewards are sparse (no `step_reward` key). The expected
    /// numbers are 0.6.0's `GiGPOAdvantageFn.process` (trinity/algorithm/advantage_fn/gigpo_advantage.py)
    /// restated in a short plain-Python script (double precision).
    fn batch() -> serde_json::Value {
        json!({
            "group_id": ["t1", "t1", "t1", "t1", "t1", "t2"],
            "run_id": ["t1/0", "t1/0", "t1/1", "t1/2", "t1/2", "t2/0"],
            "run_step": [1, 0, 0, 0, 1, 0],
            "reward": [1.0, 1.0, 0.0, 0.5, 0.5, 2.0],
            "info": [{"env_state_hash": "s1"}, {"env_state_hash": "s0"}, {"env_state_hash": "s0"},
                     {"env_state_hash": "s0"}, {"env_state_hash": "s2"}, {}],
            "action_mask": [[1, 1], [1, 0], [1, 1], [1, 1], [1, 1], [1, 1]]
        })
    }

    fn run(args: serde_json::Value, batch: serde_json::Value) -> serde_json::Value {
        eval_json(json!({"advantage_fn": "gigpo", "advantage_fn_args": args, "batch": batch}))
    }

    fn first_tokens(out: &serde_json::Value) -> Vec<f64> {
        out["advantages"].as_array().unwrap().iter().map(|r| r[0].as_f64().unwrap()).collect()
    }

    #[test]
    fn episode_and_anchor_advantages_add_up() {
        // Episode returns of t1: 1, 0, 0.5 → A_E = (R − 0.5)/(1 + ε); anchor s0 (discounted 1, 0, 0.5) → A_S the
        // same; s1 and s2 are buckets of one; t2's single run gets A_E = 2/(1 + ε).
        let out = run(json!({}), batch());
        let want = [0.499_999_5, 0.999_999, -0.999_999, 0.0, 0.0, 1.999_998];
        for (got, want) in first_tokens(&out).iter().zip(want) {
            assert!((got - want).abs() < 1e-5, "{got} vs {want}: {out}");
        }
        assert_eq!(out["advantages"][1][1], 0.0, "masked token");
        close(&out["returns"][5][1], 1.999_998);
        let m = &out["metrics"];
        close(&m["gigpo/episode_reward_mean/mean"], 0.25);
        close(&m["gigpo/episode_reward_mean/max"], 0.5);
        close(&m["gigpo/episode_reward_std/mean"], 1.0);
        close(&m["gigpo/anchor_groups_total"], 3.0);
        close(&m["gigpo/anchor_groups_size_gt1"], 1.0);
        close(&m["gigpo/anchor_group_hit_ratio"], 1.0 / 3.0);
        close(&m["gigpo/mean_abs_A_E"], 0.583_332_75);
        close(&m["gigpo/mean_abs_A_S"], 0.166_666_5);
        close(&m["experience_count"], 6.0);
    }

    #[test]
    fn gamma_discounts_and_std_normalisation_with_omega() {
        // γ = 0.5: s0's discounted returns become 0.5, 0, 0.25 → A_S = ±0.25/(1 + ε).
        let out = run(json!({"gamma": 0.5}), batch());
        let want = [0.499_999_5, 0.749_999_25, -0.749_999_25, 0.0, 0.0, 1.999_998];
        for (got, want) in first_tokens(&out).iter().zip(want) {
            assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        }
        close(&out["metrics"]["gigpo/mean_abs_A_S"], 0.083_333_25);
        // fnorm std (F = 0.5 for t1 and for s0), ω = 0.5; t2 keeps F = 1.
        let out = run(json!({"fnorm": "std", "omega": 0.5}), batch());
        let want = [0.999_998, 1.499_997, -1.499_997, 0.0, 0.0, 1.999_998];
        for (got, want) in first_tokens(&out).iter().zip(want) {
            assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        }
        close(&out["metrics"]["gigpo/episode_reward_std/mean"], 0.75);
        close(&out["metrics"]["gigpo/episode_reward_std/min"], 0.5);
    }

    #[test]
    fn step_rewards_from_info_replace_the_row_reward_and_equal_returns_give_zero() {
        // Both runs set `step_reward` (0.25 then absent → 0, or 0.25 then 0): equal episode returns and equal
        // discounted returns per anchor, so every advantage is 0; the rows' reward 9 is never read. With
        // fnorm std the std is 0 and ε keeps it finite.
        let b = json!({
            "group_id": ["t", "t", "t", "t"], "run_id": ["r0", "r0", "r1", "r1"], "run_step": [0, 1, 0, 1],
            "reward": [9.0, 9.0, 9.0, 9.0],
            "info": [{"step_reward": 0.25, "env_state_hash": "a"}, {"env_state_hash": "b"},
                     {"step_reward": 0.25, "env_state_hash": "a"}, {"step_reward": 0.0, "env_state_hash": "b"}],
            "action_mask": [[1], [1], [1], [1]]
        });
        for fnorm in ["none", "std"] {
            let out = run(json!({"fnorm": fnorm}), b.clone());
            assert_eq!(first_tokens(&out), vec![0.0; 4], "{fnorm}");
            close(&out["metrics"]["gigpo/episode_reward_mean/mean"], 0.25);
            close(&out["metrics"]["gigpo/anchor_group_hit_ratio"], 1.0);
        }
    }

    #[test]
    fn without_info_it_is_the_episode_level_alone() {
        // No `info`: no anchors, A = A_E (sparse rewards: run t1/0 ends on its step 1, row 0, reward 1).
        let mut b = batch();
        b.as_object_mut().unwrap().remove("info");
        let out = run(json!({}), b);
        let want = [0.499_999_5, 0.499_999_5, -0.499_999_5, 0.0, 0.0, 1.999_998];
        for (got, want) in first_tokens(&out).iter().zip(want) {
            assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        }
        close(&out["metrics"]["gigpo/anchor_groups_total"], 0.0);
        close(&out["metrics"]["gigpo/anchor_group_hit_ratio"], 0.0);
    }

    #[test]
    fn bad_arguments_and_fields_are_errors() {
        let err = eval_err(json!({"advantage_fn": "gigpo", "advantage_fn_args": {"fnorm": "mean"}, "batch": batch()}));
        assert!(err.contains("fnorm"), "{err}");
        let mut b = batch();
        b["info"][0] = json!({"step_reward": "lots"});
        let err = eval_err(json!({"advantage_fn": "gigpo", "batch": b}));
        assert!(err.contains("row 0") && err.contains("step_reward"), "{err}");
        for field in ["run_id", "run_step"] {
            let mut b = batch();
            b.as_object_mut().unwrap().remove(field);
            assert!(eval_err(json!({"advantage_fn": "gigpo", "batch": b})).contains(field), "{field}");
        }
    }
}
