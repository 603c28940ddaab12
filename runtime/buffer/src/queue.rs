//! The in-memory experience queue between explorer and trainer, with back-pressure.
//!
//! Invariants:
//! * `put_batch` adds a whole batch at once (a group never straddles two trainer reads because of a
//!   half-written put) and waits while the batch does not fit under `capacity`. A batch larger than the whole
//!   capacity is let in once the queue is empty, so it can never deadlock.
//! * `get_batch(n, timeout, ..)` removes nothing until `n` fresh experiences are there: on timeout the
//!   experiences stay queued for the next call (Trinity-RFT's queue loses the ones it had collected).
//! * Staleness: experiences whose `model_version` is below the reader's minimum are dropped when a reader
//!   asks, and counted in [`ExperienceQueue::stale_dropped`].
//! * After `close`, puts fail with `Closed`; gets still drain full batches, then fail with `Closed`
//!   ([`ExperienceQueue::drain`] takes a final partial batch).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use crate::error::{BufferError, Result};
use crate::experience::Experience;

/// A cloneable handle to one bounded FIFO of experiences.
#[derive(Debug, Clone)]
pub struct ExperienceQueue {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    name: String,
    capacity: usize,
    state: Mutex<State>,
    /// Signalled on every change (items added or removed, queue closed).
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    items: VecDeque<Experience>,
    closed: bool,
    stale_dropped: u64,
}

impl ExperienceQueue {
    /// A queue holding at most `capacity` experiences (at least 1).
    pub fn new(name: impl Into<String>, capacity: usize) -> ExperienceQueue {
        ExperienceQueue {
            inner: Arc::new(Inner {
                name: name.into(),
                capacity: capacity.max(1),
                state: Mutex::new(State::default()),
                changed: Notify::new(),
            }),
        }
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }

    /// Experiences queued now.
    pub fn len(&self) -> usize {
        self.lock().items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Experiences dropped so far for being older than a reader's minimum model version.
    pub fn stale_dropped(&self) -> u64 {
        self.lock().stale_dropped
    }

    /// Adds a batch, waiting while it does not fit (back-pressure on the explorer).
    pub async fn put_batch(&self, batch: Vec<Experience>) -> Result<()> {
        for exp in &batch {
            exp.validate()?;
        }
        let mut batch = Some(batch);
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            // Register before looking at the state so that a change between the check and the await wakes us.
            notified.as_mut().enable();
            {
                let mut state = self.lock();
                if state.closed {
                    return Err(self.closed());
                }
                let incoming = batch.as_ref().map_or(0, Vec::len);
                if state.items.is_empty() || state.items.len() + incoming <= self.inner.capacity {
                    state.items.extend(batch.take().unwrap_or_default());
                    drop(state);
                    self.inner.changed.notify_waiters();
                    return Ok(());
                }
            }
            notified.await;
        }
    }

    /// Takes the `n` oldest fresh experiences (model_version ≥ `min_model_version`), waiting up to `timeout`.
    /// On timeout nothing is removed; the error says how many were available.
    pub async fn get_batch(
        &self,
        n: usize,
        timeout: Duration,
        min_model_version: Option<u64>,
    ) -> Result<Vec<Experience>> {
        let n = n.max(1);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let available = {
                let mut state = self.lock();
                if let Some(min) = min_model_version {
                    let before = state.items.len();
                    state.items.retain(|e| e.model_version >= min);
                    state.stale_dropped += (before - state.items.len()) as u64;
                }
                if state.items.len() >= n {
                    let batch: Vec<Experience> = state.items.drain(..n).collect();
                    drop(state);
                    self.inner.changed.notify_waiters();
                    return Ok(batch);
                }
                if state.closed {
                    return Err(self.closed());
                }
                state.items.len()
            };
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(BufferError::Timeout {
                    name: self.inner.name.clone(),
                    wanted: n,
                    available,
                    waited_s: timeout.as_secs_f64(),
                });
            }
        }
    }

    /// Takes the `n` oldest fresh experiences if they are there now; `None` (nothing removed but stale ones)
    /// otherwise, or `Closed` once the queue is closed and cannot fill up any more.
    pub fn try_get_batch(&self, n: usize, min_model_version: Option<u64>) -> Result<Option<Vec<Experience>>> {
        let mut state = self.lock();
        if let Some(min) = min_model_version {
            let before = state.items.len();
            state.items.retain(|e| e.model_version >= min);
            state.stale_dropped += (before - state.items.len()) as u64;
        }
        if state.items.len() < n {
            return if state.closed { Err(self.closed()) } else { Ok(None) };
        }
        let batch: Vec<Experience> = state.items.drain(..n).collect();
        drop(state);
        self.inner.changed.notify_waiters();
        Ok(Some(batch))
    }

    /// Takes everything queued now, without waiting (the last partial batch at the end of a run).
    pub fn drain(&self) -> Vec<Experience> {
        let items: Vec<Experience> = self.lock().items.drain(..).collect();
        self.inner.changed.notify_waiters();
        items
    }

    /// No more puts; wakes every waiter.
    pub fn close(&self) {
        self.lock().closed = true;
        self.inner.changed.notify_waiters();
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a panic elsewhere while holding it; every critical section here leaves the
        // state consistent (no code between the mutations can panic), so the data is still good.
        self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn closed(&self) -> BufferError {
        BufferError::Closed { name: self.inner.name.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experience::Eid;

    fn exp(task: u64, version: u64) -> Experience {
        let mut e = Experience::single_turn(Eid { task, ..Eid::default() }, vec![1, 2], 1, vec![0.0]);
        e.model_version = version;
        e
    }

    #[tokio::test]
    async fn fifo_and_whole_batches() {
        let q = ExperienceQueue::new("q", 10);
        q.put_batch(vec![exp(0, 0), exp(1, 0), exp(2, 0)]).await.unwrap();
        let got = q.get_batch(2, Duration::from_millis(10), None).await.unwrap();
        assert_eq!(got.iter().map(|e| e.eid.task).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(q.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn timeout_keeps_what_was_collected() {
        let q = ExperienceQueue::new("q", 10);
        q.put_batch(vec![exp(0, 0), exp(1, 0)]).await.unwrap();
        let err = q.get_batch(3, Duration::from_secs(5), None).await.unwrap_err();
        assert!(matches!(err, BufferError::Timeout { wanted: 3, available: 2, .. }), "{err}");
        assert_eq!(q.len(), 2);
        q.put_batch(vec![exp(2, 0)]).await.unwrap();
        assert_eq!(q.get_batch(3, Duration::from_secs(5), None).await.unwrap().len(), 3);
    }

    #[tokio::test]
    async fn stale_experiences_are_dropped_and_counted() {
        let q = ExperienceQueue::new("q", 10);
        q.put_batch(vec![exp(0, 1), exp(1, 3), exp(2, 2), exp(3, 4)]).await.unwrap();
        let got = q.get_batch(2, Duration::from_millis(10), Some(3)).await.unwrap();
        assert_eq!(got.iter().map(|e| e.eid.task).collect::<Vec<_>>(), [1, 3]);
        assert_eq!(q.stale_dropped(), 2);
    }

    #[tokio::test]
    async fn invalid_experiences_are_refused() {
        let q = ExperienceQueue::new("q", 10);
        let mut bad = exp(0, 0);
        bad.logprobs.clear();
        assert!(matches!(q.put_batch(vec![bad]).await, Err(BufferError::InvalidExperience { .. })));
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn close_fails_puts_and_drains() {
        let q = ExperienceQueue::new("q", 10);
        q.put_batch(vec![exp(0, 0)]).await.unwrap();
        q.close();
        assert!(matches!(q.put_batch(vec![exp(1, 0)]).await, Err(BufferError::Closed { .. })));
        assert!(matches!(q.get_batch(2, Duration::from_secs(1), None).await, Err(BufferError::Closed { .. })));
        assert_eq!(q.drain().len(), 1);
    }
}
