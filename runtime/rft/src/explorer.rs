//! The Explorer: draws tasks, runs their workflows against the rollout engine, turns the results into
//! experiences (experience pipeline, group advantages) and evaluates the current weights on the eval tasksets.
//!
//! Its interface is narrow on purpose: it produces experiences ([`Explorer::explore_step`]) and takes weights
//! ([`Explorer::load_weights`]); where the experiences go (a buffer the trainer shares in-process or across
//! processes) and where the weights come from (the trainer in place, or files it publishes) is the mode's business.
//! Every experience carries the model version of the weights that sampled it, which the trainer's staleness
//! control reads.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use trinity_buffer::{Experience, JsonlWriter, TaskScheduler, Taskset};
use trinity_config::Config;
use trinity_engine::{Engine, EngineConfig, EngineModel};
use trinity_explorer::{
    BatchControl, DynamicTimeout, ExternalModel, OverRollout, RolloutModel, RunReport, RunnerOptions, run_batch,
};
use trinity_model::ChatTemplate;
use trinity_monitor::Metrics;

use crate::error::RftError;
use crate::failed_tasks::{FailedTaskLog, FailurePhase};
use crate::models::{self, model_error};
use crate::pipeline::ExperiencePipeline;
use crate::rollout_metrics::{Stats, is_accurate, rollout_metrics};

/// What the explorer is started for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExplorerRole {
    /// Explore the training tasksets (and evaluate): modes `both` and `explore`.
    Explore,
    /// Evaluate only (no training taskset is read): mode `bench`, and evaluation in mode `train`.
    EvaluateOnly,
}

/// One explore step's result: the experiences for the trainer and the step's metrics.
#[derive(Debug)]
pub(crate) struct ExploreOutput {
    pub experiences: Vec<Experience>,
    pub metrics: Metrics,
}

/// A batch of tasks running on the rollout engine ([`Explorer::submit`]); awaiting it gives what [`Explorer::finish`]
/// takes.
pub(crate) struct InFlight {
    started: Instant,
    handle: tokio::task::JoinHandle<RunReport>,
}

/// A batch that ran: its report and when it started.
pub(crate) struct Ran {
    report: RunReport,
    started: Instant,
}

impl InFlight {
    /// When the batch was submitted: its step's `time/explore_s` counts from here.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }
}

impl Future for InFlight {
    type Output = Result<Ran, RftError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let started = self.started;
        std::pin::Pin::new(&mut self.handle).poll(cx).map(|joined| {
            joined
                .map(|report| Ran { report, started })
                .map_err(|e| RftError::Unsupported(format!("an explore batch's runner stopped: {e}")))
        })
    }
}

impl Drop for InFlight {
    /// A batch nobody finishes (the run stopped on an error) stops running, and its workflows with it.
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// The files an exploring explorer appends to, in the run directory.
#[derive(Debug, Clone)]
pub(crate) struct ExplorerLogs {
    /// Every experience explored.
    pub experiences: PathBuf,
    /// Every task that failed for good ([`crate::failed_tasks`]).
    pub failed_tasks: PathBuf,
}

impl ExplorerLogs {
    /// `<dir>/<prefix>experiences.jsonl` and `<dir>/<prefix>failed_tasks.jsonl` (the prefix names the explorer of
    /// a decoupled run, e.g. `explorer_`; a single-process run has none).
    pub(crate) fn in_dir(dir: &Path, prefix: &str) -> ExplorerLogs {
        ExplorerLogs {
            experiences: dir.join(format!("{prefix}experiences.jsonl")),
            failed_tasks: dir.join(format!("{prefix}failed_tasks.jsonl")),
        }
    }
}

/// The explorer of a run.
pub(crate) struct Explorer {
    rollout: Arc<RolloutModel>,
    scheduler: Option<TaskScheduler>,
    eval_tasksets: Vec<Taskset>,
    pipeline: ExperiencePipeline,
    options: RunnerOptions,
    /// Over-rollout and the dynamic timeout of train steps ([`BatchControl`]).
    train_control: BatchControl,
    experiences_log: Option<JsonlWriter>,
    failed_log: Option<FailedTaskLog>,
    /// `monitor.detailed_stats`: evaluations also report std, max and min of the workflows' metrics.
    detailed_stats: bool,
    /// `enable_openai_api`: the rollout model's OpenAI-compatible server for workflows; dropping it stops it.
    _openai: Option<trinity_serve::ServerHandle>,
}

impl std::fmt::Debug for Explorer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Explorer").field("model_version", &self.rollout.model_version()).finish_non_exhaustive()
    }
}

impl Explorer {
    /// Loads the rollout engine from `model_path` (the base model, or weights a trainer saved) and the tasksets of
    /// `role`; with `logs`, every experience explored and every task that fails for good is also appended to its
    /// file.
    pub(crate) fn start(
        config: &Config,
        model_path: &Path,
        device: tch::Device,
        threads: usize,
        role: ExplorerRole,
        logs: Option<ExplorerLogs>,
    ) -> Result<Explorer, RftError> {
        let kind = models::engine_kind(&config.explorer.rollout_model.dtype, device);
        let mut generation = models::load(model_path, kind, device, threads)?;
        models::on_pool(threads, || crate::lora::merge_start_adapter(config, model_path, &mut generation.decoder))?;
        let template = models::chat_template(config, &mut generation)?;
        let tokenizer = generation.tokenizer.clone();
        let lengths = config.model.resolved;
        let engine_config = EngineConfig {
            max_model_len: lengths.max_model_len as usize,
            max_num_seqs: (config.explorer.runner_per_model as usize * config.algorithm.resolved.repeat_times as usize)
                .clamp(1, 256),
            // Trinity-RFT truncates prompts to max_prompt_tokens only with enable_prompt_truncation; without it
            // vLLM takes any prompt that leaves room in max_model_len (a multi-turn workflow's growing history),
            // and so does the engine.
            max_prompt_tokens: config.model.enable_prompt_truncation.then_some(lengths.max_prompt_tokens as usize),
            max_response_tokens: Some(lengths.max_response_tokens as usize),
            kv_cache_bytes: models::cpu_kv_budget(device),
            num_threads: Some(threads),
            // Trinity-RFT sets rollout_model.enable_return_routed_experts from algorithm.enable_router_replay.
            return_routed_experts: config.algorithm.enable_router_replay,
            ..EngineConfig::default()
        };
        let engine = Engine::start(EngineModel::from(generation), engine_config)?;
        // Rollouts render with `enable_thinking` (the rollout model's, else the model's), as Trinity-RFT passes it to
        // `apply_chat_template`.
        let enable_thinking = config.explorer.rollout_model.enable_thinking.or(config.model.enable_thinking);
        let template = template.map(|t: ChatTemplate| t.with_enable_thinking(enable_thinking));
        let rollout = Arc::new(
            RolloutModel::new(Arc::new(engine), tokenizer, template)
                .with_prompt_truncation(config.model.enable_prompt_truncation)
                .with_auxiliary_models(crate::auxiliary::load_all(config, device, threads)?),
        );
        let openai = start_openai_view(config, &rollout)?;
        Self::around(config, rollout, role, logs, openai)
    }

    /// An evaluate-only explorer whose model is the OpenAI-compatible endpoint of `model.external_model` (mode
    /// `bench`): its base URL and API key are read from the environment variables the config names. Requests
    /// run `explorer.runner_per_model` at a time, each within `explorer.max_timeout`, retried as tasks are
    /// (`explorer.max_retry_times`).
    pub(crate) fn start_external(config: &Config) -> Result<Explorer, RftError> {
        let external = &config.model.external_model;
        let read = |key: &'static str, var: &str| {
            std::env::var(var).map_err(|_| RftError::Setting {
                key,
                message: format!("environment variable `{var}` is not set (or not valid UTF-8)"),
            })
        };
        let base_url = read("model.external_model.base_url_env", &external.base_url_env)?;
        let api_key = read("model.external_model.api_key_env", &external.api_key_env)?;
        let endpoint = ExternalModel::new(
            &base_url,
            external.model_name.clone().unwrap_or_default(),
            api_key,
            Some(config.model.resolved.max_response_tokens as usize),
            Duration::from_secs(config.explorer.max_timeout),
        );
        tracing::info!("the evaluated model is `{}` at {}", endpoint.model_name(), endpoint.url());
        let rollout = Arc::new(RolloutModel::external(endpoint));
        Self::around(config, rollout, ExplorerRole::EvaluateOnly, None, None)
    }

    /// The explorer of `role` around a rollout model.
    fn around(
        config: &Config,
        rollout: Arc<RolloutModel>,
        role: ExplorerRole,
        logs: Option<ExplorerLogs>,
        openai: Option<trinity_serve::ServerHandle>,
    ) -> Result<Explorer, RftError> {
        let scheduler = match role {
            ExplorerRole::Explore => Some(TaskScheduler::from_config(&config.buffer)?),
            ExplorerRole::EvaluateOnly => None,
        };
        let explorer = &config.explorer;
        Ok(Explorer {
            rollout,
            scheduler,
            eval_tasksets: trinity_buffer::load_eval_tasksets(&config.buffer)?,
            pipeline: ExperiencePipeline::from_config(config)?,
            options: RunnerOptions {
                concurrency: explorer.runner_per_model as usize,
                timeout: Duration::from_secs(explorer.max_timeout),
                max_retries: explorer.max_retry_times,
                default_workflow: "simple_workflow".to_owned(),
            },
            train_control: train_control(config),
            experiences_log: logs.as_ref().map(|logs| JsonlWriter::open(&logs.experiences)).transpose()?,
            failed_log: logs.as_ref().map(|logs| FailedTaskLog::open(&logs.failed_tasks)).transpose()?,
            detailed_stats: config.monitor.detailed_stats,
            _openai: openai,
        })
    }

    pub(crate) fn rollout(&self) -> &Arc<RolloutModel> {
        &self.rollout
    }

    /// The version of the weights the engine holds (the trainer step they come from; 0 for the base model).
    pub(crate) fn model_version(&self) -> u64 {
        self.rollout.model_version()
    }

    /// The task scheduler of the training tasksets.
    ///
    /// # Panics
    /// On an evaluate-only explorer, which has none (a programming error).
    pub(crate) fn scheduler(&mut self) -> &mut TaskScheduler {
        self.scheduler.as_mut().expect("an exploring explorer has a task scheduler")
    }

    pub(crate) fn has_eval_tasksets(&self) -> bool {
        !self.eval_tasksets.is_empty()
    }

    /// Runs explore step `step`: draws a batch of tasks, runs them, applies the experience pipeline and the group
    /// advantage. `None` when the tasksets are used up.
    pub(crate) async fn explore_step(&mut self, step: u64) -> Result<Option<ExploreOutput>, RftError> {
        let Some(batch) = self.submit()? else {
            return Ok(None);
        };
        self.finish(step, batch.await?).await.map(Some)
    }

    /// Draws the next batch of tasks and starts running them; `None` when the tasksets are used up. The batch runs
    /// on its own (several can be in flight, `sync_style: fully_async`) until [`Explorer::finish`] takes it.
    pub(crate) fn submit(&mut self) -> Result<Option<InFlight>, RftError> {
        let Some(tasks) = self.scheduler().next_batch()? else {
            return Ok(None);
        };
        let (rollout, options, control) = (Arc::clone(&self.rollout), self.options.clone(), self.train_control.clone());
        let handle = tokio::spawn(async move { run_batch(rollout, tasks, &options, &control).await });
        Ok(Some(InFlight { started: Instant::now(), handle }))
    }

    /// Turns a batch's report into explore step `step`'s experiences and metrics.
    pub(crate) async fn finish(&mut self, step: u64, ran: Ran) -> Result<ExploreOutput, RftError> {
        let Ran { report, started } = ran;
        if let Some(dynamic) = &self.train_control.dynamic_timeout {
            dynamic.record_step(&report);
        }
        // Recorded first: when every task failed, the run stops below, and this record says why.
        if let Some(log) = &mut self.failed_log {
            log.record(step, FailurePhase::Explore, self.rollout.model_version(), &report.failures)?;
        }
        if report.groups.is_empty() {
            let first = report.failures.first().map(|f| f.error.to_string()).unwrap_or_default();
            return Err(RftError::AllTasksFailed { step, first });
        }
        let mut metrics = rollout_metrics("rollout", &report, Stats::Rollout);
        if self.train_control.over_rollout.is_some() {
            metrics.insert("rollout/finished_task_count".into(), report.finished_tasks() as f64);
            metrics.insert("rollout/cancelled_tasks".into(), report.cancelled.len() as f64);
        }
        let output = self.pipeline.process(report.groups.into_iter().flatten().collect()).await?;
        metrics.extend(output.metrics);
        // Pass rates an operator measured (`pass_rate_calculator`) feed the task selectors before the next step
        // draws its tasks (the `difficulty_based` selector's beliefs).
        self.scheduler().feedback(&output.selector_feedback)?;
        let experiences = output.experiences;
        if let Some(log) = &mut self.experiences_log {
            log.write_batch(&experiences)?;
        }
        let response_tokens: usize = experiences.iter().map(Experience::response_length).sum();
        let seconds = started.elapsed().as_secs_f64();
        metrics.insert("time/explore_s".into(), seconds);
        metrics.insert("perf/rollout_tokens_per_s".into(), response_tokens as f64 / seconds.max(1e-9));
        metrics.insert("rollout/model_version".into(), self.model_version() as f64);
        Ok(ExploreOutput { experiences, metrics })
    }

    /// Evaluates the current weights on every eval taskset: `<prefix>/<taskset>/accuracy` and the rollout statistics,
    /// plus `time/eval_<taskset>_s`. Failed tasks are recorded under `step`, the step the evaluation follows.
    pub(crate) async fn evaluate(&mut self, prefix: &str, step: u64) -> Result<Metrics, RftError> {
        self.evaluate_tasksets(prefix, step, false).await
    }

    /// [`Explorer::evaluate`] for mode `bench`, where the figures are the whole result: a taskset whose every task
    /// failed (an endpoint that is down, a model that cannot load its prompts) stops the bench with the first
    /// task's error instead of reporting an accuracy of 0.
    pub(crate) async fn benchmark(&mut self, prefix: &str, step: u64) -> Result<Metrics, RftError> {
        self.evaluate_tasksets(prefix, step, true).await
    }

    async fn evaluate_tasksets(
        &mut self,
        prefix: &str,
        step: u64,
        stop_when_all_fail: bool,
    ) -> Result<Metrics, RftError> {
        let mut metrics = Metrics::new();
        for taskset in &self.eval_tasksets {
            let started = Instant::now();
            // Evaluations wait for every task (no over-rollout) up to Trinity-RFT's limit of a batch, and read the
            // dynamic timeout without feeding it.
            let control =
                BatchControl { over_rollout: None, observe: false, batch_limit: true, ..self.train_control.clone() };
            let report = run_batch(Arc::clone(&self.rollout), taskset.all_tasks()?, &self.options, &control).await;
            if let Some(log) = &mut self.failed_log {
                log.record(step, FailurePhase::Eval, self.rollout.model_version(), &report.failures)?;
            }
            if stop_when_all_fail && every_task_failed(&report) {
                let first = report.failures.first().map(|f| f.error.to_string()).unwrap_or_default();
                return Err(RftError::EvalFailed { taskset: taskset.config.name.clone(), first });
            }
            let name = format!("{prefix}/{}", taskset.config.name);
            let mut taskset_metrics = rollout_metrics(&name, &report, Stats::Eval { detailed: self.detailed_stats });
            let experiences: Vec<&Experience> = report.experiences().collect();
            let accurate = experiences.iter().filter(|e| is_accurate(e)).count();
            taskset_metrics.insert(format!("{name}/accuracy"), accurate as f64 / experiences.len().max(1) as f64);
            // Trinity-RFT 0.6.0 reports the tasks that came back (done or failed); the metrics above are the done
            // tasks'. The tasks the batch's limit cut off are trinity's count.
            taskset_metrics.insert(format!("{name}/finished_task_count"), report.finished_tasks() as f64);
            taskset_metrics.insert(format!("{name}/cancelled_tasks"), report.cancelled.len() as f64);
            taskset_metrics.insert(format!("time/eval_{}_s", taskset.config.name), started.elapsed().as_secs_f64());
            metrics.extend(taskset_metrics);
        }
        Ok(metrics)
    }

    /// Puts `weights` (HF parameter names) into the engine between decode steps and stamps what is sampled from
    /// now on with `version`.
    pub(crate) async fn load_weights(&self, weights: Vec<(String, tch::Tensor)>, version: u64) -> Result<(), RftError> {
        self.rollout.engine().sync_weights(weights).await?;
        self.rollout.set_model_version(version);
        Ok(())
    }

    /// [`Explorer::load_weights`] from weights that come part by part: `feed` hands them to the engine's sink
    /// ([`trinity_engine::Engine::weight_sink`]), which holds the decoder from the first part to the last, so no
    /// decode step reads a mix of two versions. `feed`'s error comes first: it says why the parts stopped.
    pub(crate) async fn load_weight_parts(
        &self,
        version: u64,
        feed: impl FnOnce(&trinity_engine::WeightSink) -> Result<(), RftError>,
    ) -> Result<(), RftError> {
        let sink = self.rollout.engine().weight_sink()?;
        let fed = feed(&sink);
        let finished = sink.finish().await;
        fed?;
        finished?;
        self.rollout.set_model_version(version);
        Ok(())
    }

    /// Loads the weights of a Hugging Face directory (a checkpoint's `hf/`) into the engine as `version`.
    pub(crate) async fn load_weights_from_dir(&self, dir: &Path, version: u64) -> Result<(), RftError> {
        let stored = trinity_model::SafetensorsWeights::open_dir(dir).map_err(|e| model_error(dir, e))?;
        let names: Vec<String> =
            self.rollout.engine().with_decoder(|decoder| decoder.var_store().variables().into_keys().collect()).await?;
        let weights = names
            .into_iter()
            .map(|name| {
                let tensor = stored.get(&name).map_err(|e| model_error(dir, e))?;
                Ok((name, tensor))
            })
            .collect::<Result<Vec<_>, RftError>>()?;
        self.load_weights(weights, version).await
    }
}

/// Trinity-RFT 0.6.0's `explorer.over_rollout` (when `ratio > 0`) and `explorer.dynamic_timeout` for train steps.
fn train_control(config: &Config) -> BatchControl {
    let explorer = &config.explorer;
    let over = &explorer.over_rollout;
    let over_rollout = (over.ratio > 0.0).then(|| {
        let wait = Duration::try_from_secs_f64(over.wait_after_min).unwrap_or(Duration::ZERO);
        let over_rollout = OverRollout::new(config.buffer.batch_size as usize, over.ratio, wait);
        tracing::info!(
            "over-rollout: a train step ends {:.0} s after {} of its {} tasks are done, cancelling the rest",
            wait.as_secs_f64(),
            over_rollout.min_tasks,
            config.buffer.batch_size
        );
        over_rollout
    });
    let dynamic = &explorer.dynamic_timeout;
    let dynamic_timeout = dynamic.enable.then(|| DynamicTimeout::new(dynamic.ratio, dynamic.warmup_min_steps));
    BatchControl { over_rollout, dynamic_timeout, observe: true, batch_limit: false }
}

/// Whether a batch had tasks and none of them succeeded.
fn every_task_failed(report: &RunReport) -> bool {
    report.groups.is_empty() && !report.failures.is_empty()
}

/// `explorer.rollout_model.enable_openai_api`: serves the rollout model (and the auxiliary models, by name) to
/// workflows on a loopback port, through the same engine, so an agent's replies are the rollout's own tokens.
/// The policy samples at `model.temperature` whatever a request asks, as in mode `serve`, so recorded logprobs
/// are the ones the trainer recomputes; `enable_history` files each reply under the workflow run that asked.
fn start_openai_view(
    config: &Config,
    rollout: &Arc<RolloutModel>,
) -> Result<Option<trinity_serve::ServerHandle>, RftError> {
    let settings = &config.explorer.rollout_model;
    if !settings.enable_openai_api {
        if settings.reasoning_parser.is_some() {
            tracing::info!(
                "explorer.rollout_model.reasoning_parser shapes replies of the OpenAI-compatible API, which this run \
                 does not serve (enable_openai_api is off): it changes nothing here"
            );
        }
        return Ok(None);
    }
    let options = trinity_serve::ServeOptions {
        model_name: config.model.model_path.clone(),
        temperature: Some(config.model.temperature as f32),
        auto_tool_choice: auto_tool_choice(config),
        reasoning_parser: reasoning_parser(config),
        ..trinity_serve::ServeOptions::default()
    };
    let server = trinity_serve::serve_workflows(options, Arc::clone(rollout), settings.enable_history)
        .map_err(|e| RftError::Unsupported(format!("explorer.rollout_model.enable_openai_api: {e}")))?;
    tracing::info!(
        "the rollout model answers workflows over the OpenAI API at {} (history {})",
        server.base_url(),
        if settings.enable_history { "recorded" } else { "not recorded" }
    );
    Ok(Some(server))
}

/// `explorer.rollout_model.reasoning_parser` as the API's parser (names checked at resolve time).
pub(crate) fn reasoning_parser(config: &Config) -> Option<trinity_serve::ReasoningParser> {
    config.explorer.rollout_model.reasoning_parser.as_deref().and_then(trinity_serve::ReasoningParser::from_name)
}

/// `enable_auto_tool_choice` with `tool_call_parser: hermes` (the only parser, checked at resolve time): whether
/// the OpenAI-compatible API turns `<tool_call>` blocks into `tool_calls` for `tool_choice: "auto"`.
pub(crate) fn auto_tool_choice(config: &Config) -> bool {
    let rollout = &config.explorer.rollout_model;
    rollout.enable_auto_tool_choice && rollout.tool_call_parser.as_deref() == Some("hermes")
}
