//! Operator plugins: transform one explore step's experiences (filter, reorder, reshape rewards, add fields).
//!
//! The plugin sees a view of each experience (no tokens) and answers with updates that name their source
//! experience, so it can drop, reorder or repeat experiences and change rewards, metrics and info, but never
//! corrupt token sequences.

use std::path::Path;
use std::sync::Arc;

use serde_json::{Map, Value};
use trinity_buffer::Experience;
use trinity_explorer::{ExperienceOperator, OperatorOutput};
use wasmtime::Store;
use wasmtime::component::{Component, HasSelf, Linker};

use crate::bindings::operator::exports::trinity::plugin::operator as export;
use crate::bindings::operator::{OperatorPlugin as Operator, OperatorPluginPre as OperatorPre};
use crate::bindings::types;
use crate::component::PluginKind;
use crate::engine::{PluginLimits, StoreState, engine};
use crate::error::PluginError;
use crate::instance::{PluginInfo, call_error, metrics_map, new_store};
use crate::worker::Worker;

/// A loaded operator plugin.
pub struct OperatorPlugin {
    info: PluginInfo,
    worker: Worker<Loaded>,
    setup: Arc<Setup>,
}

impl std::fmt::Debug for OperatorPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorPlugin").field("info", &self.info).finish_non_exhaustive()
    }
}

struct Setup {
    name: String,
    path: std::path::PathBuf,
    limits: PluginLimits,
    pre: OperatorPre<StoreState<()>>,
}

struct Loaded {
    store: Store<StoreState<()>>,
    bindings: Operator,
}

impl Setup {
    fn instantiate(&self) -> Result<Loaded, PluginError> {
        let mut store = new_store(&self.name, &self.limits, (), &self.path)?;
        let bindings = self.pre.instantiate(&mut store).map_err(|e| call_error(&self.name, &self.limits, &e))?;
        Ok(Loaded { store, bindings })
    }
}

impl OperatorPlugin {
    pub(crate) fn load(path: &Path, component: &Component, limits: PluginLimits) -> Result<Self, PluginError> {
        let link = |e: wasmtime::Error| PluginError::Link { path: path.to_owned(), message: format!("{e:#}") };
        let mut linker = Linker::new(engine()?);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(link)?;
        Operator::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state).map_err(link)?;
        let pre = OperatorPre::new(linker.instantiate_pre(component).map_err(link)?).map_err(link)?;
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
                let info = PluginInfo::from_guest(&owned_path, PluginKind::Operator, info)?;
                loaded.store.data_mut().plugin = info.name.clone();
                *slot = Some(loaded);
                Ok::<_, PluginError>(info)
            })
            .ok_or_else(|| PluginError::Engine { message: "the plugin's worker thread ended".into() })??;
        let setup = Arc::new(Setup { name: info.name.clone(), path: path.to_owned(), limits, pre });
        Ok(OperatorPlugin { info, worker, setup })
    }

    /// Who the plugin is.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    /// Runs the operator over `experiences`.
    pub fn transform(
        &self,
        experiences: &[Experience],
        args: &Map<String, Value>,
    ) -> Result<OperatorOutput, PluginError> {
        let name = self.info.name.clone();
        let views: Vec<export::ExperienceView> = experiences.iter().map(view).collect();
        let args = Value::Object(args.clone()).to_string();
        let setup = Arc::clone(&self.setup);
        let output = self
            .worker
            .call(move |slot: &mut Option<Loaded>| {
                let loaded = match slot {
                    Some(loaded) => loaded,
                    None => slot.insert(setup.instantiate()?),
                };
                loaded.store.set_epoch_deadline(setup.limits.deadline_ticks());
                match loaded.bindings.trinity_plugin_operator().call_apply(&mut loaded.store, &views, &args) {
                    Ok(Ok(output)) => Ok(output),
                    Ok(Err(message)) => Err(PluginError::Guest { plugin: setup.name.clone(), message }),
                    Err(error) => {
                        *slot = None;
                        Err(call_error(&setup.name, &setup.limits, &error))
                    }
                }
            })
            .ok_or_else(|| PluginError::Engine { message: "the plugin's worker thread ended".into() })??;
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
        Ok(OperatorOutput { experiences: out, metrics })
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
