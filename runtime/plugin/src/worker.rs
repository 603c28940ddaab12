//! A thread that owns one plugin Store and runs synchronous calls on it (reward and operator plugins).
//!
//! Why a thread: WASI's synchronous host functions block on a private Tokio runtime, which panics when the
//! caller already runs inside one (workflows call rewards from async code). On its own thread a call never is.
//! The Store lives in the thread's slot and is reused between calls; a call that traps empties the slot, so the
//! next call instantiates afresh from the pre-linked component.

use std::sync::Mutex;
use std::sync::mpsc;

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
