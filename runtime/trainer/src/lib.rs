//! The training engine of trinity: Trinity-RFT's trainer step (veRL's `update_policy`) on libtorch.
//!
//! How the RFT loop drives it:
//! ```text
//! let policy = trinity_model::load_model(path, Kind::Float /* or BFloat16: bf16 compute, fp32 masters */, device)?;
//! let components = Components::from_config(&config.algorithm)?;          // resolved config
//! let mut trainer = Trainer::new(policy.decoder, components, &config.algorithm.optimizer,
//!                                TrainerOptions::from_config(&config))?;  // reference/critic made as needed
//! loop {
//!     let rows: Vec<TrainRow> = /* experiences of one train step */;
//!     let metrics = trainer.train_step(&rows)?;                            // one optimizer step
//!     generation_decoder.copy_weights_from(trainer.policy())?;             // memory sync
//!     if save { /* HF weights of trainer.policy() */ trainer.save_state(&step_dir)?; }
//! }
//! // resume: build the trainer on the checkpoint's weights, then trainer.load_state(&step_dir, step)?
//! ```
//!
//! Modules, one concept each: [`batch`] (rows and padding), [`micro_batch`] (splitting by token budget),
//! [`logprobs`] (chunked head with a recomputing backward), [`optimizer`] (AdamW, clipping, state file),
//! [`lr_schedule`], [`reference`], [`critic`], [`components`] (the algorithm from its config),
//! [`trainer`] (the step), [`data_parallel`] (several ranks sharing each step over a process group) and
//! [`shared_rows`] (one rank handing the step's rows to the others).
//!
//! Data parallel (a launcher's `WORLD_SIZE` ranks, see `trinity_collective::DistEnv`):
//! ```text
//! let (_store, group) = env.process_group_on("trainer", timeout, device)?;      // every rank (NCCL on CUDA)
//! let mut trainer = Trainer::new(...)?;  trainer.load_state(...)?;              // as above, every rank
//! let mut trainer = trainer.with_process_group(group)?;                         // rank 0's state everywhere
//! let rows = share_rows(trainer.process_group().unwrap(), 0, (rank == 0).then_some(&rows[..]))?;
//! let metrics = trainer.train_step(&rows)?;                                     // same rows, same metrics
//! ```

/// Tests that draw from torch's global generator after seeding it hold this for as long as they draw: tests of one
/// process run at the same time, and a draw in another between the seed and its own would change its numbers.
#[cfg(test)]
pub(crate) fn torch_rng() -> std::sync::MutexGuard<'static, ()> {
    static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());
    RNG.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub mod batch;
pub mod components;
pub mod critic;
pub mod data_parallel;
pub mod error;
pub mod logprobs;
pub(crate) mod loss_weight;
pub mod lr_schedule;
pub mod memory;
pub mod micro_batch;
pub mod optimizer;
pub mod policy_stats;
pub mod recompute;
pub mod reference;
pub mod router_replay;
pub mod shared_rows;
pub mod trainer;

pub use batch::TrainRow;
pub use components::Components;
pub use critic::Critic;
pub use data_parallel::DataParallel;
pub use error::{Result, TrainerError};
pub use logprobs::HeadMode;
pub use lr_schedule::LrSchedule;
pub use memory::{StateMemory, TrainedParameters};
pub use micro_batch::MicroBatching;
pub use optimizer::zero::{ShardedMemory, ZeroStage};
pub use optimizer::{AdamW, AdamWSettings};
pub use recompute::ActivationRecompute;
pub use reference::ReferenceModel;
pub use router_replay::RoutedExperts;
pub use shared_rows::share_rows;
pub use trainer::{StartingModels, StepMetrics, Trainer, TrainerOptions};
