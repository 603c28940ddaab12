//! Operator plugins: transform one explore step's experiences (filter, reorder, reshape rewards, add fields).
//!
//! The plugin sees a view of each experience (no tokens) and answers with updates that name their source
//! experience, so it can drop, reorder or repeat experiences and change rewards, metrics and info, but never
//! corrupt token sequences.

use std::path::Path;

use serde_json::{Map, Value};
use trinity_buffer::Experience;
use trinity_explorer::{ExperienceOperator, OperatorOutput};
use wasmtime::component::{Component, HasSelf, InstancePre, Linker};

use crate::bindings::operator::exports::trinity::plugin::operator as export;
use crate::bindings::operator::{OperatorPlugin as Operator, OperatorPluginPre as OperatorPre};
use crate::bindings::types;
use crate::component::PluginKind;
use crate::engine::{PluginLimits, StoreState};
use crate::error::PluginError;
use crate::instance::{PluginInfo, metrics_map};
use crate::synchronous::{PluginStore, SyncPlugin, SyncWorld};

/// A loaded operator plugin.
pub struct OperatorPlugin {
    plugin: SyncPlugin<Operator>,
}

impl std::fmt::Debug for OperatorPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorPlugin").field("info", self.info()).finish_non_exhaustive()
    }
}

impl SyncWorld for Operator {
    type Pre = OperatorPre<StoreState<()>>;
    const KIND: PluginKind = PluginKind::Operator;

    fn add_to_linker(linker: &mut Linker<StoreState<()>>) -> wasmtime::Result<()> {
        Operator::add_to_linker::<_, HasSelf<_>>(linker, |state| state)
    }

    fn pre(instance: InstancePre<StoreState<()>>) -> wasmtime::Result<Self::Pre> {
        OperatorPre::new(instance)
    }

    fn instantiate(pre: &Self::Pre, store: &mut PluginStore) -> wasmtime::Result<Self> {
        pre.instantiate(store)
    }

    fn info(&self, store: &mut PluginStore) -> wasmtime::Result<types::PluginInfo> {
        self.call_info(store)
    }
}

impl OperatorPlugin {
    pub(crate) fn load(path: &Path, component: &Component, limits: PluginLimits) -> Result<Self, PluginError> {
        Ok(OperatorPlugin { plugin: SyncPlugin::load(path, component, limits)? })
    }

    /// Who the plugin is.
    pub fn info(&self) -> &PluginInfo {
        self.plugin.info()
    }

    /// Runs the operator over `experiences`.
    pub fn transform(
        &self,
        experiences: &[Experience],
        args: &Map<String, Value>,
    ) -> Result<OperatorOutput, PluginError> {
        let name = self.info().name.clone();
        let views: Vec<export::ExperienceView> = experiences.iter().map(view).collect();
        let args = Value::Object(args.clone()).to_string();
        let output = self
            .plugin
            .call(move |bindings, store| bindings.trinity_plugin_operator().call_apply(store, &views, &args))?;
        let bad = |message: String| PluginError::Output { plugin: name.clone(), message };
        let mut out = Vec::with_capacity(output.experiences.len());
        for (i, update) in output.experiences.into_iter().enumerate() {
            let source = experiences.get(update.source as usize).ok_or_else(|| {
                bad(format!("update {i} names experience {} of {}", update.source, experiences.len()))
            })?;
            let mut experience = source.clone();
            if let Some(reward) = update.reward {
                if !reward.is_finite() {
                    return Err(bad(format!("update {i} sets reward {reward}")));
                }
                experience.reward = reward;
            }
            experience.metrics.extend(metrics_map(&name, &format!("update {i}"), update.metrics)?);
            if !update.info.trim().is_empty() {
                match serde_json::from_str(&update.info) {
                    Ok(Value::Object(fields)) => experience.info.extend(fields),
                    _ => return Err(bad(format!("update {i}: info is not a JSON object"))),
                }
            }
            out.push(experience);
        }
        let metrics = metrics_map(&name, "batch metrics", output.metrics)?;
        Ok(OperatorOutput { experiences: out, metrics, ..OperatorOutput::default() })
    }
}

fn view(experience: &Experience) -> export::ExperienceView {
    export::ExperienceView {
        uid: experience.eid.uid(),
        group_id: experience.group_id.clone(),
        reward: experience.reward,
        prompt_length: experience.prompt_length as u32,
        response_length: experience.response_length() as u32,
        action_tokens: experience.action_mask.iter().filter(|m| **m).count() as u32,
        prompt_text: experience.prompt_text.clone(),
        response_text: experience.response_text.clone(),
        metrics: experience
            .metrics
            .iter()
            .map(|(name, value)| types::Metric { name: name.clone(), value: *value })
            .collect(),
        info: Value::Object(experience.info.clone()).to_string(),
    }
}

impl ExperienceOperator for OperatorPlugin {
    fn apply(&self, experiences: &[Experience], args: &Map<String, Value>) -> Result<OperatorOutput, String> {
        self.transform(experiences, args).map_err(|e| e.to_string())
    }
}
