//! The trainer's experience buffer as the config describes it (`buffer.trainer_input.experience_buffer`).
//!
//! | `storage_type` | `path`                  | backend                                                    |
//! |----------------|-------------------------|------------------------------------------------------------|
//! | `queue`        | none                    | [`ExperienceQueue`] (in memory)                            |
//! | `queue`        | `….jsonl` / `….json`    | in-memory queue, every put also appended to that file      |
//! | `queue`, `sql` | `sqlite:///…`           | [`SqliteStore`]: the database *is* the queue               |
//!
//! Why a `sqlite:///` queue reads from the database instead of keeping an in-memory copy: the database is
//! the only state that survives kill -9, so reading from it means a restarted run finds exactly the
//! unconsumed experiences, and a separate trainer process (`mode: train`) sees the same rows. Back-pressure
//! for SQLite: a put waits while `capacity` or more rows are unconsumed. Reads poll every 20 ms, which is
//! nothing next to a train step. SQLite calls run on the calling task: each is a short local transaction,
//! though under contention from another process it may wait (up to the 30 s busy timeout) for the lock.
//!
//! Reads wait up to `max_read_timeout` seconds for a full batch, then fail with `Timeout`, leaving every
//! experience in the buffer.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use trinity_config::buffer::{ExperienceBufferConfig, StorageType};

use crate::error::{BufferError, Result};
use crate::experience::Experience;
use crate::jsonl_writer::JsonlWriter;
use crate::queue::ExperienceQueue;
use crate::sqlite_store::{ExploreStep, SqliteStore};

const POLL: Duration = Duration::from_millis(20);

/// An experience buffer opened from its config.
#[derive(Debug, Clone)]
pub struct ExperienceBuffer {
    name: String,
    backend: Backend,
    copy: Option<Arc<Mutex<JsonlWriter>>>,
    read_timeout: Duration,
}

#[derive(Debug, Clone)]
enum Backend {
    Memory(ExperienceQueue),
    Sqlite { store: Arc<SqliteStore>, capacity: usize },
}

impl ExperienceBuffer {
    /// Opens the buffer; relative file paths are taken relative to `base_dir` (the run's buffer directory).
    pub fn open(config: &ExperienceBufferConfig, base_dir: &Path) -> Result<ExperienceBuffer> {
        let capacity = config.capacity.max(1) as usize;
        let read_timeout = Duration::from_secs_f64(config.max_read_timeout.max(0.0));
        let path = config.path.as_deref().filter(|p| !p.trim().is_empty());
        let mut copy = None;
        let backend = match (config.storage_type, path) {
            (StorageType::Queue, None) => Backend::Memory(ExperienceQueue::new(&config.name, capacity)),
            (StorageType::Queue | StorageType::Sql, Some(url)) if url.starts_with("sqlite:///") => {
                let store = SqliteStore::open(&base_dir.join(crate::sqlite_store::sqlite_url_path(url)?))?;
                Backend::Sqlite { store: Arc::new(store), capacity }
            }
            (StorageType::Queue, Some(file)) if file.ends_with(".jsonl") || file.ends_with(".json") => {
                copy = Some(Arc::new(Mutex::new(JsonlWriter::open(&base_dir.join(file))?)));
                Backend::Memory(ExperienceQueue::new(&config.name, capacity))
            }
            (StorageType::Sql, other) | (StorageType::Queue, other) => {
                return Err(BufferError::NotSqliteUrl { url: other.unwrap_or_default().to_owned() });
            }
            (StorageType::File, _) => {
                return Err(BufferError::UnsupportedStorage { taskset: config.name.clone(), storage: "file".into() });
            }
        };
        Ok(ExperienceBuffer { name: config.name.clone(), backend, copy, read_timeout })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether experiences survive the process (a `sqlite:///` buffer).
    pub fn is_persistent(&self) -> bool {
        matches!(self.backend, Backend::Sqlite { .. })
    }

    /// Adds one explore step's experiences, waiting while the buffer is full.
    pub async fn put_batch(&self, batch: Vec<Experience>) -> Result<()> {
        self.put(batch, None).await
    }

    /// Both puts: the optional JSONL copy, back-pressure, then the backend (a SQLite buffer stores `step`'s
    /// record in the batch's transaction).
    async fn put(&self, batch: Vec<Experience>, step: Option<(u64, &str)>) -> Result<()> {
        if let Some(copy) = &self.copy {
            // Poisoning only follows a panic mid-write; the file is append-only, so keep using it.
            copy.lock().unwrap_or_else(std::sync::PoisonError::into_inner).write_batch(&batch)?;
        }
        match &self.backend {
            Backend::Memory(queue) => queue.put_batch(batch).await,
            Backend::Sqlite { store, capacity } => {
                while store.unconsumed_count()? >= *capacity {
                    tokio::time::sleep(POLL).await;
                }
                store.write_step(&batch, step).map(drop)
            }
        }
    }

    /// Takes `n` experiences with model_version ≥ `min_model_version`, waiting up to `max_read_timeout`.
    pub async fn get_batch(&self, n: usize, min_model_version: Option<u64>) -> Result<Vec<Experience>> {
        self.get_batch_within(n, self.read_timeout, min_model_version).await
    }

    /// [`ExperienceBuffer::get_batch`] with an explicit timeout.
    pub async fn get_batch_within(
        &self,
        n: usize,
        timeout: Duration,
        min_model_version: Option<u64>,
    ) -> Result<Vec<Experience>> {
        match &self.backend {
            Backend::Memory(queue) => queue.get_batch(n, timeout, min_model_version).await,
            Backend::Sqlite { store, .. } => store.read_batch(n, timeout, POLL, min_model_version, None).await,
        }
    }

    /// Takes `n` experiences for train step `step`, waiting up to `timeout`. A persistent buffer records the
    /// step on the rows, so a run resumed from an earlier checkpoint gets them back ([`Self::resume_after`]).
    pub async fn get_batch_for_step(&self, n: usize, timeout: Duration, step: u64) -> Result<Vec<Experience>> {
        match &self.backend {
            Backend::Memory(queue) => queue.get_batch(n, timeout, None).await,
            Backend::Sqlite { store, .. } => store.read_batch(n, timeout, POLL, None, Some(step)).await,
        }
    }

    /// Adds explore step `step`'s experiences together with the explorer's state after it (`state`, JSON),
    /// waiting while the buffer is full. A persistent buffer stores both in one transaction.
    pub async fn put_step(&self, step: u64, batch: Vec<Experience>, state: &str) -> Result<()> {
        self.put(batch, Some((step, state))).await
    }

    /// Prepares a persistent buffer for a run resumed from the checkpoint of train step `trained`: rows taken by
    /// later train steps are handed back, and the explore steps already stored after `trained` are returned
    /// (oldest first) so the explorer continues after them instead of exploring them again. An in-memory
    /// buffer has nothing to resume and returns an empty list.
    pub fn resume_after(&self, trained: u64) -> Result<Vec<ExploreStep>> {
        match &self.backend {
            Backend::Memory(_) => Ok(Vec::new()),
            Backend::Sqlite { store, .. } => {
                let released = store.release_after(trained)?;
                if released > 0 {
                    tracing::info!("buffer {}: {released} experiences of untrained steps handed back", self.name);
                }
                store.explored_after(trained)
            }
        }
    }

    /// Experiences waiting to be read.
    pub fn len(&self) -> Result<usize> {
        match &self.backend {
            Backend::Memory(queue) => Ok(queue.len()),
            Backend::Sqlite { store, .. } => store.unconsumed_count(),
        }
    }

    pub fn is_empty(&self) -> Result<bool> {
        self.len().map(|n| n == 0)
    }

    /// Ends an in-memory buffer (readers get `Closed` once it is drained); a SQLite buffer stays open for
    /// other processes.
    pub fn close(&self) {
        if let Backend::Memory(queue) = &self.backend {
            queue.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experience::Eid;

    fn config(storage_type: StorageType, path: Option<&str>) -> ExperienceBufferConfig {
        ExperienceBufferConfig {
            storage_type,
            path: path.map(str::to_owned),
            capacity: 4,
            max_read_timeout: 0.05,
            ..Default::default()
        }
    }

    fn batch(step: u64) -> Vec<Experience> {
        (0..2)
            .map(|run| Experience::single_turn(Eid { batch: step, run, ..Eid::default() }, vec![1, 2], 1, vec![0.0]))
            .collect()
    }

    #[tokio::test]
    async fn memory_queue_with_a_jsonl_copy() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = ExperienceBuffer::open(&config(StorageType::Queue, Some("copy/exp.jsonl")), dir.path()).unwrap();
        assert!(!buffer.is_persistent());
        buffer.put_batch(batch(1)).await.unwrap();
        assert_eq!(buffer.get_batch(2, None).await.unwrap().len(), 2);
        assert_eq!(crate::jsonl_writer::read_experiences(&dir.path().join("copy/exp.jsonl")).unwrap().len(), 2);
        assert!(matches!(buffer.get_batch(1, None).await, Err(BufferError::Timeout { .. })));
    }

    #[tokio::test]
    async fn sqlite_queue_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(StorageType::Queue, Some("sqlite:///buffer/exp.db"));
        let buffer = ExperienceBuffer::open(&config, dir.path()).unwrap();
        assert!(buffer.is_persistent());
        buffer.put_batch(batch(1)).await.unwrap();
        buffer.put_batch(batch(2)).await.unwrap();
        assert_eq!(buffer.get_batch(2, None).await.unwrap()[0].eid.batch, 1);
        drop(buffer);
        let again = ExperienceBuffer::open(&config, dir.path()).unwrap();
        assert_eq!(again.len().unwrap(), 2);
        assert_eq!(again.get_batch(2, None).await.unwrap()[0].eid.batch, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn sqlite_back_pressure_waits_for_the_reader() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = ExperienceBuffer::open(&config(StorageType::Sql, Some("sqlite:///exp.db")), dir.path()).unwrap();
        buffer.put_batch(batch(1)).await.unwrap();
        buffer.put_batch(batch(2)).await.unwrap();
        let writer = {
            let buffer = buffer.clone();
            tokio::spawn(async move { buffer.put_batch(batch(3)).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!writer.is_finished());
        buffer.get_batch(2, None).await.unwrap();
        writer.await.unwrap().unwrap();
        assert_eq!(buffer.len().unwrap(), 4);
    }

    #[test]
    fn bad_paths_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = ExperienceBuffer::open(&config(StorageType::Sql, Some("postgres://db")), dir.path()).unwrap_err();
        assert!(err.to_string().contains("postgres://db"));
        assert!(ExperienceBuffer::open(&config(StorageType::Sql, None), dir.path()).is_err());
        assert!(ExperienceBuffer::open(&config(StorageType::File, None), dir.path()).is_err());
    }
}
