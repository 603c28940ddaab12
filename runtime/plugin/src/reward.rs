//! Reward plugins: one call scores a whole batch of (task, response) pairs.
//!
//! The output is checked before anyone sees it: one list of components per response, finite values, no name
//! twice. A failed batch (trap, deadline, memory, guest error, bad output) is an error for that batch only; the
//! plugin's Store is rebuilt after a trap and the next batch is scored normally.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value};
use trinity_reward::{RewardComponents, RewardError, RewardInput};
use wasmtime::Store;
use wasmtime::component::{Component, HasSelf, Linker};

use crate::bindings::reward::{RewardPlugin as Reward, RewardPluginPre as RewardPre};
use crate::bindings::types;
use crate::component::PluginKind;
use crate::engine::{PluginLimits, StoreState, engine};
use crate::error::PluginError;
use crate::instance::{PluginInfo, call_error, metrics_map, new_store};
use crate::worker::Worker;

/// One task of a reward batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RewardTask {
    pub taskset: String,
    pub index: u64,
    pub prompt: Option<String>,
    pub truth: Option<String>,
    pub system_prompt: Option<String>,
    /// The taskset row.
    pub raw: Map<String, Value>,
    /// `reward_fn_args`.
    pub args: Map<String, Value>,
}

/// A loaded reward plugin.
pub struct RewardPlugin {
    info: PluginInfo,
    limits: PluginLimits,
    worker: Worker<Loaded>,
    setup: Arc<Setup>,
}

impl std::fmt::Debug for RewardPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RewardPlugin").field("info", &self.info).finish_non_exhaustive()
    }
}

/// What re-instantiation needs.
struct Setup {
    name: String,
    path: PathBuf,
    limits: PluginLimits,
    pre: RewardPre<StoreState<()>>,
}

struct Loaded {
    store: Store<StoreState<()>>,
    bindings: Reward,
}

impl Setup {
    fn instantiate(&self) -> Result<Loaded, PluginError> {
        let mut store = new_store(&self.name, &self.limits, (), &self.path)?;
        let bindings = self.pre.instantiate(&mut store).map_err(|e| call_error(&self.name, &self.limits, &e))?;
        Ok(Loaded { store, bindings })
    }
}

impl RewardPlugin {
    pub(crate) fn load(path: &Path, component: &Component, limits: PluginLimits) -> Result<Self, PluginError> {
        let link = |e: wasmtime::Error| PluginError::Link { path: path.to_owned(), message: format!("{e:#}") };
        let mut linker = Linker::new(engine()?);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(link)?;
        Reward::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state).map_err(link)?;
        let pre = RewardPre::new(linker.instantiate_pre(component).map_err(link)?).map_err(link)?;
        let label = path.display().to_string();
        let first = Setup { name: label.clone(), path: path.to_owned(), limits: limits.clone(), pre: pre.clone() };
        let worker = Worker::spawn(&label).map_err(|e| PluginError::Engine { message: e.to_string() })?;
        let owned_path = path.to_owned();
        let info = worker
            .call(move |slot: &mut Option<Loaded>| {
                let mut loaded = first.instantiate()?;
                let info = loaded
                    .bindings
                    .call_info(&mut loaded.store)
                    .map_err(|e| call_error(&first.name, &first.limits, &e))?;
                let info = PluginInfo::from_guest(&owned_path, PluginKind::Reward, info)?;
                loaded.store.data_mut().plugin = info.name.clone();
                *slot = Some(loaded);
                Ok::<_, PluginError>(info)
            })
            .ok_or_else(|| PluginError::Engine { message: "the plugin's worker thread ended".into() })??;
        let setup = Arc::new(Setup { name: info.name.clone(), path: path.to_owned(), limits: limits.clone(), pre });
        Ok(RewardPlugin { info, limits, worker, setup })
    }

    /// Who the plugin is.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    /// Scores `responses` (each `(index into tasks, text)`): one set of components per response, in order.
    pub fn score(&self, tasks: &[RewardTask], responses: &[(u32, &str)]) -> Result<Vec<RewardComponents>, PluginError> {
        let name = self.info.name.clone();
        if let Some((task, _)) = responses.iter().find(|(task, _)| *task as usize >= tasks.len()) {
            return Err(PluginError::Output { plugin: name, message: format!("response refers to task {task}") });
        }
        let wit_tasks: Vec<types::Task> = tasks.iter().map(wit_task).collect();
        let wit_responses: Vec<crate::bindings::reward::exports::trinity::plugin::reward::Response> = responses
            .iter()
            .map(|(task, text)| crate::bindings::reward::exports::trinity::plugin::reward::Response {
                task: *task,
                text: (*text).to_owned(),
            })
            .collect();
        let count = responses.len();
        let setup = Arc::clone(&self.setup);
        let rows = self
            .worker
            .call(move |slot: &mut Option<Loaded>| {
                let loaded = match slot {
                    Some(loaded) => loaded,
                    None => slot.insert(setup.instantiate()?),
                };
                loaded.store.set_epoch_deadline(setup.limits.deadline_ticks());
                let result =
                    loaded.bindings.trinity_plugin_reward().call_score(&mut loaded.store, &wit_tasks, &wit_responses);
                match result {
                    Ok(Ok(rows)) => Ok(rows),
                    Ok(Err(message)) => Err(PluginError::Guest { plugin: setup.name.clone(), message }),
                    Err(error) => {
                        // The Store is poisoned: drop it, the next batch instantiates afresh.
                        *slot = None;
                        Err(call_error(&setup.name, &setup.limits, &error))
                    }
                }
            })
            .ok_or_else(|| PluginError::Engine { message: "the plugin's worker thread ended".into() })??;
        if rows.len() != count {
            return Err(PluginError::Output {
                plugin: self.info.name.clone(),
                message: format!("returned {} score lists for {count} responses", rows.len()),
            });
        }
        rows.into_iter()
            .enumerate()
            .map(|(i, row)| {
                if row.is_empty() {
                    return Err(PluginError::Output {
                        plugin: self.info.name.clone(),
                        message: format!("response {i} got no reward component"),
                    });
                }
                metrics_map(&self.info.name, &format!("response {i}"), row)
            })
            .collect()
    }

    /// The plugin's limits.
    pub fn limits(&self) -> &PluginLimits {
        &self.limits
    }
}

fn wit_task(task: &RewardTask) -> types::Task {
    types::Task {
        taskset: task.taskset.clone(),
        index: task.index,
        prompt: task.prompt.clone(),
        truth: task.truth.clone(),
        system_prompt: task.system_prompt.clone(),
        raw: serde_json::to_string(&task.raw).unwrap_or_default(),
        args: serde_json::to_string(&task.args).unwrap_or_default(),
    }
}

impl trinity_reward::GroupReward for RewardPlugin {
    fn score_group(
        &self,
        row: Option<&Map<String, Value>>,
        inputs: &[RewardInput<'_>],
    ) -> Result<Vec<RewardComponents>, RewardError> {
        let Some(first) = inputs.first() else {
            return Ok(Vec::new());
        };
        let task = RewardTask {
            prompt: first.prompt.map(str::to_owned),
            truth: first.truth.map(str::to_owned),
            raw: row.cloned().unwrap_or_default(),
            args: first.args.clone(),
            ..RewardTask::default()
        };
        let responses: Vec<(u32, &str)> = inputs.iter().map(|input| (0, input.response)).collect();
        self.score(std::slice::from_ref(&task), &responses)
            .map_err(|error| RewardError::Plugin { reward: self.info.name.clone(), message: error.to_string() })
    }
}
