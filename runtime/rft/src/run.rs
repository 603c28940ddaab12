//! Mode `both`: explorer and trainer in one process on one device, weights synchronised in memory.
//!
//! The loop follows [`crate::schedule`]: explore whenever the sync plan allows, else train; after every
//! `sync_interval`-th train step the trainer's weights are copied into the generation engine in place.
//! Train step `s` trains on exactly the experiences of explore step `s` (whole groups, in order).
//!
//! Checkpoints (`save_interval`, and the last step) hold the policy as a Hugging Face directory (`hf/`), the
//! optimizer state (`trainer/`) and `meta.json` (steps, sync count, taskset position). A resumed run reloads
//! them. With the in-memory queue, any step explored but not trained before the stop is explored again (the queue
//! did not survive; the taskset position saved is the one of the last trained step). With a SQLite buffer the
//! explored steps survive: rows taken by train steps after the checkpoint are handed back, and exploring
//! continues after the last explore step the database recorded (its rows and taskset position are committed in
//! one transaction), so no experience is lost or made twice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tch::Kind;
use trinity_algorithm::advantage::AdvantageFn;
use trinity_algorithm::registry::{self, Kind as ComponentKind};
use trinity_buffer::difficulty_estimator::DifficultyEstimator;
use trinity_buffer::{
    Experience, ExperienceBuffer, JsonlWriter, ReplayBuffer, ReplayTake, SchedulerState, TaskScheduler, Taskset,
};
use trinity_checkpoint::CheckpointDir;
use trinity_config::synchronizer::SyncMethod;
use trinity_config::{Config, Mode};
use trinity_engine::{Engine, EngineConfig, EngineModel};
use trinity_explorer::{RolloutModel, RunReport, RunnerOptions, run_tasks};
use trinity_model::{
    ChatTemplate, DeviceRequest, LoadedModel, SafetensorsWeights, load_model, save_hf_parts, select_device,
    write_safetensors,
};
use trinity_monitor::{Metrics, Monitor};
use trinity_trainer::{Components, StartingModels, TrainRow, Trainer, TrainerOptions};

use crate::error::RftError;
use crate::mix_strategy::ExpertData;
use crate::pipeline::apply_group_advantage;
use crate::schedule::{Action, SyncSchedule, next_action};

/// What a finished run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSummary {
    /// The experiment directory (`<checkpoint_root_dir>/<project>/[<group>/]<name>`).
    pub job_dir: PathBuf,
    /// The checkpoint the run resumed from, if any.
    pub resumed_from: Option<u64>,
    /// Train steps completed in all (including those before a resume).
    pub train_steps: u64,
}

/// What a persistent buffer records with each explore step, to continue after it on resume.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ExploreRecord {
    scheduler: SchedulerState,
    metrics: Metrics,
}

/// `meta.json` of a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    train_step: u64,
    syncs: u64,
    scheduler: SchedulerState,
    /// The `difficulty_based` selectors' pass-rate beliefs, per taskset (absent in older checkpoints).
    #[serde(default)]
    beliefs: Vec<Option<DifficultyEstimator>>,
}

/// The experiment directory of a config: `<checkpoint_root_dir>/<project>/[<group>/]<name>`, or, when
/// `continue_from_checkpoint` is false and that directory is not empty, the same with `_<YYYYmmddHHMMSS>`
/// appended to the name (Trinity-RFT's rule: a fresh start never mixes with an old run). Call it once per run.
pub fn job_dir(config: &Config) -> PathBuf {
    let mut dir = PathBuf::from(&config.checkpoint_root_dir).join(&config.project);
    if !config.group.is_empty() {
        dir.push(&config.group);
    }
    let plain = dir.join(&config.name);
    let occupied = std::fs::read_dir(&plain).is_ok_and(|mut entries| entries.next().is_some());
    if config.continue_from_checkpoint || !occupied {
        return plain;
    }
    dir.join(format!("{}_{}", config.name, timestamp(std::time::SystemTime::now())))
}

/// Checks what only the run's own components can check, so that `--dry-run` refuses it as the run would: the
/// replay buffer's priority function and its arguments.
pub fn check_components(config: &Config) -> Result<(), RftError> {
    if let Some(buffer) = &config.buffer.trainer_input.experience_buffer
        && buffer.replay_buffer.enable
    {
        ReplayBuffer::from_config(&buffer.replay_buffer, buffer.capacity, config.explorer.rollout_model.seed)?;
    }
    Ok(())
}

/// Runs a resolved config in mode `both` (or `colocate`, the same on one device), writing to `job_dir` (see
/// [`job_dir`]).
pub fn run_both(config: &Config, job_dir: &Path) -> Result<RunSummary, RftError> {
    if !matches!(config.mode, Mode::Both | Mode::Colocate) {
        return Err(RftError::Unsupported(format!("mode `{}` is not supported yet", config.mode.name())));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| RftError::Unsupported(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(Run::start(config, job_dir)?.drive())
}

struct Run<'a> {
    config: &'a Config,
    job_dir: PathBuf,
    checkpoints: CheckpointDir,
    monitor: Monitor,
    trainer: Trainer,
    rollout: Arc<RolloutModel>,
    tokenizer: trinity_model::Tokenizer,
    chat_template: Option<ChatTemplate>,
    eos_token_ids: Vec<i64>,
    scheduler: TaskScheduler,
    eval_tasksets: Vec<Taskset>,
    advantage: Option<Box<dyn AdvantageFn>>,
    /// Expert rows added to every train step (sample strategy `mix`).
    expert: Option<ExpertData>,
    /// Prioritised replay (`experience_buffer.replay_buffer.enable`): train steps draw from it by priority.
    replay: Option<ReplayBuffer>,
    buffer: ExperienceBuffer,
    experiences_log: JsonlWriter,
    schedule: SyncSchedule,
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
    /// libtorch threads for the engine and for each train step (this thread keeps one; see [`Run::start`]).
    threads: usize,
}

impl<'a> Run<'a> {
    fn start(config: &'a Config, job_dir: &Path) -> Result<Run<'a>, RftError> {
        // Exploring and training alternate, each on a libtorch thread pool: the engine's on its own thread, the
        // trainer's on a thread that lives for one train step ([`on_pool`]; loading too). This thread (buffer,
        // checkpoints) stays single-threaded, so that while the engine decodes its pool is the only one alive:
        // with more pool threads than CPUs libgomp stops spinning between parallel regions and every region of a
        // decode step wakes its workers through the kernel (measured by `trinity generate`: a quarter of decode
        // throughput).
        let threads = trinity_model::hand_over_threads();
        let job_dir = job_dir.to_owned();
        let checkpoints = CheckpointDir::open(&job_dir)?;
        let latest = if config.continue_from_checkpoint { checkpoints.latest()? } else { None };
        let (model_path, meta) = match &latest {
            Some(checkpoint) => {
                tracing::info!("resuming from {}", checkpoint.path.display());
                (checkpoint.path.join("hf"), Some(checkpoint.meta::<Meta>()?))
            }
            None => (PathBuf::from(&config.model.model_path), None),
        };
        let device = select_device(DeviceRequest::Auto).map_err(|source| model_error(&model_path, source))?;
        if device == tch::Device::Cpu {
            tracing::info!("no CUDA device: running on the CPU");
        }
        let trainer_kind = trainer_kind(&config.trainer.dtype, device);
        tracing::info!(
            "training precision: {}",
            if trainer_kind == Kind::Float { "fp32" } else { "bf16 compute, fp32 master weights" }
        );
        let mut policy = on_pool(threads, || load_model(&model_path, trainer_kind, device))
            .map_err(|e| model_error(&model_path, e))?;
        let chat_template = match custom_template(config, &policy).map_err(|e| model_error(&model_path, e))? {
            Some(template) => Some(template),
            None => policy.chat_template.take(),
        };
        let tokenizer = policy.tokenizer.clone();
        let eos_token_ids = policy.eos_token_ids.clone();

        let engine_kind = engine_kind(&config.explorer.rollout_model.dtype, device);
        let generation = on_pool(threads, || load_model(&model_path, engine_kind, device))
            .map_err(|e| model_error(&model_path, e))?;
        let model = &config.model;
        let engine_config = EngineConfig {
            max_model_len: model.max_model_len.unwrap_or(2048) as usize,
            max_num_seqs: (config.explorer.runner_per_model as usize
                * config.algorithm.repeat_times.unwrap_or(1) as usize)
                .clamp(1, 256),
            max_prompt_tokens: model.max_prompt_tokens.map(|t| t as usize),
            max_response_tokens: model.max_response_tokens.map(|t| t as usize),
            kv_cache_bytes: cpu_kv_budget(device),
            num_threads: Some(threads),
            ..EngineConfig::default()
        };
        let engine = Engine::start(EngineModel::from(generation), engine_config)?;
        // Rollouts render with `enable_thinking` (the rollout model's, else the model's), as Trinity-RFT passes it to
        // `apply_chat_template`.
        let enable_thinking = config.explorer.rollout_model.enable_thinking.or(config.model.enable_thinking);
        let template_copy = match &chat_template {
            Some(template) => Some(
                ChatTemplate::new(template.source(), tokenizer.bos_token(), tokenizer.eos_token())
                    .map_err(|e| model_error(&model_path, e))?
                    .with_enable_thinking(enable_thinking),
            ),
            None => None,
        };
        let rollout = Arc::new(
            RolloutModel::new(Arc::new(engine), tokenizer.clone(), template_copy)
                .with_prompt_truncation(config.model.enable_prompt_truncation),
        );

        let mut scheduler = TaskScheduler::from_config(&config.buffer)?;
        let trained_before = meta.as_ref().map_or(0, |m| m.train_step);
        let expert = ExpertData::from_config(config, &tokenizer, chat_template.as_ref(), trained_before)?;
        let mut total_steps =
            config.trainer.total_steps.map_or(scheduler.total_steps(), |t| t.min(scheduler.total_steps()));
        if let Some(expert) = &expert
            && trained_before + expert.steps_left() < total_steps
        {
            total_steps = trained_before + expert.steps_left();
            tracing::warn!("the expert rows last for {total_steps} train steps: the run stops there");
        }
        let components = Components::from_config(&config.algorithm)?;
        let advantage = explorer_side_advantage(config, &components)?;
        let options = TrainerOptions { total_steps: Some(total_steps), ..TrainerOptions::from_config(config) };
        let vocab = policy.decoder.config().vocab_size;
        let models = starting_models(config, &components, latest.is_some(), (trainer_kind, device, vocab), threads)?;
        let decoder = policy.decoder;
        let optimizer = &config.algorithm.optimizer;
        let mut trainer =
            on_pool(threads, move || Trainer::with_models(decoder, models, components, optimizer, options))?;
        let (mut trained, mut syncs) = (0, 0);
        if let (Some(meta), Some(checkpoint)) = (&meta, &latest) {
            trainer.load_state(&checkpoint.path.join("trainer"), meta.train_step)?;
            scheduler.restore(meta.scheduler.clone())?;
            if !meta.beliefs.is_empty() {
                scheduler.restore_beliefs(meta.beliefs.clone())?;
            }
            trained = meta.train_step;
            syncs = meta.syncs;
            rollout.set_model_version(meta.train_step);
        }
        let buffer_dir = job_dir.join("buffer");
        let experience_buffer = config.buffer.trainer_input.experience_buffer.clone().unwrap_or_default();
        let buffer = ExperienceBuffer::open(&experience_buffer, &buffer_dir)?;
        let replay = match experience_buffer.replay_buffer.enable {
            true => Some(ReplayBuffer::from_config(
                &experience_buffer.replay_buffer,
                experience_buffer.capacity,
                config.explorer.rollout_model.seed,
            )?),
            false => None,
        };
        let mut explored = trained;
        let mut positions = BTreeMap::new();
        let mut pending = BTreeMap::new();
        for recorded in buffer.resume_after(trained)? {
            let record: ExploreRecord = serde_json::from_str(&recorded.state).map_err(|e| {
                RftError::Unsupported(format!("buffer {}: unreadable explore record: {e}", buffer.name()))
            })?;
            scheduler.restore(record.scheduler.clone())?;
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
        let experiences_log = JsonlWriter::open(&job_dir.join("experiences.jsonl"))?;
        let monitor = Monitor::open(&job_dir.join("monitor"), &config.monitor.monitor_type)?;
        let eval_tasksets = trinity_buffer::load_eval_tasksets(&config.buffer)?;
        Ok(Run {
            config,
            job_dir,
            checkpoints,
            monitor,
            trainer,
            rollout,
            tokenizer,
            chat_template,
            eos_token_ids,
            scheduler,
            eval_tasksets,
            advantage,
            expert,
            replay,
            buffer,
            experiences_log,
            schedule: SyncSchedule {
                interval: u64::from(config.synchronizer.sync_interval),
                offset: u64::from(config.synchronizer.sync_offset),
            },
            total_steps,
            resumed_from: latest.map(|c| c.step),
            explored,
            trained,
            syncs,
            positions,
            pending,
            step_mark: Instant::now(),
            threads,
        })
    }

    async fn drive(mut self) -> Result<RunSummary, RftError> {
        tracing::info!(
            "run {}: {} steps, sync every {} step(s), offset {}",
            self.job_dir.display(),
            self.total_steps,
            self.schedule.interval,
            self.schedule.offset
        );
        if self.resumed_from.is_none() && self.config.explorer.eval_on_startup && !self.eval_tasksets.is_empty() {
            let metrics = self.evaluate().await?;
            self.monitor.record(0, &metrics)?;
        }
        self.step_mark = Instant::now();
        loop {
            match next_action(&self.schedule, self.explored, self.trained, self.syncs, self.total_steps) {
                Action::Explore(step) => self.explore(step).await?,
                Action::Train(step) => self.train(step).await?,
                Action::Done => break,
            }
        }
        self.buffer.close();
        Ok(RunSummary { job_dir: self.job_dir, resumed_from: self.resumed_from, train_steps: self.trained })
    }

    async fn explore(&mut self, step: u64) -> Result<(), RftError> {
        let started = Instant::now();
        let Some(tasks) = self.scheduler.next_batch()? else {
            // The tasksets ran out earlier than planned (only possible with total_steps beyond the data).
            self.total_steps = step - 1;
            return Ok(());
        };
        self.positions.insert(step, self.scheduler.state());
        let explorer = &self.config.explorer;
        let options = RunnerOptions {
            concurrency: explorer.runner_per_model as usize,
            timeout: Duration::from_secs(explorer.max_timeout),
            max_retries: explorer.max_retry_times,
            default_workflow: "simple_workflow".to_owned(),
        };
        let report = run_tasks(Arc::clone(&self.rollout), tasks, &options).await;
        if report.groups.is_empty() {
            let first = report.failures.first().map(|f| f.error.to_string()).unwrap_or_default();
            return Err(RftError::AllTasksFailed { step, first });
        }
        let mut metrics = rollout_metrics("rollout", &report);
        let mut experiences: Vec<Experience> = report.groups.into_iter().flatten().collect();
        // The configured operators (plugins) run before the group advantage, as in Trinity-RFT's pipeline; one
        // that fails is skipped for this batch and counted, never fatal.
        let operators = &self.config.data_processor.experience_pipeline.operators;
        if !operators.is_empty() {
            let named = operators.iter().map(|operator| (operator.name.as_str(), &operator.args));
            let output = trinity_explorer::apply_pipeline(named, experiences);
            experiences = output.experiences;
            metrics.extend(output.metrics);
            // Pass rates an operator measured (`pass_rate_calculator`) feed the task selectors before the next
            // step draws its tasks (the `difficulty_based` selector's beliefs).
            self.scheduler.feedback(&output.selector_feedback)?;
        }
        if let Some(advantage) = &self.advantage {
            let (with_advantages, pipeline_metrics) = apply_group_advantage(advantage.as_ref(), experiences)?;
            experiences = with_advantages;
            metrics.extend(pipeline_metrics.into_iter().map(|(k, v)| (format!("pipeline/{k}"), v)));
        }
        self.experiences_log.write_batch(&experiences)?;
        let count = experiences.len();
        let response_tokens: usize = experiences.iter().map(Experience::response_length).sum();
        let seconds = started.elapsed().as_secs_f64();
        metrics.insert("time/explore_s".into(), seconds);
        metrics.insert("perf/rollout_tokens_per_s".into(), response_tokens as f64 / seconds.max(1e-9));
        let record = ExploreRecord { scheduler: self.scheduler.state(), metrics };
        let state = serde_json::to_string(&record)
            .map_err(|e| RftError::Unsupported(format!("cannot encode the explore record: {e}")))?;
        self.buffer.put_step(step, experiences, &state).await?;
        self.pending.insert(step, (count, record.metrics));
        self.explored = step;
        Ok(())
    }

    async fn train(&mut self, step: u64) -> Result<(), RftError> {
        let (count, mut metrics) = self.pending.remove(&step).unwrap_or_default();
        let started = Instant::now();
        let mut tokens = 0usize;
        if count > 0 {
            let timeout = Duration::from_secs_f64(
                self.config.buffer.trainer_input.experience_buffer.as_ref().map_or(1800.0, |b| b.max_read_timeout),
            );
            let mut batch = self.buffer.get_batch_for_step(count, timeout, step).await?;
            let min_version = min_model_version(self.config, step);
            if let Some(replay) = &mut self.replay {
                batch = draw_replay(replay, batch, step, min_version, &mut metrics)?;
            } else if let Some(min_version) = min_version {
                let before = batch.len();
                batch.retain(|e| e.model_version >= min_version);
                metrics.insert("buffer/stale_dropped".into(), (before - batch.len()) as f64);
            }
            let mut rows: Vec<TrainRow> = batch.iter().map(train_row).collect();
            if let Some(expert) = &mut self.expert {
                rows.extend(expert.rows_for(step)?);
            }
            if rows.iter().any(|r| r.action_mask.contains(&true)) {
                tokens = rows.iter().map(|r| r.tokens.len()).sum();
                let trainer = &mut self.trainer;
                let step_metrics = on_pool(self.threads, || trainer.train_step(&rows))?;
                // The trainer reports veRL's `actor/...` names; the run's metrics are `train/...` (pg_loss,
                // kl_loss, entropy, grad_norm, lr, ...).
                metrics.extend(
                    step_metrics
                        .into_iter()
                        .map(|(k, v)| (format!("train/{}", k.strip_prefix("actor/").unwrap_or(&k)), v)),
                );
            } else {
                // Every row is a masked placeholder (prompts over the limit): there is no token to train on.
                tracing::warn!("train step {step} skipped: none of its {} experiences has a trained token", rows.len());
            }
        } else {
            tracing::warn!("explore step {step} kept no experience (every group dropped); train step {step} skipped");
        }
        let train_seconds = started.elapsed().as_secs_f64();
        metrics.insert("time/train_s".into(), train_seconds);
        metrics.insert("perf/train_tokens_per_s".into(), tokens as f64 / train_seconds.max(1e-9));
        self.trained = step;

        let mut sync_seconds = 0.0;
        if self.schedule.syncs_after(step) || step == self.total_steps {
            let started = Instant::now();
            let mut weights =
                self.trainer.policy().named_parameters().map_err(|e| model_error(Path::new("policy"), e))?;
            if self.config.synchronizer.sync_method == SyncMethod::Checkpoint {
                weights = self.through_disk(weights)?;
            }
            self.rollout.engine().sync_weights(weights).await?;
            self.rollout.set_model_version(step);
            self.syncs += 1;
            sync_seconds = started.elapsed().as_secs_f64();
        }
        metrics.insert("time/sync_s".into(), sync_seconds);

        let eval_interval = self.config.explorer.eval_interval;
        if !self.eval_tasksets.is_empty() && (step.is_multiple_of(eval_interval) || step == self.total_steps) {
            metrics.extend(self.evaluate().await?);
        }
        let save_interval = self.config.trainer.save_interval;
        let mut save_seconds = 0.0;
        if (save_interval > 0 && step.is_multiple_of(save_interval)) || step == self.total_steps {
            let started = Instant::now();
            self.save(step)?;
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
            train_seconds,
        );
        Ok(())
    }

    async fn evaluate(&mut self) -> Result<Metrics, RftError> {
        let mut metrics = Metrics::new();
        let options = RunnerOptions {
            concurrency: self.config.explorer.runner_per_model as usize,
            timeout: Duration::from_secs(self.config.explorer.max_timeout),
            max_retries: self.config.explorer.max_retry_times,
            default_workflow: "simple_workflow".to_owned(),
        };
        for taskset in &self.eval_tasksets {
            let started = Instant::now();
            let report = run_tasks(Arc::clone(&self.rollout), taskset.all_tasks()?, &options).await;
            let prefix = format!("eval/{}", taskset.config.name);
            let mut taskset_metrics = rollout_metrics(&prefix, &report);
            let experiences: Vec<&Experience> = report.experiences().collect();
            let accurate = experiences.iter().filter(|e| is_accurate(e)).count();
            taskset_metrics.insert(format!("{prefix}/accuracy"), accurate as f64 / experiences.len().max(1) as f64);
            taskset_metrics.insert(format!("time/eval_{}_s", taskset.config.name), started.elapsed().as_secs_f64());
            metrics.extend(taskset_metrics);
        }
        Ok(metrics)
    }

    /// `sync_method: checkpoint`: the weights go to `<job>/sync/model.safetensors` (written beside it and renamed,
    /// so a reader never sees half a file) and the engine's copy is read back from there — the transport a
    /// separate explorer process uses, kept here so mode `both` can run with it too.
    fn through_disk(&self, weights: Vec<(String, tch::Tensor)>) -> Result<Vec<(String, tch::Tensor)>, RftError> {
        let dir = self.job_dir.join("sync");
        let io = |e: std::io::Error| RftError::Io { path: dir.clone(), source: e };
        std::fs::create_dir_all(&dir).map_err(io)?;
        let partial = dir.join("model.safetensors.partial");
        write_safetensors(&partial, &weights).map_err(|e| model_error(&partial, e))?;
        std::fs::rename(&partial, dir.join("model.safetensors")).map_err(io)?;
        let stored = SafetensorsWeights::open_dir(&dir).map_err(|e| model_error(&dir, e))?;
        weights
            .into_iter()
            .map(|(name, _)| {
                let tensor = stored.get(&name).map_err(|e| model_error(&dir, e))?;
                Ok((name, tensor))
            })
            .collect()
    }

    fn save(&mut self, step: u64) -> Result<(), RftError> {
        let scheduler = self.positions.get(&step).cloned().unwrap_or_else(|| self.scheduler.state());
        let meta = Meta { train_step: step, syncs: self.syncs, scheduler, beliefs: self.scheduler.beliefs() };
        let (trainer, tokenizer, template, eos) =
            (&self.trainer, &self.tokenizer, self.chat_template.as_ref(), &self.eos_token_ids);
        self.checkpoints.save(step, &meta, |dir| {
            save_hf_parts(trainer.policy(), tokenizer, template, eos, &dir.join("hf")).map_err(|e| e.to_string())?;
            let state = dir.join("trainer");
            std::fs::create_dir_all(&state).map_err(|e| e.to_string())?;
            trainer.save_state(&state).map_err(|e| e.to_string())
        })?;
        if let Some(keep) = self.config.trainer.max_checkpoints_to_keep {
            self.checkpoints.prune(keep as usize)?;
        }
        self.positions.retain(|&s, _| s > step);
        Ok(())
    }
}

/// The rows train step `step` trains with prioritised replay: the explore step's experiences enter the replay
/// buffer as one item (Trinity-RFT's `put_batch`), then the step reads as many experiences as the explore step
/// made, by priority: fresh ones first, earlier steps' again once their cooldown has passed and their priority
/// ranks them. Entering at the train step instead of the explore step keeps a resumed run's replay equal to its
/// buffer. When fewer are readable (Trinity's reader would wait, which in one process would wait forever), the
/// step trains on those that are.
fn draw_replay(
    replay: &mut ReplayBuffer,
    fresh: Vec<Experience>,
    step: u64,
    min_version: Option<u64>,
    metrics: &mut Metrics,
) -> Result<Vec<Experience>, RftError> {
    let wanted = fresh.len();
    let now = Instant::now();
    replay.put(fresh, now)?;
    let batch = match replay.take(wanted, now, min_version) {
        ReplayTake::Batch(batch) => batch,
        ReplayTake::Short { available, .. } => {
            tracing::warn!(
                "train step {step}: replay has {available} of {wanted} experiences readable; training on those"
            );
            match replay.take(available, now, min_version) {
                ReplayTake::Batch(batch) => batch,
                ReplayTake::Short { .. } => Vec::new(),
            }
        }
    };
    let reused = batch.iter().filter(|e| e.info.get("use_count").and_then(serde_json::Value::as_u64) > Some(1)).count();
    let stats = replay.stats();
    metrics.insert("replay/reused_experiences".into(), reused as f64);
    metrics.insert("replay/queued_items".into(), replay.queued_items() as f64);
    metrics.insert("replay/items_evicted".into(), stats.items_evicted as f64);
    Ok(batch)
}

/// Sample strategy `staleness_control`: train step `step` keeps only experiences sampled with model version
/// `step − max_staleness` or newer (Trinity-RFT's `min_model_version`); `None` for other strategies or no limit.
fn min_model_version(config: &Config, step: u64) -> Option<u64> {
    if config.algorithm.sample_strategy.as_deref() != Some("staleness_control") {
        return None;
    }
    let max = config.algorithm.sample_strategy_args.as_ref()?.get("max_staleness")?.as_u64()?;
    Some(step.saturating_sub(max))
}

/// The trainer's view of an experience.
fn train_row(experience: &Experience) -> TrainRow {
    TrainRow {
        tokens: experience.tokens.iter().map(|&t| i64::from(t)).collect(),
        prompt_length: experience.prompt_length,
        action_mask: experience.action_mask.clone(),
        logprobs: experience.logprobs.clone(),
        reward: Some(experience.reward as f32),
        token_level_rewards: experience.token_level_rewards.clone(),
        advantages: experience.advantages.clone(),
        teacher_logprobs: experience.teacher_logprobs.clone(),
        expert: false,
        group_id: Some(experience.eid.tid()),
        run_id: Some(format!("{}/{}", experience.eid.tid(), experience.eid.run)),
        step: Some(experience.eid.batch as i64),
    }
}

/// The reference model and critic backbone the trainer starts from, where copying the policy would be wrong.
///
/// KL terms are measured against the base model (`model.model_path`) for the whole run: a resumed run's policy
/// comes from its checkpoint, so the base model is loaded for the reference (a fresh run's policy is the base
/// model, and copying it saves a load). The critic starts from `model.critic_model_path` when that names another
/// model; on resume its trained weights then come from the checkpoint's trainer state.
fn starting_models(
    config: &Config,
    components: &Components,
    resuming: bool,
    (kind, device, vocab): (Kind, tch::Device, i64),
    threads: usize,
) -> Result<StartingModels, RftError> {
    let load = |path: &Path, kind: Kind| {
        on_pool(threads, || load_model(path, kind, device)).map(|m| m.decoder).map_err(|e| model_error(path, e))
    };
    let base = Path::new(&config.model.model_path);
    let reference = if components.use_reference && resuming {
        tracing::info!("reference model: {} (the base model, not the checkpoint)", base.display());
        Some(load(base, kind)?)
    } else {
        None
    };
    let critic_path = Path::new(&config.model.critic_model_path);
    let critic = if components.use_critic && !critic_path.as_os_str().is_empty() && critic_path != base {
        tracing::info!("critic starts from {}", critic_path.display());
        let critic = load(critic_path, Kind::Float)?;
        // The critic scores the policy's token ids, so it must read the same vocabulary.
        if critic.config().vocab_size != vocab {
            return Err(RftError::Setting {
                key: "model.critic_model_path",
                message: format!(
                    "{} has a vocabulary of {} tokens, the policy's has {vocab}; the critic must use the policy's \
                     tokenizer",
                    critic_path.display(),
                    critic.config().vocab_size
                ),
            });
        }
        Some(critic)
    } else {
        None
    };
    Ok(StartingModels { reference, critic })
}

/// Reward and length statistics of a batch, under `prefix/`.
fn rollout_metrics(prefix: &str, report: &RunReport) -> Metrics {
    let rewards: Vec<f64> = report.experiences().map(|e| e.reward).collect();
    let lengths: Vec<f64> = report.experiences().map(|e| e.response_length() as f64).collect();
    let mut metrics = Metrics::new();
    let n = rewards.len().max(1) as f64;
    let mean = rewards.iter().sum::<f64>() / n;
    let variance = rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n;
    metrics.insert(format!("{prefix}/reward_mean"), mean);
    metrics.insert(format!("{prefix}/reward_std"), variance.sqrt());
    metrics.insert(format!("{prefix}/reward_max"), rewards.iter().copied().fold(f64::NEG_INFINITY, f64::max));
    metrics.insert(format!("{prefix}/reward_min"), rewards.iter().copied().fold(f64::INFINITY, f64::min));
    metrics.insert(format!("{prefix}/response_length_mean"), lengths.iter().sum::<f64>() / n);
    metrics.insert(format!("{prefix}/failed_tasks"), report.failures.len() as f64);
    metrics.insert(format!("{prefix}/retries"), f64::from(report.retries));
    metrics
}

/// A rollout counts as accurate when its `accuracy` reward component is 1 (math rewards), or, for rewards
/// without one (countdown's `score`), when its total reward reaches 1.
fn is_accurate(experience: &Experience) -> bool {
    match experience.metrics.get("accuracy") {
        Some(accuracy) => *accuracy >= 1.0,
        None => experience.reward >= 1.0,
    }
}

/// The advantage function the explorer's pipeline runs (group advantages), if the algorithm has one there.
fn explorer_side_advantage(config: &Config, components: &Components) -> Result<Option<Box<dyn AdvantageFn>>, RftError> {
    if components.compute_advantage_in_trainer {
        return Ok(None);
    }
    let Some(name) = config.algorithm.advantage_fn.as_deref() else {
        return Ok(None);
    };
    if components.advantage.is_none() {
        return Ok(None);
    }
    let args = registry::resolve_args(ComponentKind::AdvantageFn, name, config.algorithm.advantage_fn_args.as_ref())?;
    let (function, in_trainer) = registry::advantage_fn(name, &args)?;
    Ok(if in_trainer { None } else { Some(function) })
}

fn custom_template(config: &Config, model: &LoadedModel) -> Result<Option<ChatTemplate>, trinity_model::ModelError> {
    let (bos, eos) = (model.tokenizer.bos_token(), model.tokenizer.eos_token());
    if let Some(path) = &config.model.chat_template_path {
        return ChatTemplate::from_file(Path::new(path), bos, eos).map(Some);
    }
    match &config.model.custom_chat_template {
        Some(source) => ChatTemplate::new(source, bos, eos).map(Some),
        None => Ok(None),
    }
}

/// The policy's parameter dtype: bf16 parameters make the trainer run mixed precision (bf16 compute, fp32 masters
/// in the optimizer); `auto` picks it where bf16 is fast.
fn trainer_kind(dtype: &str, device: tch::Device) -> Kind {
    match dtype {
        "float32" | "fp32" => Kind::Float,
        "bfloat16" | "bf16" => Kind::BFloat16,
        _ if trinity_model::fast_bf16(device) => Kind::BFloat16,
        _ => Kind::Float,
    }
}

/// Runs `work` on a thread of its own with `threads` libtorch threads, and waits for it. The thread's OpenMP pool
/// ends with it, so between calls only the engine's pool is alive (see [`Run::start`]). A panic in `work` is
/// re-raised here.
fn on_pool<T: Send>(threads: usize, work: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        let handle = scope.spawn(move || {
            tch::set_num_threads(i32::try_from(threads).unwrap_or(i32::MAX));
            work()
        });
        handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// The KV cache's memory budget on a CPU: a quarter of the memory available at start, as Trinity-RFT caps a
/// colocated engine's `gpu_memory_utilization` at 0.25, because the trainer shares the same memory. Without it a
/// long `max_model_len` (11264 in mix_math) times `runner_per_model × repeat_times` slots asked for more than the
/// machine has; with it the engine runs fewer sequences at once. On CUDA the engine allocates every slot.
fn cpu_kv_budget(device: tch::Device) -> Option<u64> {
    if device != tch::Device::Cpu {
        return None;
    }
    trinity_trainer::micro_batch::available_memory().map(|bytes| bytes / 4)
}

/// The rollout engine's weight dtype. `bfloat16` (Trinity-RFT's default, sized for GPUs) and `auto` are bf16
/// where the device computes bf16 natively; elsewhere (a CPU without AVX512-BF16 or AMX) libtorch emulates bf16
/// far slower than fp32, so the engine keeps fp32 weights, as the trainer's `auto` precision does, and says so.
fn engine_kind(dtype: &str, device: tch::Device) -> Kind {
    match dtype {
        "float32" | "fp32" => Kind::Float,
        "float16" | "fp16" => Kind::Half,
        _ if trinity_model::fast_bf16(device) => Kind::BFloat16,
        _ => {
            tracing::info!(
                "explorer.rollout_model.dtype `{dtype}`: this CPU has no native bf16, so rollouts run with fp32 weights"
            );
            Kind::Float
        }
    }
}

/// `YYYYmmddHHMMSS` in UTC, as Trinity-RFT suffixes a renamed experiment.
fn timestamp(time: std::time::SystemTime) -> String {
    let seconds = time.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = trinity_model::civil_from_days(days as i64);
    format!("{year:04}{month:02}{day:02}{:02}{:02}{:02}", rest / 3600, rest % 3600 / 60, rest % 60)
}

fn model_error(path: &Path, source: trinity_model::ModelError) -> RftError {
    RftError::Model { path: path.display().to_string(), source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_calendar_time() {
        let at = |s: u64| timestamp(std::time::UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "19700101000000");
        assert_eq!(at(951_782_400), "20000229000000", "leap day");
        assert_eq!(at(1_700_000_000), "20231114221320");
    }
}
