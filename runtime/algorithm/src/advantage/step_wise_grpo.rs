//! `step_wise_grpo`: GRPO over multi-step runs (Trinity-RFT's `StepWiseGRPOAdvantageFn`), explorer side.
//!
//! Rows are grouped by task (`group_id`), then by run (`run_id`). Each run's *last row in batch order* (its
//! last step) carries the run's reward; over a task's runs μ = mean, σ = std (unbiased) of those rewards
//! (one run: μ = 0, σ = 1), or σ over every run's last-step reward in the batch with
//! `std_cal_level = "batch"`. score = (R_last − μ)/(σ + ε) is broadcast to every step of the run:
//! A = m·score (÷ the run's number of steps with `enable_step_norm`). With `std_threshold`, a task with one run
//! or σ ≤ threshold is dropped entirely.
//! Metrics: `group_advantages/reward_{mean,std}/…`, `experience_count`, `filtered_count`,
//! `skipped_group_ratio`.

use crate::advantage::{AdvantageFn, AdvantageFnEntry, AdvantageOutput, mean_f32, std_f32};
use crate::args::{ArgDefault, ArgSpec, Args, arg};
use crate::batch::{Batch, group_rows};
use crate::error::AlgorithmError;
use crate::metrics::aggregate_groups;

const NAME: &str = "step_wise_grpo";

const ARGS: &[ArgSpec] = &[
    arg("epsilon", ArgDefault::Float(1e-6)),
    arg("enable_step_norm", ArgDefault::Bool(false)),
    arg("std_threshold", ArgDefault::Null),
    arg("std_cal_level", ArgDefault::Str("group")),
];

#[derive(Debug)]
struct StepWiseGrpo {
    epsilon: f32,
    enable_step_norm: bool,
    std_threshold: Option<f32>,
    batch_std: bool,
}

fn build(args: &Args) -> Result<Box<dyn AdvantageFn>, AlgorithmError> {
    Ok(Box::new(StepWiseGrpo {
        epsilon: args.f64("epsilon")? as f32,
        enable_step_norm: args.bool("enable_step_norm")?,
        std_threshold: args.opt_f64("std_threshold")?.map(|v| v as f32),
        batch_std: args.choice("std_cal_level", &["group", "batch"])? == "batch",
    }))
}

inventory::submit! { AdvantageFnEntry { name: NAME, args: ARGS, compute_in_trainer: false, build } }

impl AdvantageFn for StepWiseGrpo {
    fn compute(&self, batch: &Batch) -> Result<AdvantageOutput, AlgorithmError> {
        let rewards: Vec<f32> = batch.row_rewards(NAME)?.into_iter().map(|r| r as f32).collect();
        let tasks = batch.groups(NAME)?;
        let runs =
            batch.run_id.as_deref().ok_or(AlgorithmError::MissingField { component: NAME.into(), field: "run_id" })?;
        // Task groups, each split into runs (row indices), both in order of first appearance.
        let task_runs: Vec<Vec<Vec<usize>>> = group_rows(tasks)
            .into_iter()
            .map(|task| {
                let ids: Vec<String> = task.iter().map(|&i| runs[i].clone()).collect();
                group_rows(&ids).into_iter().map(|run| run.into_iter().map(|j| task[j]).collect()).collect()
            })
            .collect();
        let last_reward = |run: &Vec<usize>| run.last().map_or(0.0, |&i| rewards[i]);

        let batch_std = if self.batch_std {
            let all: Vec<f32> = task_runs.iter().flatten().map(last_reward).collect();
            Some(if all.len() <= 1 { 1.0 } else { std_f32(&all) })
        } else {
            None
        };

        let (rows_n, len) = (batch.rows(), batch.len());
        let mask = crate::batch::tensor_to_vec(&batch.action_mask.view([-1]));
        let mut adv = vec![0f32; rows_n * len];
        let mut rows = Vec::new();
        let mut per_group = Vec::new();
        let mut filtered = 0usize;
        let mut skipped = 0usize;
        for task in &task_runs {
            let last: Vec<f32> = task.iter().map(last_reward).collect();
            let (mean, std) = if last.len() == 1 { (0f32, 1f32) } else { (mean_f32(&last), std_f32(&last)) };
            per_group.push(vec![("reward_mean", f64::from(mean)), ("reward_std", f64::from(std))]);
            if self.std_threshold.is_some_and(|thr| last.len() == 1 || std <= thr) {
                filtered += task.iter().map(Vec::len).sum::<usize>();
                skipped += 1;
                continue;
            }
            let denom = batch_std.unwrap_or(std) + self.epsilon;
            for (run, &r_last) in task.iter().zip(&last) {
                let score = (r_last - mean) / denom;
                for &i in run {
                    for t in 0..len {
                        let mut a = mask[i * len + t] as f32 * score;
                        if self.enable_step_norm {
                            a /= run.len() as f32;
                        }
                        adv[i * len + t] = a;
                    }
                    rows.push(i as i64);
                }
            }
        }
        let mut metrics = aggregate_groups(&per_group, "group_advantages");
        metrics.insert("experience_count".into(), rows.len() as f64);
        metrics.insert("filtered_count".into(), filtered as f64);
        metrics.insert("skipped_group_ratio".into(), skipped as f64 / task_runs.len().max(1) as f64);
        let advantages = tch::Tensor::from_slice(&adv).view([rows_n as i64, len as i64]);
        Ok(AdvantageOutput { rows: Some(rows), ..AdvantageOutput::outcome(advantages, metrics) })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_trinity() {
        crate::testing::check_fixtures("advantage_step_wise_grpo");
    }
}
