//! `cargo xtask fuzz TARGET`: runs one cargo-fuzz target of `fuzz/` for a while, with the limits the targets
//! were tuned for, so every run of a target is comparable and a finding is a finding under the same rules.
//!
//! The fuzz crate is outside the workspace (cargo-fuzz needs nightly and its instrumentation flags); CI never
//! runs it. What it finds becomes a regression test of trinity-model, which CI does run.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::setup::Deps;

/// The fuzz targets, as named in `fuzz/Cargo.toml`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub(crate) enum Target {
    /// A GGUF file, loaded as `trinity generate` loads one.
    Gguf,
    /// A `config.json`.
    HfConfig,
    /// A `model.safetensors` (header and tensors).
    SafetensorsHeader,
    /// `tokenizer.json` + `tokenizer_config.json` + a text to encode and decode.
    Tokenizer,
    /// A chat template and the messages it renders.
    ChatTemplate,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Self::Gguf => "gguf",
            Self::HfConfig => "hf_config",
            Self::SafetensorsHeader => "safetensors_header",
            Self::Tokenizer => "tokenizer",
            Self::ChatTemplate => "chat_template",
        }
    }

    /// The largest input: the seeds are the tiny test fixtures (the largest GGUF is 24 KiB, the safetensors
    /// files 34 KiB), so 64 KiB leaves room to grow without spending time on megabytes of filler.
    fn max_len(self) -> usize {
        64 << 10
    }
}

/// Runs `target` for `seconds` on one core. Without `--sanitizer none` libtorch's uninstrumented C++ would have to
/// run under AddressSanitizer; the code under test is safe Rust, and what is fuzzed here is panics, overflows
/// (debug assertions are on), hangs and runaway allocations, which libFuzzer catches on its own.
pub(crate) fn run(root: &Path, deps: &Deps, target: Target, seconds: u64) -> Result<()> {
    let probe = Command::new("cargo").args(["+nightly", "fuzz", "--version"]).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        bail!(
            "`cargo +nightly fuzz` is not available: run `rustup toolchain install nightly` and `cargo install cargo-fuzz`"
        );
    }
    let name = target.name();
    let mut command = Command::new("cargo");
    command.current_dir(root).args(["+nightly", "fuzz", "run", "--sanitizer", "none", "--debug-assertions"]);
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        command.arg("--target-dir").arg(dir);
    }
    command.args([
        name,
        "--",
        &format!("-max_total_time={seconds}"),
        &format!("-max_len={}", target.max_len()),
        "-rss_limit_mb=2048",
        // A chat template's fuel stops a loop well under a second; ten is a hang.
        "-timeout=10",
        "-print_final_stats=1",
    ]);
    // Syntax and key names for the targets whose inputs are structured text or keyed binary.
    let dict = root.join("fuzz/dicts").join(format!("{name}.dict"));
    if dict.exists() {
        command.arg(format!("-dict={}", dict.display()));
    }
    deps.apply_env(&mut command);
    eprintln!("xtask: fuzz {name} for {seconds} s (corpus fuzz/corpus/{name}, crashes in fuzz/artifacts/{name})");
    let status = command.status().context("cannot start cargo fuzz")?;
    if !status.success() {
        bail!(
            "fuzz target {name} stopped with {status}: keep the input under fuzz/regressions/{name}/ and add a regression test"
        );
    }
    Ok(())
}
