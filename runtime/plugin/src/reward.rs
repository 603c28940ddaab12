//! Reward plugins: one call scores a whole batch of (task, response) pairs.
//!
//! The output is checked before anyone sees it: one list of components per response, finite values, no name
//! twice. A failed batch (trap, deadline, memory, guest error, bad output) is an error for that batch only; the
//! plugin's Store is rebuilt after a trap and the next batch is scored normally.

use std::path::Path;

use serde_json::{Map, Value};
use trinity_reward::{RewardComponents, RewardError, RewardInput};
use wasmtime::component::{Component, HasSelf, InstancePre, Linker};

use crate::bindings::reward::{RewardPlugin as Reward, RewardPluginPre as RewardPre};
use crate::bindings::types;
use crate::component::PluginKind;
use crate::engine::{PluginLimits, StoreState};
use crate::error::PluginError;
use crate::instance::{PluginInfo, metrics_map};
use crate::synchronous::{PluginStore, SyncPlugin, SyncWorld};

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
    plugin: SyncPlugin<Reward>,
}

impl std::fmt::Debug for RewardPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RewardPlugin").field("info", self.info()).finish_non_exhaustive()
    }
}

impl SyncWorld for Reward {
    type Pre = RewardPre<StoreState<()>>;
    const KIND: PluginKind = PluginKind::Reward;

    fn add_to_linker(linker: &mut Linker<StoreState<()>>) -> wasmtime::Result<()> {
        Reward::add_to_linker::<_, HasSelf<_>>(linker, |state| state)
    }

    fn pre(instance: InstancePre<StoreState<()>>) -> wasmtime::Result<Self::Pre> {
        RewardPre::new(instance)
    }

    fn instantiate(pre: &Self::Pre, store: &mut PluginStore) -> wasmtime::Result<Self> {
        pre.instantiate(store)
    }

    fn info(&self, store: &mut PluginStore) -> wasmtime::Result<types::PluginInfo> {
        self.call_info(store)
    }
}

impl RewardPlugin {
    pub(crate) fn load(path: &Path, component: &Component, limits: PluginLimits) -> Result<Self, PluginError> {
        Ok(RewardPlugin { plugin: SyncPlugin::load(path, component, limits)? })
    }

    /// Who the plugin is.
    pub fn info(&self) -> &PluginInfo {
        self.plugin.info()
    }

    /// Scores `responses` (each `(index into tasks, text)`): one set of components per response, in order.
    pub fn score(&self, tasks: &[RewardTask], responses: &[(u32, &str)]) -> Result<Vec<RewardComponents>, PluginError> {
        let name = self.info().name.clone();
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
        let rows = self.plugin.call(move |bindings, store| {
            bindings.trinity_plugin_reward().call_score(store, &wit_tasks, &wit_responses)
        })?;
        if rows.len() != count {
            return Err(PluginError::Output {
                plugin: self.info().name.clone(),
                message: format!("returned {} score lists for {count} responses", rows.len()),
            });
        }
        rows.into_iter()
            .enumerate()
            .map(|(i, row)| {
                if row.is_empty() {
                    return Err(PluginError::Output {
                        plugin: self.info().name.clone(),
                        message: format!("response {i} got no reward component"),
                    });
                }
                metrics_map(&self.info().name, &format!("response {i}"), row)
            })
            .collect()
    }

    /// The plugin's limits.
    pub fn limits(&self) -> &PluginLimits {
        self.plugin.limits()
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
            .map_err(|error| RewardError::Plugin { reward: self.info().name.clone(), message: error.to_string() })
    }
}
