//! Feature `nccl` (built by `cargo xtask test-cuda` after `cargo xtask setup --cuda`; CI does not build it): the
//! shim links libtorch_cuda and c10d's ProcessGroupNCCL. On a machine without a CUDA device, asking for NCCL is a
//! named error and the group is not built; the Gloo tests of this crate run in the same binary with the feature on.
//! On a machine with one, a world-size-1 group serves a CUDA tensor by NCCL and a CPU tensor by Gloo.

use std::time::Duration;

use tch::{Device, Kind, Tensor};
use trinity_collective::{CollectiveError, GroupOptions, ProcessGroup, ReduceOp, Store};

fn nccl_group() -> Result<ProcessGroup, CollectiveError> {
    let timeout = Duration::from_secs(20);
    let store = Store::server("127.0.0.1", 0, timeout).unwrap();
    let options = GroupOptions { timeout, nccl: true, ..GroupOptions::default() };
    ProcessGroup::new(&store.with_prefix("nccl-test").unwrap(), 0, 1, &options)
}

#[test]
fn nccl_group_serves_cuda_tensors_by_nccl_or_is_refused_without_a_device() {
    if tch::Cuda::device_count() == 0 {
        match nccl_group() {
            Err(CollectiveError::Backend { op: "process group", message }) => {
                assert!(message.contains("NCCL needs a CUDA device"), "{message}");
            }
            other => panic!("an NCCL group without a CUDA device must be refused by name, got {other:?}"),
        }
        return;
    }
    let group = nccl_group().unwrap();
    assert!(group.has_nccl());
    let mut on_gpu = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).to_device(Device::Cuda(0));
    group.allreduce(&mut on_gpu, ReduceOp::Sum).unwrap();
    assert_eq!(Vec::<f32>::try_from(on_gpu.to_device(Device::Cpu)).unwrap(), [1.0, 2.0, 3.0]);
    assert_eq!(on_gpu.device(), Device::Cuda(0));
    let mut on_cpu = Tensor::full([4], 2.5, (Kind::Float, Device::Cpu));
    group.broadcast(&mut on_cpu, 0).unwrap();
    assert_eq!(Vec::<f32>::try_from(on_cpu).unwrap(), [2.5; 4]);
    group.barrier().unwrap();
}

#[test]
fn a_group_without_nccl_still_has_no_nccl_backend_when_the_feature_is_on() {
    let timeout = Duration::from_secs(20);
    let store = Store::server("127.0.0.1", 0, timeout).unwrap();
    let group = ProcessGroup::new(
        &store.with_prefix("gloo-only").unwrap(),
        0,
        1,
        &GroupOptions { timeout, ..Default::default() },
    )
    .unwrap();
    assert!(!group.has_nccl());
    let mut t = Tensor::from_slice(&[4i64, 5]);
    group.allreduce(&mut t, ReduceOp::Max).unwrap();
    assert_eq!(Vec::<i64>::try_from(t).unwrap(), [4, 5]);
}
