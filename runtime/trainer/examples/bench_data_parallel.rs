//! Data-parallel training and cross-process weight sync, measured between processes on this machine.
//!
//! ```text
//! cargo run --release -p trinity-trainer --example bench_data_parallel -- [--steps 3] [--rows 16]
//!     [--model random|FILE] [--skip-dp] [--skip-sync] [--sync-model FILE]
//! ```
//! 1. **DP step**: one GRPO train step (reference KL, token-mean) on `--rows` rows, by 1 process with 2 libtorch
//!    threads (and 1 thread) against 2 processes (`trinity_collective::launch`, torchrun's environment) with 1 thread each, each
//!    training half of the rows and all-reducing gradients over Gloo. The model is a random Llama of 4 layers,
//!    hidden 256 (`--model random`, the default) or a model file. Prints the mean and best step time after one
//!    warm-up step.
//! 2. **Weight sync**: SmolLM2-135M (`--sync-model`, default `$TRINITY_SMOLLM2_GGUF`) from a sender process to a
//!    receiver process that copies every tensor into its own model, in fp32 and in bf16, over
//!    `WeightSender`/`WeightReceiver` (Gloo, 256 MiB buckets; bf16 cast while packing, into a bf16 copy on the
//!    receiver, as a bf16 rollout model would hold) against checkpoint sync (the sender writes one
//!    safetensors file and renames it, as `sync_method: checkpoint` does; the receiver opens it and copies every
//!    tensor into its model). Projects the bf16 transfer of a 1.5B and a 7B model from the measured rate.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};
use trinity_collective::{DistEnv, LaunchOptions, WeightReceiver, WeightSender, WeightSyncOptions, launch};
use trinity_config::algorithm::{AlgorithmConfig, LossAggMode, OptimizerConfig};
use trinity_model::{Decoder, Family, ModelConfig, RandomWeights, SafetensorsWeights};
use trinity_trainer::{Components, MicroBatching, TrainRow, Trainer, TrainerOptions, share_rows};

type Error = Box<dyn std::error::Error>;
const TIMEOUT: Duration = Duration::from_secs(600);

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(env) = DistEnv::from_env()? {
        return match flag(&args, "--role").as_deref() {
            Some("dp") => dp_rank(&env, &args),
            Some("sync") => sync_rank(&env, &args),
            other => Err(format!("unknown role {other:?}").into()),
        };
    }
    let exe: OsString = std::env::current_exe()?.into();
    let forward = |role: &str| -> Vec<OsString> {
        let mut out: Vec<OsString> = vec!["--role".into(), role.into()];
        out.extend(args.iter().skip(1).map(OsString::from));
        out
    };
    if !args.iter().any(|a| a == "--skip-dp") {
        println!("DP step (GRPO, {} rows):", flag(&args, "--rows").unwrap_or_else(|| "16".into()));
        for (nproc, threads) in [(1usize, 1usize), (1, 2), (2, 1)] {
            // SAFETY: the launcher is single-threaded here; the children inherit the variable.
            unsafe { std::env::set_var("OMP_NUM_THREADS", threads.to_string()) };
            let options = LaunchOptions { nproc_per_node: nproc, master_port: 0, ..LaunchOptions::default() };
            launch(&options, &exe, &forward("dp"))?;
        }
    }
    if !args.iter().any(|a| a == "--skip-sync") {
        // SAFETY: as above.
        unsafe { std::env::set_var("OMP_NUM_THREADS", "1") };
        let options = LaunchOptions { nproc_per_node: 2, master_port: 0, ..LaunchOptions::default() };
        launch(&options, &exe, &forward("sync"))?;
    }
    Ok(())
}

fn random_model() -> Result<Decoder, Error> {
    tch::manual_seed(7);
    let config = ModelConfig {
        vocab_size: 4096,
        hidden_size: 256,
        intermediate_size: 688,
        num_hidden_layers: 4,
        num_attention_heads: 8,
        num_key_value_heads: 4,
        head_dim: 32,
        max_position_embeddings: 512,
        ..ModelConfig::tiny(Family::Llama)
    };
    Ok(Decoder::load(config, &mut RandomWeights, Kind::Float, Device::Cpu)?)
}

fn model(spec: &str) -> Result<Decoder, Error> {
    if spec == "random" {
        return random_model();
    }
    Ok(trinity_model::load_model(Path::new(spec), Kind::Float, Device::Cpu)?.decoder)
}

/// GRPO groups of 8 samples: 32-token prompts, 64 to 127-token responses, advantages from the explorer.
fn rows(n: usize, vocab: i64) -> Vec<TrainRow> {
    (0..n)
        .map(|i| {
            let prompt: Vec<i64> = (0..32).map(|j| 2 + ((i / 8) * 31 + j * 7) as i64 % (vocab - 2)).collect();
            let len = 64 + (i * 37) % 64;
            let response: Vec<i64> = (0..len).map(|j| 2 + (i * 13 + j * 5) as i64 % (vocab - 2)).collect();
            let mut r = TrainRow::sft(&prompt, &response);
            r.logprobs = vec![-3.0; len];
            r.advantages = Some(vec![if i % 2 == 0 { 1.0 } else { -1.0 }; len]);
            r.group_id = Some(format!("{}", i / 8));
            r
        })
        .collect()
}

fn grpo() -> Result<AlgorithmConfig, Error> {
    let p = trinity_algorithm::registry::preset("grpo").ok_or("no grpo preset")?;
    Ok(AlgorithmConfig {
        algorithm_type: "grpo".into(),
        advantage_fn: p.advantage_fn.or(Some("grpo".into())),
        advantage_fn_args: p.advantage_fn_args,
        policy_loss_fn: p.policy_loss_fn.or(Some("ppo".into())),
        policy_loss_fn_args: p.policy_loss_fn_args,
        kl_penalty_fn: p.kl_penalty_fn.or(Some("none".into())),
        kl_loss_fn: p.kl_loss_fn.or(Some("k2".into())),
        entropy_loss_fn: p.entropy_loss_fn.or(Some("default".into())),
        loss_agg_mode: Some(LossAggMode::TokenMean),
        ..AlgorithmConfig::default()
    })
}

fn dp_rank(env: &DistEnv, args: &[String]) -> Result<(), Error> {
    let threads: i32 = std::env::var("OMP_NUM_THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(1);
    tch::set_num_threads(threads);
    let steps: usize = flag(args, "--steps").map_or(Ok(3), |s| s.parse())?;
    let n: usize = flag(args, "--rows").map_or(Ok(16), |s| s.parse())?;
    let policy = model(&flag(args, "--model").unwrap_or_else(|| "random".into()))?;
    let vocab = policy.config().vocab_size;
    let algorithm = grpo()?;
    let optimizer = OptimizerConfig { lr: 1e-6, ..OptimizerConfig::default() };
    let options = TrainerOptions { micro_batching: MicroBatching::Rows(4), ..TrainerOptions::default() };
    let mut trainer = Trainer::new(policy, Components::from_config(&algorithm)?, &optimizer, options)?;
    let _store;
    if env.world_size > 1 {
        let (store, group) = env.process_group("bench_dp", TIMEOUT)?;
        _store = store;
        trainer = trainer.with_process_group(group)?;
    }
    let all = rows(n, vocab);
    let mut times = Vec::new();
    for _ in 0..=steps {
        let start = Instant::now();
        let step_rows = match trainer.process_group() {
            Some(group) => share_rows(group, 0, (env.rank == 0).then_some(&all[..]))?,
            None => all.clone(),
        };
        trainer.train_step(&step_rows)?;
        times.push(start.elapsed().as_secs_f64());
    }
    if env.rank == 0 {
        let timed = &times[1..];
        let mean = timed.iter().sum::<f64>() / timed.len() as f64;
        let best = timed.iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "  {} process(es) x {threads} thread(s): {mean:.3} s per step (best {best:.3} s) over {} steps after one warm-up",
            env.world_size,
            timed.len()
        );
    }
    Ok(())
}

fn sync_rank(env: &DistEnv, args: &[String]) -> Result<(), Error> {
    tch::set_num_threads(1);
    let path = flag(args, "--sync-model").or_else(|| std::env::var("TRINITY_SMOLLM2_GGUF").ok()).unwrap_or_default();
    let path = if path.is_empty() {
        PathBuf::from(".deps/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    } else {
        PathBuf::from(path)
    };
    let decoder = trinity_model::load_model(&path, Kind::Float, Device::Cpu)?.decoder;
    let weights = decoder.named_parameters()?;
    let (store, _group) = env.process_group("bench_sync", TIMEOUT)?;
    let dir = std::env::temp_dir().join(format!("trinity_bench_sync_{}", env.master_port));
    let options = WeightSyncOptions { timeout: TIMEOUT, ..WeightSyncOptions::default() };
    if env.rank == 0 {
        std::fs::create_dir_all(&dir)?;
        let params: i64 = weights.iter().map(|(_, t)| t.numel() as i64).sum();
        println!(
            "weight sync of {} ({:.1} M parameters), sender → receiver process, receiver copies into its model:",
            path.display(),
            params as f64 / 1e6
        );
        let mut rates = Vec::new();
        let gloo = !args.iter().any(|a| a == "--skip-gloo");
        for (label, kind) in [("fp32", Kind::Float), ("bf16", Kind::BFloat16)].into_iter().filter(|_| gloo) {
            // One sender per dtype: the tensors' layout is fixed for a sender's life. bf16 is cast while packing.
            let cast = (kind != Kind::Float).then_some(kind);
            let mut sender =
                WeightSender::host(&env.master_addr, 0, 1, WeightSyncOptions { dtype: cast, ..options.clone() })?;
            store.set(&format!("port_{label}"), sender.port().to_string().as_bytes())?;
            let mut best = f64::INFINITY;
            let mut bytes = 0;
            for version in 0..4u64 {
                let start = Instant::now();
                let report = sender.publish(version, &weights)?;
                bytes = report.bytes;
                if version > 0 {
                    best = best.min(start.elapsed().as_secs_f64());
                }
            }
            let rate = bytes as f64 / best / 1e9;
            rates.push(rate);
            println!(
                "  Gloo, {label}: {:.1} MB in {:.3} s per sync (best of 3 after one warm-up: pack, send, apply, acknowledge), {rate:.2} GB/s",
                bytes as f64 / 1e6,
                best
            );
        }
        let file = dir.join("weights.safetensors");
        for version in 0..2 {
            let start = Instant::now();
            let partial = dir.join(".weights.partial");
            trinity_model::write_safetensors(&partial, &weights)?;
            std::fs::rename(&partial, &file)?;
            let write = start.elapsed().as_secs_f64();
            eprintln!("sender: checkpoint {version} written in {write:.3} s");
            store.set(&format!("written_{version}"), write.to_string().as_bytes())?;
            let read: f64 = String::from_utf8(store.get(&format!("read_{version}"))?)?.parse()?;
            if version == 1 {
                let total = write + read;
                let bytes = std::fs::metadata(&file)?.len() as f64;
                println!(
                    "  checkpoint, fp32: {:.1} MB, write {write:.3} s + read and apply {read:.3} s = {total:.3} s per sync",
                    bytes / 1e6
                );
            }
        }
        std::fs::remove_dir_all(&dir)?;
        if let Some(&bf16_rate) = rates.get(1) {
            for (name, params) in [("1.5B", 1.5e9), ("7B", 7.0e9)] {
                println!(
                    "  projected bf16 Gloo sync of a {name} model at the measured bf16 rate ({bf16_rate:.2} GB/s): {:.1} s",
                    params * 2.0 / (bf16_rate * 1e9)
                );
            }
        }
    } else {
        let mut mine: HashMap<String, Tensor> = weights.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
        // A bf16 rollout model's tensors, for the bf16 transfer.
        let mut mine_bf16: HashMap<String, Tensor> = weights
            .iter()
            .map(|(n, t)| Ok((n.clone(), t.f_to_kind(Kind::BFloat16)?)))
            .collect::<Result<_, tch::TchError>>()?;
        let gloo = !args.iter().any(|a| a == "--skip-gloo");
        for label in ["fp32", "bf16"].into_iter().filter(|_| gloo) {
            let port: u16 = String::from_utf8(store.get(&format!("port_{label}"))?)?.parse()?;
            let mut receiver = WeightReceiver::connect(&env.master_addr, port, options.clone())?;
            let target = if label == "fp32" { &mut mine } else { &mut mine_bf16 };
            for _ in 0..4 {
                receiver.receive_with(|name, t| {
                    if let Some(dst) = target.get_mut(name) {
                        tch::no_grad(|| dst.f_copy_(t))?;
                    }
                    Ok(())
                })?;
            }
        }
        for version in 0..2 {
            store.get(&format!("written_{version}"))?;
            let start = Instant::now();
            let file = SafetensorsWeights::open_files(&[dir.join("weights.safetensors")])?;
            for (name, dst) in mine.iter_mut() {
                let t = file.get(name)?;
                tch::no_grad(|| dst.f_copy_(&t))?;
            }
            eprintln!("receiver: checkpoint {version} read and applied in {:.3} s", start.elapsed().as_secs_f64());
            store.set(&format!("read_{version}"), start.elapsed().as_secs_f64().to_string().as_bytes())?;
        }
    }
    Ok(())
}
