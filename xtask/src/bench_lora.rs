//! `cargo xtask bench lora`: LoRA's figures and its compatibility with Python's peft, in one command.
//!
//! 1. Memory: `bench_lora_memory` (runtime/trainer/examples) runs GRPO train steps at Qwen2.5-0.5B and -1.5B shapes,
//!    LoRA against full fine-tuning, each in a process of its own, and prints peak resident memory and step time
//!    (configurations that cannot fit in this machine's memory are reported with their estimate, not run).
//! 2. peft: a LoRA adapter trinity saved (`--adapter`, or the one a two-step run of
//!    `examples/quickstart/quickstart_lora.yaml` writes) is loaded with `peft.PeftModel.from_pretrained` onto the
//!    base model and compared with `trinity convert --adapter` (`runtime/model/bench/check_peft.py`).
//!
//! peft needs torch, which CI does not install (4.6 GB), so this check lives here and not in `cargo xtask test`;
//! the tests check the adapter format against PEFT's names and config keys instead. peft lives in its own
//! environment, `.deps/peft-venv`, layered over the reference environment like `trl-venv` (a `.pth` file), so it
//! adds peft alone.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::setup::Deps;
use crate::{cargo, run, step, target_dir};

const PEFT_PACKAGE: &str = "peft==0.21.2";

pub(crate) fn bench(
    root: &Path,
    deps: &Deps,
    reference_python: &Path,
    threads: usize,
    adapter: Option<PathBuf>,
) -> Result<()> {
    let python = crate::bench_grpo::layered_venv(reference_python, "peft-venv", &[PEFT_PACKAGE], "peft")?;
    cargo(
        root,
        deps,
        "release build",
        &[
            "build",
            "--release",
            "--locked",
            "-p",
            "trinity",
            "-p",
            "trinity-trainer",
            "--bin",
            "trinity",
            "--example",
            "bench_lora_memory",
        ],
    )?;
    let release = target_dir(root).join("release");
    let trinity = release.join("trinity");
    step("bench lora: peak memory of GRPO train steps, LoRA vs full fine-tuning", || {
        run(Command::new(release.join("examples").join("bench_lora_memory")).args(["--threads", &threads.to_string()]))
    })?;
    // Scratch space for the run, the converted models and the adapter, cleared at each start.
    let work_dir = target_dir(root).join("bench-lora");
    if work_dir.exists() {
        std::fs::remove_dir_all(&work_dir).with_context(|| format!("cannot clear {}", work_dir.display()))?;
    }
    std::fs::create_dir_all(&work_dir)?;
    let work = work_dir.as_path();
    let gguf = deps.smollm2_gguf();
    let adapter = match adapter {
        Some(dir) => dir,
        None => {
            step("bench lora: a two-step LoRA run of the quickstart task for an adapter", || {
                run(Command::new(&trinity)
                    .current_dir(root)
                    .env("TRINITY_SMOLLM2_GGUF", &gguf)
                    .env("TRINITY_CHECKPOINT_ROOT_DIR", work)
                    .args(["run", "--config", "examples/quickstart/quickstart_lora.yaml"])
                    .args(["--set", "buffer.total_steps=2", "--set", "trainer.save_interval=2"])
                    .args(["--set", "explorer.eval_interval=1000", "--set", "explorer.eval_on_startup=false"]))
            })?;
            let project = work.join("quickstart");
            let run_dir = std::fs::read_dir(&project)
                .with_context(|| format!("the LoRA run wrote nothing under {}", project.display()))?
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .find(|p| p.join("global_step_2/lora_adapter").exists())
                .context("the LoRA run wrote no global_step_2/lora_adapter")?;
            run_dir.join("global_step_2/lora_adapter")
        }
    };
    let base = work.join("base-hf");
    let merged = work.join("merged-hf");
    step("bench lora: trinity convert (base, and the adapter merged)", || {
        run(Command::new(&trinity).arg("convert").arg("--gguf").arg(&gguf).arg("--output").arg(&base))?;
        run(Command::new(&trinity)
            .arg("convert")
            .arg("--adapter")
            .arg(&adapter)
            .arg("--base")
            .arg(&base)
            .arg("--output")
            .arg(&merged))
    })?;
    step("bench lora: peft loads the adapter", || {
        run(Command::new(&python)
            .arg(root.join("runtime/model/bench/check_peft.py"))
            .arg("--base")
            .arg(&base)
            .arg("--adapter")
            .arg(&adapter)
            .arg("--merged")
            .arg(&merged)
            .args(["--threads", &threads.to_string()]))
    })
}
