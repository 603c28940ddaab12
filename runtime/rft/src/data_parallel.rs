//! Data-parallel runs: `trinity run` started by a launcher (torchrun, `trinity launch`, a Slurm or Kubernetes
//! script written for PyTorch) trains each step on every rank of the job (`trinity_trainer::data_parallel`).
//!
//! Rank 0 runs the mode as one process would: the explorer in mode `both`, the shared buffer or the dataset in mode
//! `train`, weight syncs, evaluation, checkpoints, metrics and the run log. The other ranks ("followers") hold only
//! the training engine and read nothing from the run directory, so they may run on machines that do not share it.
//! Each rank trains on `cuda:LOCAL_RANK` when CUDA is there (else the CPU), and the trainers' group sends CUDA
//! parameters and gradients over NCCL, the rest over Gloo (`trinity_collective::transport`; a build without the
//! `cuda` feature refuses a CUDA run by name rather than copying every gradient bucket through host memory).
//! Every rank meets on the job's store (`MASTER_ADDR:MASTER_PORT`, hosted by rank 0), under `dp/`:
//! - `header`: the run's length and the checkpoint step rank 0 resumed from, so that every rank builds the same
//!   learning-rate schedule. The engine's state is then broadcast from rank 0 (at start, and again after rank 0
//!   loaded its checkpoint).
//! - `cmd/<n>`: rank 0's n-th command: train a step (the step's rows follow by broadcast,
//!   `trinity_trainer::share_rows`, so only rank 0 reads the buffer), save a checkpoint (a sharded optimizer
//!   state is gathered to rank 0, which alone writes it; under ZeRO stage 3 the HF export's parameters too),
//!   gather the policy's weights for rank 0 (ZeRO stage 3's weight syncs and evaluations), or stop (the run finished; each follower
//!   counts itself in `stopped` before it exits, and rank 0 keeps the store up until all did).
//! - `fail`: the error that ended rank 0's run (or a follower's), so every rank names it.
//!
//! Followers wait for commands on the store without a deadline: between train steps rank 0 may explore, evaluate
//! or wait for experiences for a long time. A store whose host died fails the wait at once, and every collective
//! of a step ends within `synchronizer.sync_timeout` (the group's timeout, as Trinity-RFT sets veRL's
//! `nccl_timeout` from it), so a rank that dies ends the others with an error naming what failed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tch::Device;
use trinity_collective::{DistEnv, ProcessGroup, Store};
use trinity_config::{Config, Mode};

use crate::error::RftError;
use crate::models::on_pool;
use crate::run::RunSummary;

/// How often a follower looks for rank 0's next command.
const POLL: Duration = Duration::from_millis(10);

/// What every rank must agree on before training: the run's length and where it resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Header {
    pub total_steps: u64,
    pub resumed_step: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Command {
    Train {
        step: u64,
    },
    /// Rank 0 saves checkpoint `step`: a sharded optimizer state is gathered to it, which every rank joins.
    Save {
        step: u64,
    },
    /// Rank 0 reads the policy's weights (a weight sync, an evaluation): under ZeRO stage 3 they are gathered
    /// unit by unit, which every rank joins ([`trinity_trainer::Trainer::share_whole_policy`]).
    Weights,
    Stop,
}

/// The modes a launched job can run: those with a trainer.
pub(crate) fn check_mode(config: &Config, env: &DistEnv) -> Result<(), RftError> {
    match config.mode {
        Mode::Both | Mode::Colocate | Mode::Train => Ok(()),
        other => Err(RftError::Unsupported(format!(
            "mode `{}` has no trainer to run data-parallel, but the launcher started {} processes (WORLD_SIZE); \
             start it as one process (without torchrun or `trinity launch`)",
            other.name(),
            env.world_size
        ))),
    }
}

/// The job's store, the trainers' process group (Gloo, plus NCCL when the ranks train on CUDA; collectives end
/// within `sync_timeout`) and this rank's device.
pub(crate) fn join(config: &Config, env: &DistEnv) -> Result<(Store, ProcessGroup, Device), RftError> {
    let timeout = Duration::from_secs(config.synchronizer.sync_timeout);
    let device = crate::models::device_for_rank(std::path::Path::new(&config.model.model_path), env)?;
    tracing::info!(
        "data parallel: rank {} of {} (local rank {}) on {device:?}, store at {}:{}",
        env.rank,
        env.world_size,
        env.local_rank,
        env.master_addr,
        env.master_port
    );
    let (store, group) =
        env.process_group_on("trainer", timeout, device).map_err(|e| collective("form the trainers' group", e))?;
    let store = store.with_prefix("dp").map_err(|e| collective("open the job's store", e))?;
    Ok((store, group, device))
}

pub(crate) fn collective(what: &str, e: trinity_collective::CollectiveError) -> RftError {
    RftError::DataParallel(format!("{what}: {e}"))
}

/// Rank 0's side: announces the header and each train step, and the end of the run.
#[derive(Debug)]
pub(crate) struct Leader {
    store: Store,
    world_size: usize,
    seq: AtomicU64,
}

impl Leader {
    pub(crate) fn new(store: Store, world_size: usize) -> Leader {
        Leader { store, world_size, seq: AtomicU64::new(0) }
    }

    pub(crate) fn header(&self, header: Header) -> Result<(), RftError> {
        self.post("header", &header)
    }

    /// Tells the followers to train `step`; the caller then shares the step's rows and trains.
    pub(crate) fn train(&self, step: u64) -> Result<(), RftError> {
        let n = self.seq.fetch_add(1, Ordering::SeqCst);
        self.post(&format!("cmd/{n}"), &Command::Train { step })
    }

    /// Tells the followers that rank 0 saves checkpoint `step` now, so they join the gather of a sharded
    /// optimizer state ([`trinity_trainer::Trainer::share_state_for_save`]).
    pub(crate) fn save(&self, step: u64) -> Result<(), RftError> {
        let n = self.seq.fetch_add(1, Ordering::SeqCst);
        self.post(&format!("cmd/{n}"), &Command::Save { step })
    }

    /// Tells the followers that rank 0 gathers the sharded policy's weights now, so they join.
    pub(crate) fn weights(&self) -> Result<(), RftError> {
        let n = self.seq.fetch_add(1, Ordering::SeqCst);
        self.post(&format!("cmd/{n}"), &Command::Weights)
    }

    /// Ends the followers: a clean stop, waiting (up to the store's timeout) until each has seen it, or rank 0's
    /// error. Best effort: the run's own outcome is what the caller reports.
    pub(crate) fn finish(&self, outcome: Result<(), String>) {
        match outcome {
            Err(error) => {
                let _ = self.store.set("fail", format!("rank 0: {error}").as_bytes());
            }
            Ok(()) => {
                let n = self.seq.fetch_add(1, Ordering::SeqCst);
                if self.post(&format!("cmd/{n}"), &Command::Stop).is_err() {
                    return;
                }
                let deadline = Instant::now() + self.store.timeout();
                while self.store.add("stopped", 0).is_ok_and(|n| (n as usize) + 1 < self.world_size)
                    && Instant::now() < deadline
                {
                    std::thread::sleep(POLL);
                }
            }
        }
    }

    fn post<T: Serialize>(&self, key: &str, value: &T) -> Result<(), RftError> {
        let bytes = serde_json::to_vec(value).map_err(|e| RftError::DataParallel(format!("encode {key}: {e}")))?;
        self.store.set(key, &bytes).map_err(|e| collective(&format!("post {key} to the other ranks"), e))
    }
}

/// Waits for `key` on the store, failing at once when a rank posted its failure or the store's host is gone.
fn wait_for<T: for<'de> Deserialize<'de>>(store: &Store, key: &str) -> Result<T, RftError> {
    let lost = |e| collective("wait for rank 0 (is it still running?)", e);
    loop {
        if store.check(&["fail"]).map_err(lost)? {
            let why = store.get("fail").map_err(lost)?;
            return Err(RftError::DataParallel(format!("another rank failed: {}", String::from_utf8_lossy(&why))));
        }
        if store.check(&[key]).map_err(lost)? {
            let bytes = store.get(key).map_err(lost)?;
            return serde_json::from_slice(&bytes)
                .map_err(|e| RftError::DataParallel(format!("rank 0 posted an unreadable {key}: {e}")));
        }
        std::thread::sleep(POLL);
    }
}

/// A rank other than 0: builds the training engine from the config, then trains each step rank 0 announces on the
/// rows rank 0 shares, until rank 0 stops the run.
pub(crate) fn follow(
    config: &Config,
    env: &DistEnv,
    store: Store,
    group: ProcessGroup,
    device: Device,
    threads: usize,
) -> Result<RunSummary, RftError> {
    let result = follow_steps(config, env, &store, group, device, threads);
    match &result {
        Ok(_) => {
            let _ = store.add("stopped", 1);
        }
        Err(e) => {
            let _ = store.compare_set("fail", b"", format!("rank {}: {e}", env.rank).as_bytes());
        }
    }
    result
}

fn follow_steps(
    config: &Config,
    env: &DistEnv,
    store: &Store,
    group: ProcessGroup,
    device: Device,
    threads: usize,
) -> Result<RunSummary, RftError> {
    let header: Header = wait_for(store, "header")?;
    let mut engine = crate::trainer::follower_engine(config, device, threads, header.total_steps, group)?;
    if header.resumed_step.is_some() {
        on_pool(threads, || engine.receive_state())?;
    }
    tracing::info!("rank {}: following rank 0 ({} steps)", env.rank, header.total_steps);
    let mut trained = header.resumed_step.unwrap_or(0);
    for n in 0.. {
        match wait_for::<Command>(store, &format!("cmd/{n}"))? {
            Command::Stop => break,
            Command::Train { step } => {
                let failed = |e: trinity_trainer::TrainerError| {
                    RftError::DataParallel(format!("train step {step} with rank 0: {e}"))
                };
                let group = engine.process_group().ok_or_else(|| RftError::DataParallel("no process group".into()))?;
                let rows = trinity_trainer::share_rows(group, 0, None).map_err(failed)?;
                on_pool(threads, || engine.train_step(&rows)).map_err(failed)?;
                trained = step;
            }
            Command::Weights => {
                let engine = &mut engine;
                on_pool(threads, move || engine.share_whole_policy())
                    .map_err(|e| RftError::DataParallel(format!("gather the policy's weights with rank 0: {e}")))?;
            }
            Command::Save { step } => {
                // A unique borrow moves into the pool's closure: the engine is `Send` but not `Sync`.
                let engine = &mut engine;
                on_pool(threads, move || engine.share_state_for_save()).map_err(|e| {
                    RftError::DataParallel(format!("save checkpoint global_step_{step} with rank 0: {e}"))
                })?;
            }
        }
    }
    tracing::info!("rank {}: rank 0 finished the run after train step {trained}", env.rank);
    Ok(RunSummary { job_dir: Default::default(), resumed_from: header.resumed_step, train_steps: trained })
}
