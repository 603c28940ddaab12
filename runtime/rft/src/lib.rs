//! The RFT loop: Trinity-RFT's Explorer, Trainer and Synchronizer, and the modes that compose them.
//!
//! * [`explorer`]: draws tasks, runs workflows on the rollout engine, makes experiences, evaluates.
//! * `failed_tasks`: the run's record of the tasks that failed for good (`failed_tasks.jsonl`).
//! * [`trainer`]: consumes experiences (with the sample strategy) or dataset rows, writes checkpoints.
//! * [`synchronizer`]: when weights move and how (in place, or through a weight store on disk).
//! * [`modes`]: `both`/`colocate` (one process), and the decoupled modes.
//! * [`schedule`]: Trinity-RFT's `sync_interval` / `sync_offset` plan as a pure function.
//! * [`pipeline`]: the explorer-side experience pipeline (group advantages).
//! * [`dataset`], [`sft_data`], [`dpo_data`] and [`cpt_data`]: SFT, DPO and CPT datasets, tokenized as Trinity-RFT's
//!   formatters do.
//! * [`mix_strategy`]: the `mix` sample strategy's expert rows, read from an SFT dataset.
//! * `data_parallel`: `trinity run` under a launcher: rank 0 runs the mode, every rank trains.
//! * [`run`]: the entry point: a resolved config's mode in a job directory; [`stages`]: several, in order.

pub(crate) mod auxiliary;
pub mod cpt_data;
pub(crate) mod data_parallel;
pub mod dataset;
pub mod dpo_data;
pub mod error;
pub(crate) mod explorer;
pub(crate) mod failed_tasks;
pub(crate) mod json_file;
pub(crate) mod lora;
pub mod mix_strategy;
pub(crate) mod models;
pub(crate) mod modes;
pub mod pipeline;
pub(crate) mod rollout_metrics;
pub mod run;
pub mod schedule;
pub mod sft_data;
pub mod stages;
pub(crate) mod synchronizer;
pub(crate) mod trainer;
pub(crate) mod weight_group;

pub use error::RftError;
pub use run::{RunSummary, check_components, job_dir, launched, run};
pub use stages::run_stages;
