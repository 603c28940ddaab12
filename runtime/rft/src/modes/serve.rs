//! Mode `serve`: the rollout model behind an OpenAI-compatible HTTP API (`trinity_serve`), for agent programs in
//! any language. Every reply is recorded as an experience; what an agent rewards (`POST /feedback`) and commits
//! (`POST /commit`) goes through the experience pipeline into the shared buffer as one explore step of producer
//! `explorer.name`, where a trainer in another process (mode `train`) trains on it. The weights that trainer
//! publishes are loaded as they appear, between decode steps, without dropping a request in flight.
//!
//! The server listens on `explorer.listen_address:explorer.proxy_port` (loopback unless the config names another
//! address; Trinity-RFT listens on all interfaces by default) and writes its base URL to
//! `<job>/<explorer.name>_server_url.txt` (as Trinity-RFT does). With `TRINITY_SERVE_API_KEY` set in its
//! environment every request needs `Authorization: Bearer <that key>` (the `openai` clients' `api_key`). Sampling
//! uses `model.temperature` whatever a request asks, as Trinity-RFT's proxy does, so the recorded logprobs are the
//! ones the trainer recomputes. It runs until Ctrl-C or SIGTERM, then finishes the requests in flight, commits
//! every rewarded experience not yet committed, and marks its producer finished.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use trinity_buffer::{Eid, Experience, ExperienceBuffer, JsonlWriter, ProducerState};
use trinity_config::Config;
use trinity_explorer::RolloutModel;
use trinity_serve::{CommitReport, ExperienceSink, ServeOptions, SinkFuture};

use crate::error::RftError;
use crate::explorer::{Explorer, ExplorerRole};
use crate::json_file;
use crate::models;
use crate::modes::shared_buffer;
use crate::pipeline::ExperiencePipeline;
use crate::run::RunSummary;
use crate::synchronizer::{WeightStore, take_named};

/// The environment variable holding the bearer key requests must carry (unset or empty: none).
const API_KEY_ENV: &str = "TRINITY_SERVE_API_KEY";

/// How often the server looks for newly published weights.
const WEIGHT_POLL: Duration = Duration::from_secs(2);

/// Runs a resolved config in mode `serve`, writing to `job_dir` (shared with the trainer).
pub(crate) async fn run(config: &Config, job_dir: &Path, threads: usize) -> Result<RunSummary, RftError> {
    let name = config.explorer.name.clone();
    let buffer = shared_buffer(config, job_dir, "serve").await?;
    let base = PathBuf::from(&config.model.model_path);
    let device = models::device(&base)?;
    let explorer = Explorer::start(config, &base, device, threads, ExplorerRole::EvaluateOnly, None)?;
    let rollout = Arc::clone(explorer.rollout());
    let store = WeightStore::open(job_dir)?;
    follow_weights(&rollout, &store).await?;
    let next_step = buffer.last_explored(&name).await?.map_or(0, |s| s.step) + 1;
    let sink = Arc::new(BufferSink {
        buffer: buffer.clone(),
        producer: name.clone(),
        pipeline: Mutex::new(ExperiencePipeline::from_config(config)?),
        log: Mutex::new(JsonlWriter::open(&job_dir.join(format!("{name}_experiences.jsonl")))?),
        next_step: AtomicU64::new(next_step),
    });
    let address = listen_address(config)?;
    let api_keys: Vec<String> =
        std::env::var(API_KEY_ENV).ok().map(|k| k.trim().to_owned()).filter(|k| !k.is_empty()).into_iter().collect();
    let options = ServeOptions {
        address,
        api_keys,
        model_name: config.model.model_path.clone(),
        temperature: Some(config.model.temperature as f32),
        auto_tool_choice: crate::explorer::auto_tool_choice(config),
        reasoning_parser: crate::explorer::reasoning_parser(config),
        ..ServeOptions::default()
    };
    let server = trinity_serve::serve(options, Arc::clone(&rollout), sink)
        .await
        .map_err(|e| RftError::Unsupported(format!("serve on {address}: {e}")))?;
    let url = format!("http://{}", server.local_addr());
    // Agents and tests poll for this file: it appears whole (a plain write let a reader see it empty).
    json_file::replace(&job_dir.join(format!("{name}_server_url.txt")), format!("{url}\n").as_bytes())?;
    buffer.set_producer(&name, ProducerState::Running).await?;
    tracing::info!(
        "serving `{}` at {url}/v1 (OpenAI API); commits go to buffer `{}`",
        config.model.model_path,
        buffer.name()
    );

    let follower = {
        let (rollout, store) = (Arc::clone(&rollout), store.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(WEIGHT_POLL).await;
                if let Err(e) = follow_weights(&rollout, &store).await {
                    tracing::warn!("serve: cannot load the published weights: {e}");
                }
            }
        })
    };
    let served = server.run_until(stop_signal()).await;
    follower.abort();
    buffer.set_producer(&name, ProducerState::Finished).await?;
    served.map_err(|e| RftError::Unsupported(format!("serve: {e}")))?;
    tracing::info!("serve stopped");
    drop(explorer);
    Ok(RunSummary { job_dir: job_dir.to_owned(), resumed_from: None, train_steps: 0 })
}

/// `explorer.listen_address:explorer.proxy_port`.
fn listen_address(config: &Config) -> Result<SocketAddr, RftError> {
    let host: IpAddr = config.explorer.listen_address.parse().map_err(|e| RftError::Setting {
        key: "explorer.listen_address",
        message: format!("`{}` is not an IP address: {e}", config.explorer.listen_address),
    })?;
    Ok(SocketAddr::new(host, config.explorer.proxy_port))
}

/// Ctrl-C or SIGTERM.
async fn stop_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = terminate => {},
    }
}

/// Loads the newest published weights into the engine when they differ from the ones it holds.
async fn follow_weights(rollout: &Arc<RolloutModel>, store: &WeightStore) -> Result<(), RftError> {
    let Some(version) = store.latest()? else { return Ok(()) };
    if version == rollout.model_version() {
        return Ok(());
    }
    let Some((version, stored)) = store.latest_weights()? else { return Ok(()) };
    let names: Vec<String> =
        rollout.engine().with_decoder(|decoder| decoder.var_store().variables().into_keys().collect()).await?;
    let weights = take_named(&stored, names, store.dir())?;
    rollout.engine().sync_weights(weights).await?;
    rollout.set_model_version(version);
    tracing::info!("serve: now generating with the trainer's weights of step {version}");
    Ok(())
}

/// Committed experiences → the experience pipeline → one explore step in the shared buffer.
struct BufferSink {
    buffer: ExperienceBuffer,
    producer: String,
    pipeline: Mutex<ExperiencePipeline>,
    log: Mutex<JsonlWriter>,
    /// The explore step the next commit is stored as (continuing after the producer's last stored step).
    next_step: AtomicU64,
}

impl BufferSink {
    /// Renumbers the commit as explore step `step` (the server counts commits per process; the buffer needs
    /// steps unique over restarts) and runs the pipeline on it.
    async fn process(
        &self,
        step: u64,
        mut experiences: Vec<Experience>,
    ) -> Result<(Vec<Experience>, CommitReport), RftError> {
        for experience in &mut experiences {
            experience.eid = Eid { batch: step, ..experience.eid };
            experience.group_id = experience.eid.tid();
        }
        let lock = || self.pipeline.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // The operators run off the runtime (and outside the lock), so a slow operator plugin never stalls the
        // server's other requests.
        let operators = lock().operators();
        let operated = ExperiencePipeline::run_operators(operators, experiences).await;
        let output = lock().advantages(operated)?;
        self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).write_batch(&output.experiences)?;
        let report = CommitReport { accepted: output.experiences.len(), step: Some(step), metrics: output.metrics };
        Ok((output.experiences, report))
    }
}

impl ExperienceSink for BufferSink {
    fn commit(&self, experiences: Vec<Experience>) -> SinkFuture<'_> {
        Box::pin(async move {
            // Commits come one at a time (the server serialises them), so the step is taken only on success.
            let step = self.next_step.load(Ordering::SeqCst);
            let (experiences, report) = self.process(step, experiences).await?;
            let state = serde_json::json!({"serve": true, "metrics": report.metrics}).to_string();
            self.buffer.put_step(&self.producer, step, experiences, &state).await?;
            self.next_step.store(step + 1, Ordering::SeqCst);
            tracing::info!("serve: commit stored as step {step} ({} experiences)", report.accepted);
            Ok(report)
        })
    }
}
