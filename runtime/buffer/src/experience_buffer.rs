//! The trainer's experience buffer as the config describes it (`buffer.trainer_input.experience_buffer`): the
//! contract between explorer and trainer, in one process (`mode: both`) or several (`mode: explore` /
//! `mode: train`, several explorers feeding one trainer, possibly on different machines).
//!
//! | `storage_type` | `path`                          | backend                                                |
//! |----------------|---------------------------------|--------------------------------------------------------|
//! | `queue`        | none                            | in memory ([`crate::ExperienceQueue`] + step records)  |
//! | `queue`        | `….jsonl` / `….json`            | in memory, every stored step also appended to the file |
//! | `queue`, `sql` | `sqlite:///…`                   | [`SqliteStore`]: one machine, any number of processes  |
//! | `queue`, `sql` | `postgresql://user:pw@host/db`  | [`PgStore`]: any number of machines                    |
//!
//! Every backend has the same interface and rules (see [`crate::store`]): idempotent explore steps keyed by
//! (producer, step), claims by (consumer, train step) that become final with [`ExperienceBuffer::commit_through`]
//! and come back with [`ExperienceBuffer::release_after`], and producer status. The in-memory backend lives and
//! dies with the process, so it has nothing to release.
//!
//! Why a persistent buffer reads from the database instead of keeping an in-memory copy: the database is the
//! only state that survives kill -9, so reading from it means a restarted run finds exactly the unconsumed
//! experiences, and a trainer in another process sees the same rows. Back-pressure: storing a step waits while
//! `capacity` or more rows wait to be claimed (all producers together). Persistent backends are polled (every
//! 20 ms for SQLite, 100 ms for PostgreSQL), which is nothing next to a train step.
//!
//! Blocking reads wait up to their timeout for a full batch, then fail with `Timeout`, leaving every
//! experience in the buffer.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use trinity_config::buffer::{ExperienceBufferConfig, StorageType};

use crate::error::{BufferError, Result};
use crate::experience::Experience;
use crate::jsonl_writer::JsonlWriter;
use crate::memory_store::MemoryStore;
use crate::postgres_connection::is_postgres_url;
use crate::postgres_store::PgStore;
use crate::sqlite_store::SqliteStore;
use crate::store::{DEFAULT_CONSUMER, DEFAULT_LEASE, ExploreStep, ProducerState, ProducerStatus};

/// An experience buffer opened from its config. Clones share the store (and, for PostgreSQL, its connection).
#[derive(Debug, Clone)]
pub struct ExperienceBuffer {
    name: String,
    backend: Backend,
    copy: Option<Arc<Mutex<JsonlWriter>>>,
    capacity: usize,
    consumer: Arc<str>,
    lease: Duration,
    /// Longest a put waits for room (back-pressure) before it fails naming what it waited for.
    room_timeout: Duration,
}

/// How long a put waits for room unless [`ExperienceBuffer::with_room_timeout`] says otherwise: Trinity-RFT's
/// default `synchronizer.sync_timeout`.
pub const DEFAULT_ROOM_TIMEOUT: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone)]
enum Backend {
    Memory(Arc<MemoryStore>),
    Sqlite(Arc<SqliteStore>),
    Postgres(Arc<PgStore>),
}

impl ExperienceBuffer {
    /// Opens the buffer, creating or migrating its tables; relative file paths are taken relative to `base_dir`
    /// (the run's buffer directory). Claims are made as consumer `trainer` with a 30-minute lease unless
    /// [`Self::with_consumer`] / [`Self::with_lease`] say otherwise.
    pub async fn open(config: &ExperienceBufferConfig, base_dir: &Path) -> Result<ExperienceBuffer> {
        let capacity = config.capacity.max(1) as usize;
        let path = config.path.as_deref().filter(|p| !p.trim().is_empty());
        let mut copy = None;
        let memory = || Backend::Memory(Arc::new(MemoryStore::new(&config.name, capacity)));
        let backend = match (config.storage_type, path) {
            (StorageType::File, _) => {
                return Err(BufferError::UnsupportedStorage { taskset: config.name.clone(), storage: "file".into() });
            }
            (StorageType::Queue, None) => memory(),
            (_, Some(url)) if url.starts_with("sqlite:///") => {
                let store = SqliteStore::open(&base_dir.join(crate::sqlite_store::sqlite_url_path(url)?))?;
                Backend::Sqlite(Arc::new(store))
            }
            (_, Some(url)) if is_postgres_url(url) => {
                Backend::Postgres(Arc::new(PgStore::connect(url, &config.name).await?))
            }
            (StorageType::Queue, Some(file)) if file.ends_with(".jsonl") || file.ends_with(".json") => {
                copy = Some(Arc::new(Mutex::new(JsonlWriter::open(&base_dir.join(file))?)));
                memory()
            }
            (_, other) => {
                return Err(BufferError::UnsupportedUrl {
                    name: config.name.clone(),
                    url: other.unwrap_or_default().to_owned(),
                });
            }
        };
        Ok(ExperienceBuffer {
            name: config.name.clone(),
            backend,
            copy,
            capacity,
            consumer: Arc::from(DEFAULT_CONSUMER),
            lease: DEFAULT_LEASE,
            room_timeout: DEFAULT_ROOM_TIMEOUT,
        })
    }

    /// Claims as `consumer` (Trinity's `trainer.name`): a restarted trainer must use the same name to get its
    /// uncommitted claims back.
    pub fn with_consumer(mut self, consumer: &str) -> ExperienceBuffer {
        self.consumer = Arc::from(consumer);
        self
    }

    /// How long another consumer's silence must last before its open claims may be taken (default 30 min).
    pub fn with_lease(mut self, lease: Duration) -> ExperienceBuffer {
        self.lease = lease;
        self
    }

    /// How long storing a step may wait for room before it fails (a run passes `synchronizer.sync_timeout`): a
    /// full buffer nobody drains must end in an error that says so, never in a silent hang.
    pub fn with_room_timeout(mut self, timeout: Duration) -> ExperienceBuffer {
        self.room_timeout = timeout;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The consumer this handle claims as.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// Whether experiences survive the process (SQLite or PostgreSQL).
    pub fn is_persistent(&self) -> bool {
        !matches!(self.backend, Backend::Memory(_))
    }

    /// Stores explore step `step` of explorer `producer` with the explorer's state after it (`state`, JSON) in
    /// one transaction, waiting first while the buffer is full. Idempotent: a step stored before (a retry after a
    /// lost connection, a restarted explorer) is left as it is and nothing is added.
    pub async fn put_step(&self, producer: &str, step: u64, batch: Vec<Experience>, state: &str) -> Result<()> {
        if self.has_step(producer, step).await? {
            tracing::debug!("buffer {}: {producer} step {step} is stored already", self.name);
            return Ok(());
        }
        if let Some(copy) = &self.copy {
            // Poisoning only follows a panic mid-write; the file is append-only, so keep using it.
            copy.lock().unwrap_or_else(std::sync::PoisonError::into_inner).write_batch(&batch)?;
        }
        match &self.backend {
            // The queue applies its own back-pressure, woken by the reader.
            Backend::Memory(store) => store.put_step(producer, step, batch, state, self.room_timeout).await,
            Backend::Sqlite(store) => {
                self.wait_for_room(step, batch.len(), SQLITE_POLL).await?;
                store.put_step(producer, step, &batch, state).map(drop)
            }
            Backend::Postgres(store) => {
                self.wait_for_room(step, batch.len(), POSTGRES_POLL).await?;
                store.put_step(producer, step, &batch, state).await.map(drop)
            }
        }
    }

    /// Back-pressure for a persistent buffer: waits while `capacity` or more rows wait to be claimed, up to the
    /// room timeout. Producers check independently, so several of them may overshoot the capacity by a step each.
    async fn wait_for_room(&self, step: u64, incoming: usize, poll: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + self.room_timeout;
        loop {
            let waiting = self.len().await?;
            if waiting < self.capacity {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(BufferError::NoRoom {
                    name: self.name.clone(),
                    step,
                    incoming,
                    waiting,
                    capacity: self.capacity,
                    waited_s: self.room_timeout.as_secs_f64(),
                });
            }
            tokio::time::sleep(poll).await;
        }
    }

    async fn has_step(&self, producer: &str, step: u64) -> Result<bool> {
        match &self.backend {
            Backend::Memory(store) => Ok(store.has_step(producer, step)),
            Backend::Sqlite(store) => store.has_step(producer, step),
            Backend::Postgres(store) => store.has_step(producer, step).await,
        }
    }

    /// `producer`'s explore steps after `step`, oldest first.
    pub async fn explored_after(&self, producer: &str, step: u64) -> Result<Vec<ExploreStep>> {
        match &self.backend {
            Backend::Memory(store) => Ok(store.explored_after(producer, step)),
            Backend::Sqlite(store) => store.explored_after(producer, step),
            Backend::Postgres(store) => store.explored_after(producer, step).await,
        }
    }

    /// `producer`'s latest explore step (where a restarted explorer continues).
    pub async fn last_explored(&self, producer: &str) -> Result<Option<ExploreStep>> {
        match &self.backend {
            Backend::Memory(store) => Ok(store.last_explored(producer)),
            Backend::Sqlite(store) => store.last_explored(producer),
            Backend::Postgres(store) => store.last_explored(producer).await,
        }
    }

    /// Takes the `n` oldest waiting experiences (any producer) with model_version ≥ `min_model_version` for train
    /// step `step`, without waiting: `None`, and nothing taken, when fewer are there. Older experiences are
    /// skipped as stale. Asking again for the same step returns the same experiences (a retry after an unknown
    /// outcome) on a persistent buffer.
    pub async fn try_take_for_step(
        &self,
        n: usize,
        min_model_version: Option<u64>,
        step: u64,
    ) -> Result<Option<Vec<Experience>>> {
        if n == 0 {
            return Ok(Some(Vec::new()));
        }
        match &self.backend {
            Backend::Memory(store) => store.try_take(n, min_model_version),
            Backend::Sqlite(store) => store.try_take(&self.consumer, self.lease, step, n, min_model_version),
            Backend::Postgres(store) => store.try_take(&self.consumer, self.lease, step, n, min_model_version).await,
        }
    }

    /// [`Self::try_take_for_step`] without a minimum version, waiting up to `timeout` for `n` experiences.
    pub async fn get_batch_for_step(&self, n: usize, timeout: Duration, step: u64) -> Result<Vec<Experience>> {
        let poll = match &self.backend {
            Backend::Memory(store) => return store.take(n, timeout).await,
            Backend::Sqlite(_) => SQLITE_POLL,
            Backend::Postgres(_) => POSTGRES_POLL,
        };
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(batch) = self.try_take_for_step(n, None, step).await? {
                return Ok(batch);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(BufferError::Timeout {
                    name: self.name.clone(),
                    wanted: n,
                    available: self.len().await?,
                    waited_s: timeout.as_secs_f64(),
                });
            }
            tokio::time::sleep(poll.min(deadline - now)).await;
        }
    }

    /// Hands back this consumer's claims of train steps after `step` that are not final (a trainer resumed from
    /// its checkpoint of `step`); returns how many experiences. Always 0 in memory.
    pub async fn release_after(&self, step: u64) -> Result<usize> {
        match &self.backend {
            Backend::Memory(_) => Ok(0),
            Backend::Sqlite(store) => store.release_after(&self.consumer, step),
            Backend::Postgres(store) => store.release_after(&self.consumer, step).await,
        }
    }

    /// Makes this consumer's claims of train steps ≤ `step` final, to call once its checkpoint of `step` is
    /// durable; the step is recorded in the database ([`Self::committed_step`]).
    pub async fn commit_through(&self, step: u64) -> Result<()> {
        match &self.backend {
            Backend::Memory(store) => {
                store.commit_through(step);
                Ok(())
            }
            Backend::Sqlite(store) => store.commit_through(&self.consumer, step),
            Backend::Postgres(store) => store.commit_through(&self.consumer, step).await,
        }
    }

    /// The last step this consumer committed through.
    pub async fn committed_step(&self) -> Result<Option<u64>> {
        match &self.backend {
            Backend::Memory(store) => Ok(store.committed_step()),
            Backend::Sqlite(store) => store.committed_step(&self.consumer),
            Backend::Postgres(store) => store.committed_step(&self.consumer).await,
        }
    }

    /// Tells the buffer this consumer is alive (claims, releases and commits do too); a trainer whose steps take
    /// longer than the lease calls it during them.
    pub async fn heartbeat(&self) -> Result<()> {
        match &self.backend {
            Backend::Memory(_) => Ok(()),
            Backend::Sqlite(store) => store.heartbeat(&self.consumer),
            Backend::Postgres(store) => store.heartbeat(&self.consumer).await,
        }
    }

    /// Records what explorer `producer` is doing, with the time (a `Running` report is a heartbeat). Storing a
    /// step also registers its producer as running and updates its time.
    pub async fn set_producer(&self, producer: &str, state: ProducerState) -> Result<()> {
        match &self.backend {
            Backend::Memory(store) => {
                store.set_producer(producer, state);
                Ok(())
            }
            Backend::Sqlite(store) => store.set_producer(producer, state),
            Backend::Postgres(store) => store.set_producer(producer, state).await,
        }
    }

    /// Every producer known to the buffer, by name: a trainer stops once all are `Finished` and nothing waits.
    pub async fn producers(&self) -> Result<Vec<ProducerStatus>> {
        match &self.backend {
            Backend::Memory(store) => Ok(store.producers()),
            Backend::Sqlite(store) => store.producers(),
            Backend::Postgres(store) => store.producers().await,
        }
    }

    /// Prepares for a run resumed from the checkpoint of train step `trained`: this consumer's claims of later
    /// steps are handed back, and `producer`'s explore steps stored after `trained` are returned (oldest first)
    /// so the explorer continues after them instead of exploring them again.
    pub async fn resume_after(&self, producer: &str, trained: u64) -> Result<Vec<ExploreStep>> {
        let released = self.release_after(trained).await?;
        if released > 0 {
            tracing::info!("buffer {}: {released} experiences of untrained steps handed back", self.name);
        }
        self.explored_after(producer, trained).await
    }

    /// Experiences waiting to be taken.
    pub async fn len(&self) -> Result<usize> {
        match &self.backend {
            Backend::Memory(store) => Ok(store.len()),
            Backend::Sqlite(store) => store.waiting_count(),
            Backend::Postgres(store) => store.waiting_count().await,
        }
    }

    pub async fn is_empty(&self) -> Result<bool> {
        self.len().await.map(|n| n == 0)
    }

    /// Ends an in-memory buffer (readers get `Closed` once it is drained); a persistent buffer stays open for
    /// other processes.
    pub fn close(&self) {
        if let Backend::Memory(store) = &self.backend {
            store.close();
        }
    }
}

/// How often a SQLite buffer is polled while waiting: a local query costs microseconds.
const SQLITE_POLL: Duration = Duration::from_millis(20);
/// How often a PostgreSQL buffer is polled while waiting: a round trip to another machine, and one transaction.
const POSTGRES_POLL: Duration = Duration::from_millis(100);

#[cfg(test)]
mod suite;
