//! `synchronizer:` — how and when the trainer's weights reach the explorer.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Weight synchronisation between trainer and explorer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SynchronizerConfig {
    /// `memory` (in-place copy, one process), `checkpoint` (safetensors on disk), or `nccl` (Trinity-RFT's
    /// default; in one process it means `memory`; between an explorer and a trainer process, a process group:
    /// NCCL when both hold their weights on CUDA, else Gloo).
    pub sync_method: SyncMethod,
    /// Who waits for whom: `fixed` (every `sync_interval` steps), `explorer_driven`, `trainer_driven`,
    /// `fully_async`.
    pub sync_style: SyncStyle,
    /// Explore steps run on one set of weights.
    pub sync_interval: u32,
    /// Explore steps the explorer may run ahead of the trainer (one-step-off-policy with 1).
    pub sync_offset: u32,
    /// Seconds to wait for new weights, or for room in a full experience buffer, before failing; also the
    /// timeout of every collective between processes (on NCCL, c10d's watchdog ends the process when it passes).
    pub sync_timeout: u64,
    /// Unused by Trinity-RFT itself; kept for its configs.
    pub wait_for_checkpoint: bool,
    /// The explorer's own sync interval (Trinity-RFT 0.6.0; unset means `sync_interval`): it syncs after explore
    /// step `n` when `n > sync_offset` and `n − sync_offset` is a multiple of it, taking the newest weights the
    /// trainer published from the steps before, less the offset. Where the explorer waits for weights (`fixed`, or
    /// one process) it must be at least `trainer_sync_interval`.
    pub explorer_sync_interval: Option<u32>,
    /// The trainer's own sync interval (Trinity-RFT 0.6.0; unset means `sync_interval`): it publishes its weights
    /// after every this-many train steps.
    pub trainer_sync_interval: Option<u32>,
    /// Name of the NCCL weight-sync group (newer Trinity-RFT).
    pub group_name: Option<String>,
}

impl Default for SynchronizerConfig {
    fn default() -> Self {
        SynchronizerConfig {
            sync_method: SyncMethod::Nccl,
            sync_style: SyncStyle::Fixed,
            sync_interval: 1,
            sync_offset: 0,
            sync_timeout: 3600,
            wait_for_checkpoint: false,
            explorer_sync_interval: None,
            trainer_sync_interval: None,
            group_name: None,
        }
    }
}

impl SynchronizerConfig {
    /// `explorer_sync_interval`, else `sync_interval`.
    pub fn explorer_interval(&self) -> u32 {
        self.explorer_sync_interval.unwrap_or(self.sync_interval)
    }

    /// `trainer_sync_interval`, else `sync_interval`.
    pub fn trainer_interval(&self) -> u32 {
        self.trainer_sync_interval.unwrap_or(self.sync_interval)
    }

    /// The most explore steps whose experiences wait in the buffer at once when explorer and trainer alternate in
    /// one process (trinity-rft's `SyncSchedule::steps_buffered`, the same formula): the explorer runs
    /// `sync_offset` steps ahead, plus the step being stored, plus the train steps a sync point can wait for
    /// beyond those (`ti − gcd(ei, ti)`: none when the explorer's interval is a multiple of the trainer's).
    /// With `fully_async` it is the batches in flight, `max_inflight_batches`.
    pub fn steps_buffered(&self, max_inflight_batches: u32) -> u64 {
        if self.sync_style == SyncStyle::FullyAsync {
            return u64::from(max_inflight_batches.max(1));
        }
        steps_buffered(
            u64::from(self.explorer_interval()),
            u64::from(self.trainer_interval()),
            u64::from(self.sync_offset),
        )
    }
}

/// The formula of [`SynchronizerConfig::steps_buffered`] for the fixed-style plans, in one place: trinity-rft's
/// `SyncSchedule` (the order one process runs the two sides in) calls it too, so the runnable check and the run
/// cannot disagree. `offset + 1 + ti − gcd(ei, ti)`, each interval at least 1.
pub fn steps_buffered(explorer_interval: u64, trainer_interval: u64, offset: u64) -> u64 {
    let (explorer, trainer) = (explorer_interval.max(1), trainer_interval.max(1));
    let (mut a, mut b) = (explorer, trainer);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    offset + 1 + trainer - a
}

/// Weight transports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SyncMethod {
    /// Collective broadcast; the same as `memory` when explorer and trainer share one device.
    Nccl,
    /// Weights written as a checkpoint and read back (explorer and trainer in separate processes).
    Checkpoint,
    /// In-place tensor copy inside one process.
    Memory,
}

/// When synchronisation happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SyncStyle {
    /// Every `sync_interval` explore steps.
    Fixed,
    /// Whenever the explorer finishes its interval and new weights exist (Trinity-RFT's newer name:
    /// `explorer_driven`).
    #[serde(alias = "explorer_driven")]
    DynamicByExplorer,
    /// Whenever the trainer finishes a step (Trinity-RFT's newer name: `trainer_driven`).
    #[serde(alias = "trainer_driven")]
    DynamicByTrainer,
    /// Trinity-RFT 0.6.0: the explorer never waits for weights; it keeps up to `explorer.max_inflight_batches`
    /// train batches in flight and takes the trainer's weights as soon as they are published (every
    /// `trainer_sync_interval` steps). No eval tasksets.
    FullyAsync,
}

impl SyncStyle {
    /// The name configs use (Trinity-RFT's newer spelling).
    pub fn name(self) -> &'static str {
        match self {
            SyncStyle::Fixed => "fixed",
            SyncStyle::DynamicByExplorer => "explorer_driven",
            SyncStyle::DynamicByTrainer => "trainer_driven",
            SyncStyle::FullyAsync => "fully_async",
        }
    }
}
