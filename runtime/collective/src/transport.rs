//! Which backend carries tensors between processes, decided from where the tensors live and whether this build
//! has NCCL, so that the trainer and the weight sync decide it the same way and a CUDA run never falls back to
//! host copies without saying so.
//!
//! - **Data-parallel ranks** all hold their model on the same kind of device (each rank on its own GPU, or all on
//!   the CPU): CPU tensors go over Gloo, CUDA tensors over NCCL ([`for_ranks`]). A CUDA run in a build without
//!   NCCL is refused ([`CollectiveError::NeedsCudaBuild`]): staging every gradient bucket through host memory would
//!   make each step pay two PCIe copies per bucket and hide the reason the run is slow.
//! - **Weight sync** may join processes on different devices (a trainer on a GPU, an explorer on the CPU, or the
//!   reverse). NCCL needs a CUDA tensor on every rank, so it is used only when the sender and every receiver hold
//!   CUDA weights; otherwise the buckets are CPU tensors on Gloo and the CUDA side copies them to or from host
//!   memory ([`Transport::GlooStaged`], logged once). Each process checks its own build first ([`check_build`]):
//!   a process that holds CUDA weights needs NCCL compiled in, whatever its peers hold, so the refusal comes at
//!   start, on the side that can fix it, and never depends on who joined.

use tch::Device;

use crate::error::{CollectiveError, Result};

/// Whether this build of `trinity-collective` has NCCL (the `nccl` feature; the CLI's `cuda` feature).
pub const NCCL_BUILT: bool = cfg!(feature = "nccl");

/// How one set of transfers travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// CPU tensors over Gloo.
    Gloo,
    /// CUDA tensors over NCCL, device to device, with no host copy.
    Nccl,
    /// CPU buffers over Gloo, filled from or emptied into CUDA tensors on the side(s) that hold them.
    GlooStaged,
}

impl Transport {
    /// Whether the process group needs its NCCL backend.
    pub fn needs_nccl(self) -> bool {
        self == Transport::Nccl
    }

    /// The device the transfer buffers of a process whose tensors are on `device` live on.
    pub fn buffer_device(self, device: Device) -> Device {
        match self {
            Transport::Nccl => device,
            Transport::Gloo | Transport::GlooStaged => Device::Cpu,
        }
    }

    /// The name written to the store and to logs.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Gloo => "gloo",
            Transport::Nccl => "nccl",
            Transport::GlooStaged => "gloo-staged",
        }
    }

    /// The inverse of [`Transport::name`].
    pub fn parse(name: &str) -> Result<Transport> {
        match name {
            "gloo" => Ok(Transport::Gloo),
            "nccl" => Ok(Transport::Nccl),
            "gloo-staged" => Ok(Transport::GlooStaged),
            other => Err(CollectiveError::WeightSync(format!(
                "unknown transport {other:?} (a peer built from another version of trinity?)"
            ))),
        }
    }
}

/// Where a process's tensors live, as far as the choice of backend goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Cpu,
    Cuda,
}

impl Placement {
    pub fn of(device: Device) -> Placement {
        if device.is_cuda() { Placement::Cuda } else { Placement::Cpu }
    }

    /// The name written to the store.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Cpu => "cpu",
            Placement::Cuda => "cuda",
        }
    }

    /// The inverse of [`Placement::name`].
    pub fn parse(name: &str) -> Result<Placement> {
        match name {
            "cpu" => Ok(Placement::Cpu),
            "cuda" => Ok(Placement::Cuda),
            other => Err(CollectiveError::WeightSync(format!("a peer declared its tensors on {other:?}"))),
        }
    }
}

/// Fails when tensors on `device` need NCCL and this build has none; `what` names the work that needs it.
pub fn check_build(device: Device, what: &str) -> Result<()> {
    check_build_with(device, NCCL_BUILT, what)
}

fn check_build_with(device: Device, nccl_built: bool, what: &str) -> Result<()> {
    if device.is_cuda() && !nccl_built {
        return Err(CollectiveError::NeedsCudaBuild { what: what.to_owned() });
    }
    Ok(())
}

/// The backend of a data-parallel group whose ranks hold their tensors on `device` (see the module docs).
pub fn for_ranks(device: Device, what: &str) -> Result<Transport> {
    for_ranks_with(device, NCCL_BUILT, what)
}

fn for_ranks_with(device: Device, nccl_built: bool, what: &str) -> Result<Transport> {
    check_build_with(device, nccl_built, what)?;
    Ok(if device.is_cuda() { Transport::Nccl } else { Transport::Gloo })
}

/// The transport of a weight sync from a sender with `sender` placement to receivers with `receivers` (see the
/// module docs); every process has passed [`check_build`] already.
pub fn for_weight_sync(sender: Placement, receivers: &[Placement]) -> Transport {
    let everyone = || std::iter::once(sender).chain(receivers.iter().copied());
    if everyone().all(|p| p == Placement::Cuda) {
        Transport::Nccl
    } else if everyone().all(|p| p == Placement::Cpu) {
        Transport::Gloo
    } else {
        Transport::GlooStaged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_parallel_ranks_use_gloo_on_the_cpu_and_nccl_on_cuda() {
        assert_eq!(for_ranks_with(Device::Cpu, false, "dp").unwrap(), Transport::Gloo);
        assert_eq!(for_ranks_with(Device::Cpu, true, "dp").unwrap(), Transport::Gloo);
        assert_eq!(for_ranks_with(Device::Cuda(1), true, "dp").unwrap(), Transport::Nccl);
    }

    #[test]
    fn cuda_without_nccl_is_refused_with_the_rebuild_command() {
        let err = for_ranks_with(Device::Cuda(0), false, "data-parallel training").unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, CollectiveError::NeedsCudaBuild { .. }), "{err:?}");
        assert!(message.starts_with("data-parallel training holds CUDA tensors"), "{message}");
        assert!(message.contains("cargo xtask setup --cuda"), "{message}");
        assert!(message.contains("--features cuda"), "{message}");
        assert!(check_build_with(Device::Cuda(0), false, "weight sync").is_err());
        assert!(check_build_with(Device::Cuda(0), true, "weight sync").is_ok());
        assert!(check_build_with(Device::Cpu, false, "weight sync").is_ok());
    }

    #[test]
    fn weight_sync_uses_nccl_only_when_every_side_is_on_cuda() {
        use Placement::{Cpu, Cuda};
        assert_eq!(for_weight_sync(Cuda, &[Cuda]), Transport::Nccl);
        assert_eq!(for_weight_sync(Cuda, &[Cuda, Cuda]), Transport::Nccl);
        assert_eq!(for_weight_sync(Cpu, &[Cpu]), Transport::Gloo);
        assert_eq!(for_weight_sync(Cuda, &[Cpu]), Transport::GlooStaged);
        assert_eq!(for_weight_sync(Cpu, &[Cuda]), Transport::GlooStaged);
        assert_eq!(for_weight_sync(Cuda, &[Cuda, Cpu]), Transport::GlooStaged);
    }

    #[test]
    fn only_nccl_keeps_buffers_on_the_device() {
        assert_eq!(Transport::Nccl.buffer_device(Device::Cuda(2)), Device::Cuda(2));
        assert_eq!(Transport::GlooStaged.buffer_device(Device::Cuda(2)), Device::Cpu);
        assert_eq!(Transport::Gloo.buffer_device(Device::Cpu), Device::Cpu);
        assert!(Transport::Nccl.needs_nccl() && !Transport::GlooStaged.needs_nccl());
    }

    #[test]
    fn names_round_trip_and_unknown_ones_are_errors() {
        for t in [Transport::Gloo, Transport::Nccl, Transport::GlooStaged] {
            assert_eq!(Transport::parse(t.name()).unwrap(), t);
        }
        for p in [Placement::Cpu, Placement::Cuda] {
            assert_eq!(Placement::parse(p.name()).unwrap(), p);
        }
        assert!(Transport::parse("mpi").is_err());
        assert!(Placement::parse("mps").is_err());
        assert_eq!(Placement::of(Device::Cuda(3)), Placement::Cuda);
        assert_eq!(Placement::of(Device::Cpu), Placement::Cpu);
    }
}
