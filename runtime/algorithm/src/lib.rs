//! Trinity-RFT's algorithm components on libtorch (`tch`): advantage functions, policy losses, KL functions
//! (as reward penalty and as loss term), entropy terms, loss aggregation and the `algorithm_type` presets —
//! under Trinity-RFT's registry names, with its arguments, defaults, metric names and numbers.
//!
//! * Each component registers itself with `inventory` next to its code ([`advantage::AdvantageFnEntry`],
//!   [`policy_loss::PolicyLossFnEntry`], [`kl::KlFnEntry`], [`entropy::EntropyLossFnEntry`],
//!   [`preset::PresetEntry`]); [`registry`] finds them by name and [`registry::BuiltinCatalog`] shows them to
//!   the configuration.
//! * Arguments arrive as JSON maps; [`args::Args`] fills defaults (null = default) and rejects unknown names.
//! * Components from elsewhere join through [`external::ExternalComponents`], registered once into a
//!   process-global list that the registry consults after the built-ins. Algorithm libraries (`abi_stable`
//!   plugins built with trinity-plugin-sdk) are loaded by `trinity-algorithm-library`, which implements it, so
//!   this crate and its math never link the plugin ABI.
//! * [`eval::eval`] runs a set of components on a recorded batch (`trinity algorithm eval`), and
//!   [`registry::list`] lists everything (`trinity algorithm list`).
//!
//! Tensors are `f32` on the CPU, as Trinity-RFT's are. Batches are validated up front ([`batch::Batch`]), so the
//! tensor code never sees mismatched shapes; failures are [`AlgorithmError`] values naming the component, the
//! argument or the batch field.
//!
//! Where Trinity-RFT has a bug we do the correct thing and say so in the component's docs: DPO with several
//! pairs per micro-batch ([`policy_loss::dpo`]), the REC advantage on a group of one ([`advantage::rec`]), the
//! adaptive KL controller ([`kl`]) and MIX-CHORD with an empty part under seq-mean aggregation
//! ([`policy_loss::mix_chord`]).

pub mod advantage;
pub mod aggregation;
pub mod args;
pub mod batch;
pub mod entropy;
pub mod error;
pub mod eval;
pub mod external;
pub mod kl;
pub mod loss;
pub mod masked;
pub mod metrics;
pub mod policy_loss;
pub mod preset;
pub mod registry;
pub mod rollout_correction;

#[cfg(test)]
mod testing;

pub use aggregation::{AggCounts, LossAggMode};
pub use batch::Batch;
pub use error::AlgorithmError;
pub use eval::{EvalInput, EvalOutput, eval, eval_str};
pub use registry::{BuiltinCatalog, Kind, Listing, list};
