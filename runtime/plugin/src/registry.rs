//! Loading plugin files and registering their names, so that configs use them exactly like built-ins.

use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::component::{PluginKind, compile};
use crate::engine::PluginLimits;
use crate::error::PluginError;
use crate::instance::PluginInfo;
use crate::operator::OperatorPlugin;
use crate::reward::RewardPlugin;
use crate::workflow::WorkflowPlugin;

/// A loaded plugin of any kind.
#[derive(Debug, Clone)]
pub enum Plugin {
    Reward(Arc<RewardPlugin>),
    Workflow(Arc<WorkflowPlugin>),
    Operator(Arc<OperatorPlugin>),
}

impl Plugin {
    /// Who the plugin is.
    pub fn info(&self) -> &PluginInfo {
        match self {
            Plugin::Reward(plugin) => plugin.info(),
            Plugin::Workflow(plugin) => plugin.info(),
            Plugin::Operator(plugin) => plugin.info(),
        }
    }
}

/// Reads, checks, compiles and instantiates the plugin at `path` (without registering it).
pub fn load(path: &Path, limits: PluginLimits) -> Result<Plugin, PluginError> {
    let (component, kind) = compile(path)?;
    Ok(match kind {
        PluginKind::Reward => Plugin::Reward(Arc::new(RewardPlugin::load(path, &component, limits)?)),
        PluginKind::Workflow => Plugin::Workflow(Arc::new(WorkflowPlugin::load(path, &component, limits)?)),
        PluginKind::Operator => Plugin::Operator(Arc::new(OperatorPlugin::load(path, &component, limits)?)),
    })
}

/// Plugins registered in this process, in registration order.
static REGISTERED: Mutex<Vec<PluginInfo>> = Mutex::new(Vec::new());

/// Registers `plugin` under its declared name with the workflow, reward or operator registry. A built-in of the
/// same name is an error unless `override_builtin`.
pub fn register(plugin: &Plugin, override_builtin: bool) -> Result<(), PluginError> {
    let info = plugin.info();
    let refused = |message: String| PluginError::Register {
        plugin: info.name.clone(),
        kind: info.kind.label(),
        message: format!("{message} ({})", info.path.display()),
    };
    match plugin {
        Plugin::Reward(reward) => {
            trinity_reward::register(&info.name, Arc::clone(reward) as _, override_builtin)
                .map_err(|e| refused(e.to_string()))?;
        }
        Plugin::Workflow(workflow) => {
            trinity_explorer::register_workflow(&info.name, Arc::clone(workflow) as _, override_builtin)
                .map_err(|e| refused(e.to_string()))?;
        }
        Plugin::Operator(operator) => {
            trinity_explorer::register_operator(&info.name, Arc::clone(operator) as _, override_builtin)
                .map_err(|e| refused(e.to_string()))?;
        }
    }
    REGISTERED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(info.clone());
    tracing::info!("plugin {} {} ({}) from {}", info.kind.label(), info.name, info.version, info.path.display());
    Ok(())
}

/// [`load`] then [`register`].
pub fn load_and_register(path: &Path, limits: PluginLimits, override_builtin: bool) -> Result<PluginInfo, PluginError> {
    let plugin = load(path, limits)?;
    register(&plugin, override_builtin)?;
    Ok(plugin.info().clone())
}

/// Every plugin registered so far.
pub fn registered() -> Vec<PluginInfo> {
    REGISTERED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
}
