//! Per-rank memory and step time of ZeRO stages 0, 1, 2 and 3 at Qwen2.5-0.5B's and -1.5B's shapes (random weights from their
//! published `config.json` values), measured on data-parallel ranks of this machine, with the per-GPU figures of
//! Qwen2.5-7B and -14B projected from the measured bytes a parameter.
//!
//! ```text
//! cargo run --release -p trinity-trainer --example bench_zero_memory -- [--shapes 0.5b,1.5b] [--stages 0,1,2]
//!     [--world 2] [--layers N] [--dtype bf16|f32] [--offload] [--steps 3] [--no-prefetch]
//! ```
//! Stage `3` runs [`FullShard`] (`trinity_trainer::optimizer::zero3`, not yet behind the trainer's config) in its
//! own loop: a whole-vocabulary SFT loss with activation recomputation, parameters gathered per layer; `3-base` is
//! the same loop unsharded (whole parameters, gradients summed over the ranks, AdamW), its step-time baseline,
//! since the trainer's own step (stages 0-2) computes the head in vocabulary chunks and costs otherwise. The step
//! time is the last of `--steps` steps. `--no-prefetch` gathers each layer of stage 3 only when it is about to
//! compute, instead of during the previous layer's computation.
//! `3-sync` is the trainer's own stage 3 (`zero_stage` = parameters), and reports besides rank 0's peak memory of a
//! weight sync into a second model of the same shape (the explorer's engine in mode `both`): with the policy
//! gathered whole, and part by part as the weight syncs take it.
//! For each (shape, stage) `--world` ranks start (`trinity_collective::launch`, torchrun's environment, Gloo), each
//! builds the model, joins the group with `zero_stage` set and trains one SFT step on 2 rows of 24 tokens each, so
//! that every state exists as a step leaves it. Each rank then reports what it holds, measured from its own
//! tensors' bytes: the trained parameters, the gradients its last update read (stage 2: its fp32 shards of the
//! reduced gradients, stages 0 and 1: the whole gradients), and AdamW's moments and fp32 masters; next to them the
//! trainer's own expectation ([`Trainer::expected_memory`], what it logs at start and sizes micro-batches by) and
//! the process's resident memory, its peak when the trainer has joined the group (`start`: the model built, rank
//! 0's state broadcast and AdamW's state allocated, under ZeRO only as the rank's shard) and its peak after the
//! step. The ranks share this machine's memory, so resident memory shows the sharding only per rank; tensor bytes
//! are the figures that fall as 1/N.
//!
//! `--layers N` keeps the shape's widths and vocabulary and only N of its layers, for a machine that cannot hold
//! the whole model `--world` times over: the bytes a parameter do not depend on the depth (every trained
//! parameter takes the same bytes whatever layer it is in), and the projections use the full models' counts.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tch::{Device, Kind};
use trinity_collective::{DistEnv, LaunchOptions, launch};
use trinity_config::algorithm::{AlgorithmConfig, LossAggMode, OptimizerConfig};
use trinity_model::{Decoder, ModelConfig, RandomWeights};
use trinity_trainer::optimizer::zero3::FullShard;
use trinity_trainer::{
    AdamW, AdamWSettings, Components, DataParallel, MicroBatching, StateMemory, TrainRow, TrainedParameters, Trainer,
    TrainerOptions, ZeroStage,
};

type Error = Box<dyn std::error::Error>;
const TIMEOUT: Duration = Duration::from_secs(900);

/// Qwen2.5's published architecture values: hidden, intermediate, layers, heads, kv heads, vocabulary, tied head.
fn qwen(shape: &str) -> Option<(i64, i64, i64, i64, i64, i64, bool)> {
    Some(match shape {
        "0.5b" => (896, 4864, 24, 14, 2, 151_936, true),
        "1.5b" => (1536, 8960, 28, 12, 2, 151_936, true),
        "7b" => (3584, 18944, 28, 28, 4, 152_064, false),
        "14b" => (5120, 13824, 48, 40, 8, 152_064, false),
        _ => return None,
    })
}

/// The `config.json` of `shape` with `layers` layers (its own count when `None`).
fn qwen_config(shape: &str, layers: Option<i64>) -> Result<ModelConfig, Error> {
    let (hidden, inter, all, heads, kv, vocab, tied) = qwen(shape).ok_or(format!("--shapes {shape}: 0.5b or 1.5b"))?;
    let config = json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers.unwrap_or(all), "num_attention_heads": heads,
        "num_key_value_heads": kv, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": tied, "vocab_size": vocab, "hidden_act": "silu",
        "bos_token_id": 151643, "eos_token_id": 151643, "torch_dtype": "bfloat16",
    });
    Ok(ModelConfig::from_json(&config)?)
}

/// Parameters of the whole published model (q/k/v biases, untied or tied head), without building it.
fn parameter_count(shape: &str) -> u64 {
    let Some((h, i, l, heads, kv, v, tied)) = qwen(shape) else { return 0 };
    let d = h / heads;
    let attention = h * heads * d + heads * d + 2 * (h * kv * d + kv * d) + heads * d * h;
    let layer = attention + 3 * h * i + 2 * h;
    (v * h * if tied { 1 } else { 2 } + l * layer + h) as u64
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn stage(number: &str) -> Result<ZeroStage, Error> {
    Ok(match number {
        "0" => ZeroStage::Replicated,
        "1" => ZeroStage::OptimizerState,
        "2" => ZeroStage::Gradients,
        other => return Err(format!("--stages {other}: 0, 1, 2, 3, 3-base or 3-sync").into()),
    })
}

/// Steps each rank takes; the report's step time is the last one's (the first allocates the gradients and the
/// state a step leaves).
fn steps(args: &[String]) -> Result<usize, Error> {
    Ok(flag(args, "--steps").map_or(Ok(3), |s| s.parse())?.max(1))
}

/// The rows of the measured steps: 2 a rank, 24 tokens each (8 prompt, 16 response).
fn bench_rows(world: usize, vocab: i64) -> Vec<TrainRow> {
    (0..2 * world as i64)
        .map(|r| {
            let tokens: Vec<i64> = (0..24).map(|t| 2 + (r * 977 + t * 131) % (vocab - 2)).collect();
            TrainRow::sft(&tokens[..8], &tokens[8..])
        })
        .collect()
}

/// The SFT loss of `rows` (whole-vocabulary logits; stage 3's own loop, not the trainer's chunked head), divided
/// by `total` response tokens so the ranks' losses add up to the batch mean.
fn direct_loss(m: &Decoder, rows: &[TrainRow], total: f64) -> Result<tch::Tensor, Error> {
    let ids: Vec<i64> = rows.iter().flat_map(|r| r.tokens.iter().copied()).collect();
    let t = rows[0].tokens.len() as i64;
    let ids = tch::Tensor::from_slice(&ids).view([rows.len() as i64, t]);
    let logits = m.logits(&m.forward_hidden(&ids, None)?)?;
    let p = rows[0].prompt_length as i64;
    let logp = logits.f_narrow(1, p - 1, t - p)?.f_log_softmax(-1, Kind::Float)?;
    let nll = -logp.f_gather(2, &ids.f_narrow(1, p, t - p)?.f_unsqueeze(-1)?, false)?;
    Ok(nll.f_sum(Kind::Float)? / total)
}

/// One rank of stage 3 (`FullShard`, parameters gathered per layer) or of its replicated baseline (`3-base`:
/// the same loop with whole parameters, gradients summed over the ranks, plain AdamW): build, shard, `--steps`
/// SFT steps on the rank's 2 rows, report into `--out`.
fn rank_direct(env: &DistEnv, args: &[String], sharded: bool) -> Result<(), Error> {
    tch::set_num_threads(1);
    let shape = flag(args, "--shape").ok_or("--shape")?;
    let layers = flag(args, "--layers").map(|l| l.parse()).transpose()?;
    let kind = if flag(args, "--dtype").as_deref() == Some("f32") { Kind::Float } else { Kind::BFloat16 };
    let config = qwen_config(&shape, layers)?;
    tch::manual_seed(0);
    let mut policy = Decoder::load(config.clone(), &mut RandomWeights, kind, Device::Cpu)?;
    policy.set_recompute_activations(true)?;
    let params = policy.trainable_parameters()?;
    let trained = TrainedParameters::of(params.iter().map(|(_, t)| t));
    let (_store, group) = env.process_group("bench_zero", TIMEOUT)?;
    let settings = AdamWSettings::from(&OptimizerConfig::default());
    let rows = bench_rows(env.world_size, config.vocab_size);
    let total = rows.iter().map(|r| (r.tokens.len() - r.prompt_length) as f64).sum::<f64>();
    let mine = rows[trinity_trainer::data_parallel::share(rows.len(), env.rank, env.world_size, 1)].to_vec();
    let mut times = Vec::new();
    let (start_peak, parameters, gradients, state, pass) = if sharded {
        let layers = config.num_hidden_layers as usize;
        let mut fs = FullShard::new(params, layers, settings, false, &group)?;
        fs.set_prefetch(!args.iter().any(|a| a == "--no-prefetch"));
        let start_peak = status_bytes("VmHWM:");
        let mut gradients = 0;
        for _ in 0..steps(args)? {
            let start = Instant::now();
            fs.pass(&group, true, || -> Result<(), Error> {
                direct_loss(&policy, &mine, total)?.f_backward()?;
                Ok(())
            })??;
            gradients = fs.memory().gradient_shards;
            fs.step(&group, 1.0, 1e-6)?;
            times.push(start.elapsed().as_secs_f64());
        }
        let m = fs.memory();
        let t = fs.pass_seconds();
        let per_step = |x: f64| x / times.len() as f64;
        println!(
            "stage 3 rank {}: a step waits {:.2} s for gathers, packs gradients {:.2} s, waits {:.2} s for \
             reduce-scatters (means over {} steps; prefetch {})",
            env.rank,
            per_step(t.gather_wait),
            per_step(t.scatter_pack),
            per_step(t.scatter_wait),
            times.len(),
            if args.iter().any(|a| a == "--no-prefetch") { "off" } else { "on" }
        );
        (start_peak, m.parameter_shards, gradients, m.optimizer_state, m.pass_parameters)
    } else {
        let mut adamw = AdamW::new(params, settings)?;
        let dp = DataParallel::new(group);
        let start_peak = status_bytes("VmHWM:");
        let vars: Vec<tch::Tensor> = policy.trainable_parameters()?.into_iter().map(|(_, t)| t).collect();
        let mut gradients = 0;
        for _ in 0..steps(args)? {
            let start = Instant::now();
            direct_loss(&policy, &mine, total)?.f_backward()?;
            dp.reduce_gradients(&vars)?;
            gradients = vars.iter().map(|v| bytes(&v.grad())).sum::<u64>() as i64;
            adamw.clip_grad_norm(1.0)?;
            adamw.step(1e-6)?;
            adamw.zero_grad();
            times.push(start.elapsed().as_secs_f64());
        }
        (start_peak, trained.bytes as i64, gradients, 4 * adamw.state_elements(), 0)
    };
    let report = json!({
        "rank": env.rank,
        "elements": trained.elements,
        "parameters": parameters,
        "gradients": gradients,
        "optimizer_state": state,
        "pass_parameters": pass,
        "expected": [0, 0, 0, 0],
        "rss": status_bytes("VmRSS:"),
        "peak": status_bytes("VmHWM:"),
        "start_peak": start_peak,
        "step_s": times.last().copied().unwrap_or(0.0),
    });
    let out = PathBuf::from(flag(args, "--out").ok_or("--out")?).join(format!("rank{}.json", env.rank));
    std::fs::write(out, report.to_string())?;
    Ok(())
}

fn status_bytes(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = text.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok());
    kib.unwrap_or(0u64) * 1024
}

fn sft() -> Result<AlgorithmConfig, Error> {
    let p = trinity_algorithm::registry::preset("sft").ok_or("no sft preset")?;
    Ok(AlgorithmConfig {
        algorithm_type: "sft".into(),
        // The preset names no advantage function (SFT has none); the trainer's resolver fills `ppo` in.
        advantage_fn: p.advantage_fn.or(Some("ppo".into())),
        advantage_fn_args: p.advantage_fn_args,
        policy_loss_fn: p.policy_loss_fn.or(Some("sft".into())),
        policy_loss_fn_args: p.policy_loss_fn_args,
        kl_penalty_fn: p.kl_penalty_fn.or(Some("none".into())),
        kl_loss_fn: p.kl_loss_fn.or(Some("k2".into())),
        entropy_loss_fn: p.entropy_loss_fn.or(Some("default".into())),
        loss_agg_mode: Some(LossAggMode::TokenMean),
        ..AlgorithmConfig::default()
    })
}

/// One rank: build, join, one step, report into `--out`.
fn rank(env: &DistEnv, args: &[String]) -> Result<(), Error> {
    match flag(args, "--stage").as_deref() {
        Some("3") => return rank_direct(env, args, true),
        Some("3-base") => return rank_direct(env, args, false),
        _ => {}
    }
    tch::set_num_threads(1);
    let shape = flag(args, "--shape").ok_or("--shape")?;
    let layers = flag(args, "--layers").map(|l| l.parse()).transpose()?;
    let kind = if flag(args, "--dtype").as_deref() == Some("f32") { Kind::Float } else { Kind::BFloat16 };
    let config = qwen_config(&shape, layers)?;
    tch::manual_seed(0);
    let policy = Decoder::load(config.clone(), &mut RandomWeights, kind, Device::Cpu)?;
    let number = flag(args, "--stage").ok_or("--stage")?;
    let sync = number == "3-sync";
    let options = TrainerOptions {
        micro_batching: MicroBatching::Rows(1),
        zero_stage: if sync { ZeroStage::Parameters } else { stage(&number)? },
        optimizer_offload: args.iter().any(|a| a == "--offload"),
        total_steps: Some(1),
        ..TrainerOptions::default()
    };
    let optimizer = OptimizerConfig { lr: 1e-6, ..OptimizerConfig::default() };
    let trainer = Trainer::new(policy, Components::from_config(&sft()?)?, &optimizer, options)?;
    let (_store, group) = env.process_group("bench_zero", TIMEOUT)?;
    let mut trainer = trainer.with_process_group(group)?;
    // The start's peak: the model built, the state broadcast and (under ZeRO) allocated as the rank's shard.
    let start_peak = status_bytes("VmHWM:");
    let rows = bench_rows(env.world_size, config.vocab_size);
    let mut step_s = 0.0;
    for _ in 0..steps(args)? {
        let start = Instant::now();
        trainer.train_step(&rows)?;
        step_s = start.elapsed().as_secs_f64();
    }
    let params = trainer.policy().trainable_parameters()?;
    let mut trained = TrainedParameters::of(params.iter().map(|(_, t)| t));
    if sync {
        // Stage 3's parameters are empty between passes: count the whole ones from the layout, and the bytes the
        // rank holds from its shards.
        let layout = trainer.policy_layout()?;
        trained.elements = layout.iter().map(|spec| spec.shape.iter().product::<i64>() as u64).sum();
        trained.bytes = trainer.sharded_memory().map_or(0, |m| m.parameters as u64);
    }
    // Stage 2 releases the whole gradients as it reduces them and keeps fp32 shards, whose elements the trainer
    // counts at the update; in the other stages the update reads every trained parameter's whole gradient in the
    // parameter's dtype (released after the step, so counted from the parameters).
    let gradients = match (trainer.expected_memory().stage, trainer.sharded_memory()) {
        (ZeroStage::Gradients | ZeroStage::Parameters, Some(m)) => m.gradients as u64,
        _ => params.iter().map(|(_, t)| bytes(t)).sum(),
    };
    let expected = trainer.expected_memory();
    let sync = if sync { Some(sync_peaks(&trainer, &config, kind, env.rank)?) } else { None };
    let report = json!({
        "sync": sync,
        "rank": env.rank,
        "elements": trained.elements,
        "parameters": trained.bytes,
        "gradients": gradients,
        "optimizer_state": 4 * trainer.optimizer().state_elements() as u64,
        "expected": [expected.parameters, expected.gradients, expected.gradient_shard, expected.optimizer_state],
        "rss": status_bytes("VmRSS:"),
        "peak": status_bytes("VmHWM:"),
        "start_peak": start_peak,
        "step_s": step_s,
    });
    let out = PathBuf::from(flag(args, "--out").ok_or("--out")?).join(format!("rank{}.json", env.rank));
    std::fs::write(out, report.to_string())?;
    Ok(())
}

/// Rank 0's peak memory over what it held, while the stage-3 policy's weights are copied into a second model of
/// the same shape (the explorer's engine in mode `both`): gathered whole first ([`Trainer::policy_weights`]: every
/// gathered copy alive until the copy ends), then part by part ([`Trainer::policy_parts`], as a weight sync takes
/// them now: one gathered unit at a time). The other ranks join the same gathers. Peaks are reset through
/// `/proc/self/clear_refs` before each.
fn sync_peaks(trainer: &Trainer, config: &ModelConfig, kind: Kind, rank: usize) -> Result<(u64, u64), Error> {
    let target = match rank {
        0 => Some(Decoder::load(config.clone(), &mut RandomWeights, kind, Device::Cpu)?.var_store().variables()),
        _ => None,
    };
    let copy = |part: &[(String, tch::Tensor)]| {
        let Some(vars) = &target else { return };
        tch::no_grad(|| {
            for (name, source) in part {
                vars[name].shallow_clone().copy_(source);
            }
        });
    };
    let peak_over = |run: &mut dyn FnMut() -> Result<(), Error>| -> Result<u64, Error> {
        std::fs::write("/proc/self/clear_refs", "5")?;
        let before = status_bytes("VmRSS:");
        run()?;
        Ok(status_bytes("VmHWM:").saturating_sub(before))
    };
    let whole = peak_over(&mut || {
        copy(&trainer.policy_weights()?);
        Ok(())
    })?;
    let parts = peak_over(&mut || {
        let copied: Result<(), std::convert::Infallible> = trainer.policy_parts(|part| {
            copy(&part);
            Ok(())
        })?;
        let Ok(()) = copied;
        Ok(())
    })?;
    Ok((whole, parts))
}

fn bytes(t: &tch::Tensor) -> u64 {
    (t.numel() * t.kind().elt_size_in_bytes()) as u64
}

fn gib(b: f64) -> f64 {
    b / f64::from(1u32 << 30)
}

/// Launches the ranks of one (shape, stage) and reads their reports.
fn measure(args: &[String], shape: &str, number: &str, world: usize, dir: &Path) -> Result<Vec<Value>, Error> {
    let exe: OsString = std::env::current_exe()?.into();
    let mut forwarded: Vec<OsString> = vec!["--role".into(), "rank".into(), "--shape".into(), shape.into()];
    forwarded.extend(["--stage".into(), number.into(), "--out".into(), dir.as_os_str().to_owned()]);
    for name in ["--layers", "--dtype", "--steps"] {
        if let Some(value) = flag(args, name) {
            forwarded.extend([name.into(), value.into()]);
        }
    }
    for name in ["--offload", "--no-prefetch"] {
        if args.iter().any(|a| a == name) {
            forwarded.push(name.into());
        }
    }
    let options = LaunchOptions { nproc_per_node: world, master_port: 0, ..LaunchOptions::default() };
    launch(&options, &exe, &forwarded)?;
    (0..world)
        .map(|r| Ok(serde_json::from_str(&std::fs::read_to_string(dir.join(format!("rank{r}.json")))?)?))
        .collect()
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(env) = DistEnv::from_env()? {
        return rank(&env, &args);
    }
    // SAFETY: single-threaded here; the ranks inherit the variable.
    unsafe { std::env::set_var("OMP_NUM_THREADS", "1") };
    let shapes = flag(&args, "--shapes").unwrap_or_else(|| "0.5b,1.5b".into());
    let stages = flag(&args, "--stages").unwrap_or_else(|| "0,1,2".into());
    let world: usize = flag(&args, "--world").map_or(Ok(2), |w| w.parse())?;
    let kind = if flag(&args, "--dtype").as_deref() == Some("f32") { Kind::Float } else { Kind::BFloat16 };
    let layers = flag(&args, "--layers");
    println!(
        "ZeRO memory per rank, {world} ranks on this machine (Gloo), {:?} parameters with fp32 AdamW state{}, one SFT \
         step; measured = the rank's own tensors' bytes; layers: {}",
        kind,
        if args.iter().any(|a| a == "--offload") { ", optimizer_offload" } else { "" },
        layers.as_deref().unwrap_or("all")
    );
    println!(
        "{:<5} {:>6} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8} {:>10} {:>8} {:>9} {:>8} {:>7}",
        "shape",
        "stage",
        "params",
        "param GiB",
        "grad GiB",
        "state GiB",
        "sum GiB",
        "B/param",
        "expect GiB",
        "RSS GiB",
        "start GiB",
        "peak GiB",
        "step s"
    );
    // Bytes a parameter each stage measured (the largest over the ranks), for the projection.
    let mut per_parameter: Vec<(String, u64, f64, f64)> = Vec::new();
    for shape in shapes.split(',') {
        for number in stages.split(',') {
            let dir = tempfile::tempdir()?;
            let reports = measure(&args, shape, number, world, dir.path())?;
            let mut worst = 0f64;
            for r in &reports {
                let get = |k: &str| r[k].as_u64().unwrap_or(0) as f64;
                let held = get("parameters") + get("gradients") + get("optimizer_state");
                let expected: f64 = r["expected"].as_array().map_or(0.0, |e| {
                    // A step's peak: the whole gradients or the shard after them, whichever the rank held last.
                    let e: Vec<f64> = e.iter().map(|x| x.as_u64().unwrap_or(0) as f64).collect();
                    e[0] + if e[2] > 0.0 { e[2] } else { e[1] } + e[3]
                });
                let per = held / get("elements").max(1.0);
                worst = worst.max(per);
                println!(
                    "{shape:<5} {number:>6} {:>9.1}M {:>9.3} {:>9.3} {:>9.3} {:>9.3} {per:>8.2} {:>10} {:>8.2} {:>9.2} {:>8.2} {:>7.2}  rank {}{}",
                    get("elements") / 1e6,
                    gib(get("parameters")),
                    gib(get("gradients")),
                    gib(get("optimizer_state")),
                    gib(held),
                    if expected > 0.0 { format!("{:.3}", gib(expected)) } else { "-".into() },
                    gib(get("rss")),
                    gib(get("start_peak")),
                    gib(get("peak")),
                    r["step_s"].as_f64().unwrap_or(0.0),
                    r["rank"],
                    match r["pass_parameters"].as_u64() {
                        Some(p) if p > 0 => format!(" (+ up to {:.3} GiB of whole units during a pass)", gib(p as f64)),
                        _ => String::new(),
                    },
                );
                if let (Some(whole), Some(parts)) = (r["sync"][0].as_u64(), r["sync"][1].as_u64())
                    && r["rank"] == 0
                {
                    println!(
                        "      weight sync into a second model, rank 0's peak over what it held: gathered whole {:.3} GiB, \
                         part by part {:.3} GiB",
                        gib(whole as f64),
                        gib(parts as f64)
                    );
                }
            }
            // What falls as 1/N at the backward's peak, a parameter: the optimizer state (stage 2's gradient shard
            // comes only after the whole gradients are released, so the peak still holds those).
            let most = |k: &str| reports.iter().map(|r| r[k].as_f64().unwrap_or(0.0)).fold(0.0, f64::max);
            let sharded = if number == "0" { 0.0 } else { most("optimizer_state") };
            let elements = reports.first().and_then(|r| r["elements"].as_f64()).unwrap_or(1.0);
            if let Ok(number) = number.parse() {
                per_parameter.push((shape.to_owned(), number, worst, sharded / elements));
            }
        }
    }
    project(&per_parameter, world, kind);
    Ok(())
}

/// Per-GPU state of the whole published models from the measured bytes a parameter: at the measured world size,
/// and at 8 ranks with the optimizer state scaled by `world / 8`. Stage 2's fp32 gradient shard replaces the whole
/// gradients only after the backward, which still holds them whole, so at the peak stages 1 and 2 hold the same.
fn project(measured: &[(String, u64, f64, f64)], world: usize, kind: Kind) {
    println!(
        "\nprojected per-GPU parameters + whole gradients + AdamW state at the backward's peak (before activations), from \
         the measured bytes a parameter:"
    );
    println!(
        "{:<6} {:>5} {:>8} {:>12} {:>12} {:>14}",
        "model",
        "stage",
        "B/param",
        "params",
        &format!("GiB @{world}"),
        "GiB @8 (scaled)"
    );
    let e = kind.elt_size_in_bytes() as f64;
    for (shape, number, per, state) in measured.iter().filter(|m| m.0 == "0.5b") {
        for model in ["0.5b", "1.5b", "7b", "14b"] {
            let params = parameter_count(model) as f64;
            let at8 = match number {
                0 => *per,
                // Parameters, gradients and state are all sharded (the whole units a pass holds come on top).
                3 => per * world as f64 / 8.0,
                _ => per - state + state * world as f64 / 8.0,
            };
            println!(
                "{model:<6} {number:>5} {per:>8.2} {:>11.2}B {:>12.1} {:>14.1}   (bytes a parameter measured at {shape})",
                params / 1e9,
                gib(per * params),
                gib(at8 * params)
            );
        }
    }
    let expected = |s: ZeroStage, n: usize| {
        StateMemory::expected(TrainedParameters::uniform(1, kind), s, n, false).optimizer_state
    };
    println!(
        "(per parameter the state is {} bytes replicated and {} at stage 1-2 on {world} ranks; parameters and gradients \
         {e} each)",
        expected(ZeroStage::Replicated, 1),
        expected(ZeroStage::Gradients, world)
    );
}
