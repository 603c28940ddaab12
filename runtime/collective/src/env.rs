//! torchrun's environment contract: how a launcher tells each process who it is.
//!
//! torchrun (and `trinity launch`, Slurm or Kubernetes scripts written for PyTorch) set, per process:
//! `WORLD_SIZE` (processes in all), `RANK` (this one's index), `LOCAL_RANK` (its index on this machine, which
//! picks its GPU), `MASTER_ADDR` / `MASTER_PORT` (where rank 0 hosts the store). `LOCAL_WORLD_SIZE` and
//! `GROUP_RANK` (the node's index) come along and are optional here.
//!
//! None of them set means "not launched": one process. Some set and others missing is an error naming what is
//! missing, because guessing would start a group that waits for processes nobody started. At world size 1 the
//! master address and port may be left out.

use std::time::Duration;

use tch::Device;

use crate::error::{CollectiveError, Result};
use crate::group::{GlooDevice, GroupOptions, ProcessGroup};
use crate::store::Store;
use crate::transport;

/// The variables [`DistEnv::from_env`] reads.
pub const VARIABLES: [&str; 5] = ["WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"];

/// Who this process is in a launched job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistEnv {
    pub world_size: usize,
    pub rank: usize,
    pub local_rank: usize,
    /// Processes on this machine (`LOCAL_WORLD_SIZE`), when the launcher says.
    pub local_world_size: Option<usize>,
    /// This machine's index among the nodes (`GROUP_RANK`), when the launcher says.
    pub node_rank: Option<usize>,
    pub master_addr: String,
    pub master_port: u16,
}

impl DistEnv {
    /// Reads the process environment; `Ok(None)` when none of [`VARIABLES`] is set.
    pub fn from_env() -> Result<Option<DistEnv>> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// Reads the variables through `get` (the process environment in [`DistEnv::from_env`]).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<DistEnv>> {
        let value = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        if VARIABLES.iter().all(|k| value(k).is_none()) {
            return Ok(None);
        }
        let number = |k: &'static str| -> Result<Option<usize>> {
            value(k)
                .map(|v| {
                    v.trim().parse::<usize>().map_err(|_| CollectiveError::Environment {
                        variable: k,
                        problem: format!("{v:?} is not a non-negative integer"),
                    })
                })
                .transpose()
        };
        let world_size = number("WORLD_SIZE")?;
        let rank = number("RANK")?;
        let local_rank = number("LOCAL_RANK")?;
        let single = world_size == Some(1);
        let mut missing: Vec<&str> = Vec::new();
        for (k, set) in [("WORLD_SIZE", world_size.is_some()), ("RANK", rank.is_some())] {
            if !set {
                missing.push(k);
            }
        }
        if local_rank.is_none() && !single {
            missing.push("LOCAL_RANK");
        }
        for k in ["MASTER_ADDR", "MASTER_PORT"] {
            if value(k).is_none() && !single {
                missing.push(k);
            }
        }
        if let Some(first) = missing.first() {
            let set: Vec<&str> = VARIABLES.iter().copied().filter(|k| value(k).is_some()).collect();
            return Err(CollectiveError::Environment {
                variable: first,
                problem: format!(
                    "{} set but {} missing; a launcher (torchrun, `trinity launch`) sets all five, or set none to \
                     run one process",
                    set.join(", "),
                    missing.join(", ")
                ),
            });
        }
        let (world_size, rank) = (world_size.unwrap_or(1), rank.unwrap_or(0));
        if world_size == 0 {
            return Err(CollectiveError::Environment { variable: "WORLD_SIZE", problem: "must be at least 1".into() });
        }
        if rank >= world_size {
            return Err(CollectiveError::Environment {
                variable: "RANK",
                problem: format!("{rank} is not below WORLD_SIZE {world_size}"),
            });
        }
        let local_world_size = number("LOCAL_WORLD_SIZE")?;
        let local_rank = local_rank.unwrap_or(0);
        if let Some(n) = local_world_size
            && local_rank >= n
        {
            return Err(CollectiveError::Environment {
                variable: "LOCAL_RANK",
                problem: format!("{local_rank} is not below LOCAL_WORLD_SIZE {n}"),
            });
        }
        let master_port = match value("MASTER_PORT") {
            None => 0,
            Some(p) => p.trim().parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| {
                CollectiveError::Environment { variable: "MASTER_PORT", problem: format!("{p:?} is not a TCP port") }
            })?,
        };
        Ok(Some(DistEnv {
            world_size,
            rank,
            local_rank,
            local_world_size,
            node_rank: number("GROUP_RANK")?,
            master_addr: value("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into()).trim().to_owned(),
            master_port,
        }))
    }

    /// The variables a launcher sets for this process (torchrun's names).
    pub fn to_vars(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![
            ("WORLD_SIZE", self.world_size.to_string()),
            ("RANK", self.rank.to_string()),
            ("LOCAL_RANK", self.local_rank.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.master_port.to_string()),
        ];
        if let Some(n) = self.local_world_size {
            vars.push(("LOCAL_WORLD_SIZE", n.to_string()));
        }
        if let Some(n) = self.node_rank {
            vars.push(("GROUP_RANK", n.to_string()));
        }
        vars
    }

    /// The job's store: rank 0 hosts it on `MASTER_PORT`, the others connect to `MASTER_ADDR:MASTER_PORT`.
    pub fn store(&self, timeout: Duration) -> Result<Store> {
        if self.rank == 0 {
            Store::server(&self.master_addr, self.master_port, timeout)
        } else {
            Store::client(&self.master_addr, self.master_port, timeout)
        }
    }

    /// The job's store and the process group of all its ranks, formed under the store prefix `name` (a second
    /// group on the same store needs another name). Gloo binds to the device [`GlooDevice::for_master`] picks.
    /// For ranks whose tensors are on the CPU; see [`DistEnv::process_group_on`].
    pub fn process_group(&self, name: &str, timeout: Duration) -> Result<(Store, ProcessGroup)> {
        self.process_group_on(name, timeout, Device::Cpu)
    }

    /// [`DistEnv::process_group`] for ranks whose tensors are on `device`: with CUDA the group also gets its NCCL
    /// backend, so those tensors never pass through host memory ([`transport::for_ranks`]; a build without NCCL
    /// is refused before anything connects, so every rank fails the same way at once instead of waiting).
    pub fn process_group_on(&self, name: &str, timeout: Duration, device: Device) -> Result<(Store, ProcessGroup)> {
        let nccl = transport::for_ranks(device, "data-parallel training")?.needs_nccl();
        let store = self.store(timeout)?;
        let options =
            GroupOptions { timeout, device: GlooDevice::for_master(&self.master_addr), nccl, ..Default::default() };
        let group = ProcessGroup::new(&store.with_prefix(name)?, self.rank, self.world_size, &options)?;
        Ok((store, group))
    }

    /// The device of this rank's model, given the device a single process would use (`auto`): its own GPU,
    /// `cuda:LOCAL_RANK`, as torchrun pins ranks, or the CPU. `cuda_devices` is how many this process sees. A local
    /// rank past them is an error, not a shared GPU: NCCL refuses two ranks on one device.
    pub fn rank_device(&self, auto: Device, cuda_devices: usize) -> Result<Device> {
        if !auto.is_cuda() {
            return Ok(auto);
        }
        if self.local_rank >= cuda_devices {
            return Err(CollectiveError::Environment {
                variable: "LOCAL_RANK",
                problem: format!(
                    "is {} but this process sees {cuda_devices} CUDA device(s); start at most {cuda_devices} \
                     processes per machine (--nproc-per-node) or make one GPU visible per rank",
                    self.local_rank
                ),
            });
        }
        Ok(Device::Cuda(self.local_rank))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<Option<DistEnv>> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        DistEnv::from_vars(|k| map.get(k).cloned())
    }

    #[test]
    fn nothing_set_is_one_process() {
        assert_eq!(read(&[]).unwrap(), None);
    }

    #[test]
    fn torchrun_sets_everything() {
        let env = read(&[
            ("WORLD_SIZE", "4"),
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("GROUP_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((env.world_size, env.rank, env.local_rank, env.node_rank), (4, 3, 1, Some(1)));
        assert_eq!((env.master_addr.as_str(), env.master_port), ("10.0.0.1", 29500));
        let again = read(&env.to_vars().iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>()).unwrap();
        assert_eq!(again, Some(env));
    }

    #[test]
    fn partial_settings_name_what_is_missing() {
        let err = read(&[("WORLD_SIZE", "2"), ("RANK", "0")]).unwrap_err().to_string();
        assert!(err.contains("LOCAL_RANK, MASTER_ADDR, MASTER_PORT missing"), "{err}");
        let err = read(&[("MASTER_ADDR", "h"), ("MASTER_PORT", "1")]).unwrap_err().to_string();
        assert!(err.contains("WORLD_SIZE, RANK, LOCAL_RANK missing"), "{err}");
        // World size 1 needs no master.
        let env = read(&[("WORLD_SIZE", "1"), ("RANK", "0")]).unwrap().unwrap();
        assert_eq!((env.world_size, env.local_rank), (1, 0));
    }

    #[test]
    fn bad_values_are_errors() {
        let base = [("LOCAL_RANK", "0"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "29500")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            read(&v).unwrap_err().to_string()
        };
        assert!(with(&[("WORLD_SIZE", "2"), ("RANK", "2")]).contains("not below WORLD_SIZE 2"));
        assert!(with(&[("WORLD_SIZE", "two"), ("RANK", "0")]).contains("not a non-negative integer"));
        assert!(with(&[("WORLD_SIZE", "0"), ("RANK", "0")]).contains("at least 1"));
        let err = read(&[
            ("WORLD_SIZE", "2"),
            ("RANK", "0"),
            ("LOCAL_RANK", "0"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "99999"),
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("not a TCP port"), "{err}");
    }

    #[test]
    fn each_rank_takes_the_gpu_of_its_local_rank() {
        let vars = |local: &str| {
            read(&[
                ("WORLD_SIZE", "4"),
                ("RANK", "3"),
                ("LOCAL_RANK", local),
                ("MASTER_ADDR", "10.0.0.1"),
                ("MASTER_PORT", "29500"),
            ])
            .unwrap()
            .unwrap()
        };
        assert_eq!(vars("1").rank_device(Device::Cuda(0), 2).unwrap(), Device::Cuda(1));
        assert_eq!(vars("1").rank_device(Device::Cpu, 0).unwrap(), Device::Cpu);
        let err = vars("2").rank_device(Device::Cuda(0), 2).unwrap_err().to_string();
        assert!(err.contains("LOCAL_RANK") && err.contains("sees 2 CUDA device(s)"), "{err}");
    }

    #[cfg(not(feature = "nccl"))]
    #[test]
    fn a_cuda_group_in_a_build_without_nccl_is_refused_before_connecting() {
        // Port 1 on a documentation address: the refusal must come before any connection is tried.
        let env = read(&[
            ("WORLD_SIZE", "2"),
            ("RANK", "1"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "192.0.2.1"),
            ("MASTER_PORT", "1"),
        ])
        .unwrap()
        .unwrap();
        let started = std::time::Instant::now();
        let err = env.process_group_on("trainer", Duration::from_secs(60), Device::Cuda(1)).unwrap_err();
        assert!(matches!(err, CollectiveError::NeedsCudaBuild { .. }), "{err:?}");
        assert!(err.to_string().contains("--features cuda"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
