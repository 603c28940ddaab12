//! `cargo xtask bench grpo`: trinity's whole RFT loop against TRL's GRPOTrainer doing the same GRPO work
//! (`runtime/rft/bench/bench_grpo.py` says exactly what that work is).
//!
//! TRL lives in its own throwaway environment, `.deps/trl-venv`, layered over the reference environment: a `.pth`
//! file puts the reference venv's site-packages (torch, transformers, accelerate) on its path, so pip sees them as
//! installed and adds only TRL and what TRL needs beyond them (datasets, pandas, pyarrow; ~300 MB, seconds) instead
//! of a second 4.6 GB torch. Deleting the folder removes TRL and leaves the reference environment untouched.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::setup::Deps;
use crate::{cargo, run, step, target_dir};

/// TRL and datasets pinned: GRPOConfig's defaults (bf16, gradient checkpointing, loss type, beta) move between
/// releases, and the bench's docstring describes these versions' behaviour.
const TRL_PACKAGES: [&str; 2] = ["trl==1.16.0", "datasets==5.2.0"];

/// Makes sure the TRL environment exists, builds trinity, and runs the side-by-side script (setup first, like
/// every other xtask command, so a broken build does not hide a broken environment).
pub(crate) fn bench(
    root: &Path,
    deps: &Deps,
    reference_python: &Path,
    threads: usize,
    steps: usize,
    reward: &str,
) -> Result<()> {
    let python = layered_venv(reference_python, "trl-venv", &TRL_PACKAGES, "TRL")?;
    cargo(root, deps, "release build", &["build", "--release", "--locked", "--bin", "trinity"])?;
    let trinity = target_dir(root).join("release").join("trinity");
    step("bench grpo: TRL GRPOTrainer vs trinity run", || {
        run(Command::new(&python)
            .arg(root.join("runtime/rft/bench/bench_grpo.py"))
            .arg("--trinity")
            .arg(&trinity)
            .arg("--gguf")
            .arg(deps.smollm2_gguf())
            .args(["--threads", &threads.to_string(), "--steps", &steps.to_string(), "--reward", reward]))
    })
}

/// A virtual environment named `name`, created on first use beside the reference environment and layered over
/// it (a `.pth` file puts the reference's packages on its path), with `packages` installed on top: benchmarks that
/// need one more package than torch and transformers (TRL, peft) get it without a second 4.6 GB torch install.
/// Returns its interpreter.
pub(crate) fn layered_venv(reference_python: &Path, name: &str, packages: &[&str], what: &str) -> Result<PathBuf> {
    let reference_venv = reference_python
        .parent()
        .and_then(Path::parent)
        .context("the reference interpreter is not inside a venv's bin/ folder")?;
    let venv = reference_venv.with_file_name(name);
    let python = venv.join("bin").join("python");
    let marker = venv.join(format!(".installed-{}", packages.join("-")));
    if marker.exists() {
        return Ok(python);
    }
    step(&format!("setup: {what} environment over the reference environment"), || {
        if venv.exists() {
            std::fs::remove_dir_all(&venv)
                .with_context(|| format!("cannot clear the partial install at {}", venv.display()))?;
        }
        // The reference interpreter creates the venv so both share one Python version, which the `.pth` needs.
        run(Command::new(reference_python).args(["-m", "venv"]).arg(&venv))?;
        let reference_packages = purelib(reference_python)?;
        std::fs::write(purelib(&python)?.join("reference-venv.pth"), format!("{}\n", reference_packages.display()))?;
        run(Command::new(&python)
            .env("PIP_ROOT_USER_ACTION", "ignore")
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .args(packages))?;
        std::fs::write(&marker, packages.join("\n"))?;
        Ok(())
    })?;
    Ok(python)
}

/// The site-packages folder of an interpreter, as it reports it.
pub(crate) fn purelib(python: &Path) -> Result<PathBuf> {
    let output = Command::new(python)
        .args(["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
        .output()
        .with_context(|| format!("cannot start {}", python.display()))?;
    anyhow::ensure!(output.status.success(), "{} cannot report its site-packages folder", python.display());
    Ok(PathBuf::from(String::from_utf8(output.stdout).context("site-packages path is not UTF-8")?.trim()))
}
