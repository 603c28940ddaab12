//! The learning-rate schedule, with veRL's semantics (Trinity-RFT's `algorithm.optimizer` feeds veRL's FSDP
//! workers).
//!
//! The learning rate of optimizer update `k` (0-based, counted in train steps) is `lr · f(k)`:
//! - warm-up, `k < W`: `f = k / max(1, W)` — so with a warm-up the very first update has lr 0, as in veRL's
//!   `get_constant_schedule_with_warmup` / `get_cosine_schedule_with_warmup`;
//! - after it, with `p = (k − W) / max(1, total − W)`:
//!   `constant`: 1; `cosine`: `max(min_lr_ratio, min_lr_ratio + (1 − min_lr_ratio)·½(1 + cos πp))`;
//!   `linear`: `max(min_lr_ratio, 1 − (1 − min_lr_ratio)·p)` (veRL has no linear schedule; this is the cosine
//!   one's linear counterpart, ending at `min_lr_ratio · lr` as the config documents).
//!
//! Steps past `total` keep the final value (veRL's cosine would climb back up; its runs never get there).
//!
//! `W = lr_warmup_steps` when it is ≥ 0, else `⌊lr_warmup_steps_ratio · total⌋` (veRL's rule). Decaying
//! schedules and a warm-up ratio need the total number of train steps.

use trinity_config::algorithm::{LrScheduler, OptimizerConfig};

use crate::error::{Result, TrainerError};

/// A resolved schedule: `lr(step)` for every optimizer update.
#[derive(Debug, Clone, PartialEq)]
pub struct LrSchedule {
    base_lr: f64,
    warmup_steps: u64,
    total_steps: Option<u64>,
    min_lr_ratio: f64,
    kind: LrScheduler,
}

impl LrSchedule {
    /// Builds the schedule of `optimizer` for a run of `total_steps` train steps (`None`: unknown, which only
    /// a constant schedule with an explicit warm-up length accepts).
    pub fn new(optimizer: &OptimizerConfig, total_steps: Option<u64>) -> Result<Self> {
        let kind = optimizer.warmup_style.unwrap_or(optimizer.lr_scheduler_type);
        let warmup_steps = if optimizer.lr_warmup_steps >= 0 {
            optimizer.lr_warmup_steps as u64
        } else if optimizer.lr_warmup_steps_ratio > 0.0 {
            let total = total_steps.ok_or_else(|| {
                TrainerError::setting(
                    "algorithm.optimizer.lr_warmup_steps_ratio",
                    "a warm-up ratio needs trainer.total_steps",
                )
            })?;
            (optimizer.lr_warmup_steps_ratio * total as f64) as u64
        } else {
            0
        };
        if kind != LrScheduler::Constant && total_steps.is_none() {
            return Err(TrainerError::setting(
                "algorithm.optimizer.lr_scheduler_type",
                format!("{kind:?} decay needs trainer.total_steps").to_lowercase(),
            ));
        }
        if !(0.0..=1.0).contains(&optimizer.min_lr_ratio) {
            return Err(TrainerError::setting("algorithm.optimizer.min_lr_ratio", "must be between 0 and 1"));
        }
        Ok(LrSchedule { base_lr: optimizer.lr, warmup_steps, total_steps, min_lr_ratio: optimizer.min_lr_ratio, kind })
    }

    /// The peak learning rate.
    pub fn base_lr(&self) -> f64 {
        self.base_lr
    }

    /// Warm-up length in updates.
    pub fn warmup_steps(&self) -> u64 {
        self.warmup_steps
    }

    /// The multiplier of update `step` (0-based).
    pub fn factor(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return step as f64 / self.warmup_steps.max(1) as f64;
        }
        let total = self.total_steps.unwrap_or(0);
        let progress = (step - self.warmup_steps) as f64 / total.saturating_sub(self.warmup_steps).max(1) as f64;
        // Past the last step veRL's cosine would rise again; the schedule stays at its end instead.
        let progress = progress.min(1.0);
        let min = self.min_lr_ratio;
        match self.kind {
            LrScheduler::Constant => 1.0,
            LrScheduler::Cosine => {
                let x = (std::f64::consts::PI * progress).cos();
                (x * (1.0 - min) * 0.5 + (1.0 + min) * 0.5).max(min)
            }
            LrScheduler::Linear => (1.0 - (1.0 - min) * progress).max(min),
        }
    }

    /// The learning rate of update `step` (0-based).
    pub fn lr(&self, step: u64) -> f64 {
        self.base_lr * self.factor(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(kind: LrScheduler, warmup: i64, ratio: f64) -> OptimizerConfig {
        OptimizerConfig {
            lr: 1.0,
            lr_warmup_steps: warmup,
            lr_warmup_steps_ratio: ratio,
            min_lr_ratio: 0.1,
            lr_scheduler_type: kind,
            ..OptimizerConfig::default()
        }
    }

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }

    #[test]
    fn constant_with_warmup_starts_at_zero_like_verl() {
        let s = LrSchedule::new(&config(LrScheduler::Constant, 4, 0.0), None).unwrap();
        let lrs: Vec<f64> = (0..6).map(|k| s.lr(k)).collect();
        assert_eq!(lrs, vec![0.0, 0.25, 0.5, 0.75, 1.0, 1.0]);
        let s = LrSchedule::new(&config(LrScheduler::Constant, -1, 0.0), None).unwrap();
        close(s.lr(0), 1.0);
    }

    #[test]
    fn cosine_matches_verl_formula() {
        let s = LrSchedule::new(&config(LrScheduler::Cosine, 2, 0.0), Some(12)).unwrap();
        close(s.lr(1), 0.5);
        close(s.lr(2), 1.0);
        // Half-way through the decay: the midpoint between 1 and min_lr_ratio.
        close(s.lr(7), 0.55);
        close(s.lr(12), 0.1);
        close(s.lr(40), 0.1);
    }

    #[test]
    fn linear_and_ratio_warmup() {
        let s = LrSchedule::new(&config(LrScheduler::Linear, -1, 0.25), Some(8)).unwrap();
        assert_eq!(s.warmup_steps(), 2);
        close(s.lr(2), 1.0);
        close(s.lr(5), 1.0 - 0.9 * 0.5);
        close(s.lr(8), 0.1);
    }

    #[test]
    fn decay_without_total_steps_is_an_error() {
        let err = LrSchedule::new(&config(LrScheduler::Cosine, 0, 0.0), None).unwrap_err().to_string();
        assert!(err.contains("lr_scheduler_type") && err.contains("total_steps"), "{err}");
        let err = LrSchedule::new(&config(LrScheduler::Constant, -1, 0.1), None).unwrap_err().to_string();
        assert!(err.contains("lr_warmup_steps_ratio"), "{err}");
    }
}
