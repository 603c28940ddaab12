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
pub(crate) fn bench(root: &Path, deps: &Deps, reference_python: &Path, threads: usize, steps: usize) -> Result<()> {
    let python = trl_python(reference_python)?;
    cargo(root, deps, "release build", &["build", "--release", "--locked", "--bin", "trinity"])?;
    let trinity = target_dir(root).join("release").join("trinity");
    step("bench grpo: TRL GRPOTrainer vs trinity run", || {
        run(Command::new(&python)
            .arg(root.join("runtime/rft/bench/bench_grpo.py"))
            .arg("--trinity")
            .arg(&trinity)
            .arg("--gguf")
            .arg(deps.smollm2_gguf())
            .args(["--threads", &threads.to_string(), "--steps", &steps.to_string()]))
    })
}

/// The TRL environment's interpreter, created on first use beside the reference environment it layers over.
fn trl_python(reference_python: &Path) -> Result<PathBuf> {
    let reference_venv = reference_python
        .parent()
        .and_then(Path::parent)
        .context("the reference interpreter is not inside a venv's bin/ folder")?;
    let venv = reference_venv.with_file_name("trl-venv");
    let python = venv.join("bin").join("python");
    let marker = venv.join(format!(".installed-{}", TRL_PACKAGES.join("-")));
    if marker.exists() {
        return Ok(python);
    }
    step("setup: TRL environment over the reference environment", || {
        if venv.exists() {
            std::fs::remove_dir_all(&venv)
                .with_context(|| format!("cannot clear the partial install at {}", venv.display()))?;
        }
        // The reference interpreter creates the venv so both share one Python version, which the `.pth` needs.
        run(Command::new(reference_python).args(["-m", "venv"]).arg(&venv))?;
        let reference_packages = purelib(reference_python)?;
        let packages = purelib(&python)?;
        std::fs::write(packages.join("reference-venv.pth"), format!("{}\n", reference_packages.display()))?;
        run(Command::new(&python)
            .env("PIP_ROOT_USER_ACTION", "ignore")
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
            .args(TRL_PACKAGES))?;
        std::fs::write(&marker, TRL_PACKAGES.join("\n"))?;
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
