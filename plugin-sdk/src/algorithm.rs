//! Algorithm libraries: RL components (advantage functions, policy losses, KL functions, entropy losses, presets)
//! written as plain Rust functions on `tch::Tensor`s, built as a `cdylib`, and loaded by trinity with
//! `--plugin libmy_algo.so` (or `plugins:` in the config). Their components are then used by name in configs and
//! `trinity algorithm eval` exactly like built-ins.
//!
//! ```text
//! use trinity_plugin_sdk::algorithm::{Args, Batch, Component, Error, Loss, Metrics, aggregate, scalar};
//!
//! /// −ℓ scaled by `scale`, aggregated with the configured mode.
//! fn scaled_nll(batch: &Batch<'_>, args: &Args) -> Result<Loss, Error> {
//!     let logprob = batch.need("logprob")?;
//!     let loss = aggregate(&(-logprob * args.f64("scale")?), batch.action_mask, args.str("loss_agg_mode")?)?;
//!     Ok(Loss { metrics: Metrics::from([("nll".to_owned(), scalar(&loss))]), loss })
//! }
//!
//! trinity_plugin_sdk::algorithm_library! {
//!     Component::policy_loss("scaled_nll", scaled_nll).arg("scale", 1.0).arg("loss_agg_mode", "token-mean"),
//! }
//! ```
//!
//! Rules a library lives by (the host checks what it can at load):
//! * Host and library link the same shared libtorch through the same tch ([`tch`] is re-exported: depend on
//!   this crate, not on tch). Never build a library with `LIBTORCH_STATIC`.
//! * Tensors in a [`Batch`] are borrowed from the host; return new tensors (`shallow_clone()` to return an input
//!   unchanged). Losses stay connected to `batch.logprob` so the host's backward pass reaches its model.
//! * Return errors rather than panicking; a panic is caught and reported as an error anyway.
//! * `inventory` registrations inside a library do not reach the host: the exported root module is the only door.

mod abi;
pub mod compat;
mod component;

pub use abi::{Library, LoadError, LoadedComponent, load};
pub use component::{
    AdvantageFn, Advantages, Args, Batch, Component, ComponentKind, EntropyLossFn, Error, KlFn, Loss, Metrics,
    PolicyLossFn, Preset, aggregate, scalar,
};
/// The tch the host links, for plugin code (`trinity_plugin_sdk::algorithm::tch::Tensor`).
pub use tch;

/// What the [`algorithm_library!`](crate::algorithm_library) macro expands to; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use super::abi::export::*;
}

/// Exports the library's components: write it once, at the crate root of a `cdylib`, with one [`Component`]
/// expression per component. The library's name and version are the crate's (`CARGO_PKG_NAME`,
/// `CARGO_PKG_VERSION`).
///
/// The expressions are evaluated when the host loads the library, not at compile time, so they may build
/// argument maps and presets freely.
#[macro_export]
macro_rules! algorithm_library {
    ($($component:expr),* $(,)?) => {
        /// The root-module header trinity looks up (abi_stable's loader symbol).
        #[doc(hidden)]
        #[unsafe(export_name = "_1as_0lib_1header_0root_bmodule_bloader")]
        pub static __TRINITY_ALGORITHM_LIBRARY: $crate::algorithm::__private::LibHeader = {
            extern "C" fn loader() -> $crate::algorithm::__private::RootModuleResult {
                $crate::algorithm::__private::root_module_result(
                    env!("CARGO_PKG_NAME"),
                    env!("CARGO_PKG_VERSION"),
                    || vec![$($component),*],
                )
            }
            $crate::algorithm::__private::header(loader)
        };
    };
}
