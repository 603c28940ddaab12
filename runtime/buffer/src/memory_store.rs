//! The in-memory store: an [`ExperienceQueue`] plus the records a persistent store keeps beside it (explore
//! steps, producers, the committed step), so that one process sees the same interface whatever the backend.
//!
//! What it cannot do: nothing survives the process, so there is nothing to resume. Claimed experiences leave
//! the queue at once (keeping them until `commit_through` would hold every step's rows for nothing, since no
//! later process could ask for them back); `release_after` therefore returns nothing. Idempotent puts hold
//! within the process: a step stored before is not stored again.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::error::{BufferError, Result};
use crate::experience::Experience;
use crate::queue::ExperienceQueue;
use crate::store::{ExploreStep, ProducerState, ProducerStatus, unix_now};

#[derive(Debug)]
pub(crate) struct MemoryStore {
    queue: ExperienceQueue,
    ledger: Mutex<Ledger>,
}

#[derive(Debug, Default)]
struct Ledger {
    /// Keyed by (producer, step); a step is entered before its experiences are queued, so a concurrent second
    /// put of the same step is a no-op too.
    steps: BTreeMap<(String, u64), ExploreStep>,
    producers: BTreeMap<String, (ProducerState, u64)>,
    committed: Option<u64>,
}

impl MemoryStore {
    pub(crate) fn new(name: &str, capacity: usize) -> MemoryStore {
        MemoryStore { queue: ExperienceQueue::new(name, capacity), ledger: Mutex::new(Ledger::default()) }
    }

    /// Queues a step's experiences (waiting up to `room_timeout` while the queue is full) unless the step was
    /// stored before. On failure the step is not recorded, so a retry stores it.
    pub(crate) async fn put_step(
        &self,
        producer: &str,
        step: u64,
        batch: Vec<Experience>,
        state: &str,
        room_timeout: Duration,
    ) -> Result<()> {
        for exp in &batch {
            exp.validate()?;
        }
        let key = (producer.to_owned(), step);
        {
            let mut ledger = self.lock();
            if ledger.steps.contains_key(&key) {
                return Ok(());
            }
            let record =
                ExploreStep { producer: producer.to_owned(), step, count: batch.len(), state: state.to_owned() };
            ledger.steps.insert(key.clone(), record);
            ledger.producers.entry(producer.to_owned()).or_insert((ProducerState::Running, 0)).1 = now_secs();
        }
        let incoming = batch.len();
        // Dropping the put mid-wait is safe: nothing is queued until all of the batch fits.
        let queued = match tokio::time::timeout(room_timeout, self.queue.put_batch(batch)).await {
            Ok(queued) => queued,
            Err(_) => Err(BufferError::NoRoom {
                name: self.queue.name().to_owned(),
                step,
                incoming,
                waiting: self.queue.len(),
                capacity: self.queue.capacity(),
                waited_s: room_timeout.as_secs_f64(),
            }),
        };
        if queued.is_err() {
            self.lock().steps.remove(&key);
        }
        queued
    }

    pub(crate) fn has_step(&self, producer: &str, step: u64) -> bool {
        self.lock().steps.contains_key(&(producer.to_owned(), step))
    }

    pub(crate) fn explored_after(&self, producer: &str, step: u64) -> Vec<ExploreStep> {
        if step == u64::MAX {
            return Vec::new();
        }
        let ledger = self.lock();
        let from = (producer.to_owned(), step + 1);
        let to = (producer.to_owned(), u64::MAX);
        ledger.steps.range(from..=to).map(|(_, record)| record.clone()).collect()
    }

    pub(crate) fn last_explored(&self, producer: &str) -> Option<ExploreStep> {
        let ledger = self.lock();
        let range = (producer.to_owned(), 0)..=(producer.to_owned(), u64::MAX);
        ledger.steps.range(range).next_back().map(|(_, record)| record.clone())
    }

    pub(crate) fn try_take(&self, n: usize, min_model_version: Option<u64>) -> Result<Option<Vec<Experience>>> {
        self.queue.try_get_batch(n, min_model_version)
    }

    /// Waits for `n` experiences on the queue's own notification instead of polling.
    pub(crate) async fn take(&self, n: usize, timeout: Duration) -> Result<Vec<Experience>> {
        self.queue.get_batch(n, timeout, None).await
    }

    pub(crate) fn commit_through(&self, step: u64) {
        let mut ledger = self.lock();
        ledger.committed = Some(ledger.committed.map_or(step, |c| c.max(step)));
    }

    pub(crate) fn committed_step(&self) -> Option<u64> {
        self.lock().committed
    }

    pub(crate) fn set_producer(&self, producer: &str, state: ProducerState) {
        self.lock().producers.insert(producer.to_owned(), (state, now_secs()));
    }

    pub(crate) fn producers(&self) -> Vec<ProducerStatus> {
        let ledger = self.lock();
        ledger
            .producers
            .iter()
            .map(|(name, &(state, last_seen))| ProducerStatus {
                name: name.clone(),
                state,
                last_seen,
                steps: ledger.steps.keys().filter(|(p, _)| p == name).count() as u64,
            })
            .collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    pub(crate) fn close(&self) {
        self.queue.close();
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        // Every critical section leaves the ledger consistent (no code between its mutations can panic), so a
        // poisoned lock still guards good data.
        self.ledger.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn now_secs() -> u64 {
    unix_now() as u64
}
