//! The WASM plugin host: reward functions, workflows and experience operators as sandboxed components.
//!
//! A plugin is a WebAssembly component built against the `trinity:plugin` WIT package (`plugin-sdk/wit`). It
//! declares its name, kind and version; [`load_and_register`] compiles it once (through an on-disk cache),
//! pre-links it once, and registers its name with the workflow, reward or operator registry, where configs find
//! it exactly like a built-in.
//!
//! Isolation, the reason for WASM: every instance lives in its own Store with one memory budget for all its
//! memories and tables, capped instance/memory/table counts and a deadline (epoch interruption) from
//! [`PluginLimits`]; no filesystem, network or environment unless the config grants a read-only directory; its
//! stdout and stderr captured, capped and logged under its name. A trap poisons its Store, so the host drops the
//! Store and instantiates afresh; the failure costs the task or batch that was running, named in the error
//! ([`PluginError`]), and the run goes on. Workflows also have a model budget (calls and generated tokens per
//! task) and may return at most one experience per model turn (or per rollout). (Native algorithm libraries
//! cannot be sandboxed; the binary refuses limits given for one.)
//!
//! * [`component`]: reading a file, the WIT version check, finding the kind.
//! * [`RewardPlugin`] / [`OperatorPlugin`]: synchronous calls on a pool of worker threads, each owning a Store.
//! * [`WorkflowPlugin`]: a fresh Store per task; the `model` interface is async, so the generation engine
//!   batches the requests of every workflow in flight.

mod bindings;
pub mod build;
pub mod component;
mod conversation;
mod engine;
mod error;
mod instance;
mod limits;
mod operator;
mod output;
mod registry;
mod reward;
mod synchronous;
mod worker;
mod workflow;

pub use component::{PluginKind, WIT_COMPATIBLE, WIT_VERSION};
pub use engine::PluginLimits;
pub use error::PluginError;
pub use instance::PluginInfo;
pub use operator::OperatorPlugin;
pub use registry::{Plugin, load, load_and_register, register, registered};
pub use reward::{RewardPlugin, RewardTask};
pub use workflow::WorkflowPlugin;
