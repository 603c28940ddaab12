//! Correctness of every collective across 2 and 3 processes, in f32 and bf16.

use std::time::Duration;

use tch::{Device, Kind, Tensor};
use trinity_collective::testing::assert_all_succeeded;
use trinity_collective::{ProcessGroup, ReduceOp};

use crate::spawn;

fn values(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.to_kind(Kind::Float).view([-1])).unwrap()
}

/// Runs in every rank: checks each collective against what it must produce.
pub(crate) fn run(group: &ProcessGroup) {
    let (rank, world) = (group.rank() as f32, group.world_size() as f32);
    let sum_of_ranks: f32 = (0..group.world_size()).map(|r| r as f32).sum();
    for kind in [Kind::Float, Kind::BFloat16] {
        // allreduce: rank r holds [r, r+1, 2r]; bf16 holds these small integers exactly.
        let mine = || Tensor::from_slice(&[rank, rank + 1.0, 2.0 * rank]).to_kind(kind);
        let mut t = mine();
        group.allreduce(&mut t, ReduceOp::Sum).unwrap();
        assert_eq!(values(&t), vec![sum_of_ranks, sum_of_ranks + world, 2.0 * sum_of_ranks], "{kind:?} sum");
        let mut t = mine();
        group.allreduce(&mut t, ReduceOp::Avg).unwrap();
        let mean = sum_of_ranks / world;
        assert_eq!(values(&t), vec![mean, mean + 1.0, 2.0 * mean], "{kind:?} avg");
        let mut t = mine();
        group.allreduce(&mut t, ReduceOp::Max).unwrap();
        assert_eq!(values(&t)[0], world - 1.0, "{kind:?} max");
        assert_eq!(t.kind(), kind);

        // broadcast from the last rank.
        let root = group.world_size() - 1;
        let mut t = Tensor::full([2, 3], f64::from(rank) + 0.5, (kind, Device::Cpu));
        group.broadcast(&mut t, root).unwrap();
        assert_eq!(values(&t), vec![root as f32 + 0.5; 6], "{kind:?} broadcast");

        // allgather: every rank's tensor in rank order.
        let gathered = group.allgather(&Tensor::full([2], f64::from(rank), (kind, Device::Cpu))).unwrap();
        let expect: Vec<Vec<f32>> = (0..group.world_size()).map(|r| vec![r as f32; 2]).collect();
        assert_eq!(gathered.iter().map(values).collect::<Vec<_>>(), expect, "{kind:?} allgather");

        // Flat reduce-scatter: rank r holds [r·10 + i for i in 0..3·world]; rank r gets the sum of chunk r.
        let n = 3 * group.world_size();
        let input: Vec<f32> = (0..n).map(|i| rank * 10.0 + i as f32).collect();
        let input = Tensor::from_slice(&input).to_kind(kind);
        let output = Tensor::zeros([3], (kind, Device::Cpu));
        group.reduce_scatter_flat_async(&input, &output, ReduceOp::Sum).unwrap().wait().unwrap();
        let expect: Vec<f32> = (0..3).map(|j| 10.0 * sum_of_ranks + world * (3.0 * rank + j as f32)).collect();
        assert_eq!(values(&output), expect, "{kind:?} reduce_scatter");

        // Flat all-gather: rank r contributes [r, r + 0.5]; everyone gets them in rank order.
        let mine = Tensor::from_slice(&[rank, rank + 0.5]).to_kind(kind);
        let all = Tensor::zeros([2 * group.world_size() as i64], (kind, Device::Cpu));
        group.allgather_flat_async(&mine, &all).unwrap().wait().unwrap();
        let expect: Vec<f32> = (0..group.world_size()).flat_map(|r| [r as f32, r as f32 + 0.5]).collect();
        assert_eq!(values(&all), expect, "{kind:?} allgather_flat");
        assert!(group.allgather_flat_async(&mine, &mine).is_err(), "sizes must be world × input");
    }
    group.barrier().unwrap();

    // A non-contiguous tensor is refused, not reduced wrongly.
    let t = Tensor::zeros([3, 2], (Kind::Float, Device::Cpu)).transpose(0, 1);
    assert!(group.allreduce_async(&t, ReduceOp::Sum).is_err());

    // Bytes of different lengths, and a broadcast of rank 0's bytes.
    let mine = vec![rank as u8; group.rank() + 1];
    let all = group.allgather_bytes(&mine).unwrap();
    assert_eq!(all, (0..group.world_size()).map(|r| vec![r as u8; r + 1]).collect::<Vec<_>>());
    let from_root = group.broadcast_bytes(if group.rank() == 0 { b"config" } else { b"" }, 0).unwrap();
    assert_eq!(from_root, b"config");

    // Bucketed: many tensors of mixed dtypes in small buckets.
    let mut ts: Vec<Tensor> = (0..7)
        .map(|i| {
            let kind = if i % 3 == 2 { Kind::BFloat16 } else { Kind::Float };
            Tensor::full([i + 1, 3], f64::from(rank) + i as f64, (kind, Device::Cpu))
        })
        .collect();
    group.allreduce_buckets(&mut ts, ReduceOp::Sum, 64).unwrap();
    for (i, t) in ts.iter().enumerate() {
        let expect = sum_of_ranks + world * i as f32;
        assert!(values(t).iter().all(|&v| v == expect), "bucket tensor {i}: {:?}", values(t));
    }
    let mut ts: Vec<Tensor> =
        (0..5).map(|i| Tensor::full([100 + i], f64::from(rank), (Kind::Float, Device::Cpu))).collect();
    group.broadcast_buckets(&mut ts, 1, 1000).unwrap();
    assert!(ts.iter().all(|t| values(t).iter().all(|&v| v == 1.0)));
    println!("rank {} of {}: every collective checked", group.rank(), group.world_size());
}

#[test]
fn two_processes_agree_on_every_collective() {
    assert_all_succeeded(&spawn("collectives", &[(0, 2), (1, 2)], Duration::from_secs(20)));
}

#[test]
fn three_processes_agree_on_every_collective() {
    assert_all_succeeded(&spawn("collectives", &[(0, 3), (1, 3), (2, 3)], Duration::from_secs(20)));
}
