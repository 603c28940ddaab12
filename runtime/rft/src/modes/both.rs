//! Modes `both` and `colocate`: explorer and trainer in one process on one device, weights synchronised in place.
//!
//! The loop follows [`crate::schedule`]: a train step that publishes no weights runs as soon as its explore step is
//! stored, otherwise explore whenever the sync plan allows, else train; after every `sync_interval`-th train step the trainer's weights are copied into the generation engine (`memory`), or go
//! through the run's weight store on disk first (`checkpoint`). Train step `s` trains on exactly the experiences of
//! explore step `s` (whole groups, in order).
//!
//! Resume: with the in-memory queue, any step explored but not trained before the stop is explored again (the
//! queue did not survive; the taskset position saved is the one of the last trained step). With a SQLite buffer
//! the explored steps survive: rows taken by train steps after the checkpoint are handed back, and exploring
//! continues after the last explore step the database recorded (its rows and taskset position are committed in
//! one transaction), so no experience is lost or made twice.
//!
//! A `buffer.train_batch_size` other than one explore step's output reads fixed-size batches in arrival order
//! instead ([`fixed`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use trinity_buffer::difficulty_estimator::DifficultyEstimator;
use trinity_buffer::{Experience, ExperienceBuffer, SchedulerState};
use trinity_config::Config;
use trinity_config::synchronizer::{SyncMethod, SyncStyle};
use trinity_monitor::{Metrics, Monitor, Phase};

use crate::error::RftError;
use crate::explorer::{Explorer, ExplorerLogs, ExplorerRole};
use crate::models;
use crate::run::RunSummary;
use crate::schedule::{Action, SyncSchedule, next_action, next_action_fully_async};
use crate::synchronizer::{WeightStore, take_named};
use crate::trainer::{Meta, Rank0, Trainer};

mod fixed;

/// What a persistent buffer records with each explore step, to continue after it on resume.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ExploreRecord {
    pub scheduler: SchedulerState,
    pub metrics: Metrics,
    /// The `difficulty_based` selectors' beliefs after the step (mode `explore`, whose state lives in the buffer;
    /// mode `both` keeps them in its checkpoints).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub beliefs: Vec<Option<DifficultyEstimator>>,
}

/// Runs a resolved config in mode `both` (or `colocate`, the same on one device), writing to `job_dir`.
/// With `dp` this process is rank 0 of a data-parallel run: it explores alone and trains each step with the
/// other ranks ([`crate::data_parallel`]).
pub(crate) async fn run(
    config: &Config,
    job_dir: &Path,
    threads: usize,
    dp: Option<Rank0>,
) -> Result<RunSummary, RftError> {
    Both::start(config, job_dir, threads, dp).await?.drive().await
}

struct Both<'a> {
    config: &'a Config,
    job_dir: PathBuf,
    monitor: Monitor,
    explorer: Explorer,
    trainer: Trainer,
    buffer: ExperienceBuffer,
    /// `sync_method: checkpoint`: weights go through the disk, as they would to an explorer in another process.
    weight_store: Option<WeightStore>,
    schedule: SyncSchedule,
    /// `sync_style: fully_async`: the batches in flight at most (`explorer.max_inflight_batches`).
    fully_async: Option<u64>,
    total_steps: u64,
    resumed_from: Option<u64>,
    explored: u64,
    trained: u64,
    syncs: u64,
    /// Taskset position after each explore step not yet checkpointed, to save with the matching train step.
    positions: BTreeMap<u64, SchedulerState>,
    /// Experiences each explore step put in the buffer, and its metrics, until its train step.
    pending: BTreeMap<u64, (usize, Metrics)>,
    /// End of the previous train step (or the start of the loop): `time/step_s` is measured from here.
    step_mark: Instant,
    /// `train_batch_size` is not one explore step's output: each train step reads a fixed-size batch.
    fixed: Option<fixed::Fixed>,
}

impl<'a> Both<'a> {
    async fn start(
        config: &'a Config,
        job_dir: &Path,
        threads: usize,
        dp: Option<Rank0>,
    ) -> Result<Both<'a>, RftError> {
        let device = match &dp {
            Some(rank0) => rank0.device,
            None => models::device(Path::new(&config.model.model_path))?,
        };
        // The tasksets' length bounds the run; the trainer's own limit may shorten it. (Read after the model loads,
        // so that a missing model is the error a run with two missing inputs reports.)
        let per_batch = trinity_config::fixed_size_train_batch(config);
        let (explore_steps, nominal) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        let planned = |_: &_, _: Option<&_>, _| {
            let steps = trinity_buffer::TaskScheduler::from_config(&config.buffer)?.total_steps();
            explore_steps.set(steps);
            let steps = match per_batch {
                Some(per_batch) => fixed::planned_train_steps(config, steps, per_batch),
                None => steps,
            };
            nominal.set(steps);
            Ok(config.trainer.total_steps.map_or(steps, |t| t.min(steps)))
        };
        let started = Trainer::start(config, job_dir, device, threads, planned, dp)?;
        let trainer = started.trainer;
        let model_path = match &started.resumed {
            Some((checkpoint, _)) => checkpoint.path.join("hf"),
            None => PathBuf::from(&config.model.model_path),
        };
        let logs = ExplorerLogs::in_dir(job_dir, "");
        let mut explorer = Explorer::start(config, &model_path, device, threads, ExplorerRole::Explore, Some(logs))?;
        let (mut trained, mut syncs) = (0, 0);
        if let Some((_, meta)) = &started.resumed {
            let scheduler = explorer.scheduler();
            if let Some(state) = &meta.scheduler {
                scheduler.restore(state.clone())?;
            }
            if !meta.beliefs.is_empty() {
                scheduler.restore_beliefs(meta.beliefs.clone())?;
            }
            trained = meta.train_step;
            syncs = meta.syncs;
            explorer.rollout().set_model_version(meta.train_step);
        }
        let experience_buffer = config.buffer.trainer_input.experience_buffer.clone().unwrap_or_default();
        let buffer = ExperienceBuffer::open(&experience_buffer, &job_dir.join("buffer"))
            .await?
            .with_consumer(&config.trainer.name)
            .with_room_timeout(Duration::from_secs(config.synchronizer.sync_timeout));
        let mut explored = trained;
        let mut positions = BTreeMap::new();
        let mut pending = BTreeMap::new();
        // Fixed-size batches train as many steps as the explored experiences fill, unless the trainer's own limit
        // (trainer.total_steps, or mix's expert rows) is below the plan.
        let limited = config.trainer.total_steps.is_some() || trainer.total_steps() < nominal.get();
        let limit = if limited { trainer.total_steps() } else { u64::MAX };
        let fixed = per_batch.map(|per_batch| fixed::Fixed::new(per_batch, explore_steps.get(), trained, limit));
        if fixed.is_some() {
            explored = started.resumed.as_ref().and_then(|(_, meta)| meta.explored).unwrap_or(trained);
            buffer.release_after(trained).await?;
            for recorded in buffer.explored_after(&config.explorer.name, explored).await? {
                let record: ExploreRecord = serde_json::from_str(&recorded.state).map_err(|e| {
                    RftError::Unsupported(format!("buffer {}: unreadable explore record: {e}", buffer.name()))
                })?;
                explorer.scheduler().restore(record.scheduler)?;
                explored = recorded.step;
            }
        }
        let records =
            if fixed.is_some() { Vec::new() } else { buffer.resume_after(&config.explorer.name, trained).await? };
        for recorded in records {
            let record: ExploreRecord = serde_json::from_str(&recorded.state).map_err(|e| {
                RftError::Unsupported(format!("buffer {}: unreadable explore record: {e}", buffer.name()))
            })?;
            explorer.scheduler().restore(record.scheduler.clone())?;
            positions.insert(recorded.step, record.scheduler);
            pending.insert(recorded.step, (recorded.count, record.metrics));
            explored = recorded.step;
        }
        if explored > trained {
            tracing::info!(
                "explore steps {}..={explored} are in the buffer already: continuing after them",
                trained + 1
            );
        }
        let weight_store = match config.synchronizer.sync_method {
            SyncMethod::Checkpoint => Some(WeightStore::open(job_dir)?),
            SyncMethod::Memory | SyncMethod::Nccl => None,
        };
        Ok(Both {
            config,
            job_dir: job_dir.to_owned(),
            monitor: Monitor::open_run(&job_dir.join("monitor"), &super::monitor_spec(config, "both"))?,
            total_steps: trainer.total_steps(),
            explorer,
            trainer,
            buffer,
            weight_store,
            schedule: SyncSchedule::of(&config.synchronizer),
            fully_async: (config.synchronizer.sync_style == SyncStyle::FullyAsync)
                .then_some(u64::from(config.explorer.max_inflight_batches)),
            resumed_from: started.resumed.map(|(c, _)| c.step),
            explored,
            trained,
            syncs,
            positions,
            pending,
            step_mark: Instant::now(),
            fixed,
        })
    }

    async fn drive(mut self) -> Result<RunSummary, RftError> {
        if self.fixed.is_some() {
            return self.drive_fixed().await;
        }
        tracing::info!(
            "run {}: {} steps, explorer syncs every {} step(s), trainer every {}, offset {}",
            self.job_dir.display(),
            self.total_steps,
            self.schedule.explorer_interval,
            self.schedule.trainer_interval,
            self.schedule.offset
        );
        if let Some(inflight) = self.fully_async {
            tracing::info!(
                "sync_style fully_async: up to {inflight} batches in flight between explore and train step; the \
                 explorer takes the weights of every {}th train step as soon as it ends",
                self.schedule.trainer_interval
            );
        }
        self.monitor.plan(Some(self.total_steps), self.trained)?;
        if self.resumed_from.is_none() && self.config.explorer.eval_on_startup && self.explorer.has_eval_tasksets() {
            let metrics = self.explorer.evaluate("eval", 0).await?;
            self.monitor.record(0, &metrics)?;
        }
        self.step_mark = Instant::now();
        loop {
            let action = match self.fully_async {
                Some(inflight) => next_action_fully_async(inflight, self.explored, self.trained, self.total_steps),
                None => next_action(&self.schedule, self.explored, self.trained, self.syncs, self.total_steps),
            };
            match action {
                Action::Explore(step) => self.explore(step).await?,
                Action::Train(step) => self.train(step).await?,
                Action::Done => break,
            }
        }
        self.buffer.close();
        Ok(RunSummary { job_dir: self.job_dir, resumed_from: self.resumed_from, train_steps: self.trained })
    }

    async fn explore(&mut self, step: u64) -> Result<(), RftError> {
        self.monitor.phase(step, Phase::Explore);
        let Some(output) = self.explorer.explore_step(step).await? else {
            // The tasksets ran out earlier than planned (only possible with total_steps beyond the data).
            self.total_steps = step - 1;
            return Ok(());
        };
        let scheduler = self.explorer.scheduler().state();
        self.positions.insert(step, scheduler.clone());
        let count = output.experiences.len();
        let record = ExploreRecord { scheduler, metrics: output.metrics, beliefs: Vec::new() };
        let state = serde_json::to_string(&record)
            .map_err(|e| RftError::Unsupported(format!("cannot encode the explore record: {e}")))?;
        self.buffer.put_step(&self.config.explorer.name, step, output.experiences, &state).await?;
        self.pending.insert(step, (count, record.metrics));
        self.explored = step;
        Ok(())
    }

    async fn train(&mut self, step: u64) -> Result<(), RftError> {
        self.monitor.phase(step, Phase::Train);
        let (count, mut metrics) = self.pending.remove(&step).unwrap_or_default();
        if count > 0 {
            let timeout = Duration::from_secs_f64(
                self.config.buffer.trainer_input.experience_buffer.as_ref().map_or(1800.0, |b| b.max_read_timeout),
            );
            let batch: Vec<Experience> = self.buffer.get_batch_for_step(count, timeout, step).await?;
            self.trainer.train_experiences(step, batch, &mut metrics)?;
        } else {
            self.trainer.train_rows(step, &[], &mut metrics)?;
        }
        self.trained = step;

        let mut sync_seconds = 0.0;
        // A fully asynchronous explorer takes every version the trainer publishes, as soon as it is published.
        let loads = match self.fully_async {
            Some(_) => self.schedule.publishes_after(step),
            None => self.schedule.loads_after(step),
        };
        if loads || step == self.total_steps {
            let started = Instant::now();
            self.monitor.phase(step, Phase::Sync);
            self.sync(step).await?;
            sync_seconds = started.elapsed().as_secs_f64();
        }
        metrics.insert("time/sync_s".into(), sync_seconds);

        let eval_interval = self.config.explorer.eval_interval;
        if self.explorer.has_eval_tasksets() && (step.is_multiple_of(eval_interval) || step == self.total_steps) {
            self.monitor.phase(step, Phase::Evaluate);
            metrics.extend(self.explorer.evaluate("eval", step).await?);
        }
        let save_interval = self.config.trainer.save_interval;
        let mut save_seconds = 0.0;
        if (save_interval > 0 && step.is_multiple_of(save_interval)) || step == self.total_steps {
            let started = Instant::now();
            self.monitor.phase(step, Phase::Save);
            self.save(step).await?;
            save_seconds = started.elapsed().as_secs_f64();
        }
        metrics.insert("time/save_s".into(), save_seconds);
        // Wall time since the previous step ended: the time/* phases above add up to it (explore, train, sync,
        // eval, save), which is how a reader checks that no phase goes unmeasured.
        metrics.insert("time/step_s".into(), self.step_mark.elapsed().as_secs_f64());
        self.step_mark = Instant::now();
        self.monitor.record(step, &metrics)?;
        tracing::info!(
            // `train/loss` is what every policy loss reports (`pg_loss` is PPO-family only); absent when the step
            // trained nothing.
            "step {step}/{}: reward {:.3}, loss {:.4}, explore {:.1}s, train {:.1}s",
            self.total_steps,
            metrics.get("rollout/reward_mean").copied().unwrap_or(f64::NAN),
            metrics.get("train/loss").copied().unwrap_or(f64::NAN),
            metrics.get("time/explore_s").copied().unwrap_or(0.0),
            metrics.get("time/train_s").copied().unwrap_or(0.0),
        );
        // GiGPO's step-level advantages exist only where several turns share an anchor state.
        if let Some(shared) = metrics.get("pipeline/gigpo/anchor_groups_size_gt1") {
            tracing::info!(
                "step {step}: gigpo anchor groups of more than one turn: {shared} of {}",
                metrics.get("pipeline/gigpo/anchor_groups_total").copied().unwrap_or(f64::NAN)
            );
        }
        Ok(())
    }

    /// Carries the trainer's weights of `step` to the engine: in place, or through the weight store on disk (the
    /// transport an explorer in another process uses, kept here so mode `both` can run with it too). Either way
    /// they go part by part (under ZeRO stage 3 a decoder layer at a time, as the ranks gather it), so rank 0
    /// never holds a second whole model beside the engine's.
    async fn sync(&mut self, step: u64) -> Result<(), RftError> {
        let trainer = &self.trainer;
        if let Some(store) = &self.weight_store {
            let specs = trainer.weight_layout()?;
            let names = specs.iter().map(|spec| spec.name.clone()).collect();
            store.publish_parts(step, specs, |file| trainer.weight_parts(|part| file.push(part))?)?;
            let (version, stored) = store.latest_weights()?.ok_or_else(|| {
                RftError::Unsupported(format!("{}: published weights vanished", store.dir().display()))
            })?;
            debug_assert_eq!(version, step);
            self.explorer.load_weights(take_named(&stored, names, store.dir())?, step).await?;
        } else {
            let feed = |sink: &trinity_engine::WeightSink| Ok(trainer.weight_parts(|part| sink.send(part))??);
            self.explorer.load_weight_parts(step, feed).await?;
        }
        tracing::info!("the explorer samples with the trainer's weights of step {step} from now on");
        self.syncs += 1;
        Ok(())
    }

    async fn save(&mut self, step: u64) -> Result<(), RftError> {
        let scheduler = self.positions.get(&step).cloned().unwrap_or_else(|| self.explorer.scheduler().state());
        let meta = Meta {
            train_step: step,
            syncs: self.syncs,
            scheduler: Some(scheduler),
            beliefs: self.explorer.scheduler().beliefs(),
            dataset_rows: None,
            explored: self.fixed.is_some().then_some(self.explored),
        };
        self.trainer.save(&meta)?;
        self.positions.retain(|&s, _| s > step);
        // The checkpoint is durable: what the steps up to it trained is never handed back again.
        self.buffer.commit_through(step).await?;
        Ok(())
    }
}
