//! Recording: every choice the server returns becomes an [`Experience`] (the exact sampled token ids, their
//! logprobs, the prompt tokens and the model version), held under its response id until the agent rewards it
//! (`POST /feedback`) and commits (`POST /commit`), which hands the rewarded ones to an [`ExperienceSink`] (the
//! experience pipeline and the buffer).
//!
//! Invariants:
//! - The store never holds more than `capacity` experiences, counting those reserved by requests in flight: a
//!   request reserves its choices before generating, so a full store refuses it up front (429) instead of
//!   generating replies it cannot keep. A request that fails or is cancelled releases its reservation.
//! - A commit takes only rewarded experiences; unrewarded ones stay. A commit the sink refuses puts everything
//!   it took back, rewards included, so nothing is lost.
//! - Commits run one at a time, so experiences are never handed over twice.
//! - At shutdown every rewarded experience is committed; what is left (never rewarded, or refused by the sink) is
//!   logged with its count and response ids, never dropped silently.
//! - `/feedback`'s `updated` counts each experience once, however many of the ids name it.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use indexmap::IndexMap;
use serde::Serialize;
use serde_json::{Map, Value, json};
use trinity_buffer::{Eid, Experience, TruncateStatus};

use crate::error::ApiError;

/// What an [`ExperienceSink`] may fail with.
pub type SinkError = Box<dyn std::error::Error + Send + Sync>;

/// The future [`ExperienceSink::commit`] returns.
pub type SinkFuture<'a> = Pin<Box<dyn Future<Output = Result<CommitReport, SinkError>> + Send + 'a>>;

/// Where committed experiences go: in `trinity run` the experience pipeline and the buffer, where a trainer
/// (same process, or `mode: train` sharing the buffer) trains on them.
///
/// `commit` receives every rewarded experience of one `POST /commit`, grouped: experiences of one group (same
/// `group_id`: the `task_id` the agent gave, else the response id, so the `n` choices of one request form a
/// group) are contiguous, and their `eid` is `{batch: commit number, task: group index, run: index in group,
/// step: 0}`. Each experience's `info` holds `response_id` and `choice`, plus `task_id` / `run_id` when the
/// feedback named them. An error is returned to the agent (HTTP 500) and the experiences stay pending.
pub trait ExperienceSink: Send + Sync {
    /// Takes one commit's experiences.
    fn commit(&self, experiences: Vec<Experience>) -> SinkFuture<'_>;
}

/// What a sink reports back for one commit; the server adds its own counts and returns it from `/commit`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CommitReport {
    /// Experiences the sink kept (its pipeline may filter some out).
    pub accepted: usize,
    /// The explore step the experiences were written as, when the sink counts steps.
    pub step: Option<u64>,
    /// Anything else worth showing the agent (pipeline metrics).
    pub metrics: BTreeMap<String, f64>,
}

/// One returned choice, as the recorder needs it.
#[derive(Debug, Clone)]
pub(crate) struct ChoiceRecord {
    /// Index of the choice in the response.
    pub(crate) choice: usize,
    pub(crate) prompt: Arc<Vec<u32>>,
    pub(crate) tokens: Vec<u32>,
    pub(crate) logprobs: Vec<f32>,
    /// The raw output text (before tool-call parsing).
    pub(crate) text: String,
    pub(crate) finish_reason: &'static str,
}

/// One response: its choices and how they were sampled.
#[derive(Debug, Clone)]
pub(crate) struct ResponseRecord {
    pub(crate) id: String,
    /// `chat.completions` or `completions`.
    pub(crate) endpoint: &'static str,
    /// Model version when the request started and when it ended (they differ when weights were synced while
    /// it ran; the experience carries the older).
    pub(crate) versions: (u64, u64),
    pub(crate) temperature: f32,
    pub(crate) choices: Vec<ChoiceRecord>,
}

/// A recorded response awaiting feedback and commit.
#[derive(Debug)]
struct Pending {
    experiences: Vec<Experience>,
    rewards: Vec<Option<f64>>,
    task_id: Option<String>,
    run_id: Option<String>,
}

#[derive(Debug, Default)]
struct Store {
    /// In arrival order, so commits hand experiences over in the order they were generated.
    responses: IndexMap<String, Pending>,
    /// Experiences held in `responses`.
    held: usize,
    /// Choices reserved by requests in flight.
    reserved: usize,
    committed: u64,
    commits: u64,
}

/// Counts for `/metrics` and `/commit`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct RecorderStats {
    pub(crate) pending: usize,
    pub(crate) rewarded: usize,
    pub(crate) capacity: usize,
    pub(crate) committed: u64,
    pub(crate) commits: u64,
}

/// The pending store and the sink.
pub(crate) struct Recorder {
    store: Mutex<Store>,
    capacity: usize,
    sink: Arc<dyn ExperienceSink>,
    commit_lock: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

/// Room for a request's choices, taken before it generates; dropping it unused gives the room back.
#[derive(Debug)]
pub(crate) struct Reservation {
    recorder: Arc<Recorder>,
    choices: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.choices > 0 {
            self.recorder.lock().reserved -= self.choices;
        }
    }
}

impl Reservation {
    /// Stores the finished response (its choices were reserved).
    pub(crate) fn record(mut self, response: ResponseRecord, prompt_texts: &dyn Fn(&[u32]) -> Option<String>) {
        let experiences = build_experiences(&response, prompt_texts);
        let mut store = self.recorder.lock();
        store.reserved -= self.choices;
        self.choices = 0;
        store.held += experiences.len();
        let rewards = vec![None; experiences.len()];
        store.responses.insert(response.id, Pending { experiences, rewards, task_id: None, run_id: None });
    }
}

/// The experiences of one response, before any reward (eids are assigned at commit).
pub(crate) fn build_experiences(
    response: &ResponseRecord,
    prompt_texts: &dyn Fn(&[u32]) -> Option<String>,
) -> Vec<Experience> {
    // Choices of one prompt share its tokens, so its text is decoded once.
    let mut texts: Vec<(&Arc<Vec<u32>>, Option<String>)> = Vec::new();
    response
        .choices
        .iter()
        .map(|c| {
            let prompt_text = match texts.iter().find(|(p, _)| Arc::ptr_eq(p, &c.prompt)) {
                Some((_, text)) => text.clone(),
                None => {
                    let text = prompt_texts(&c.prompt);
                    texts.push((&c.prompt, text.clone()));
                    text
                }
            };
            let mut tokens = Vec::with_capacity(c.prompt.len() + c.tokens.len());
            tokens.extend_from_slice(&c.prompt);
            tokens.extend_from_slice(&c.tokens);
            let mut e = Experience::single_turn(Eid::default(), tokens, c.prompt.len(), c.logprobs.clone());
            e.group_id = response.id.clone();
            e.model_version = response.versions.0;
            e.prompt_text = prompt_text;
            e.response_text = Some(c.text.clone());
            e.truncate_status = (c.finish_reason == "length").then_some(TruncateStatus::ResponseTruncated);
            let mut info = Map::new();
            info.insert("response_id".into(), json!(response.id));
            info.insert("choice".into(), json!(c.choice));
            info.insert("endpoint".into(), json!(response.endpoint));
            info.insert("finish_reason".into(), json!(c.finish_reason));
            info.insert("temperature".into(), json!(response.temperature));
            if response.versions.1 != response.versions.0 {
                info.insert("model_version_end".into(), json!(response.versions.1));
            }
            e.info = info;
            e
        })
        .collect()
}

/// A parsed `POST /feedback` body.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Feedback {
    /// Response ids (all choices) or `<response id>#<choice>` (one choice).
    pub(crate) msg_ids: Vec<String>,
    pub(crate) reward: f64,
    #[serde(default)]
    pub(crate) task_id: Option<Value>,
    #[serde(default)]
    pub(crate) run_id: Option<Value>,
}

/// An id given as a string or a number, as text.
fn id_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Recorder {
    pub(crate) fn new(capacity: usize, sink: Arc<dyn ExperienceSink>) -> Self {
        Recorder { store: Mutex::new(Store::default()), capacity, sink, commit_lock: tokio::sync::Mutex::new(()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves room for `choices` experiences, or refuses with 429 when the store is full.
    pub(crate) fn reserve(self: &Arc<Self>, choices: usize) -> Result<Reservation, ApiError> {
        let mut store = self.lock();
        if store.held + store.reserved + choices > self.capacity {
            return Err(ApiError {
                status: axum::http::StatusCode::TOO_MANY_REQUESTS,
                message: format!(
                    "the recorder holds {} experiences awaiting feedback or commit ({} more in flight) and its capacity is {}: reward them (POST /feedback) and commit (POST /commit), or raise the capacity",
                    store.held, store.reserved, self.capacity
                ),
                kind: "rate_limit_error",
                param: None,
                code: Some("too_many_pending_experiences"),
            });
        }
        store.reserved += choices;
        Ok(Reservation { recorder: Arc::clone(self), choices })
    }

    /// Sets the reward (and task / run ids) of the named responses; all ids must be known, or nothing changes.
    pub(crate) fn feedback(&self, feedback: &Feedback) -> Result<usize, ApiError> {
        if !feedback.reward.is_finite() {
            return Err(ApiError::invalid_param("reward", format!("{} is not a finite number", feedback.reward)));
        }
        if feedback.msg_ids.is_empty() {
            return Err(ApiError::invalid_param("msg_ids", "name at least one response id"));
        }
        let mut store = self.lock();
        let mut targets = Vec::with_capacity(feedback.msg_ids.len());
        let mut unknown = Vec::new();
        for id in &feedback.msg_ids {
            match resolve(&store.responses, id) {
                Some(target) => targets.push(target),
                None => unknown.push(id.as_str()),
            }
        }
        if !unknown.is_empty() {
            return Err(ApiError::not_found(
                format!(
                    "no pending response with id {} (ids are the `id` of completion responses, optionally with `#<choice index>`; committed responses are no longer pending)",
                    unknown.iter().map(|id| format!("`{id}`")).collect::<Vec<_>>().join(", ")
                ),
                Some("msg_ids"),
            ));
        }
        // An experience named twice (`id` and `id#0`, or one id repeated) is one update.
        let mut updated = std::collections::HashSet::new();
        for (key, choice) in targets {
            let Some(pending) = store.responses.get_mut(&key) else { continue };
            for (i, reward) in pending.rewards.iter_mut().enumerate() {
                if choice.is_none_or(|c| c == i) {
                    *reward = Some(feedback.reward);
                    updated.insert((key.clone(), i));
                }
            }
            if let Some(task) = &feedback.task_id {
                pending.task_id = Some(id_text(task));
            }
            if let Some(run) = &feedback.run_id {
                pending.run_id = Some(id_text(run));
            }
        }
        Ok(updated.len())
    }

    /// The last commit, when the server stops: hands every rewarded experience to the sink and logs what stays
    /// behind (unrewarded experiences, or all of them when the sink refuses), naming the responses.
    pub(crate) async fn commit_at_shutdown(&self) {
        let rewarded = self.stats().rewarded;
        if rewarded > 0 {
            match self.commit().await {
                Ok(report) => tracing::info!(
                    experiences = rewarded,
                    step = %report["step"],
                    "serve: committed the rewarded experiences left at shutdown"
                ),
                // `commit` put them back; they are listed below as lost.
                Err(error) => tracing::warn!("serve: the commit at shutdown failed: {}", error.message),
            }
        }
        let store = self.lock();
        if store.held == 0 {
            return;
        }
        let rewarded = store.responses.values().flat_map(|p| &p.rewards).filter(|r| r.is_some()).count();
        let ids: Vec<&str> = store.responses.keys().map(String::as_str).collect();
        let shown = ids.len().min(20);
        tracing::warn!(
            "serve: {} recorded experiences were never committed and are lost ({rewarded} rewarded, {} never \
             rewarded), from {} responses: {}{}",
            store.held,
            store.held - rewarded,
            ids.len(),
            ids[..shown].join(", "),
            if shown < ids.len() { ", ..." } else { "" }
        );
    }

    /// Hands every rewarded experience to the sink, grouped; returns the `/commit` body.
    pub(crate) async fn commit(&self) -> Result<Value, ApiError> {
        let _one_at_a_time = self.commit_lock.lock().await;
        let (experiences, taken, batch) = self.take_rewarded();
        let groups = {
            let mut ids: Vec<&str> = experiences.iter().map(|e| e.group_id.as_str()).collect();
            ids.dedup();
            ids.len()
        };
        if experiences.is_empty() {
            let stats = self.stats();
            return Ok(
                json!({"committed": 0, "groups": 0, "pending": stats.pending, "accepted": 0, "step": null, "metrics": {}}),
            );
        }
        let count = experiences.len();
        match self.sink.commit(experiences).await {
            Ok(report) => {
                let pending = {
                    let mut store = self.lock();
                    store.committed += count as u64;
                    store.commits += 1;
                    store.held
                };
                tracing::info!(experiences = count, groups, batch, "committed recorded experiences");
                Ok(json!({
                    "committed": count, "groups": groups, "pending": pending,
                    "accepted": report.accepted, "step": report.step, "metrics": report.metrics,
                }))
            }
            Err(error) => {
                self.restore(taken);
                tracing::warn!(%error, experiences = count, "the experience sink refused a commit; experiences kept");
                Err(ApiError::internal(format!("committing {count} experiences failed (they stay pending): {error}")))
            }
        }
    }

    /// Removes the rewarded experiences, grouped and numbered; also returns them as they were stored, for
    /// [`Recorder::restore`].
    fn take_rewarded(&self) -> (Vec<Experience>, Vec<(String, Pending)>, u64) {
        let mut store = self.lock();
        let batch = store.commits;
        let mut taken: Vec<(String, Pending)> = Vec::new();
        let mut count = 0;
        store.responses.retain(|id, pending| {
            if pending.rewards.iter().all(Option::is_none) {
                return true;
            }
            let mut kept = Pending { experiences: Vec::new(), rewards: Vec::new(), ..pending.clone_ids() };
            let mut took = Pending { experiences: Vec::new(), rewards: Vec::new(), ..pending.clone_ids() };
            for (e, r) in pending.experiences.drain(..).zip(pending.rewards.drain(..)) {
                let side = if r.is_some() { &mut took } else { &mut kept };
                side.experiences.push(e);
                side.rewards.push(r);
            }
            count += took.experiences.len();
            taken.push((id.clone(), took));
            *pending = kept;
            !pending.experiences.is_empty()
        });
        store.held -= count;
        drop(store);

        // Group by task id (else response id), groups in order of first appearance.
        let mut groups: IndexMap<String, Vec<Experience>> = IndexMap::new();
        for (id, pending) in &taken {
            let group = pending.task_id.clone().unwrap_or_else(|| id.clone());
            for (e, reward) in pending.experiences.iter().zip(&pending.rewards) {
                let mut e = e.clone();
                e.reward = reward.unwrap_or_default();
                e.group_id = group.clone();
                if let Some(task) = &pending.task_id {
                    e.info.insert("task_id".into(), json!(task));
                }
                if let Some(run) = &pending.run_id {
                    e.info.insert("run_id".into(), json!(run));
                }
                groups.entry(group.clone()).or_default().push(e);
            }
        }
        let mut experiences = Vec::with_capacity(count);
        for (task, (_, members)) in groups.into_iter().enumerate() {
            for (run, mut e) in members.into_iter().enumerate() {
                e.eid = Eid { batch, task: task as u64, run: run as u64, step: 0 };
                experiences.push(e);
            }
        }
        (experiences, taken, batch)
    }

    /// Puts experiences taken by a failed commit back.
    fn restore(&self, taken: Vec<(String, Pending)>) {
        let mut store = self.lock();
        for (id, took) in taken {
            store.held += took.experiences.len();
            match store.responses.get_mut(&id) {
                Some(pending) => {
                    pending.experiences.extend(took.experiences);
                    pending.rewards.extend(took.rewards);
                }
                None => {
                    store.responses.insert(id, took);
                }
            }
        }
    }

    pub(crate) fn stats(&self) -> RecorderStats {
        let store = self.lock();
        RecorderStats {
            pending: store.held,
            rewarded: store.responses.values().flat_map(|p| &p.rewards).filter(|r| r.is_some()).count(),
            capacity: self.capacity,
            committed: store.committed,
            commits: store.commits,
        }
    }
}

impl Pending {
    /// A pending entry with the same ids and nothing in it.
    fn clone_ids(&self) -> Pending {
        Pending {
            experiences: Vec::new(),
            rewards: Vec::new(),
            task_id: self.task_id.clone(),
            run_id: self.run_id.clone(),
        }
    }
}

/// Which stored response (and which choice of it, or all) `id` names.
fn resolve(responses: &IndexMap<String, Pending>, id: &str) -> Option<(String, Option<usize>)> {
    if responses.contains_key(id) {
        return Some((id.to_owned(), None));
    }
    let (key, choice) = id.rsplit_once('#')?;
    let choice: usize = choice.parse().ok()?;
    let pending = responses.get(key)?;
    // A choice already committed is gone from the entry; choices are stored in index order.
    let stored =
        pending.experiences.iter().position(|e| e.info.get("choice").and_then(Value::as_u64) == Some(choice as u64))?;
    Some((key.to_owned(), Some(stored)))
}
