//! Mode `both` with fixed-size train batches: `buffer.train_batch_size` is not one explore step's output
//! ([`trinity_config::fixed_size_train_batch`]), so each train step reads that many experiences from the buffer in
//! arrival order, whatever explore step they came from, and what is left waits for the next step. This is how
//! Trinity-RFT's trainer reads its queue (`QueueStorage.get_batch` keeps the surplus of a read in its pool), and
//! what a workflow whose steps make more experiences than `batch_size × repeat_times` needs: the trainable RULER
//! judge adds its own judgements to a fifth of its groups, and Trinity's GSM8K RULER example trains 960 a step of
//! the 768 rollouts and about 154 judgements an explore step makes.
//!
//! The order, in one process: a train step runs as soon as a full batch waits (Trinity-RFT's trainer, beside the
//! explorer, takes each batch as soon as the queue can fill it); otherwise the explorer explores while its sync
//! plan allows; at each of its sync points (every `sync_interval` explore steps after `sync_offset`, as 0.6.0's
//! `Explorer.need_sync`) it takes the trainer's newest weights, or keeps its own when no train step ran since the
//! last sync (Trinity's explorer would wait `sync_timeout` for weights the trainer cannot make without more
//! experiences). Staleness control skips experiences older than `max_staleness` versions in the read, as
//! Trinity's `min_model_version` does.
//!
//! The run explores every explore step the tasksets give and makes `floor(explore steps × batch_size ×
//! repeat_times / train_batch_size)` train steps (what mode `train` counts from the same data), or
//! `trainer.total_steps` if fewer; experiences no train step reads at the end are left, and the log says how many.
//! Metrics: explore step `n`'s under step `n` (rollout, eval), train step `n`'s under step `n` (train, buffer), as
//! Trinity-RFT's explorer and trainer log to one monitor each at their own step.
//!
//! Resume: a checkpoint records the explore steps made ([`Meta::explored`]) and the taskset position after them.
//! With the in-memory queue the experiences waiting at the checkpoint are lost with the process (the log at save
//! says how many); with a SQLite or PostgreSQL buffer they survive, claims of train steps after the checkpoint are
//! handed back, and exploring continues after the last explore step the database recorded.
//!
//! [`Meta::explored`]: crate::trainer::Meta::explored

use std::time::Instant;

use trinity_config::Config;
use trinity_monitor::{Metrics, Phase};

use super::{Both, ExploreRecord};
use crate::error::RftError;
use crate::run::RunSummary;
use crate::schedule::{FixedAction, next_action_fixed};

/// The state of a run reading fixed-size batches.
pub(super) struct Fixed {
    /// Experiences a train step reads from the buffer (`train_batch_size`, less `mix`'s expert rows).
    per_batch: usize,
    /// Explore steps the tasksets give.
    explore_steps: u64,
    /// The most train steps: `trainer.total_steps` (or fewer when `mix`'s expert rows run out), else unbounded.
    limit: u64,
    /// The train step whose weights the explorer samples with.
    loaded: u64,
    /// The last train step checkpointed.
    saved: u64,
}

impl Fixed {
    pub(super) fn new(per_batch: u64, explore_steps: u64, trained: u64, limit: u64) -> Fixed {
        Fixed { per_batch: per_batch as usize, explore_steps, limit, loaded: trained, saved: trained }
    }
}

/// Train steps a run of `explore_steps` explore steps plans reading `per_batch` experiences a step (the learning
/// rate's schedule and the progress display): the experiences `batch_size × repeat_times` a step promises, in whole
/// batches (at least one). The run trains every full batch the explore steps make, which may be more (a judge's
/// experiences on top) or fewer (failed tasks, filtered groups); steps past the plan keep the schedule's last rate.
pub(super) fn planned_train_steps(config: &Config, explore_steps: u64, per_batch: u64) -> u64 {
    let per_step = u64::from(config.buffer.batch_size) * u64::from(config.algorithm.resolved.repeat_times);
    (explore_steps * per_step / per_batch.max(1)).max(1)
}

impl Both<'_> {
    fn fixed(&self) -> &Fixed {
        self.fixed.as_ref().expect("a run reading fixed-size batches")
    }

    fn fixed_mut(&mut self) -> &mut Fixed {
        self.fixed.as_mut().expect("a run reading fixed-size batches")
    }

    pub(super) async fn drive_fixed(mut self) -> Result<RunSummary, RftError> {
        let Fixed { per_batch, explore_steps, .. } = *self.fixed();
        tracing::info!(
            "run {}: train_batch_size {} is not one explore step's experiences (batch_size {} × repeat_times {}): \
             each train step reads {per_batch} in arrival order, the rest waiting for the next, as Trinity-RFT's \
             trainer reads its queue; {explore_steps} explore steps, about {} train steps, the explorer syncs every \
             {} explore step(s) after {}",
            self.job_dir.display(),
            self.config.buffer.train_batch_size,
            self.config.buffer.batch_size,
            self.config.algorithm.resolved.repeat_times,
            self.total_steps,
            self.schedule.explorer_interval,
            self.schedule.offset,
        );
        // Records go up to the last explore step (explore metrics) or the last train step, whichever is later.
        self.monitor.plan(Some(self.total_steps.max(explore_steps)), self.trained)?;
        if self.resumed_from.is_none() && self.config.explorer.eval_on_startup && self.explorer.has_eval_tasksets() {
            let metrics = self.explorer.evaluate("eval", 0).await?;
            self.monitor.record(0, &metrics)?;
        }
        loop {
            let step = self.trained + 1;
            let batch = match self.trained < self.fixed().limit {
                true => {
                    let min_version = self.trainer.min_model_version(step);
                    self.buffer.try_take_for_step(per_batch, min_version, step).await?
                }
                false => None,
            };
            let action = next_action_fixed(
                &self.schedule,
                batch.is_some(),
                (self.explored, self.fixed().explore_steps),
                (self.trained, self.fixed().limit),
                self.syncs,
            );
            match action {
                FixedAction::Train(step) => {
                    let batch = batch.expect("a full batch was read");
                    self.train_fixed(step, batch).await?;
                }
                FixedAction::Explore(step) => self.explore_fixed(step).await?,
                FixedAction::Sync => self.sync_fixed().await?,
                FixedAction::Done => break,
            }
        }
        let waiting = self.buffer.len().await?;
        if self.trained != self.total_steps {
            tracing::info!(
                "the run trained {} steps where {} were planned from batch_size × repeat_times; steps past the plan \
                 keep the learning rate schedule's last rate",
                self.trained,
                self.total_steps
            );
            self.total_steps = self.trained;
        }
        if waiting > 0 {
            tracing::info!(
                "{waiting} experiences are left in the buffer, fewer than a batch of {per_batch} or past the last \
                 train step: not trained (Trinity-RFT's trainer leaves them in its queue too)"
            );
        }
        self.finish_fixed().await?;
        self.buffer.close();
        Ok(RunSummary { job_dir: self.job_dir, resumed_from: self.resumed_from, train_steps: self.trained })
    }

    async fn explore_fixed(&mut self, step: u64) -> Result<(), RftError> {
        self.monitor.phase(step, Phase::Explore);
        let Some(output) = self.explorer.explore_step(step).await? else {
            // The tasksets ran out earlier than planned (only possible with total_steps beyond the data).
            self.fixed_mut().explore_steps = step - 1;
            return Ok(());
        };
        let scheduler = self.explorer.scheduler().state();
        let count = output.experiences.len();
        let mut metrics = output.metrics;
        let record = ExploreRecord { scheduler, metrics: metrics.clone(), beliefs: Vec::new() };
        let state = serde_json::to_string(&record)
            .map_err(|e| RftError::Unsupported(format!("cannot encode the explore record: {e}")))?;
        self.buffer.put_step(&self.config.explorer.name, step, output.experiences, &state).await?;
        self.explored = step;
        let waiting = self.buffer.len().await?;
        metrics.insert("rollout/experience_count".into(), count as f64);
        metrics.insert("buffer/waiting".into(), waiting as f64);
        if self.explorer.has_eval_tasksets() && step.is_multiple_of(self.config.explorer.eval_interval) {
            self.monitor.phase(step, Phase::Evaluate);
            metrics.extend(self.explorer.evaluate("eval", step).await?);
        }
        self.monitor.record(step, &metrics)?;
        tracing::info!(
            "explore step {step}/{}: reward {:.3}, {count} experiences, {waiting} waiting for train step {}, \
             explore {:.1}s",
            self.fixed().explore_steps,
            metrics.get("rollout/reward_mean").copied().unwrap_or(f64::NAN),
            self.trained + 1,
            metrics.get("time/explore_s").copied().unwrap_or(0.0),
        );
        Ok(())
    }

    async fn train_fixed(&mut self, step: u64, batch: Vec<trinity_buffer::Experience>) -> Result<(), RftError> {
        let started = Instant::now();
        self.monitor.phase(step, Phase::Train);
        let carried = self.buffer.len().await?;
        let steps_read = {
            let mut steps: Vec<u64> = batch.iter().map(|e| e.eid.batch).collect();
            steps.sort_unstable();
            steps.dedup();
            steps
        };
        let mut metrics = Metrics::new();
        metrics.insert("buffer/carried_over".into(), carried as f64);
        metrics.insert("buffer/explore_steps_read".into(), steps_read.len() as f64);
        self.trainer.train_experiences(step, batch, &mut metrics)?;
        self.trained = step;
        let save_interval = self.config.trainer.save_interval;
        let mut save_seconds = 0.0;
        if save_interval > 0 && step.is_multiple_of(save_interval) && step < self.total_steps {
            let started = Instant::now();
            self.monitor.phase(step, Phase::Save);
            self.save_fixed(step).await?;
            save_seconds = started.elapsed().as_secs_f64();
        }
        metrics.insert("time/save_s".into(), save_seconds);
        metrics.insert("time/step_s".into(), started.elapsed().as_secs_f64());
        self.monitor.record(step, &metrics)?;
        tracing::info!(
            "step {step}/{}: a batch of {} from explore step(s) {:?}, {carried} experiences carried over to the \
             next step; loss {:.4}, train {:.1}s",
            self.total_steps,
            self.fixed().per_batch,
            steps_read,
            metrics.get("train/loss").copied().unwrap_or(f64::NAN),
            metrics.get("time/train_s").copied().unwrap_or(0.0),
        );
        Ok(())
    }

    /// One of the explorer's sync points: the trainer's newest weights go into the engine, unless no train step
    /// ran since the last one.
    async fn sync_fixed(&mut self) -> Result<(), RftError> {
        let Fixed { loaded, per_batch, .. } = *self.fixed();
        if loaded < self.trained {
            let (step, started) = (self.trained, Instant::now());
            self.monitor.phase(step, Phase::Sync);
            self.sync(step).await?;
            self.fixed_mut().loaded = step;
            tracing::info!("sync after explore step {}: {:.1}s", self.explored, started.elapsed().as_secs_f64());
        } else {
            self.syncs += 1;
            tracing::info!(
                "sync after explore step {}: no train step since the last sync ({} experiences wait for a batch of \
                 {per_batch}), so the explorer keeps the weights of step {loaded}",
                self.explored,
                self.buffer.len().await?,
            );
        }
        Ok(())
    }

    async fn save_fixed(&mut self, step: u64) -> Result<(), RftError> {
        self.save(step).await?;
        self.fixed_mut().saved = step;
        let waiting = self.buffer.len().await?;
        if !self.buffer.is_persistent() && waiting > 0 {
            tracing::info!(
                "checkpoint of step {step}: {waiting} experiences wait in the in-memory queue; a run resumed from it \
                 explores after explore step {} and does not train them",
                self.explored
            );
        }
        Ok(())
    }

    /// The last train step's weights go into the engine, are evaluated and checkpointed (the explorer's last
    /// sync may be older), as mode `both` ends its last step.
    async fn finish_fixed(&mut self) -> Result<(), RftError> {
        let step = self.trained;
        if step == 0 {
            return Ok(());
        }
        let mut metrics = Metrics::new();
        if self.fixed().loaded < step {
            self.monitor.phase(step, Phase::Sync);
            self.sync(step).await?;
            self.fixed_mut().loaded = step;
        }
        if self.explorer.has_eval_tasksets() {
            self.monitor.phase(step, Phase::Evaluate);
            metrics.extend(self.explorer.evaluate("eval", step).await?);
        }
        if self.fixed().saved < step {
            let started = Instant::now();
            self.monitor.phase(step, Phase::Save);
            self.save_fixed(step).await?;
            metrics.insert("time/save_s".into(), started.elapsed().as_secs_f64());
        }
        if !metrics.is_empty() {
            self.monitor.record(step, &metrics)?;
        }
        Ok(())
    }
}
