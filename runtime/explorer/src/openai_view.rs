//! The rollout model over the OpenAI API, as workflows see it (`explorer.rollout_model.enable_openai_api`).
//!
//! Agent code written against the `openai` client (an agent framework, a program a workflow starts) reaches the
//! rollout model through an in-process server (`trinity_serve::serve_workflows`) on a loopback port that
//! generates through the same engine, so its replies are the rollout's own tokens and logprobs. Each workflow
//! run opens an [`OpenAiSession`]: a base URL of its own (`http://127.0.0.1:<port>/runs/<key>/v1`), so that with
//! `enable_history` the server files every reply under the run that asked for it, and the workflow takes them as
//! its experiences ([`OpenAiSession::extract_experience_from_history`], Trinity-RFT's name). Auxiliary models
//! answer on the same URL under their names (the request's `model` field); their replies are never recorded.
//!
//! Invariants: a run's history lives only while its session does (dropping the session forgets it, and a late
//! request on its URL is refused), so a finished or failed task never leaks recorded replies into another.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use trinity_buffer::Experience;

/// The server's address and the recorded replies of every open run.
#[derive(Debug)]
pub struct OpenAiView {
    /// `http://127.0.0.1:<port>`.
    origin: String,
    /// The rollout model's name in requests and `/v1/models` (`model.model_path`, as Trinity-RFT names it).
    model_name: String,
    /// `enable_history`: replies on a run's URL are kept for its workflow.
    history: bool,
    runs: Mutex<HashMap<String, Vec<Experience>>>,
    next: AtomicU64,
}

/// Why a reply could not be filed under a run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no workflow run `{0}` is open (its task ended); ask through the base URL the running workflow was given")]
pub struct RunClosed(pub String);

impl OpenAiView {
    /// A view of the server listening at `origin` (`http://host:port`), serving the rollout model as `model_name`.
    pub fn new(origin: impl Into<String>, model_name: impl Into<String>, history: bool) -> Self {
        OpenAiView {
            origin: origin.into(),
            model_name: model_name.into(),
            history,
            runs: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }

    /// The base URL of requests outside any workflow run (never recorded).
    pub fn base_url(&self) -> String {
        format!("{}/v1", self.origin)
    }

    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    /// Whether replies are recorded (`enable_history`).
    pub fn history_enabled(&self) -> bool {
        self.history
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Experience>>> {
        self.runs.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether `run` is open (the server refuses requests on the URL of a closed run).
    pub fn is_open(&self, run: &str) -> bool {
        self.lock().contains_key(run)
    }

    /// Files the experiences of one reply under `run` (when history is on; otherwise only checks the run).
    pub fn record(&self, run: &str, experiences: Vec<Experience>) -> Result<(), RunClosed> {
        let mut runs = self.lock();
        let Some(history) = runs.get_mut(run) else { return Err(RunClosed(run.to_owned())) };
        if self.history {
            history.extend(experiences);
        }
        Ok(())
    }
}

/// One workflow run's view of the rollout model over the OpenAI API; closing it (drop) forgets its history.
#[derive(Debug)]
pub struct OpenAiSession {
    view: std::sync::Arc<OpenAiView>,
    key: String,
}

impl OpenAiSession {
    /// Opens a run on `view`.
    pub fn open(view: &std::sync::Arc<OpenAiView>) -> Self {
        let key = format!("r{}", view.next.fetch_add(1, Ordering::Relaxed));
        view.lock().insert(key.clone(), Vec::new());
        OpenAiSession { view: std::sync::Arc::clone(view), key }
    }

    /// The OpenAI base URL of this run (`OPENAI_BASE_URL` for a program the workflow starts).
    pub fn base_url(&self) -> String {
        format!("{}/runs/{}/v1", self.view.origin, self.key)
    }

    /// The name requests use for the rollout model (`model`).
    pub fn model_name(&self) -> &str {
        self.view.model_name()
    }

    /// The run's key in URLs.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Every reply recorded for this run since the last call, in the order they were completed (one experience
    /// per choice: the prompt tokens, the sampled tokens and their logprobs, the model version). `None` when
    /// history is off (`explorer.rollout_model.enable_history: false`).
    pub fn extract_experience_from_history(&self) -> Option<Vec<Experience>> {
        if !self.view.history {
            return None;
        }
        Some(self.view.lock().get_mut(&self.key).map(std::mem::take).unwrap_or_default())
    }
}

impl Drop for OpenAiSession {
    fn drop(&mut self) {
        self.view.lock().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use trinity_buffer::Eid;

    use super::*;

    fn experience(token: u32) -> Experience {
        Experience::single_turn(Eid::default(), vec![1, token], 1, vec![-0.5])
    }

    #[test]
    fn replies_are_filed_under_their_run_and_forgotten_with_it() {
        let view = Arc::new(OpenAiView::new("http://127.0.0.1:9", "m", true));
        let a = OpenAiSession::open(&view);
        let b = OpenAiSession::open(&view);
        assert_ne!(a.base_url(), b.base_url());
        assert!(a.base_url().starts_with("http://127.0.0.1:9/runs/") && a.base_url().ends_with("/v1"));
        view.record(a.key(), vec![experience(5)]).unwrap();
        view.record(b.key(), vec![experience(6), experience(7)]).unwrap();
        let taken = a.extract_experience_from_history().unwrap();
        assert_eq!(taken.iter().map(|e| e.tokens[1]).collect::<Vec<_>>(), [5]);
        assert!(a.extract_experience_from_history().unwrap().is_empty(), "taking drains the history");
        let key = b.key().to_owned();
        drop(b);
        assert!(!view.is_open(&key));
        assert_eq!(view.record(&key, vec![experience(8)]), Err(RunClosed(key)));
    }

    #[test]
    fn without_history_nothing_is_kept_but_runs_still_close() {
        let view = Arc::new(OpenAiView::new("http://127.0.0.1:9", "m", false));
        let a = OpenAiSession::open(&view);
        view.record(a.key(), vec![experience(5)]).unwrap();
        assert!(a.extract_experience_from_history().is_none());
        assert!(view.lock().get(a.key()).unwrap().is_empty());
    }
}
