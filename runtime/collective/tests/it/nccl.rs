//! Feature `nccl` (built by `cargo xtask test-cuda` after `cargo xtask setup --cuda`; CI does not build it): the
//! shim links libtorch_cuda and c10d's ProcessGroupNCCL. On a machine without a CUDA device, asking for NCCL is a
//! named error and the group is not built; the Gloo tests of this crate run in the same binary with the feature on.
//! On a machine with one, a world-size-1 group serves a CUDA tensor by NCCL and a CPU tensor by Gloo. The same
//! holds for the groups the data-parallel trainer and the weight sync build for CUDA tensors.

use std::time::Duration;

use tch::{Device, Kind, Tensor};
use trinity_collective::{
    CollectiveError, GroupOptions, ProcessGroup, ReduceOp, Store, WeightReceiver, WeightSender, WeightSyncOptions,
};

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

/// The group the data-parallel trainer builds for ranks on CUDA (`DistEnv::process_group_on`): NCCL beside Gloo,
/// or, with no device, the named error on every rank at once, never an abort or a hang.
#[test]
fn a_data_parallel_group_on_cuda_gets_nccl_or_a_named_error() {
    let env = trinity_collective::DistEnv {
        world_size: 1,
        rank: 0,
        local_rank: 0,
        local_world_size: None,
        node_rank: None,
        master_addr: "127.0.0.1".into(),
        master_port: 0,
    };
    let started = std::time::Instant::now();
    let result = env.process_group_on("trainer", Duration::from_secs(20), Device::Cuda(0));
    if tch::Cuda::device_count() == 0 {
        match result {
            Err(CollectiveError::Backend { op: "process group", message }) => {
                assert!(message.contains("NCCL needs a CUDA device"), "{message}");
            }
            other => panic!("a CUDA data-parallel group without a device must be refused by name, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(10));
        return;
    }
    let (_store, group) = result.unwrap();
    assert!(group.has_nccl());
    // Gradient buckets and the parameter broadcast as the trainer runs them: on the GPU, through NCCL.
    let mut grads: Vec<Tensor> =
        (0..3).map(|i| Tensor::full([1000 + i], 1.5, (Kind::Float, Device::Cuda(0)))).collect();
    group.allreduce_buckets(&mut grads, ReduceOp::Sum, 4096).unwrap();
    group.broadcast_buckets(&mut grads, 0, 4096).unwrap();
    for g in &grads {
        assert_eq!(g.device(), Device::Cuda(0));
        assert_eq!(g.sum(Kind::Float).double_value(&[]), 1.5 * g.numel() as f64);
    }
}

fn sync_options(tensors: Device) -> WeightSyncOptions {
    WeightSyncOptions { timeout: Duration::from_secs(20), bucket_bytes: 1 << 16, tensors, ..Default::default() }
}

/// Weight sync when both sides declare CUDA weights: NCCL, refused by name on both sides where no device is
/// visible. With a device (one GPU, so both sides cannot hold their own), a trainer on CUDA and an explorer on the
/// CPU: Gloo through host memory, values intact.
#[test]
fn weight_sync_between_cuda_sides_uses_nccl_or_is_refused_by_name_on_both_sides() {
    let has_device = tch::Cuda::device_count() > 0;
    let receiver_on = if has_device { Device::Cpu } else { Device::Cuda(0) };
    let sender_on = Device::Cuda(0);
    let mut sender = WeightSender::host("127.0.0.1", 0, 1, sync_options(sender_on)).unwrap();
    let port = sender.port();
    let receiver = std::thread::spawn(move || {
        let mut receiver = WeightReceiver::connect("127.0.0.1", port, sync_options(receiver_on))?;
        receiver.receive()
    });
    let weights: Vec<(String, Tensor)> = (0..4)
        .map(|i| {
            let t = Tensor::arange(20_000, (Kind::Float, Device::Cpu)) + i as f64;
            (format!("w{i}"), if has_device { t.to_device(sender_on) } else { t })
        })
        .collect();
    let sent = sender.publish(7, &weights);
    let received = receiver.join().unwrap();
    if !has_device {
        for (side, err) in [("sender", sent.unwrap_err()), ("receiver", received.unwrap_err())] {
            assert!(err.to_string().contains("NCCL needs a CUDA device"), "{side}: {err}");
        }
        return;
    }
    sent.unwrap();
    let (version, tensors) = received.unwrap();
    assert_eq!(version, 7);
    for ((name, got), (_, want)) in tensors.iter().zip(&weights) {
        assert_eq!(got.device(), Device::Cpu, "{name}");
        assert!(got.equal(&want.to_device(Device::Cpu)), "{name} differs");
    }
}
