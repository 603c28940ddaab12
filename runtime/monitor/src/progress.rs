//! A run's live progress: how many steps it plans and which phase the current step is in.
//!
//! Metric files say what a step measured once it ended; a person watching a long run also wants to know where it
//! is now and when it will end. The modes report their plan and each phase through their [`crate::Monitor`], which
//! writes the plan beside the metrics (`plan.json`, read by the studio) and hands every event to the process's
//! [`Progress`] observer, if the binary installed one (the terminal display of `trinity run`). The observer is
//! process-global because a process runs one job: the CLI installs it once, before the run starts, and the run's
//! code never has to carry it.

use std::sync::Mutex;

use crate::Metrics;

/// What a step is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Running workflows on a batch of tasks.
    Explore,
    /// Training on a batch of experiences (or dataset rows).
    Train,
    /// Moving the trained weights to the explorer.
    Sync,
    /// Evaluating on the eval tasksets.
    Evaluate,
    /// Writing a checkpoint.
    Save,
}

impl Phase {
    /// The word displays show.
    pub fn label(self) -> &'static str {
        match self {
            Phase::Explore => "explore",
            Phase::Train => "train",
            Phase::Sync => "sync",
            Phase::Evaluate => "eval",
            Phase::Save => "save",
        }
    }
}

/// Receives a run's progress events (a live display).
pub trait Progress: Send {
    /// The run will end after `total_steps` (`None`: it cannot know, e.g. a trainer that runs until its explorers
    /// finish); `done` steps were done before this process started (a resumed run).
    fn planned(&mut self, total_steps: Option<u64>, done: u64);
    /// Step `step` entered `phase`.
    fn phase(&mut self, step: u64, phase: Phase);
    /// Step `step` ended with these metrics.
    fn recorded(&mut self, step: u64, metrics: &Metrics);
}

static OBSERVER: Mutex<Option<Box<dyn Progress>>> = Mutex::new(None);

/// Installs the process's progress observer (replacing any earlier one); every [`crate::Monitor`] reports to it.
pub fn observe(progress: Box<dyn Progress>) {
    *OBSERVER.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(progress);
}

/// Removes the observer, so that a finished display stops drawing.
pub fn stop_observing() -> Option<Box<dyn Progress>> {
    OBSERVER.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
}

/// Hands one event to the observer, if there is one. A display that panicked must not take the run down with it,
/// so a poisoned lock is taken over rather than propagated.
pub(crate) fn notify(event: impl FnOnce(&mut dyn Progress)) {
    let mut observer = OBSERVER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(progress) = observer.as_deref_mut() {
        event(progress);
    }
}
