//! Collectives between processes on PyTorch's own distributed engine (c10d), from Rust.
//!
//! A small C++ shim (`csrc/collective.cpp`, C ABI, every exception caught and returned as a string) drives
//! libtorch's `TCPStore`, `PrefixStore` and `ProcessGroupGloo` (and `ProcessGroupNCCL` with the `nccl` feature);
//! this crate wraps them in a safe API on `tch::Tensor`s:
//!
//! - [`Store`]: the TCP key-value store processes meet on.
//! - [`ProcessGroup`]: broadcast, all-reduce (sum, average, max, min), all-gather, flat reduce-scatter and
//!   all-gather (the shards of sharded data parallel) and barrier, each ending within the group's timeout with an
//!   error, never a hang; bucketed variants for many tensors ([`bucket`]).
//! - [`DistEnv`]: torchrun's environment contract; [`launch`]: `trinity launch`, a static torchrun.
//! - [`WeightSender`] / [`WeightReceiver`]: the trainer's weights to explorer processes, bucketed and
//!   double-buffered, after a version handshake, the group rebuilt after a failure ([`weight_sync`]).
//!
//! CPU tensors always go through Gloo. With the `nccl` feature and `GroupOptions::nccl`, one group also holds an
//! NCCL backend and sends CUDA tensors through it; without it a CUDA tensor is copied to host memory, reduced or
//! broadcast by Gloo and copied back. [`transport`] decides which for a data-parallel group
//! ([`DistEnv::process_group_on`]) and the weight sync: NCCL wherever every side holds CUDA tensors, and a named
//! error in a build without NCCL. The feature needs `cargo xtask setup --cuda` (the CUDA wheels whose headers
//! the shim compiles against and whose libraries `libtorch_cuda.so` loads; docs/cuda.md) and is tested by
//! `cargo xtask test-cuda`, not by CI. It has been compiled, linked and its no-device error tested on a machine
//! without a GPU; no NCCL collective has run.

pub mod bucket;
pub mod env;
pub mod error;
mod ffi;
pub mod group;
pub mod launch;
mod rendezvous;
pub mod store;
pub mod transport;
pub mod weight_layout;
pub mod weight_sync;

pub use bucket::DEFAULT_BUCKET_BYTES;
pub use env::DistEnv;
pub use error::{CollectiveError, Result};
pub use group::{GlooDevice, GroupOptions, ProcessGroup, ReduceOp, Work};
pub use launch::{LaunchOptions, launch};
pub use store::Store;
pub use transport::{Placement, Transport};
pub use weight_sync::{PartSink, SyncReport, WeightReceiver, WeightSender, WeightSyncOptions};

#[cfg(feature = "test-support")]
pub mod testing;
