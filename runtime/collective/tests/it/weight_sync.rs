//! Weight sync between processes: a sender in this test process, receivers started as copies of this binary
//! (entering `receiver_child`). A bucketed transfer of ~200 MB, checked value by value, with its rate printed;
//! a receiver that dies and the group rebuilt for its replacement; timeouts instead of hangs.

use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};
use trinity_collective::testing::{Outcome, assert_all_succeeded, run_ranks, var};
use trinity_collective::{WeightReceiver, WeightSender, WeightSyncOptions};

/// 25 fp32 tensors of 8 MiB, one bf16 tensor of an odd length and a scalar: ~200 MiB, spanning 64 MiB buckets.
fn weights(version: u64) -> Vec<(String, Tensor)> {
    let value = |i: usize| (version * 100 + i as u64) as f64;
    let mut out: Vec<(String, Tensor)> = (0..25)
        .map(|i| (format!("layers.{i}.weight"), Tensor::full([1024, 2048], value(i), (Kind::Float, Device::Cpu))))
        .collect();
    out.push(("embed.weight".into(), Tensor::full([3_000_007], value(25), (Kind::BFloat16, Device::Cpu))));
    out.push(("scale".into(), Tensor::full([], value(26), (Kind::Float, Device::Cpu))));
    out
}

fn options(timeout: Duration) -> WeightSyncOptions {
    WeightSyncOptions { timeout, bucket_bytes: 64 << 20, ..WeightSyncOptions::default() }
}

/// The entry point of a receiver process; returns at once in an ordinary test run.
#[test]
fn receiver_child() {
    let Ok(mode) = std::env::var("TRINITY_WS_MODE") else { return };
    let port: u16 = std::env::var("TRINITY_WS_PORT").unwrap().parse().unwrap();
    let versions: u64 = std::env::var("TRINITY_WS_VERSIONS").unwrap().parse().unwrap();
    let mut receiver = WeightReceiver::connect("127.0.0.1", port, options(Duration::from_secs(30))).unwrap();
    for _ in 0..versions {
        let start = Instant::now();
        let (version, tensors) = receiver.receive().unwrap();
        let seconds = start.elapsed().as_secs_f64();
        let expected = weights(version);
        assert_eq!(tensors.len(), expected.len());
        for ((name, got), (want_name, want)) in tensors.iter().zip(&expected) {
            assert_eq!(name, want_name);
            assert!(got.kind() == want.kind() && got.equal(want), "version {version}: {name} differs");
        }
        let bytes: usize = tensors.iter().map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes()).sum();
        println!(
            "receiver: version {version}, {:.1} MB in {seconds:.3} s ({:.2} GB/s)",
            bytes as f64 / 1e6,
            bytes as f64 / seconds / 1e9
        );
        if mode == "die" {
            std::process::abort();
        }
    }
}

fn receivers(port: u16, mode: &str, versions: u64) -> std::thread::JoinHandle<Vec<Outcome>> {
    let env = vec![var("TRINITY_WS_MODE", mode), var("TRINITY_WS_PORT", port), var("TRINITY_WS_VERSIONS", versions)];
    std::thread::spawn(move || run_ranks("weight_sync::receiver_child", &[env], Duration::from_secs(120)))
}

#[test]
fn a_bucketed_transfer_of_200_mb_arrives_intact() {
    let mut sender = WeightSender::host("127.0.0.1", 0, 1, options(Duration::from_secs(30))).unwrap();
    let child = receivers(sender.port(), "check", 3);
    for version in 1..=3 {
        let w = weights(version);
        let report = if version == 2 {
            // Part by part, as a sharded trainer gathers its layers: the sink holds only the tensors of the
            // buckets it has not packed yet (eight 8 MiB tensors fill a 64 MiB bucket).
            let shapes = w.iter().map(|(n, t)| (n.as_str(), t.kind(), t.size()));
            let (most_held, report) = sender
                .publish_parts(version, shapes, |sink| {
                    let mut most = 0;
                    for part in w.chunks(3).chain(std::iter::once(&[][..])) {
                        sink.push(part.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect()).unwrap();
                        most = most.max(sink.held());
                    }
                    most
                })
                .unwrap();
            assert!(most_held <= 11, "the sink held {most_held} tensors");
            report
        } else {
            sender.publish(version, &w).unwrap()
        };
        println!(
            "sender: version {version}, {:.1} MB in {} buckets, {:.3} s including the acknowledgement ({:.2} GB/s)",
            report.bytes as f64 / 1e6,
            report.buckets,
            report.seconds,
            report.bytes as f64 / report.seconds / 1e9
        );
    }
    let outcomes = child.join().unwrap();
    assert_all_succeeded(&outcomes);
    for line in outcomes[0].output.lines().filter(|l| l.contains("receiver:")) {
        println!("{line}");
    }
}

#[test]
fn a_dead_receiver_fails_one_publish_and_its_replacement_joins_a_new_group() {
    let mut sender = WeightSender::host("127.0.0.1", 0, 1, options(Duration::from_secs(10))).unwrap();
    let small = |v: u64| vec![("w".to_owned(), Tensor::full([1000], v as f64, (Kind::Float, Device::Cpu)))];
    let dying = receivers(sender.port(), "die", 1);
    // The receiver checks against `weights`: send those.
    sender.publish(1, &weights(1)).unwrap();
    let outcome = dying.join().unwrap();
    assert!(!outcome[0].succeeded());
    let start = Instant::now();
    let err = sender.publish(2, &weights(2)).unwrap_err();
    println!("publish to a dead receiver failed after {:.2} s: {err}", start.elapsed().as_secs_f64());
    assert!(start.elapsed() < Duration::from_secs(12));
    assert_eq!(sender.generation(), 1);
    // A different tensor list is refused before anything is sent.
    assert!(sender.publish(3, &small(3)).is_err());
    let shapes = small(3).into_iter().map(|(n, t)| (n, t.kind(), t.size())).collect::<Vec<_>>();
    let err = sender.publish_parts(3, shapes.iter().map(|(n, k, s)| (n.as_str(), *k, s.clone())), |_| ()).unwrap_err();
    assert!(err.to_string().contains("differ from the first publish"), "{err}");
    let replacement = receivers(sender.port(), "check", 1);
    sender.publish(3, &weights(3)).unwrap();
    let outcomes = replacement.join().unwrap();
    assert_all_succeeded(&outcomes);
    assert!(outcomes[0].output.contains("version 3"), "{}", outcomes[0].output);
}

#[test]
fn a_receiver_without_a_sync_times_out() {
    let _sender = WeightSender::host("127.0.0.1", 0, 1, options(Duration::from_secs(1))).unwrap();
    let mut receiver = WeightReceiver::connect("127.0.0.1", _sender.port(), options(Duration::from_secs(1))).unwrap();
    assert_eq!(receiver.offered_version().unwrap(), None);
    let start = Instant::now();
    let err = receiver.receive().unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
}

/// A side whose weights are on CUDA needs NCCL compiled in: without it both ends refuse at once, naming the
/// rebuild, before connecting to anything (the receiver's address is never contacted).
#[cfg(not(feature = "nccl"))]
#[test]
fn a_cuda_side_in_a_build_without_nccl_is_refused_at_start() {
    let on_cuda = WeightSyncOptions { tensors: Device::Cuda(0), ..options(Duration::from_secs(30)) };
    let started = Instant::now();
    let sender = WeightSender::host("127.0.0.1", 0, 1, on_cuda.clone()).unwrap_err();
    let receiver = WeightReceiver::connect("192.0.2.1", 1, on_cuda).unwrap_err();
    for err in [sender, receiver] {
        assert!(matches!(err, trinity_collective::CollectiveError::NeedsCudaBuild { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.starts_with("weight sync (synchronizer.sync_method: nccl) holds CUDA tensors"), "{message}");
        assert!(message.contains("--features cuda"), "{message}");
    }
    assert!(started.elapsed() < Duration::from_secs(5));
}
