//! Mode `train`: a trainer in a process of its own.
//!
//! * RL (schema `experience`): it trains on what explorers in other processes (mode `explore`) store in the
//!   shared buffer, `buffer.train_batch_size` experiences a step, and publishes its weights for them as
//!   `sync_style` says ([`crate::synchronizer`]). Claims are made as consumer `trainer.name` and become final when
//!   the checkpoint that trained them is on disk, so a trainer killed at any moment and started again trains every
//!   experience exactly once into the saved model. It stops after its planned steps, once every explorer that
//!   wrote to the buffer has finished and fewer than a batch wait, or after `max_read_timeout` seconds without a
//!   batch — saying which.
//! * SFT, DPO and CPT (schemas `sft`, `dpo`, `cpt`): it trains on a dataset (`buffer.trainer_input.experience_buffer`,
//!   a file) read as Trinity-RFT's formatters do, `train_batch_size` rows (DPO: pairs) a step, for `total_steps` or
//!   `total_epochs` passes.
//!
//! Both evaluate on the eval tasksets, if the config has any, with a rollout engine of their own at
//! `eval_interval` steps and at the end. Metrics go to `monitor/<trainer.name>/` (mode `both` writes `monitor/`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use trinity_buffer::{Experience, ExperienceBuffer, ProducerState};
use trinity_config::steps::TrainSteps;
use trinity_config::synchronizer::{SyncMethod, SyncStyle};
use trinity_config::{Config, ExperienceSchema};
use trinity_monitor::{Metrics, Monitor, Phase};
use trinity_trainer::Components;

use crate::dataset::DatasetRows;
use crate::error::RftError;
use crate::explorer::{Explorer, ExplorerRole};
use crate::models;
use crate::modes::shared_buffer;
use crate::run::RunSummary;
use crate::schedule::SyncSchedule;
use crate::synchronizer::{POLL, REPORT_EVERY, SyncAnswer, WeightStore};
use crate::trainer::{Meta, Rank0, Trainer};
use crate::weight_group::GroupSender;

/// Where a train step's rows come from.
enum Source {
    /// Experiences explorers store in the shared buffer.
    Buffer(ExperienceBuffer),
    /// A tokenized SFT, DPO or CPT dataset.
    Dataset(DatasetRows),
}

/// Runs a resolved config in mode `train`, writing to `job_dir` (shared with the explorers in RL).
/// With `dp` this process is rank 0 of a data-parallel run: it alone reads the buffer or dataset and shares each
/// step's rows with the other ranks ([`crate::data_parallel`]).
pub(crate) async fn run(
    config: &Config,
    job_dir: &Path,
    threads: usize,
    dp: Option<Rank0>,
) -> Result<RunSummary, RftError> {
    let schema = Components::from_config(&config.algorithm)?.schema;
    let device = match &dp {
        Some(rank0) => rank0.device,
        None => models::device(Path::new(&config.model.model_path))?,
    };
    let batch_size = config.buffer.train_batch_size as usize;
    let mut dataset = None;
    let mut source_buffer = None;
    let started = match schema {
        ExperienceSchema::Experience => {
            source_buffer = Some(shared_buffer(config, job_dir, "train").await?);
            let planned = rl_steps(config)?;
            Trainer::start(config, job_dir, device, threads, |_, _, _| Ok(planned), dp)?
        }
        ExperienceSchema::Sft | ExperienceSchema::Dpo | ExperienceSchema::Cpt => {
            let plan = |tokenizer: &_, template: Option<&_>, _| {
                let rows = load_dataset(config, schema, tokenizer, template)?;
                let (rows, steps) = dataset_steps(config, rows, batch_size)?;
                dataset = Some(rows);
                Ok(steps)
            };
            Trainer::start(config, job_dir, device, threads, plan, dp)?
        }
    };
    let source = match (source_buffer, dataset) {
        (Some(buffer), _) => Source::Buffer(buffer),
        (None, Some(rows)) => Source::Dataset(rows),
        (None, None) => unreachable!("one of the two sources was made above"),
    };
    let run = TrainRun::new(config, job_dir, threads, device, started, source).await?;
    run.drive().await
}

/// Train steps of an RL trainer ([`TrainSteps`]): a total_steps key, else what the explorers make of the training
/// tasksets the config carries, else unbounded (it stops when the explorers have finished or no batch comes for
/// `max_read_timeout`).
fn rl_steps(config: &Config) -> Result<u64, RftError> {
    let plan = TrainSteps::of(config);
    let rows: Vec<u64> = match plan {
        TrainSteps::FromRows { .. } => trinity_buffer::TaskScheduler::from_config(&config.buffer)?
            .tasksets()
            .iter()
            .map(|t| t.len() as u64)
            .collect(),
        _ => Vec::new(),
    };
    let steps = plan.count(&rows);
    if let (TrainSteps::FromRows { .. }, Some(steps)) = (plan, steps) {
        tracing::info!(
            "{steps} train steps: the experiences the explorers make of the {} training task rows",
            rows.iter().sum::<u64>()
        );
    }
    Ok(steps.unwrap_or(u64::MAX))
}

fn load_dataset(
    config: &Config,
    schema: ExperienceSchema,
    tokenizer: &trinity_model::Tokenizer,
    template: Option<&trinity_model::ChatTemplate>,
) -> Result<DatasetRows, RftError> {
    const KEY: &str = "buffer.trainer_input.experience_buffer";
    let buffer = config.buffer.trainer_input.experience_buffer.as_ref().ok_or_else(|| RftError::Setting {
        key: KEY,
        message: format!("algorithm `{}` trains on a dataset: set its path here", config.algorithm.algorithm_type),
    })?;
    let max_model_len = config.model.resolved.max_model_len as usize;
    let epochs = config.buffer.total_epochs;
    if schema == ExperienceSchema::Cpt {
        // Plain text, tokenized as it is: no chat template is needed or read.
        let rows = DatasetRows::load_cpt(buffer, KEY, epochs, tokenizer, max_model_len)?;
        tracing::info!("dataset `{}`: {} rows of text", buffer.name, rows.len());
        return Ok(rows);
    }
    let source = buffer.format.chat_template.as_deref().or(template.map(trinity_model::ChatTemplate::source));
    let source = source.ok_or_else(|| RftError::Setting {
        key: KEY,
        message: "the dataset's rows need a chat template; the model has none, set model.custom_chat_template".into(),
    })?;
    let template = trinity_model::ChatTemplate::new(source, tokenizer.bos_token(), tokenizer.eos_token())
        .map_err(|e| RftError::Setting { key: KEY, message: format!("format.chat_template: {e}") })?
        .with_enable_thinking(buffer.format.enable_thinking.or(config.model.enable_thinking));
    let rows = match schema {
        ExperienceSchema::Dpo => DatasetRows::load_dpo(buffer, KEY, epochs, (tokenizer, &template), max_model_len)?,
        _ => DatasetRows::load_sft(buffer, KEY, epochs, (tokenizer, &template), max_model_len)?,
    };
    tracing::info!("dataset `{}`: {} rows", buffer.name, rows.len());
    Ok(rows)
}

/// A dataset run's steps ([`TrainSteps`]): a total_steps key (the reader then cycles over as many passes as they
/// need, as Trinity-RFT's does), else the full batches of `total_epochs` passes.
fn dataset_steps(config: &Config, mut rows: DatasetRows, batch: usize) -> Result<(DatasetRows, u64), RftError> {
    let batch = batch.max(1);
    let plan = TrainSteps::of(config);
    let steps = plan.count(&[rows.len() as u64]).unwrap_or(0);
    if let TrainSteps::Given { .. } = plan {
        let passes = (steps as usize * batch).div_ceil(rows.len().max(1));
        rows.extend_epochs(u32::try_from(passes).unwrap_or(u32::MAX));
    }
    if steps == 0 {
        return Err(RftError::Setting {
            key: "buffer.train_batch_size",
            message: format!(
                "{batch} rows a step, but the dataset has {} rows in {} passes",
                rows.len(),
                config.buffer.total_epochs
            ),
        });
    }
    Ok((rows, steps))
}

struct TrainRun<'a> {
    config: &'a Config,
    job_dir: PathBuf,
    monitor: Monitor,
    trainer: Trainer,
    source: Source,
    /// An engine for the eval tasksets, when there are any.
    evaluator: Option<Explorer>,
    store: WeightStore,
    /// `sync_method: nccl`: the process group weights go over until it fails ([`crate::weight_group`]).
    group: Option<GroupSender>,
    schedule: SyncSchedule,
    resumed_from: Option<u64>,
    trained: u64,
    saved: u64,
    published: Option<u64>,
    /// End of the previous train step: `time/step_s` is measured from here.
    step_mark: Instant,
}

impl<'a> TrainRun<'a> {
    async fn new(
        config: &'a Config,
        job_dir: &Path,
        threads: usize,
        device: tch::Device,
        started: crate::trainer::Started,
        mut source: Source,
    ) -> Result<TrainRun<'a>, RftError> {
        let trained = started.resumed.as_ref().map_or(0, |(_, meta)| meta.train_step);
        match &mut source {
            Source::Buffer(buffer) => {
                let released = buffer.release_after(trained).await?;
                if released > 0 {
                    tracing::info!(
                        "{released} experiences taken by train steps after the checkpoint of step {trained} are trained again"
                    );
                }
            }
            Source::Dataset(rows) => {
                if let Some((_, meta)) = &started.resumed {
                    rows.skip_to(meta.dataset_rows.unwrap_or(0));
                }
            }
        }
        let evaluator = match trinity_buffer::load_eval_tasksets(&config.buffer)?.is_empty() {
            true => None,
            false => {
                let model = match &started.resumed {
                    Some((checkpoint, _)) => checkpoint.path.join("hf"),
                    None => PathBuf::from(&config.model.model_path),
                };
                let explorer = Explorer::start(config, &model, device, threads, ExplorerRole::EvaluateOnly, None)?;
                explorer.rollout().set_model_version(trained);
                Some(explorer)
            }
        };
        let store = WeightStore::open(job_dir)?;
        store.set_trainer_finished(None)?;
        let group = match (&source, config.synchronizer.sync_method) {
            (Source::Buffer(_), SyncMethod::Nccl) => {
                let dtype = models::engine_kind(&config.explorer.rollout_model.dtype, device);
                Some(GroupSender::host(config, store.dir(), dtype, device)?)
            }
            _ => None,
        };
        let mut run = TrainRun {
            config,
            job_dir: job_dir.to_owned(),
            monitor: Monitor::open_run(
                &job_dir.join("monitor").join(&config.trainer.name),
                &super::monitor_spec(config, &config.trainer.name),
            )?,
            trainer: started.trainer,
            source,
            evaluator,
            published: store.latest()?,
            store,
            group,
            schedule: SyncSchedule::of(&config.synchronizer),
            resumed_from: started.resumed.map(|(c, _)| c.step),
            trained,
            saved: trained,
            step_mark: Instant::now(),
        };
        // A restarted trainer republishes its checkpoint's weights, replacing any it published after that
        // checkpoint before it stopped: explorers then sample from the weights the trainer continues from.
        if trained > 0 && run.published != Some(trained) {
            run.publish().await?;
        }
        Ok(run)
    }

    async fn drive(mut self) -> Result<RunSummary, RftError> {
        let total = self.trainer.total_steps();
        tracing::info!(
            "trainer `{}` in {}: {}, {} rows a step, sync every {} step(s) ({})",
            self.config.trainer.name,
            self.job_dir.display(),
            if total == u64::MAX { "until the explorers finish".to_owned() } else { format!("{total} steps") },
            self.config.buffer.train_batch_size,
            self.schedule.trainer_interval,
            self.config.synchronizer.sync_style.name(),
        );
        if self.resumed_from.is_none() && self.config.explorer.eval_on_startup && self.evaluator.is_some() {
            let metrics = self.evaluate(0).await?;
            self.monitor.record(0, &metrics)?;
        }
        self.monitor.plan((total != u64::MAX).then_some(total), self.trained)?;
        self.step_mark = Instant::now();
        while self.trained < total {
            let step = self.trained + 1;
            let Some(mut metrics) = self.step(step).await? else { break };
            metrics.insert("time/step_s".into(), self.step_mark.elapsed().as_secs_f64());
            self.step_mark = Instant::now();
            self.monitor.record(step, &metrics)?;
            tracing::info!(
                "train step {step}: loss {:.4}, {} rows, train {:.1}s, waited {:.1}s",
                metrics.get("train/loss").copied().unwrap_or(f64::NAN),
                metrics.get("train/rows").copied().unwrap_or(0.0),
                metrics.get("time/train_s").copied().unwrap_or(0.0),
                metrics.get("time/wait_s").copied().unwrap_or(0.0),
            );
        }
        self.finish().await?;
        Ok(RunSummary { job_dir: self.job_dir, resumed_from: self.resumed_from, train_steps: self.trained })
    }

    /// Train step `step`: its rows, the update, the sync, evaluation and the checkpoint. `None` when no batch
    /// will come (the explorers finished, or none came for `max_read_timeout`).
    async fn step(&mut self, step: u64) -> Result<Option<Metrics>, RftError> {
        let mut metrics = Metrics::new();
        self.monitor.phase(step, Phase::Train);
        let waited = Instant::now();
        match &mut self.source {
            Source::Dataset(rows) => {
                let rows = rows.take(self.config.buffer.train_batch_size as usize)?;
                metrics.insert("time/wait_s".into(), waited.elapsed().as_secs_f64());
                metrics.insert("train/rows".into(), rows.len() as f64);
                self.trainer.train_rows(step, &rows, &mut metrics)?;
            }
            Source::Buffer(_) => {
                let Some(batch) = self.next_batch(step).await? else { return Ok(None) };
                metrics.insert("time/wait_s".into(), waited.elapsed().as_secs_f64());
                metrics.insert("train/rows".into(), batch.len() as f64);
                rollout_summary(&batch, &mut metrics);
                self.trainer.train_experiences(step, batch, &mut metrics)?;
            }
        }
        self.trained = step;
        let sync = Instant::now();
        self.monitor.phase(step, Phase::Sync);
        match self.config.synchronizer.sync_style {
            SyncStyle::DynamicByExplorer => self.answer_requests().await?,
            SyncStyle::Fixed | SyncStyle::DynamicByTrainer | SyncStyle::FullyAsync => {
                if self.schedule.publishes_after(step) {
                    self.publish().await?;
                }
            }
        }
        metrics.insert("time/sync_s".into(), sync.elapsed().as_secs_f64());
        let total = self.trainer.total_steps();
        if self.evaluator.is_some() && (step.is_multiple_of(self.config.explorer.eval_interval) || step == total) {
            self.monitor.phase(step, Phase::Evaluate);
            metrics.extend(self.evaluate(step).await?);
        }
        let save_interval = self.config.trainer.save_interval;
        let saving = Instant::now();
        if (save_interval > 0 && step.is_multiple_of(save_interval)) || step == total {
            self.monitor.phase(step, Phase::Save);
            self.save().await?;
        }
        metrics.insert("time/save_s".into(), saving.elapsed().as_secs_f64());
        Ok(Some(metrics))
    }

    /// Waits for `train_batch_size` experiences for step `step`, answering sync requests meanwhile; `None` when
    /// every explorer finished with less than a batch left, or when `max_read_timeout` passed.
    async fn next_batch(&mut self, step: u64) -> Result<Option<Vec<Experience>>, RftError> {
        let Source::Buffer(buffer) = &self.source else { return Ok(None) };
        let buffer = buffer.clone();
        // Sample strategy `mix` fills `ceil(expert_data_ratio × train_batch_size)` of the batch with expert rows.
        let batch = self.config.buffer.train_batch_size;
        let expert = self.config.algorithm.resolved.sample_strategy.expert_rows(batch).map_or(0, |(expert, _)| expert);
        let wanted = u64::from(batch).saturating_sub(expert).max(1) as usize;
        let min_version = self.trainer.min_model_version(step);
        let timeout = Duration::from_secs_f64(
            self.config.buffer.trainer_input.experience_buffer.as_ref().map_or(1800.0, |b| b.max_read_timeout),
        );
        let started = Instant::now();
        let mut reported = Instant::now();
        loop {
            if let Some(batch) = buffer.try_take_for_step(wanted, min_version, step).await? {
                return Ok(Some(batch));
            }
            if self.config.synchronizer.sync_style == SyncStyle::DynamicByExplorer {
                self.answer_requests().await?;
            }
            let producers = buffer.producers().await?;
            if !producers.is_empty() && producers.iter().all(|p| p.state == ProducerState::Finished) {
                // A last step may have landed between the take and reading the states.
                if let Some(batch) = buffer.try_take_for_step(wanted, min_version, step).await? {
                    return Ok(Some(batch));
                }
                tracing::info!(
                    "every explorer has finished ({}); {} experiences wait, fewer than train_batch_size {wanted}: training ends",
                    producers.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", "),
                    buffer.len().await?
                );
                return Ok(None);
            }
            if started.elapsed() >= timeout {
                tracing::warn!(
                    "no batch of {wanted} experiences came for max_read_timeout ({:.0} s): training ends after step {}",
                    timeout.as_secs_f64(),
                    step - 1
                );
                return Ok(None);
            }
            if reported.elapsed() >= REPORT_EVERY {
                buffer.heartbeat().await?;
                tracing::info!(
                    "train step {step} waits for {wanted} experiences ({} in the buffer); explorers: {}",
                    buffer.len().await?,
                    describe_producers(&producers)
                );
                reported = Instant::now();
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// `explorer_driven`: answers every pending request, publishing the current weights first when they are newer
    /// than the last published.
    async fn answer_requests(&mut self) -> Result<(), RftError> {
        let pending = self.store.pending_requests()?;
        if pending.is_empty() {
            return Ok(());
        }
        if self.published.is_none_or(|v| v < self.trained) && self.trained > 0 {
            self.publish().await?;
        }
        let version = self.published.unwrap_or(0);
        for (explorer, request) in pending {
            self.store.write_answer(&explorer, SyncAnswer { seq: request.seq, version })?;
        }
        Ok(())
    }

    /// Publishes the trained weights: over the explorer's process group, or as a file in the weight store when
    /// there is none or it failed. Either way part by part (under ZeRO stage 3 a decoder layer at a time, as the
    /// ranks gather it), so this rank never holds the whole model twice.
    async fn publish(&mut self) -> Result<(), RftError> {
        let started = Instant::now();
        let trainer = &self.trainer;
        let specs = trainer.weight_layout()?;
        if let Some(group) = &mut self.group {
            let feed = |sink: &mut trinity_collective::PartSink<'_>| Ok(trainer.weight_parts(|part| sink.push(part))??);
            match group.publish_parts(self.trained, &specs, feed) {
                Ok(()) => {
                    self.published = Some(self.trained);
                    return Ok(());
                }
                Err(error) => {
                    if let Some(group) = self.group.take() {
                        group.abandon(&error);
                    }
                }
            }
        }
        self.store.publish_parts(self.trained, specs, |file| trainer.weight_parts(|part| file.push(part))?)?;
        self.published = Some(self.trained);
        tracing::info!("weights of step {} published ({:.1}s)", self.trained, started.elapsed().as_secs_f64());
        Ok(())
    }

    async fn evaluate(&mut self, step: u64) -> Result<Metrics, RftError> {
        let Some(evaluator) = &mut self.evaluator else { return Ok(Metrics::new()) };
        if evaluator.model_version() != step {
            evaluator.load_weights(self.trainer.weights()?, step).await?;
        }
        evaluator.evaluate("eval", step).await
    }

    async fn save(&mut self) -> Result<(), RftError> {
        let meta = Meta {
            train_step: self.trained,
            dataset_rows: match &self.source {
                Source::Dataset(rows) => Some(rows.served()),
                Source::Buffer(_) => None,
            },
            ..Meta::default()
        };
        self.trainer.save(&meta)?;
        self.saved = self.trained;
        if let Source::Buffer(buffer) = &self.source {
            // The checkpoint is durable: what the steps up to it trained is never handed back again.
            buffer.commit_through(self.trained).await?;
        }
        Ok(())
    }

    /// After the last step: the final checkpoint and weights, answers to waiting explorers, and the mark that
    /// tells explorers waiting for weights that none will come.
    async fn finish(&mut self) -> Result<(), RftError> {
        if self.trained > self.saved {
            self.save().await?;
        }
        if let (Some(_), Source::Buffer(buffer)) = (&self.group, &self.source) {
            let producers = buffer.producers().await?;
            // No explorer is left to take the last weights over the group: they go to files, for whoever comes.
            if !producers.is_empty()
                && producers.iter().all(|p| p.state == ProducerState::Finished)
                && let Some(group) = self.group.take()
            {
                group.close();
            }
        }
        if self.trained > 0 && self.published != Some(self.trained) {
            self.publish().await?;
        }
        self.answer_requests().await?;
        self.store.set_trainer_finished(Some(self.trained))?;
        tracing::info!("trainer `{}` finished after {} train steps", self.config.trainer.name, self.trained);
        Ok(())
    }
}

/// Reward and staleness of the experiences a step trains (the explorers report their own rollout metrics).
fn rollout_summary(batch: &[Experience], metrics: &mut Metrics) {
    let n = batch.len().max(1) as f64;
    metrics.insert("buffer/reward_mean".into(), batch.iter().map(|e| e.reward).sum::<f64>() / n);
    metrics.insert("buffer/model_version_mean".into(), batch.iter().map(|e| e.model_version as f64).sum::<f64>() / n);
}

fn describe_producers(producers: &[trinity_buffer::ProducerStatus]) -> String {
    if producers.is_empty() {
        return "none has stored a step yet".to_owned();
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    producers
        .iter()
        .map(|p| {
            let state = match p.state {
                ProducerState::Running => "running",
                ProducerState::Finished => "finished",
            };
            format!("{} ({state}, {} steps, seen {} s ago)", p.name, p.steps, now.saturating_sub(p.last_seen))
        })
        .collect::<Vec<_>>()
        .join(", ")
}
