//! What every plugin kind shares: its identity, the Store set-up, and turning a failed call into a named error.

use std::path::PathBuf;

use wasmtime::Store;

use crate::bindings::types;
use crate::component::PluginKind;
use crate::engine::{PluginLimits, StoreState, engine};
use crate::error::PluginError;
use crate::limits::OverBudget;

/// Who a loaded plugin is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    /// The name configs use.
    pub name: String,
    pub kind: PluginKind,
    /// The plugin's own version.
    pub version: String,
    /// One line about what it does.
    pub description: String,
    /// The file it was loaded from.
    pub path: PathBuf,
}

impl PluginInfo {
    /// Checks what the plugin declared against what it exports.
    pub(crate) fn from_guest(
        path: &std::path::Path,
        exported: PluginKind,
        info: types::PluginInfo,
    ) -> Result<PluginInfo, PluginError> {
        let declared = match info.kind {
            types::PluginKind::Reward => PluginKind::Reward,
            types::PluginKind::Workflow => PluginKind::Workflow,
            types::PluginKind::Operator => PluginKind::Operator,
        };
        if declared != exported {
            return Err(PluginError::KindMismatch {
                path: path.to_owned(),
                declared: declared.label(),
                exported: exported.label(),
            });
        }
        let bad = |message: String| PluginError::BadInfo { path: path.to_owned(), message };
        let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        if info.name.is_empty() || !info.name.chars().all(valid_char) {
            return Err(bad(format!("name {:?} must be non-empty ASCII letters, digits, `_`, `-` or `.`", info.name)));
        }
        if info.version.trim().is_empty() {
            return Err(bad(format!("plugin `{}` declares no version", info.name)));
        }
        Ok(PluginInfo {
            name: info.name,
            kind: declared,
            version: info.version,
            description: info.description,
            path: path.to_owned(),
        })
    }
}

/// A fresh Store with the plugin's memory limit and its granted folder; the caller arms the deadline.
pub(crate) fn limited_store<X: Send>(
    plugin: &str,
    limits: &PluginLimits,
    extra: X,
    path: &std::path::Path,
) -> Result<Store<StoreState<X>>, PluginError> {
    let state = StoreState::new(plugin, limits, extra).map_err(|message| PluginError::Grant {
        path: path.to_owned(),
        dir: limits.allow_dir.clone().unwrap_or_default(),
        message,
    })?;
    let mut store = Store::new(engine()?, state);
    store.limiter(|state| &mut state.limiter);
    Ok(store)
}

/// A fresh Store ([`limited_store`]) with a deadline that traps (synchronous calls).
pub(crate) fn new_store<X: Send>(
    plugin: &str,
    limits: &PluginLimits,
    extra: X,
    path: &std::path::Path,
) -> Result<Store<StoreState<X>>, PluginError> {
    let mut store = limited_store(plugin, limits, extra, path)?;
    store.set_epoch_deadline(limits.deadline_ticks());
    store.epoch_deadline_trap();
    Ok(store)
}

/// Marks a call stopped by the workflow deadline callback.
#[derive(Debug, thiserror::Error)]
#[error("deadline exceeded")]
pub(crate) struct DeadlineExceeded;

/// Names what went wrong in a call that failed on the host side of the boundary (a trap, the deadline, the
/// memory budget, the model budget). The Store of such a call is poisoned and must be dropped. Limits are
/// recognised by the error types our own limiter and callbacks raise, never by wasmtime's wording.
pub(crate) fn call_error(plugin: &str, limits: &PluginLimits, error: &wasmtime::Error) -> PluginError {
    let trap = error.downcast_ref::<wasmtime::Trap>();
    if trap == Some(&wasmtime::Trap::Interrupt) || error.is::<DeadlineExceeded>() {
        return PluginError::Deadline { plugin: plugin.to_owned(), seconds: limits.call_timeout.as_secs_f64() };
    }
    if let Some(over) = error.downcast_ref::<OverBudget>() {
        return PluginError::Memory {
            plugin: plugin.to_owned(),
            limit_mib: limits.memory_mib(),
            message: over.to_string(),
        };
    }
    if let Some(budget) = error.downcast_ref::<ModelBudgetExceeded>() {
        return PluginError::ModelBudget { plugin: plugin.to_owned(), message: budget.to_string() };
    }
    let message = match trap {
        Some(trap) => trap.to_string(),
        None => format!("{error:#}").lines().next().unwrap_or_default().to_owned(),
    };
    PluginError::Trap { plugin: plugin.to_owned(), message }
}

/// A workflow went past its model budget ([`PluginLimits::max_model_calls`], [`PluginLimits::max_model_tokens`]):
/// the host call traps with this, so a plugin cannot ignore the refusal and keep asking.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct ModelBudgetExceeded(pub(crate) String);

/// A metric list from the guest as a map, refusing non-finite values and repeated names.
pub(crate) fn metrics_map(
    plugin: &str,
    what: &str,
    metrics: Vec<types::Metric>,
) -> Result<std::collections::BTreeMap<String, f64>, PluginError> {
    let mut map = std::collections::BTreeMap::new();
    for metric in metrics {
        if !metric.value.is_finite() {
            return Err(PluginError::Output {
                plugin: plugin.to_owned(),
                message: format!("{what}: `{}` is {}", metric.name, metric.value),
            });
        }
        if map.insert(metric.name.clone(), metric.value).is_some() {
            return Err(PluginError::Output {
                plugin: plugin.to_owned(),
                message: format!("{what}: `{}` appears twice", metric.name),
            });
        }
    }
    Ok(map)
}
