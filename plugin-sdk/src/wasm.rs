//! Writing trinity plugins as WebAssembly components.
//!
//! A plugin is a `cdylib` crate built with `cargo build --target wasm32-wasip2 --release`; the `.wasm` file is
//! what `trinity run --plugin` loads. Depend on this crate with the `wasm` feature, implement [`reward::Reward`],
//! [`workflow::Workflow`] or [`operator::Operator`], and export it with the matching macro (one per plugin):
//!
//! ```ignore
//! use trinity_plugin_sdk::wasm::reward::{Metric, Reward, Task, metric};
//!
//! struct ExactMatch;
//!
//! impl Reward for ExactMatch {
//!     const NAME: &'static str = "exact_match";
//!     const VERSION: &'static str = env!("CARGO_PKG_VERSION");
//!     fn score(task: &Task, response: &str) -> Result<Vec<Metric>, String> {
//!         let truth = task.truth.as_deref().ok_or("the task has no reference answer")?;
//!         Ok(vec![metric("accuracy", f64::from(u8::from(response.trim() == truth.trim())))])
//!     }
//! }
//!
//! trinity_plugin_sdk::export_reward!(ExactMatch);
//! ```
//!
//! The contract is the WIT package `trinity:plugin@0.1.1` in this crate's `wit/` folder; the host refuses a
//! plugin built against an incompatible version with a message naming both. Inside the sandbox a plugin has no
//! filesystem (unless the config grants a read-only directory, mounted at `/data`), no network, no environment,
//! a memory cap and a deadline per call; a panic traps the plugin and costs only the task or batch it was
//! working on.

pub mod operator;
pub mod reward;
pub mod workflow;

/// The bindings generator, for the export macros.
#[doc(hidden)]
pub use wit_bindgen;

pub use serde_json;

/// Parses a JSON object the host sent as text (`task.raw`, `task.args`, operator `args`); empty text is an
/// empty object.
pub fn json_object(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    if text.trim().is_empty() {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err(format!("expected a JSON object, found {text}")),
        Err(error) => Err(format!("invalid JSON: {error}")),
    }
}

/// Defines the shared helpers of one world's bindings module (they have their own copies of the WIT types).
macro_rules! world_helpers {
    () => {
        pub use bindings::trinity::plugin::log::Level;
        pub use bindings::trinity::plugin::types::{Message, Metric, PluginInfo, PluginKind, Task};

        /// A named number (a reward component or a metric).
        pub fn metric(name: impl Into<String>, value: f64) -> Metric {
            Metric { name: name.into(), value }
        }

        /// Writes `message` to the run's log, attributed to this plugin.
        pub fn log(level: Level, message: &str) {
            bindings::trinity::plugin::log::log(level, message);
        }

        /// The task's arguments (`reward_fn_args` or `workflow_args`) as a JSON object.
        pub fn task_args(
            task: &Task,
        ) -> Result<$crate::wasm::serde_json::Map<String, $crate::wasm::serde_json::Value>, String> {
            $crate::wasm::json_object(&task.args)
        }

        /// The task's taskset row as a JSON object.
        pub fn task_row(
            task: &Task,
        ) -> Result<$crate::wasm::serde_json::Map<String, $crate::wasm::serde_json::Value>, String> {
            $crate::wasm::json_object(&task.raw)
        }
    };
}
pub(crate) use world_helpers;
