//! The trinity plugin SDK.
//!
//! Two kinds of plugin, two features, so a WASM guest never pulls libtorch and an algorithm library never pulls
//! the component bindings:
//! - `wasm`: reward functions, workflows and experience operators as WASM components;
//! - `algorithm`: RL algorithm components as `abi_stable` dynamic libraries sharing the host's libtorch.

#[cfg(feature = "wasm")]
pub mod wasm;

// The guest bindings' export macros name this crate by its public path, which must resolve inside it too.
#[cfg(feature = "wasm")]
extern crate self as trinity_plugin_sdk;

#[cfg(feature = "algorithm")]
pub mod algorithm;
