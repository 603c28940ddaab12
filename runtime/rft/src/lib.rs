//! The RFT loop: explorer, buffer, trainer and synchronizer wired together.
//!
//! * [`schedule`]: Trinity-RFT's `sync_interval` / `sync_offset` plan as a pure function.
//! * [`pipeline`]: the explorer-side experience pipeline (group advantages).
//! * [`mix_strategy`] and [`sft_data`]: the `mix` sample strategy's expert rows, read from an SFT dataset.
//! * [`run`]: mode `both` on one device with in-memory weight sync, evaluation, checkpoints and metrics.

pub mod error;
pub mod mix_strategy;
pub mod pipeline;
pub mod run;
pub mod schedule;
pub mod sft_data;

pub use error::RftError;
pub use run::{RunSummary, check_components, job_dir, run_both};
