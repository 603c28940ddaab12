//! Peak memory and time of GRPO train steps with LoRA against full fine-tuning, at the shapes of Qwen2.5-0.5B and
//! Qwen2.5-1.5B (random weights built from their published `config.json` values: memory and speed do not need
//! trained weights).
//!
//! ```text
//! cargo run --release -p trinity-trainer --example bench_lora_memory -- [--shapes 0.5b,1.5b] [--modes full,lora]
//!     [--rows 8] [--prompt 64] [--response 64] [--steps 2] [--rank 32] [--alpha 32] [--threads 2]
//! ```
//! A mode may end in `-keep` or `-recompute` (`full-recompute`, `lora-keep`): layer activations always kept, or
//! always recomputed in the backward (`enable_gradient_checkpointing`, [`ActivationRecompute`]); a bare mode runs
//! the trainer's default, which recomputes only a pass whose kept activations would not fit in memory.
//! Each (shape, mode) runs in a child process of its own, because peak resident memory (`VmHWM`) only grows: the
//! parent prints one table. A step is the trainer's real GRPO step (`Trainer::train_step`: old logprobs from the
//! rows, the KL reference, policy loss, backward through the chunked head, AdamW): fp32 parameters, `rows` rows of
//! `prompt + response` tokens in groups of 8. With LoRA (rank 32, alpha 32, `all-linear`, Trinity-RFT's defaults)
//! the base weights are frozen and the KL reference is the policy with its adapters off; full fine-tuning keeps a
//! frozen reference copy, gradients and AdamW state for every weight.
//!
//! A child whose estimate (weights × 4 copies for full fine-tuning, plus the reference copy) exceeds the memory
//! available is not started: it says so and prints the estimate instead of measuring, so the benchmark never
//! pushes a shared machine into swap or the OOM killer.

use std::process::Command;
use std::time::Instant;

use serde_json::{Value, json};
use tch::{Device, Kind};
use trinity_config::algorithm::{AlgorithmConfig, LossAggMode, OptimizerConfig};
use trinity_model::{Decoder, LoraSpec, ModelConfig, RandomWeights};
use trinity_trainer::{ActivationRecompute, Components, TrainRow, Trainer, TrainerOptions};

/// `config.json` values Qwen publishes for the two models (architecture only). `runtime/model/bench/shape_gguf.py`
/// writes GGUF files of the same shapes for `cargo xtask bench generate|train --shape`.
fn qwen_config(shape: &str) -> Option<Value> {
    let (hidden, inter, layers, heads, kv, max_pos) = match shape {
        "0.5b" => (896, 4864, 24, 14, 2, 32768),
        "1.5b" => (1536, 8960, 28, 12, 2, 131072),
        _ => return None,
    };
    Some(json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv, "max_position_embeddings": max_pos, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": true, "vocab_size": 151936, "hidden_act": "silu",
        "bos_token_id": 151643, "eos_token_id": 151643, "torch_dtype": "bfloat16",
    }))
}

struct Args {
    shapes: Vec<String>,
    modes: Vec<String>,
    rows: usize,
    prompt: usize,
    response: usize,
    steps: usize,
    rank: i64,
    alpha: f64,
    threads: i32,
    child: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        shapes: vec!["0.5b".into(), "1.5b".into()],
        modes: vec!["full".into(), "lora".into()],
        rows: 8,
        prompt: 64,
        response: 64,
        steps: 2,
        rank: 32,
        alpha: 32.0,
        threads: 2,
        child: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--child" {
            a.child = true;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        let list = |v: &str| v.split(',').map(str::to_owned).collect::<Vec<_>>();
        match flag.as_str() {
            "--shapes" => a.shapes = list(&value),
            "--modes" => a.modes = list(&value),
            "--rows" => a.rows = num(&value)?.max(1),
            "--prompt" => a.prompt = num(&value)?.max(1),
            "--response" => a.response = num(&value)?.max(1),
            "--steps" => a.steps = num(&value)?.max(1),
            "--rank" => a.rank = num(&value)? as i64,
            "--alpha" => a.alpha = value.parse().map_err(|e| format!("{flag}: {e}"))?,
            "--threads" => a.threads = num(&value)? as i32,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    for shape in &a.shapes {
        qwen_config(shape).ok_or_else(|| format!("--shapes {shape}: use 0.5b or 1.5b"))?;
    }
    for mode in &a.modes {
        split_mode(mode)?;
    }
    Ok(a)
}

/// A mode's fine-tuning (`full` or `lora`) and what happens to layer activations.
fn split_mode(mode: &str) -> Result<(&str, ActivationRecompute), String> {
    let (base, recompute) = match mode.split_once('-') {
        None => (mode, ActivationRecompute::WhenShort),
        Some((base, "keep")) => (base, ActivationRecompute::Never),
        Some((base, "recompute")) => (base, ActivationRecompute::Always),
        Some(_) => return Err(format!("--modes {mode}: a mode ends in -keep or -recompute, or in neither")),
    };
    if base != "full" && base != "lora" {
        return Err(format!("--modes {mode}: use full or lora, optionally with -keep or -recompute"));
    }
    Ok((base, recompute))
}

/// A `/proc/self/status` field in bytes (`VmHWM`: peak resident memory; `VmRSS`: now).
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn available_bytes() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn gib(bytes: f64) -> f64 {
    bytes / f64::from(1u32 << 30)
}

/// Parameters of the model at `shape` (tied head counted once).
fn parameter_count(config: &ModelConfig) -> u64 {
    trinity_model::param_specs(config).iter().map(|s| s.shape.iter().product::<i64>() as u64).sum()
}

/// Bytes the weights, gradients, AdamW moments and reference copy need (activations not included).
fn state_estimate(config: &ModelConfig, mode: &str) -> f64 {
    let weights = parameter_count(config) as f64 * 4.0;
    match mode {
        // Weights, gradients, two moments, and GRPO's frozen reference copy.
        "full" => weights * 5.0,
        // Weights only: the adapters and their state are a few per cent.
        _ => weights * 1.1,
    }
}

fn grpo() -> AlgorithmConfig {
    AlgorithmConfig {
        algorithm_type: "grpo".into(),
        advantage_fn: Some("grpo".into()),
        policy_loss_fn: Some("ppo".into()),
        kl_penalty_fn: Some("none".into()),
        kl_loss_fn: Some("k2".into()),
        entropy_loss_fn: Some("default".into()),
        loss_agg_mode: Some(LossAggMode::TokenMean),
        ..AlgorithmConfig::default()
    }
}

/// Rows of `prompt + response` random tokens, groups of 8 sharing a prompt, with advantages of ±1.
fn rows(args: &Args, vocab: i64) -> Vec<TrainRow> {
    let mut state = 17u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % (vocab as u64 - 1)) as i64 + 1
    };
    let mut out = Vec::new();
    let mut prompt: Vec<i64> = Vec::new();
    for i in 0..args.rows {
        if i % 8 == 0 {
            prompt = (0..args.prompt).map(|_| next()).collect();
        }
        let mut tokens = prompt.clone();
        tokens.extend((0..args.response).map(|_| next()));
        let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
        out.push(TrainRow {
            tokens,
            prompt_length: args.prompt,
            action_mask: vec![true; args.response],
            logprobs: vec![-11.0; args.response],
            reward: Some(sign),
            advantages: Some(vec![sign; args.response]),
            group_id: Some(format!("g{}", i / 8)),
            ..TrainRow::default()
        });
    }
    out
}

/// One measurement, in this process: prints `RESULT shape mode loaded_gib peak_gib step_s trainable`.
fn child(args: &Args, shape: &str, mode: &str) -> Result<(), String> {
    tch::set_num_threads(args.threads);
    let config = ModelConfig::from_json(&qwen_config(shape).unwrap_or_default()).map_err(|e| e.to_string())?;
    tch::manual_seed(0);
    let mut policy =
        Decoder::load(config.clone(), &mut RandomWeights, Kind::Float, Device::Cpu).map_err(|e| e.to_string())?;
    let (base, activation_recompute) = split_mode(mode)?;
    if base == "lora" {
        let spec = LoraSpec::all_linear(args.rank, args.alpha);
        policy.add_lora(&spec, 42).map_err(|e| e.to_string())?;
    }
    let trainable: i64 =
        policy.trainable_parameters().map_err(|e| e.to_string())?.iter().map(|(_, t)| t.numel() as i64).sum();
    let loaded = status_bytes("VmRSS:");
    let components = Components::from_config(&grpo()).map_err(|e| e.to_string())?;
    let optimizer = OptimizerConfig { lr: 1e-5, ..OptimizerConfig::default() };
    let options =
        TrainerOptions { total_steps: Some(args.steps as u64), activation_recompute, ..TrainerOptions::default() };
    let mut trainer = Trainer::new(policy, components, &optimizer, options).map_err(|e| e.to_string())?;
    let rows = rows(args, config.vocab_size);
    let mut times = Vec::new();
    for _ in 0..args.steps {
        let started = Instant::now();
        trainer.train_step(&rows).map_err(|e| e.to_string())?;
        times.push(started.elapsed().as_secs_f64());
    }
    let peak = status_bytes("VmHWM:");
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    println!("RESULT {shape} {mode} {:.3} {:.3} {best:.2} {trainable}", gib(loaded as f64), gib(peak as f64));
    Ok(())
}

fn main() -> Result<(), String> {
    let args = parse()?;
    if args.child {
        return child(&args, &args.shapes[0], &args.modes[0]);
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let tokens = args.rows * (args.prompt + args.response);
    println!(
        "GRPO train step, fp32, {} rows × ({} prompt + {} response) tokens = {tokens} tokens, {} threads; LoRA rank {} \
         alpha {} all-linear",
        args.rows, args.prompt, args.response, args.threads, args.rank, args.alpha
    );
    println!(
        "{:<6} {:<14} {:>8} {:>10} {:>10} {:>10} {:>9}",
        "shape", "mode", "params", "trainable", "loaded GiB", "peak GiB", "step s"
    );
    for shape in &args.shapes {
        let config = ModelConfig::from_json(&qwen_config(shape).unwrap_or_default()).map_err(|e| e.to_string())?;
        let params = parameter_count(&config);
        for mode in &args.modes {
            let estimate = state_estimate(&config, split_mode(mode)?.0);
            let available = available_bytes() as f64;
            if estimate > 0.8 * available {
                println!(
                    "{shape:<6} {mode:<14} {:>7.2}B  not run: weights, gradients, AdamW state and reference need ~{:.1} GiB \
                     before activations; {:.1} GiB available",
                    params as f64 / 1e9,
                    gib(estimate),
                    gib(available)
                );
                continue;
            }
            let mut command = Command::new(&exe);
            command.args(["--child", "--shapes", shape, "--modes", mode]);
            for (flag, value) in [
                ("--rows", args.rows.to_string()),
                ("--prompt", args.prompt.to_string()),
                ("--response", args.response.to_string()),
                ("--steps", args.steps.to_string()),
                ("--rank", args.rank.to_string()),
                ("--alpha", args.alpha.to_string()),
                ("--threads", args.threads.to_string()),
            ] {
                command.args([flag, &value]);
            }
            let output = command.output().map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&output.stdout);
            let Some(line) = text.lines().find_map(|l| l.strip_prefix("RESULT ")) else {
                println!(
                    "{shape:<6} {mode:<14} failed: {}",
                    String::from_utf8_lossy(&output.stderr).lines().last().unwrap_or("no output")
                );
                continue;
            };
            let f: Vec<&str> = line.split_whitespace().collect();
            println!(
                "{shape:<6} {mode:<14} {:>7.2}B {:>10} {:>10} {:>10} {:>9}",
                params as f64 / 1e9,
                f[5],
                f[2],
                f[3],
                f[4]
            );
        }
    }
    Ok(())
}
