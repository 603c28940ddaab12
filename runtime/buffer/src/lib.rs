//! trinity's buffer: what the explorer reads (tasks) and what it hands the trainer (experiences).
//!
//! * Tasks: [`reader`] loads a taskset (JSONL, JSON, Parquet, Hugging Face dataset directory) into rows,
//!   failing at load time with the file and line/row of a malformed row; [`Task`] is one row with its
//!   workflow, reward and rollout settings resolved; [`TaskScheduler`] hands out `batch_size` tasks per
//!   explore step from one or several tasksets through seeded [`selector`]s, with a serialisable
//!   [`SchedulerState`] for exact resume.
//! * Experiences: [`Experience`] (serde); [`ExperienceQueue`] is the bounded in-process queue with
//!   back-pressure; [`SqliteStore`] persists experiences crash-safely and lets explorer and trainer run as
//!   separate processes; [`JsonlWriter`] appends every experience to the run's `experiences.jsonl`;
//!   [`ExperienceBuffer`] opens the right one of these from `trainer_input.experience_buffer`.
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
//! let buffer = ExperienceBuffer::open(&ExperienceBufferConfig::default(), Path::new("buffer"))?;
//! // Explorer: one batch of tasks per step; each task's group of `repeat_times` experiences goes in together.
//! while let Some(tasks) = scheduler.next_batch()? {
//!     let mut experiences = Vec::new();
//!     for (t, task) in tasks.iter().enumerate() {
//!         for run in 0..task.repeat_times as u64 {
//!             let eid = Eid { batch: task.batch_id, task: t as u64, run, step: 0 };
//!             let mut exp = Experience::single_turn(eid, vec![1, 2, 3], 2, vec![-0.5]);
//!             exp.reward = 1.0; // from trinity_reward::score(task.reward_fn, ...)
//!             experiences.push(exp);
//!         }
//!     }
//!     buffer.put_batch(experiences).await?;
//!     // Checkpoint: save `scheduler.state()` (serde) with the weights.
//! }
//! // Trainer: `batch_size × repeat_times` experiences per step, none older than the allowed model version.
//! let batch = buffer.get_batch_within(2, Duration::from_secs(1), Some(0)).await?;
//! assert_eq!(batch.len(), 2);
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
pub mod queue;
pub mod reader;
pub mod replay;
pub mod scheduler;
pub mod selector;
pub mod sqlite_store;
pub mod task;

pub use crate::error::{BufferError, Result};
pub use crate::experience::{Eid, Experience, TruncateStatus};
pub use crate::experience_buffer::ExperienceBuffer;
pub use crate::jsonl_writer::{JsonlWriter, read_experiences};
pub use crate::queue::ExperienceQueue;
pub use crate::reader::{Taskset, load_eval_tasksets, read_rows};
pub use crate::replay::{ReplayBuffer, ReplayConfigError, ReplayStats, ReplayTake};
pub use crate::scheduler::{SchedulerState, TaskScheduler};
pub use crate::selector::{Selector, SelectorKind};
pub use crate::sqlite_store::{ExploreStep, SqliteStore, sqlite_url_path};
pub use crate::task::{Row, Task};
