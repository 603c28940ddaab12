//! `synchronizer.sync_method: nccl` between an explorer and a trainer in processes of their own (modes `explore`
//! and `train`): the trainer's weights go over a c10d process group (`trinity_collective`'s `WeightSender` /
//! `WeightReceiver`: layout sent once, bucketed double-buffered broadcast, a version handshake), instead of through
//! safetensors files.
//!
//! - **Devices.** NCCL when the trainer's weights and the explorer's engine are both on CUDA, device to device;
//!   Gloo when both are on the CPU; when one side is on CUDA and the other on the CPU, Gloo with the CUDA side
//!   copying each bucket to or from host memory, said once in the log (`trinity_collective::transport`). A
//!   process whose weights are on CUDA in a build without the `cuda` feature refuses `sync_method: nccl` at start,
//!   naming the rebuild.
//!
//! - **Rendezvous.** Trainer rank 0 hosts the group's store and writes where it listens to `<job>/sync/nccl.json`
//!   (the directory the pair shares anyway: buffer, checkpoints, the fallback files). It listens on
//!   `TRINITY_SYNC_ADDR` (else `MASTER_ADDR`, else 127.0.0.1) and `TRINITY_SYNC_PORT` (else a free port): set them
//!   when the explorer runs on another machine. One explorer process receives; more explorers sync through
//!   `checkpoint`.
//! - **Receiving.** The explorer receives on a thread of its own as soon as the trainer offers a version, so the
//!   trainer waits only for the transfer, not for the explorer's current step to end; the weights wait in host
//!   memory and the explorer applies the newest at its sync points, where its engine is between decode steps with
//!   no request in flight. Applying them in the middle of an explore step would mix two versions in one step and
//!   make the version stamps of its experiences untrue.
//! - **Fallback.** When the group fails (the explorer died, a transfer timed out after `sync_timeout`), the trainer
//!   logs it, removes `nccl.json` and publishes that version and every later one as checkpoint files in `<job>/sync/`;
//!   the explorer takes whichever of the two sources holds the newer version. A restarted trainer hosts a new group
//!   and writes a new `nccl.json`, which a waiting explorer joins.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tch::Tensor;
use trinity_collective::{GlooDevice, WeightReceiver, WeightSender, WeightSyncOptions};
use trinity_config::Config;

use crate::error::RftError;
use crate::json_file;

/// The file in `<job>/sync/` that says where the trainer's group meets.
pub(crate) const ADDRESS_FILE: &str = "nccl.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Address {
    host: String,
    port: u16,
}

fn options(config: &Config, host: &str, dtype: Option<tch::Kind>, tensors: tch::Device) -> WeightSyncOptions {
    WeightSyncOptions {
        timeout: Duration::from_secs(config.synchronizer.sync_timeout),
        device: GlooDevice::for_master(host),
        dtype,
        tensors,
        ..WeightSyncOptions::default()
    }
}

/// The trainer's side: hosts the group and sends each published version, until the group fails.
#[derive(Debug)]
pub(crate) struct GroupSender {
    sender: WeightSender,
    address_file: PathBuf,
}

impl GroupSender {
    /// Hosts the group's store and writes `<sync_dir>/nccl.json`. `dtype` is the explorer engine's (weights are
    /// converted while they are packed); `device` is where the trainer's weights are.
    pub(crate) fn host(
        config: &Config,
        sync_dir: &Path,
        dtype: tch::Kind,
        device: tch::Device,
    ) -> Result<GroupSender, RftError> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let host = env("TRINITY_SYNC_ADDR").or_else(|| env("MASTER_ADDR")).unwrap_or_else(|| "127.0.0.1".into());
        let port = match env("TRINITY_SYNC_PORT") {
            None => 0,
            Some(p) => p.trim().parse().map_err(|_| RftError::Setting {
                key: "synchronizer.sync_method",
                message: format!("TRINITY_SYNC_PORT {p:?} is not a TCP port"),
            })?,
        };
        let sender = WeightSender::host(&host, port, 1, options(config, &host, Some(dtype), device))?;
        let address_file = sync_dir.join(ADDRESS_FILE);
        json_file::write(&address_file, &Address { host: host.clone(), port: sender.port() })?;
        tracing::info!("weight sync (nccl): the explorer's group meets at {host}:{}", sender.port());
        Ok(GroupSender { sender, address_file })
    }

    /// Sends `version` and waits until the explorer holds it: `feed` hands the weights (`specs`: their names,
    /// dtypes and shapes, in order) to the sink part by part, and each bucket goes as soon as it is full. An error
    /// means the group failed or `feed` did: the caller falls back to checkpoint files (see
    /// [`GroupSender::abandon`]).
    pub(crate) fn publish_parts(
        &mut self,
        version: u64,
        specs: &[trinity_model::TensorSpec],
        feed: impl FnOnce(&mut trinity_collective::PartSink<'_>) -> Result<(), RftError>,
    ) -> Result<(), RftError> {
        let shapes = specs.iter().map(|spec| (spec.name.as_str(), spec.kind, spec.shape.clone()));
        let (fed, report) = self.sender.publish_parts(version, shapes, feed)?;
        fed?;
        tracing::info!(
            "weights of step {version} sent over the process group: {:.1} MB in {} buckets, {:.2} s",
            report.bytes as f64 / 1e6,
            report.buckets,
            report.seconds
        );
        Ok(())
    }

    /// Closes the group when no explorer is left to receive (they all finished).
    pub(crate) fn close(self) {
        tracing::info!("every explorer has finished: weight sync over the process group ends");
        let _ = std::fs::remove_file(&self.address_file);
    }

    /// Gives the group up after `error`: explorers stop looking for it.
    pub(crate) fn abandon(self, error: &RftError) {
        tracing::warn!(
            "weight sync over the process group failed ({error}); this and every later version go through \
             checkpoint files in {}",
            self.address_file.parent().map(Path::display).map(|d| d.to_string()).unwrap_or_default()
        );
        let _ = std::fs::remove_file(&self.address_file);
    }
}

/// Tensors by parameter name, as the engine takes them.
type NamedTensors = Vec<(String, Tensor)>;

/// The newest version received over the group, waiting to be applied.
#[derive(Debug, Default)]
struct Slot {
    version: Option<u64>,
    weights: Option<Vec<(String, Tensor)>>,
}

/// The explorer's side: a thread that joins the trainer's group (following `nccl.json`) and keeps the newest
/// version it received.
#[derive(Debug, Clone)]
pub(crate) struct GroupReceiver {
    slot: Arc<Mutex<Slot>>,
    received: Arc<AtomicU64>,
}

/// `received` holds version + 1 (0: nothing received yet).
const NOTHING: u64 = 0;

impl GroupReceiver {
    /// Starts the receiving thread for the trainer that publishes into `sync_dir`, for an engine on `device`.
    /// Fails at once when the engine is on CUDA and this build has no NCCL.
    pub(crate) fn start(config: &Config, sync_dir: &Path, device: tch::Device) -> Result<GroupReceiver, RftError> {
        trinity_collective::transport::check_build(device, "weight sync (synchronizer.sync_method: nccl)")?;
        let receiver = GroupReceiver { slot: Arc::default(), received: Arc::new(AtomicU64::new(NOTHING)) };
        let (this, config, dir) = (receiver.clone(), config.clone(), sync_dir.to_owned());
        let spawned = std::thread::Builder::new().name("weight-receiver".into()).spawn(move || {
            // Receiving only copies bytes: one libtorch thread, so no second OpenMP pool competes with the engine's.
            tch::set_num_threads(1);
            this.receive_forever(&config, &dir, device)
        });
        if let Err(e) = spawned {
            tracing::warn!("weight sync (nccl): cannot start the receiving thread ({e}); using checkpoint files");
        }
        Ok(receiver)
    }

    /// The newest version received over the group.
    pub(crate) fn version(&self) -> Option<u64> {
        self.received.load(Ordering::SeqCst).checked_sub(1)
    }

    /// The newest received weights, by the names the engine asks for; `None` when nothing new came.
    pub(crate) fn take(&self, names: &[String]) -> Result<Option<(u64, NamedTensors)>, RftError> {
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        let (Some(version), Some(weights)) = (slot.version, slot.weights.take()) else { return Ok(None) };
        let mut by_name: HashMap<String, Tensor> = weights.into_iter().collect();
        let weights = names
            .iter()
            .map(|name| {
                by_name.remove(name).map(|t| (name.clone(), t)).ok_or_else(|| {
                    RftError::Unsupported(format!(
                        "weight sync (nccl): the trainer sent no tensor `{name}`; are explorer and trainer running \
                         the same model?"
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some((version, weights)))
    }

    fn receive_forever(&self, config: &Config, dir: &Path, device: tch::Device) {
        let path = dir.join(ADDRESS_FILE);
        let mut last: Option<Address> = None;
        loop {
            // A new group: the first address, or another after the trainer restarted.
            let address = match json_file::read::<Address>(&path) {
                Ok(Some(address)) if last.as_ref() != Some(&address) => address,
                _ => {
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            };
            last = Some(address.clone());
            if let Err(e) = self.receive_from(config, &address, device) {
                tracing::warn!(
                    "weight sync over the process group at {}:{} failed ({e}); the explorer takes checkpoint files \
                     from {} until the trainer hosts a new group",
                    address.host,
                    address.port,
                    dir.display()
                );
            }
        }
    }

    /// Receives every version the trainer at `address` offers, until the group fails.
    fn receive_from(&self, config: &Config, address: &Address, device: tch::Device) -> Result<(), RftError> {
        let options = options(config, &address.host, None, device);
        let mut receiver = WeightReceiver::connect(&address.host, address.port, options)?;
        tracing::info!("weight sync (nccl): connected to the trainer's group at {}:{}", address.host, address.port);
        loop {
            let offered = receiver.offered_version()?;
            if offered.is_none() || offered == receiver.last_version() {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            let started = Instant::now();
            let (version, weights) = receiver.receive()?;
            let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
            *slot = Slot { version: Some(version), weights: Some(weights) };
            self.received.store(version + 1, Ordering::SeqCst);
            drop(slot);
            tracing::info!(
                "weights of step {version} received over the process group ({:.2} s)",
                started.elapsed().as_secs_f64()
            );
        }
    }
}
