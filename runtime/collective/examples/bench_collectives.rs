//! Throughput of Gloo collectives and of the weight sync between processes on this machine.
//!
//! `cargo run -p trinity-collective --example bench_collectives [-- --nproc N]` launches N processes (default 2)
//! through `trinity_collective::launch`, each with torchrun's environment and one libtorch thread; rank 0 prints:
//! - allreduce (sum, f32) and broadcast, one tensor of 1 to 256 MiB: the time per call and the algorithm rate
//!   (bytes of the tensor / time), plus the bus rate for allreduce (× 2(n−1)/n, NCCL-tests' convention, the bytes
//!   each rank really sends);
//! - a bucketed allreduce of 256 MiB in 128 tensors (a gradient reduction) with 4 and 25 MiB buckets;
//! - the weight sync (WeightSender → WeightReceivers) of 256 MiB with 64 and 256 MiB buckets, including packing,
//!   copying into the receiver's own tensors and the acknowledgement.
//!
//! Reference printed beside: the research note's Gloo broadcast of 1 GiB bf16 between two processes on this VM
//! (0.48 s in one bucket, i.e. ~2.1 GiB/s).

use std::ffi::OsString;
use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};
use trinity_collective::{
    DistEnv, LaunchOptions, ProcessGroup, ReduceOp, WeightReceiver, WeightSender, WeightSyncOptions, launch,
};

const MIB: usize = 1 << 20;
const TIMEOUT: Duration = Duration::from_secs(300);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    match DistEnv::from_env()? {
        Some(env) => rank(&env),
        None => {
            let args: Vec<String> = std::env::args().collect();
            let nproc =
                args.iter().position(|a| a == "--nproc").and_then(|i| args.get(i + 1)).map_or(Ok(2), |n| n.parse())?;
            let exe: OsString = std::env::current_exe()?.into();
            // SAFETY: set before any thread starts; the children inherit one libtorch thread each.
            unsafe { std::env::set_var("OMP_NUM_THREADS", "1") };
            let options = LaunchOptions { nproc_per_node: nproc, master_port: 0, ..LaunchOptions::default() };
            launch(&options, &exe, &[])?;
            Ok(())
        }
    }
}

/// Seconds per call of `f`: the best of `reps` calls after one warm-up call. The count is fixed, never decided by
/// the clock: every rank must make the same calls.
fn time(
    reps: usize,
    mut f: impl FnMut() -> Result<(), Box<dyn std::error::Error>>,
) -> Result<f64, Box<dyn std::error::Error>> {
    f()?;
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let start = Instant::now();
        f()?;
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(best)
}

fn rank(env: &DistEnv) -> Result<(), Box<dyn std::error::Error>> {
    tch::set_num_threads(1);
    let (store, group) = env.process_group("bench", TIMEOUT)?;
    let n = group.world_size() as f64;
    let say = |line: String| {
        if env.rank == 0 {
            println!("{line}");
        }
    };
    say(format!("{} processes on loopback, Gloo, one libtorch thread each", group.world_size()));
    say("collective   size       best time    algorithm rate   bus rate".into());
    for mib in [1usize, 16, 64, 256] {
        let mut t = Tensor::ones([(mib * MIB / 4) as i64], (Kind::Float, Device::Cpu));
        let reps = if mib >= 64 { 5 } else { 20 };
        let s = time(reps, || Ok(group.allreduce(&mut t, ReduceOp::Sum)?))?;
        let rate = (mib * MIB) as f64 / s / 1e9;
        say(format!(
            "allreduce    {mib:>4} MiB  {:>9.2} ms  {rate:>9.2} GB/s   {:>6.2} GB/s",
            s * 1e3,
            rate * 2.0 * (n - 1.0) / n
        ));
        let s = time(reps, || Ok(group.broadcast(&mut t, 0)?))?;
        say(format!("broadcast    {mib:>4} MiB  {:>9.2} ms  {:>9.2} GB/s", s * 1e3, (mib * MIB) as f64 / s / 1e9));
    }
    for bucket in [4usize, 25] {
        let mut grads: Vec<Tensor> =
            (0..128).map(|_| Tensor::ones([(2 * MIB / 4) as i64], (Kind::Float, Device::Cpu))).collect();
        let s = time(3, || Ok(group.allreduce_buckets(&mut grads, ReduceOp::Sum, bucket * MIB)?))?;
        say(format!(
            "bucketed allreduce of 256 MiB in 128 tensors, {bucket:>2} MiB buckets: {:.1} ms ({:.2} GB/s)",
            s * 1e3,
            (256 * MIB) as f64 / s / 1e9
        ));
    }
    weight_sync(env, &store, &group)?;
    say("reference: Gloo broadcast of 1 GiB bf16, 2 processes on this VM (research note): 0.48 s, ~2.2 GB/s".into());
    Ok(())
}

/// Rank 0 sends 256 MiB to every other rank through the weight-sync protocol.
fn weight_sync(
    env: &DistEnv,
    store: &trinity_collective::Store,
    group: &ProcessGroup,
) -> Result<(), Box<dyn std::error::Error>> {
    let weights: Vec<(String, Tensor)> =
        (0..64).map(|i| (format!("w{i}"), Tensor::ones([(4 * MIB / 4) as i64], (Kind::Float, Device::Cpu)))).collect();
    for bucket in [64usize, 256] {
        let options =
            WeightSyncOptions { timeout: TIMEOUT, bucket_bytes: bucket * MIB, ..WeightSyncOptions::default() };
        let key = format!("weight_sync_port_{bucket}");
        if env.rank == 0 {
            let mut sender = WeightSender::host(&env.master_addr, 0, group.world_size() - 1, options)?;
            store.set(&key, sender.port().to_string().as_bytes())?;
            let mut seconds = Vec::new();
            for version in 0..4 {
                seconds.push(sender.publish(version, &weights)?.seconds);
            }
            let best = seconds[1..].iter().copied().fold(f64::INFINITY, f64::min);
            println!(
                "weight sync of 256 MiB to {} receiver(s), {bucket:>3} MiB buckets: {:.1} ms per version, best of 3 after one warm-up ({:.2} GB/s)",
                group.world_size() - 1,
                best * 1e3,
                (256 * MIB) as f64 / best / 1e9
            );
        } else {
            let port: u16 = String::from_utf8(store.get(&key)?)?.parse()?;
            let mut receiver = WeightReceiver::connect(&env.master_addr, port, options)?;
            // As an explorer applies weights: copied into tensors it already has.
            let mut mine: std::collections::HashMap<String, Tensor> =
                weights.iter().map(|(n, t)| (n.clone(), t.zeros_like())).collect();
            for _ in 0..4 {
                receiver.receive_with(|name, t| {
                    if let Some(dst) = mine.get_mut(name) {
                        dst.f_copy_(t)?;
                    }
                    Ok(())
                })?;
            }
        }
        group.barrier()?;
    }
    Ok(())
}
