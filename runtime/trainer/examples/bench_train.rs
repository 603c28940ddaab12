//! Training throughput of the engine's core: forward + backward + log-softmax gather over every next-token
//! position, for SmolLM2-135M on the CPU (8 × 164 tokens by default; `--model` takes any model file, e.g. the
//! Qwen2.5-shaped ones `cargo xtask bench train --shape` writes), in fp32 and in bf16 (bf16 parameters and
//! compute with fp32 master weights — the trainer's bf16 mode). The computation is the trainer's own path:
//! `Decoder::forward_hidden` and the chunked head ([`trinity_trainer::logprobs`], by default in the trainer's
//! head mode, recomputing), with loss = −mean(logprob). No optimizer step (that is outside what PyTorch's `bench_train.py` measures too).
//!
//! ```text
//! cargo run --release -p trinity-trainer --example bench_train -- [--model FILE] [--dtype f32|bf16|both]
//!     [--batch 8] [--seq 164] [--iters 3] [--threads 2] [--chunk 1024] [--head keep|recompute] [--phases]
//!     [--recompute] [--step-memory]
//! ```
//! `--recompute` recomputes each layer's activations in the backward (`Decoder::set_recompute_activations`, veRL's
//! `enable_gradient_checkpointing`); the FLOPs line still counts the model's work only, so it reads what the
//! recomputation costs. Each line ends with the process's peak resident memory so far.
//!
//! `--step-memory` adds what one iteration holds at its peak above what the process held when it began: before
//! each iteration the kernel's high-water mark is reset to the current resident size (`/proc/self/clear_refs`),
//! and after it the mark is read. The process-wide peak cannot tell a step's memory apart from the model load's
//! (at Qwen2.5-0.5B's shape, 1 to 6 sequences of 512 tokens peaked at 4.8-6.0 GB in no order). Pages freed by one
//! iteration must go back to the kernel for this to see the next one's, so the flag needs jemalloc told to return
//! them at once: `MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0` (the binary otherwise keeps them, see
//! runtime/cli/src/allocator.rs). Taken at two batch sizes, the difference over the difference in tokens is the
//! activation memory a token costs, the figure `micro_batch`'s token caps are sized by.
//! The model defaults to `$TRINITY_SMOLLM2_GGUF`. Prints one line per dtype: wall seconds per iteration (best
//! and mean of `--iters` after one warm-up), tokens/s, and the process CPU seconds per iteration (user + system,
//! all threads), which is less sensitive than wall time to other processes competing for the cores.
//!
//! A second line puts the iteration against the machine: the model's matmul FLOPs per iteration (forward and
//! backward of every linear layer, the attention products and the head, counted once, as MFU counts them: a
//! recomputed head is work the step chose, not work the model needs) over the best time, as a share of this CPU's
//! matmul rate in the same dtype and thread count, measured here on a 2048³ matmul. That share is what issue 20's
//! "a train step at ≥ 60% of the matmul rate" is read from.

// The trinity binary's allocator, so that the figures are the train step's as `trinity run` pays it: under
// glibc's malloc the large activation blocks go back to the kernel on free and every iteration faults them in
// again (~10% of the main thread's samples in the kernel, 12% slower iterations, measured 2026-11-25).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[path = "../../cli/src/allocator.rs"]
mod allocator;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tch::{Device, Kind, Tensor};
use trinity_model::load_model;
use trinity_trainer::TrainerOptions;
use trinity_trainer::logprobs::{self, HeadMode};

struct Args {
    model: PathBuf,
    dtypes: Vec<Kind>,
    batch: i64,
    seq: i64,
    iters: usize,
    threads: i32,
    chunk: i64,
    head: HeadMode,
    phases: bool,
    recompute: bool,
    step_memory: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        model: std::env::var_os("TRINITY_SMOLLM2_GGUF").map(PathBuf::from).unwrap_or_default(),
        dtypes: vec![Kind::Float, Kind::BFloat16],
        batch: 8,
        seq: 164,
        iters: 3,
        threads: 2,
        chunk: 1024,
        head: TrainerOptions::default().head_mode,
        phases: false,
        recompute: false,
        step_memory: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if matches!(flag.as_str(), "--phases" | "--recompute" | "--step-memory") {
            args.phases |= flag == "--phases";
            args.recompute |= flag == "--recompute";
            args.step_memory |= flag == "--step-memory";
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<i64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--model" => args.model = PathBuf::from(value),
            "--dtype" => {
                args.dtypes = match value.as_str() {
                    "f32" => vec![Kind::Float],
                    "bf16" => vec![Kind::BFloat16],
                    "both" => vec![Kind::Float, Kind::BFloat16],
                    other => return Err(format!("--dtype {other}: use f32, bf16 or both")),
                }
            }
            "--batch" => args.batch = num(&value)?,
            "--seq" => args.seq = num(&value)?,
            "--iters" => args.iters = num(&value)?.max(1) as usize,
            "--threads" => args.threads = num(&value)? as i32,
            "--chunk" => args.chunk = num(&value)?,
            "--head" => {
                args.head = match value.as_str() {
                    "keep" => HeadMode::KeepUpTo(i64::MAX),
                    "recompute" => HeadMode::Recompute,
                    other => return Err(format!("--head {other}: use keep or recompute")),
                }
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.model.as_os_str().is_empty() {
        return Err("no model: pass --model FILE or set TRINITY_SMOLLM2_GGUF".into());
    }
    let conf = std::env::var("MALLOC_CONF").unwrap_or_default();
    let set = |option: &str| conf.split(',').any(|o| o.trim() == option);
    if args.step_memory && !(set("dirty_decay_ms:0") && set("muzzy_decay_ms:0")) {
        return Err("--step-memory needs freed pages returned to the kernel at once: run with \
                    MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0"
            .into());
    }
    Ok(args)
}

fn run(args: &Args, kind: Kind) -> Result<(), Box<dyn std::error::Error>> {
    let mut model = load_model(&args.model, kind, Device::Cpu)?;
    model.decoder.set_recompute_activations(args.recompute)?;
    let decoder = &model.decoder;
    tch::manual_seed(0);
    let vocab = decoder.config().vocab_size;
    let ids = Tensor::f_randint(vocab, [args.batch, args.seq], (Kind::Int64, Device::Cpu))?;
    let n = args.seq - 1;
    let targets = ids.f_narrow(1, 1, n)?;
    let grad = Tensor::f_full([args.batch, n], -1.0 / (args.batch * n) as f64, (Kind::Float, Device::Cpu))?;
    let mut times = Vec::new();
    let mut step_bytes = 0u64;
    let mut cpu_start = 0.0;
    for i in 0..=args.iters {
        if i == 1 {
            cpu_start = cpu_seconds();
        }
        let resident_before = if args.step_memory { reset_peak_rss()? } else { 0 };
        let start = Instant::now();
        let mut phases = Vec::new();
        let mut mark = |name: &'static str| phases.push((name, start.elapsed().as_secs_f64(), cpu_seconds()));
        mark("start");
        let hidden = decoder.forward_hidden(&ids, None)?.f_narrow(1, 0, n)?;
        mark("decoder forward");
        let pass = logprobs::forward(decoder, &hidden, &targets, 1.0, args.chunk, false, false, args.head)?;
        let loss = -pass.stats.logprob.f_mean(Kind::Float)?.f_double_value(&[])?;
        mark("head forward");
        logprobs::backward(decoder, pass, &hidden, &targets, 1.0, args.chunk, &grad, None)?;
        mark("backward");
        let secs = start.elapsed().as_secs_f64();
        if args.step_memory && i > 0 {
            step_bytes = step_bytes.max(status_bytes("VmHWM:").saturating_sub(resident_before));
        }
        if args.phases {
            let line: Vec<String> = phases
                .windows(2)
                .map(|w| format!("{} {:.2} s wall / {:.2} s cpu", w[1].0, w[1].1 - w[0].1, w[1].2 - w[0].2))
                .collect();
            eprintln!("  iteration {i}: {}", line.join(", "));
        }
        // As the trainer's optimizer clears gradients: dropped, so the next backward writes them afresh.
        for (_, mut p) in decoder.named_parameters()? {
            trinity_model::release_grad(&mut p);
        }
        if i > 0 {
            times.push(secs);
        } else {
            eprintln!("warm-up {secs:.2} s (loss {loss:.4})");
        }
    }
    let cpu = (cpu_seconds() - cpu_start) / args.iters as f64;
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    let tokens = (args.batch * args.seq) as f64;
    let name = if kind == Kind::Float { "fp32" } else { "bf16 (bf16 params, fp32 masters)" };
    let layers = if args.recompute { ", layers recomputed" } else { "" };
    let flops = model_flops(decoder.config(), args.batch, args.seq);
    let rate = matmul_rate(kind)?;
    let logit_bytes = args.batch * (args.seq - 1) * vocab * 4;
    let head = match args.head {
        HeadMode::KeepUpTo(limit) if logit_bytes <= limit => "head kept",
        _ => "head recomputed",
    };
    println!(
        "trinity {name} [{head}{layers}] {}x{} tokens: best {best:.2} s, mean {mean:.2} s -> {:.0} tokens/s (best), {:.0} tokens/s (mean); cpu {cpu:.2} s/iter; peak RSS {:.2} GB",
        args.batch,
        args.seq,
        tokens / best,
        tokens / mean,
        peak_rss_bytes() as f64 / 1e9
    );
    if args.step_memory {
        println!(
            "  an iteration's peak above its start: {:.3} GB ({:.3} MB a token over all {} tokens)",
            step_bytes as f64 / 1e9,
            step_bytes as f64 / 1e6 / tokens,
            tokens
        );
    }
    println!(
        "  {:.3} TFLOP of matmuls per iteration -> {:.1} GFLOP/s (best) = {:.0}% of this CPU's {name} matmul rate, {:.1} GFLOP/s (2048^3, {} threads)",
        flops / 1e12,
        flops / best / 1e9,
        100.0 * flops / best / rate,
        rate / 1e9,
        args.threads
    );
    Ok(())
}

/// Matmul FLOPs of one training iteration (forward + backward) over `batch` × `seq` tokens: each linear layer
/// costs 2 FLOPs per weight per token forward and twice that backward (input and weight gradients); the attention
/// products QKᵀ and AV cost 2·seq²·head_dim per head and sequence forward (the full square: the causal mask does
/// not skip work in the kernels used) and twice that backward; the head (vocab × hidden) runs over the `seq − 1`
/// predicted positions. The input embedding is a gather, not a matmul, and norms and activations are left out.
fn model_flops(config: &trinity_model::ModelConfig, batch: i64, seq: i64) -> f64 {
    let (h, i, d) = (config.hidden_size as f64, config.intermediate_size as f64, config.head_dim as f64);
    let (heads, kv) = (config.num_attention_heads as f64, config.num_key_value_heads as f64);
    let per_layer = h * heads * d * 2.0 + h * kv * d * 2.0 + 3.0 * h * i;
    let tokens = (batch * seq) as f64;
    let linear = 2.0 * per_layer * config.num_hidden_layers as f64 * tokens;
    let attention = 2.0 * 2.0 * (seq * seq) as f64 * d * heads * batch as f64 * config.num_hidden_layers as f64;
    let head = 2.0 * config.vocab_size as f64 * h * (batch * (seq - 1)) as f64;
    3.0 * (linear + attention + head)
}

/// This CPU's matmul rate in `kind` (FLOP/s) at the thread count already set: the best of ten 2048 × 2048 ×
/// 2048 products after a warm-up, the shape where libtorch's GEMM is at its steady rate.
fn matmul_rate(kind: Kind) -> Result<f64, tch::TchError> {
    const N: i64 = 2048;
    let a = Tensor::f_randn([N, N], (kind, Device::Cpu))?;
    let b = Tensor::f_randn([N, N], (kind, Device::Cpu))?;
    let _ = a.f_matmul(&b)?;
    let mut best = f64::INFINITY;
    for _ in 0..10 {
        let start = Instant::now();
        let _ = a.f_matmul(&b)?;
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(2.0 * (N * N * N) as f64 / best)
}

/// User + system CPU seconds of this process (all threads), from `/proc/self/stat` (clock ticks of 1/100 s);
/// 0 where that file does not exist.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th of them.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// The highest `VmHWM` seen before [`reset_peak_rss`] last reset it, so the process's peak survives the resets.
static PEAK_BEFORE_RESETS: AtomicU64 = AtomicU64::new(0);

/// The process's peak resident memory (`VmHWM` of `/proc/self/status`, or higher before a reset), in bytes; 0
/// where unreadable.
fn peak_rss_bytes() -> u64 {
    status_bytes("VmHWM:").max(PEAK_BEFORE_RESETS.load(Ordering::Relaxed))
}

/// A `/proc/self/status` line's size (kB there), in bytes; 0 where unreadable.
fn status_bytes(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with(key)).unwrap_or("");
    line.split_whitespace().nth(1).and_then(|k| k.parse::<u64>().ok()).unwrap_or(0) * 1024
}

/// Resets the kernel's peak resident size of this process to its current one (Linux's `clear_refs` value 5) and
/// returns that size, so a later `status_bytes("VmHWM:")` reads the peak since now; [`peak_rss_bytes`] keeps the
/// process's.
fn reset_peak_rss() -> Result<u64, String> {
    PEAK_BEFORE_RESETS.fetch_max(status_bytes("VmHWM:"), Ordering::Relaxed);
    std::fs::write("/proc/self/clear_refs", "5")
        .map_err(|e| format!("--step-memory: cannot reset the peak resident size (/proc/self/clear_refs): {e}"))?;
    Ok(status_bytes("VmRSS:"))
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench_train: {e}");
            std::process::exit(2);
        }
    };
    tch::set_num_threads(args.threads);
    for &kind in &args.dtypes {
        if let Err(e) = run(&args, kind) {
            eprintln!("bench_train: {e}");
            std::process::exit(1);
        }
    }
}
