//! trinity's buffer: what the explorer reads (tasks) and what it hands the trainer (experiences).
//!
//! * Tasks: [`reader`] loads a taskset (JSONL, JSON, Parquet, Hugging Face dataset directory) into rows,
//!   failing at load time with the file and line/row of a malformed row; [`Task`] is one row with its
//!   workflow, reward and rollout settings resolved; [`TaskScheduler`] hands out `batch_size` tasks per
//!   explore step from one or several tasksets through seeded [`selector`]s, with a serialisable
//!   [`SchedulerState`] for exact resume.
//! * Experiences: [`Experience`] (serde); [`ExperienceBuffer`] is the contract between explorer and trainer,
//!   opened from `trainer_input.experience_buffer`: in memory ([`ExperienceQueue`] with back-pressure), SQLite
//!   ([`SqliteStore`], processes on one machine, crash-safe) or PostgreSQL ([`PgStore`], several machines).
//!   Explorers store idempotent explore steps with their state; the trainer claims rows per train step and
//!   commits them once its checkpoint is durable ([`store`] has the rules). [`JsonlWriter`] appends every
//!   experience to the run's `experiences.jsonl`.
//!
//! How the loop uses it (mode `both`, one process):
//!
//! ```
//! # use std::path::Path;
//! # use std::time::Duration;
//! # use trinity_buffer::*;
//! # use trinity_config::buffer::{ExperienceBufferConfig, TasksetConfig};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<()> {
//! # let config = TasksetConfig { name: "demo".into(), repeat_times: Some(2), ..Default::default() };
//! # let rows = vec![serde_json::json!({"prompt": "1+1?", "response": "2"}).as_object().cloned().unwrap_or_default()];
//! // Start-up: load tasksets (normally `TaskScheduler::from_config(&config.buffer)`), restore a checkpoint.
//! let taskset = Taskset::from_rows(&config, rows, 0, false, Path::new("demo.jsonl"))?;
//! let mut scheduler = TaskScheduler::new(vec![taskset], 1, 1, None)?;
//! # let saved: Option<SchedulerState> = None;
//! if let Some(state) = saved {
//!     scheduler.restore(state)?;
//! }
//! let buffer = ExperienceBuffer::open(&ExperienceBufferConfig::default(), Path::new("buffer")).await?;
//! // Explorer: one batch of tasks per step; each task's group of `repeat_times` experiences goes in together,
//! // stored with the scheduler's position so that a restarted explorer continues after it.
//! let mut step = 0;
//! while let Some(tasks) = scheduler.next_batch()? {
//!     step += 1;
//!     let mut experiences = Vec::new();
//!     for (t, task) in tasks.iter().enumerate() {
//!         for run in 0..task.repeat_times as u64 {
//!             let eid = Eid { batch: task.batch_id, task: t as u64, run, step: 0 };
//!             let mut exp = Experience::single_turn(eid, vec![1, 2, 3], 2, vec![-0.5]);
//!             exp.reward = 1.0; // from trinity_reward::score(task.reward_fn, ...)
//!             experiences.push(exp);
//!         }
//!     }
//!     let state = serde_json::to_string(&scheduler.state()).unwrap_or_default();
//!     buffer.put_step("explorer", step, experiences, &state).await?;
//! }
//! // Trainer: `batch_size × repeat_times` experiences for train step 1, then commit once its checkpoint is saved.
//! let batch = buffer.get_batch_for_step(2, Duration::from_secs(1), 1).await?;
//! assert_eq!(batch.len(), 2);
//! buffer.commit_through(1).await?;
//! # Ok(())
//! # }
//! ```
//!
//! No tensors here: token ids and per-token floats are plain vectors, so this crate builds without libtorch.

pub mod difficulty_estimator;
pub mod error;
pub mod experience;
pub mod experience_buffer;
pub mod jsonl_writer;
mod memory_store;
mod payload;
mod postgres_connection;
mod postgres_schema;
pub mod postgres_store;
pub mod queue;
pub mod reader;
pub mod replay;
pub mod routed_experts;
pub mod scheduler;
pub mod selector;
mod sqlite_schema;
pub mod sqlite_store;
pub mod store;
pub mod task;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;

pub use crate::error::{BufferError, Result};
pub use crate::experience::{Eid, Experience, TruncateStatus};
pub use crate::experience_buffer::ExperienceBuffer;
pub use crate::jsonl_writer::{JsonlWriter, read_experiences};
pub use crate::postgres_store::PgStore;
pub use crate::queue::ExperienceQueue;
pub use crate::reader::{Taskset, load_eval_tasksets, read_rows};
pub use crate::replay::{ReplayBuffer, ReplayConfigError, ReplayStats, ReplayTake};
pub use crate::routed_experts::RoutedExperts;
pub use crate::scheduler::{SchedulerState, TaskScheduler};
pub use crate::selector::{Selector, SelectorKind};
pub use crate::sqlite_store::{SqliteStore, sqlite_url_path};
pub use crate::store::{DEFAULT_CONSUMER, DEFAULT_LEASE, ExploreStep, ProducerState, ProducerStatus};
pub use crate::task::{Row, Task};
