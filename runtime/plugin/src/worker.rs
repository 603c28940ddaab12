//! A thread that owns one plugin Store and runs synchronous calls on it (reward and operator plugins).
//!
//! Why a thread: WASI's synchronous host functions block on a private Tokio runtime, which panics when the
//! caller already runs inside one (workflows call rewards from async code). On its own thread a call never is.
//! The Store lives in the thread's slot and is reused between calls; a call that traps empties the slot, so the
//! next call instantiates afresh from the pre-linked component.
//!
//! A [`Pool`] holds several workers of one plugin, each with its own Store: a call takes an idle worker (starting
//! one while fewer than the pool's size run), so one call stuck until its deadline (a looping reward) holds one
//! worker, and the other tasks' calls go on with the others.

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

type Job<S> = Box<dyn FnOnce(&mut Option<S>) + Send>;

/// The calling side of a worker thread.
pub(crate) struct Worker<S> {
    jobs: Mutex<mpsc::Sender<Job<S>>>,
}

impl<S> std::fmt::Debug for Worker<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").finish_non_exhaustive()
    }
}

impl<S: 'static> Worker<S> {
    /// Starts the thread; it ends when the worker is dropped.
    pub(crate) fn spawn(name: &str) -> std::io::Result<Self> {
        let (sender, receiver) = mpsc::channel::<Job<S>>();
        std::thread::Builder::new().name(format!("plugin {name}")).spawn(move || {
            let mut slot = None;
            while let Ok(job) = receiver.recv() {
                job(&mut slot);
            }
        })?;
        Ok(Worker { jobs: Mutex::new(sender) })
    }

    /// Runs `job` on the worker's thread with its Store slot and waits for the answer; `None` when the thread
    /// is gone (it only ends if a job panicked, which host code never does on purpose).
    pub(crate) fn call<R: Send + 'static>(&self, job: impl FnOnce(&mut Option<S>) -> R + Send + 'static) -> Option<R> {
        let (reply, answer) = mpsc::sync_channel(1);
        let boxed: Job<S> = Box::new(move |slot| {
            // The caller may have given up waiting; then nobody needs the answer.
            let _ = reply.send(job(slot));
        });
        {
            let jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            jobs.send(boxed).ok()?;
        }
        answer.recv().ok()
    }
}

/// Up to `size` workers of one plugin, started on demand.
pub(crate) struct Pool<S> {
    name: String,
    size: usize,
    state: Mutex<PoolState<S>>,
    freed: Condvar,
}

struct PoolState<S> {
    idle: Vec<Arc<Worker<S>>>,
    started: usize,
}

impl<S> std::fmt::Debug for Pool<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("name", &self.name).field("size", &self.size).finish_non_exhaustive()
    }
}

impl<S: 'static> Pool<S> {
    /// A pool of at most `size` (at least 1) workers named after `name`; none is started yet.
    pub(crate) fn new(name: &str, size: usize) -> Self {
        Pool {
            name: name.to_owned(),
            size: size.max(1),
            state: Mutex::new(PoolState { idle: Vec::new(), started: 0 }),
            freed: Condvar::new(),
        }
    }

    /// Runs `job` on an idle worker (waiting for one when all `size` are busy) with that worker's Store slot.
    /// `Err` when a worker thread cannot be started; `Ok(None)` when the worker's thread is gone.
    pub(crate) fn call<R: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Option<S>) -> R + Send + 'static,
    ) -> std::io::Result<Option<R>> {
        let worker = self.take()?;
        let answer = worker.call(job);
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if answer.is_some() {
            state.idle.push(worker);
        } else {
            // Its thread ended: forget it, so a new one can take its place.
            state.started -= 1;
        }
        drop(state);
        self.freed.notify_one();
        Ok(answer)
    }

    fn take(&self) -> std::io::Result<Arc<Worker<S>>> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        loop {
            if let Some(worker) = state.idle.pop() {
                return Ok(worker);
            }
            if state.started < self.size {
                state.started += 1;
                let index = state.started;
                drop(state);
                return match Worker::spawn(&format!("{} #{index}", self.name)) {
                    Ok(worker) => Ok(Arc::new(worker)),
                    Err(error) => {
                        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).started -= 1;
                        Err(error)
                    }
                };
            }
            state = self.freed.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn a_stuck_call_holds_one_worker_and_the_others_go_on() {
        let pool = Arc::new(Pool::<u32>::new("test", 2));
        let stuck = {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || pool.call(|_| std::thread::sleep(Duration::from_millis(800))).unwrap())
        };
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        for i in 0..20u32 {
            let seen = pool.call(move |slot| *slot.get_or_insert(i)).unwrap().unwrap();
            assert_eq!(seen, 0, "the free worker keeps its Store between calls");
        }
        assert!(started.elapsed() < Duration::from_millis(500), "waited on the stuck worker: {:?}", started.elapsed());
        stuck.join().unwrap();
    }
}
