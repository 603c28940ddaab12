//! Mode `explore`: an explorer in a process of its own, feeding a trainer in another process (mode `train`)
//! through a shared buffer, and taking the weights the trainer publishes.
//!
//! The explorer is named `explorer.name`; several explorers with distinct names can feed one trainer and join or
//! leave at any time. Its state lives in the buffer: every explore step is stored with the explorer's taskset
//! position in one transaction, so a restarted explorer (after kill -9 too) continues after its last stored step,
//! and nothing is explored twice or lost. It starts from the base model and loads the newest published weights.
//!
//! Before each explore step it follows the sync plan ([`crate::synchronizer`]): at a sync point it waits (fixed),
//! asks (explorer_driven) or looks (trainer_driven) for new weights, up to `synchronizer.sync_timeout`, saying what
//! it waits for. Metrics go to `monitor/<explorer.name>/`, experiences also to `<explorer.name>_experiences.jsonl`
//! and failed tasks to `<explorer.name>_failed_tasks.jsonl`.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use trinity_buffer::{ExperienceBuffer, ProducerState, SchedulerState};
use trinity_config::Config;
use trinity_config::synchronizer::{SyncMethod, SyncStyle};
use trinity_monitor::{Metrics, Monitor, Phase};

use crate::error::RftError;
use crate::explorer::{ExploreOutput, Explorer, ExplorerLogs, ExplorerRole, InFlight};
use crate::models;
use crate::modes::both::ExploreRecord;
use crate::modes::shared_buffer;
use crate::run::RunSummary;
use crate::schedule::SyncSchedule;
use crate::synchronizer::{SyncRequest, WeightStore, take_named, wait_until};

/// How often a fully asynchronous explorer looks for new weights while its batches run (Trinity-RFT's watcher:
/// every 0.5 s).
const WATCH: Duration = Duration::from_millis(500);
use crate::weight_group::GroupReceiver;

/// Runs a resolved config in mode `explore`, writing to `job_dir` (shared with the trainer).
pub(crate) async fn run(config: &Config, job_dir: &Path, threads: usize) -> Result<RunSummary, RftError> {
    let name = config.explorer.name.clone();
    let device = models::device(Path::new(&config.model.model_path))?;
    let buffer = shared_buffer(config, job_dir, "explore").await?;
    let logs = ExplorerLogs::in_dir(job_dir, &format!("{name}_"));
    let base = PathBuf::from(&config.model.model_path);
    let mut explorer = Explorer::start(config, &base, device, threads, ExplorerRole::Explore, Some(logs))?;
    let mut explored = 0;
    if let Some(last) = buffer.last_explored(&name).await? {
        let record: ExploreRecord = serde_json::from_str(&last.state).map_err(|e| {
            RftError::Unsupported(format!("buffer {}: unreadable explore record of `{name}`: {e}", buffer.name()))
        })?;
        explorer.scheduler().restore(record.scheduler)?;
        if !record.beliefs.is_empty() {
            explorer.scheduler().restore_beliefs(record.beliefs)?;
        }
        explored = last.step;
        tracing::info!("explorer `{name}`: steps 1..={explored} are in the buffer already: continuing after them");
    }
    let store = WeightStore::open(job_dir)?;
    let group = match config.synchronizer.sync_method {
        SyncMethod::Nccl => Some(GroupReceiver::start(config, store.dir(), device)?),
        _ => None,
    };
    let mut run = ExploreRun {
        group,
        config,
        name,
        monitor: Monitor::open_run(
            &job_dir.join("monitor").join(&config.explorer.name),
            &super::monitor_spec(config, &config.explorer.name),
        )?,
        explorer,
        buffer,
        store,
        schedule: SyncSchedule::of(&config.synchronizer),
        request_seq: 0,
    };
    run.pull_newest().await?;
    run.buffer.set_producer(&run.name, ProducerState::Running).await?;
    if explored == 0 && config.explorer.eval_on_startup && run.explorer.has_eval_tasksets() {
        let metrics = run.explorer.evaluate("eval", 0).await?;
        run.monitor.record(0, &metrics)?;
    }
    let total = run.explorer.scheduler().total_steps();
    run.monitor.plan(Some(total), explored)?;
    if config.synchronizer.sync_style == SyncStyle::FullyAsync {
        explored = run.fully_async(explored).await?;
        run.buffer.set_producer(&run.name, ProducerState::Finished).await?;
        tracing::info!("explorer `{}` finished after {explored} explore steps", run.name);
        return Ok(RunSummary { job_dir: job_dir.to_owned(), resumed_from: None, train_steps: 0 });
    }
    for step in explored + 1..=total {
        match run.step(step).await? {
            StepOutcome::Stored => explored = step,
            StepOutcome::TasksetsEnded => break,
            StepOutcome::TrainerFinished(trained) => {
                tracing::info!(
                    "the trainer has finished after train step {trained}: explorer `{}` stops before explore step {step}",
                    run.name
                );
                break;
            }
        }
    }
    run.buffer.set_producer(&run.name, ProducerState::Finished).await?;
    tracing::info!("explorer `{}` finished after {explored} explore steps", run.name);
    Ok(RunSummary { job_dir: job_dir.to_owned(), resumed_from: None, train_steps: 0 })
}

/// How an explore step ended.
enum StepOutcome {
    Stored,
    /// The tasksets are used up.
    TasksetsEnded,
    /// No new weights will come: the trainer finished (after this train step).
    TrainerFinished(u64),
}

/// What a sync point did.
enum Synced {
    /// The engine keeps its weights.
    Kept,
    /// New weights were loaded.
    Loaded,
    /// The trainer finished after this train step; no weights will come.
    TrainerFinished(u64),
}

struct ExploreRun<'a> {
    config: &'a Config,
    name: String,
    monitor: Monitor,
    explorer: Explorer,
    buffer: ExperienceBuffer,
    store: WeightStore,
    /// `sync_method: nccl`: weights received over the trainer's process group ([`crate::weight_group`]).
    group: Option<GroupReceiver>,
    schedule: SyncSchedule,
    /// Sequence number of this explorer's last `explorer_driven` request.
    request_seq: u64,
}

impl ExploreRun<'_> {
    /// Syncs as the plan says, then explores and stores step `step`.
    async fn step(&mut self, step: u64) -> Result<StepOutcome, RftError> {
        let started = Instant::now();
        let synced = match self.sync_before(step).await? {
            Synced::TrainerFinished(trained) => return Ok(StepOutcome::TrainerFinished(trained)),
            Synced::Loaded => true,
            Synced::Kept => false,
        };
        let sync_seconds = started.elapsed().as_secs_f64();
        self.monitor.phase(step, Phase::Explore);
        let Some(output) = self.explorer.explore_step(step).await? else {
            return Ok(StepOutcome::TasksetsEnded);
        };
        let scheduler = self.explorer.scheduler().state();
        let mut sync = Metrics::new();
        sync.insert("time/sync_wait_s".into(), sync_seconds);
        sync.insert("explorer/synced".into(), if synced { 1.0 } else { 0.0 });
        self.store(step, output, scheduler, sync, started).await?;
        Ok(StepOutcome::Stored)
    }

    /// Stores explore step `step` with the taskset position after its draw (`scheduler`), evaluates when due and
    /// records its metrics (`extra` besides the step's own).
    async fn store(
        &mut self,
        step: u64,
        output: ExploreOutput,
        scheduler: SchedulerState,
        extra: Metrics,
        started: Instant,
    ) -> Result<(), RftError> {
        let beliefs = self.explorer.scheduler().beliefs();
        let mut metrics = output.metrics;
        metrics.extend(extra);
        let record = ExploreRecord { scheduler, metrics: metrics.clone(), beliefs };
        let state = serde_json::to_string(&record)
            .map_err(|e| RftError::Unsupported(format!("cannot encode the explore record: {e}")))?;
        let count = output.experiences.len();
        let stored = Instant::now();
        self.buffer.put_step(&self.name, step, output.experiences, &state).await?;
        metrics.insert("time/buffer_put_s".into(), stored.elapsed().as_secs_f64());
        let eval_interval = self.config.explorer.eval_interval;
        if self.explorer.has_eval_tasksets() && step.is_multiple_of(eval_interval) {
            self.monitor.phase(step, Phase::Evaluate);
            metrics.extend(self.explorer.evaluate("eval", step).await?);
        }
        self.monitor.record(step, &metrics)?;
        tracing::info!(
            "explore step {step}: {count} experiences, reward {:.3}, model version {}, {:.1}s",
            metrics.get("rollout/reward_mean").copied().unwrap_or(f64::NAN),
            self.explorer.model_version(),
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// `sync_style: fully_async` (Trinity-RFT 0.6.0): keeps up to `explorer.max_inflight_batches` batches running
    /// at once, finishing and storing the oldest before it submits one more, and loads the trainer's newest weights
    /// as soon as they are published, also while batches run (their later requests sample with them; each
    /// experience carries the version that sampled it). Returns the last explore step stored.
    async fn fully_async(&mut self, mut explored: u64) -> Result<u64, RftError> {
        let window = self.config.explorer.max_inflight_batches.max(1) as usize;
        // Each batch with the taskset position after its draw: what a restarted explorer continues from once the
        // batch is stored, whatever was drawn after it.
        let mut inflight: VecDeque<(u64, SchedulerState, InFlight)> = VecDeque::new();
        let mut next = explored + 1;
        let mut exhausted = false;
        loop {
            self.pull_newest().await?;
            if !exhausted && inflight.len() < window {
                match self.explorer.submit()? {
                    Some(batch) => {
                        self.monitor.phase(next, Phase::Explore);
                        inflight.push_back((next, self.explorer.scheduler().state(), batch));
                        next += 1;
                    }
                    None => exhausted = true,
                }
                continue;
            }
            let Some((step, scheduler, mut batch)) = inflight.pop_front() else { break };
            let started = batch.started();
            let ran = loop {
                tokio::select! {
                    ran = &mut batch => break ran?,
                    () = tokio::time::sleep(WATCH) => {
                        self.pull_newest().await?;
                    }
                }
            };
            let output = self.explorer.finish(step, ran).await?;
            let mut extra = Metrics::new();
            extra.insert("explorer/inflight_batches".into(), (inflight.len() + 1) as f64);
            self.store(step, output, scheduler, extra, started).await?;
            explored = step;
        }
        Ok(explored)
    }

    /// Before explore step `step`: at a sync point of the plan, gets new weights as `sync_style` says.
    async fn sync_before(&mut self, step: u64) -> Result<Synced, RftError> {
        let required = self.schedule.required_syncs(step);
        if step == 1 || required == self.schedule.required_syncs(step - 1) {
            return Ok(Synced::Kept);
        }
        let timeout = Duration::from_secs(self.config.synchronizer.sync_timeout);
        let (store, name, group) = (self.store.clone(), self.name.clone(), self.group.clone());
        let gave_up = |what: &str| {
            format!(
                "explorer `{name}` waited synchronizer.sync_timeout ({} s) for {what}; is the trainer (mode train) \
                 running? Run this command again to continue after explore step {}",
                timeout.as_secs(),
                step - 1
            )
        };
        match self.config.synchronizer.sync_style {
            // Never reached: a fully asynchronous explorer has no sync points ([`ExploreRun::fully_async`]).
            SyncStyle::FullyAsync => self.pull_newest().await,
            SyncStyle::Fixed => {
                // The weights the plan gives this sync ([`SyncSchedule::version_of_sync`]).
                let wanted = self.schedule.version_of_sync(required);
                if self.explorer.model_version() < wanted {
                    let waited = wait_until(
                        timeout,
                        || format!("explorer `{name}` waits for the trainer's weights of step {wanted} before explore step {step}"),
                        || gave_up(&format!("the trainer's weights of step {wanted}")),
                        || match newest(&store, group.as_ref())?.filter(|&v| v >= wanted) {
                            Some(_) => Ok(Some(None)),
                            None => Ok(store.trainer_finished()?.map(Some)),
                        },
                    )
                    .await?;
                    if let Some(trained) = waited {
                        return Ok(Synced::TrainerFinished(trained));
                    }
                }
                self.pull_newest().await
            }
            SyncStyle::DynamicByTrainer => self.pull_newest().await,
            SyncStyle::DynamicByExplorer => {
                self.request_seq = self.store.answer(&self.name)?.map_or(0, |a| a.seq).max(self.request_seq) + 1;
                let request = SyncRequest { seq: self.request_seq, have: self.explorer.model_version() };
                self.store.request(&self.name, request)?;
                let answer = wait_until(
                    timeout,
                    || format!("explorer `{name}` waits for the trainer to answer its sync request before explore step {step}"),
                    || gave_up("the trainer to answer its sync request"),
                    || match store.answer(&name)?.filter(|a| a.seq >= request.seq) {
                        Some(answer) => Ok(Some(Ok(answer))),
                        None => Ok(store.trainer_finished()?.map(Err)),
                    },
                )
                .await?;
                match answer {
                    Err(trained) => Ok(Synced::TrainerFinished(trained)),
                    Ok(answer) => {
                        if answer.version <= request.have {
                            tracing::info!(
                                "explorer `{name}`: no new model weights (trainer at version {})",
                                answer.version
                            );
                        }
                        self.pull_newest().await
                    }
                }
            }
        }
    }

    /// Loads the newest published weights when they differ from the engine's (a restarted trainer may publish an
    /// older version than the one it published before it stopped: the explorer follows it). With `nccl` sync the
    /// weights received over the process group count too; the source with the newer version wins.
    async fn pull_newest(&mut self) -> Result<Synced, RftError> {
        let in_files = self.store.latest()?;
        if let Some(group) = &self.group
            && let Some(received) = group.version()
            && in_files.is_none_or(|v| received >= v)
        {
            if received == self.explorer.model_version() {
                return Ok(Synced::Kept);
            }
            let names = self.engine_names().await?;
            let Some((version, weights)) = group.take(&names)? else { return Ok(Synced::Kept) };
            self.explorer.load_weights(weights, version).await?;
            tracing::info!(
                "explorer `{}` now samples with the trainer's weights of step {version} (received over the process \
                 group)",
                self.name
            );
            return Ok(Synced::Loaded);
        }
        let Some((version, stored)) = self.store.latest_weights()? else {
            return Ok(Synced::Kept);
        };
        if version == self.explorer.model_version() {
            return Ok(Synced::Kept);
        }
        let weights = take_named(&stored, self.engine_names().await?, self.store.dir())?;
        self.explorer.load_weights(weights, version).await?;
        tracing::info!("explorer `{}` now samples with the trainer's weights of step {version}", self.name);
        Ok(Synced::Loaded)
    }
}

impl ExploreRun<'_> {
    /// The names of the engine's parameters: what a sync must bring.
    async fn engine_names(&self) -> Result<Vec<String>, RftError> {
        Ok(self
            .explorer
            .rollout()
            .engine()
            .with_decoder(|decoder| decoder.var_store().variables().into_keys().collect())
            .await?)
    }
}

/// The newest version the trainer published: in files, or received over the process group.
fn newest(store: &WeightStore, group: Option<&GroupReceiver>) -> Result<Option<u64>, RftError> {
    let in_files = store.latest()?;
    Ok(match group.and_then(GroupReceiver::version) {
        Some(received) => Some(in_files.map_or(received, |v| v.max(received))),
        None => in_files,
    })
}
