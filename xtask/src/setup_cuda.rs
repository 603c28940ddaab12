//! `cargo xtask setup --cuda`: the CUDA libraries and headers that `libtorch_cuda.so` and the `nccl` feature of
//! `runtime/collective` need, added to the libtorch folder that `setup` made.
//!
//! Why these files and this place: the plain setup installs PyPI's torch wheel with `--no-deps` plus only the
//! CUDA runtime and CUPTI (what `libtorch_cpu.so` loads), so `libtorch_cuda.so` is on disk but cannot load: it needs
//! cuBLAS, cuDNN, NCCL, ... . The wheel's own metadata names the exact wheels it was built against, and its RPATH
//! (`$ORIGIN/../../nvidia/<package>/lib`) finds them when they sit next to `torch/` in the same `--target`
//! folder, so installing exactly those requirements there makes it loadable without `LD_LIBRARY_PATH`, and their
//! `include/` folders hold the CUDA runtime, cuBLAS/cuSPARSE/cuSOLVER and NCCL headers the shim compiles against
//! (the collective crate's build script finds them there by itself).
//!
//! Restartable and never destructive: wheels are downloaded into `<deps>/cuda-wheels` (pip keeps what is already
//! there), installed into `<deps>/cuda-staging`, and only then moved into `<deps>/libtorch`, file by file and
//! never over an existing file (`pip install --target` would skip, or with `--upgrade` replace, the `nvidia/`
//! folder the CUDA runtime is already in). An interrupted run resumes where it stopped; the marker is written last.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::setup::{Deps, TORCH_VERSION, python_command};
use crate::{run, step};

/// Headers the shim's NCCL build includes through `ProcessGroupNCCL.hpp`; `setup --cuda` checks each is installed.
const CUDA_HEADERS: [&str; 7] =
    ["cuda_runtime_api.h", "crt/host_config.h", "nv/target", "cublas_v2.h", "cusparse.h", "cusolverDn.h", "nccl.h"];

impl Deps {
    fn cuda_marker(&self) -> PathBuf {
        self.dir().join("libtorch").join(format!(".installed-cuda-{TORCH_VERSION}"))
    }

    /// Installs the CUDA wheels torch's metadata requires into the libtorch folder (2.0 GB downloaded, 2.8 GB on
    /// disk). Needs the plain setup's libtorch first.
    pub(crate) fn install_cuda(&self) -> Result<()> {
        let target = self.dir().join("libtorch");
        let metadata = target.join(format!("torch-{TORCH_VERSION}.dist-info")).join("METADATA");
        let text = std::fs::read_to_string(&metadata)
            .with_context(|| format!("cannot read torch's wheel metadata {}", metadata.display()))?;
        let requirements = cuda_requirements(&text);
        if requirements.is_empty() {
            bail!("{} names no nvidia-* or cuda-toolkit requirement", metadata.display());
        }
        let pins = requirements.join("\n");
        // The marker holds what was installed: another requirement list (a new torch, a new header) redoes the step.
        if std::fs::read_to_string(self.cuda_marker()).ok().as_deref() == Some(pins.as_str()) {
            return Ok(());
        }
        step("setup --cuda: the CUDA, cuDNN and NCCL wheels libtorch_cuda.so was built against", || {
            eprintln!("  {}", requirements.join("\n  "));
            let wheels = self.dir().join("cuda-wheels");
            let staging = self.dir().join("cuda-staging");
            // Outside the staging folder, which is merged away entry by entry.
            let staged = self.dir().join("cuda-staging.done");
            if std::fs::read_to_string(&staged).ok().as_deref() != Some(pins.as_str()) {
                std::fs::create_dir_all(&wheels)?;
                // `--no-cache-dir`: the wheels are kept in `wheels` until installed, and a copy in pip's cache
                // would double the 2 GB.
                let started = std::time::Instant::now();
                run(python_command()
                    .args(["-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-cache-dir"])
                    .args(["--only-binary=:all:", "--dest"])
                    .arg(&wheels)
                    .args(&requirements))
                .context("pip cannot download the CUDA wheels (PyPI must be reachable)")?;
                // Wheels an interrupted run left are not fetched again, so the time covers this run's part.
                eprintln!(
                    "  wheels: {:.2} GB in {}, download {:.1} s",
                    folder_bytes(&wheels)? as f64 / 1e9,
                    wheels.display(),
                    started.elapsed().as_secs_f64()
                );
                if staging.exists() {
                    std::fs::remove_dir_all(&staging)
                        .with_context(|| format!("cannot clear the partial install at {}", staging.display()))?;
                }
                run(python_command()
                    .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-cache-dir"])
                    .args(["--no-index", "--find-links"])
                    .arg(&wheels)
                    .arg("--target")
                    .arg(&staging)
                    .args(&requirements))?;
                std::fs::write(&staged, &pins)?;
            }
            merge_tree(&staging, &target)?;
            self.check_cuda(&target)?;
            std::fs::remove_dir_all(&staging)?;
            std::fs::remove_file(&staged)?;
            if wheels.exists() {
                std::fs::remove_dir_all(&wheels)?;
            }
            std::fs::write(self.cuda_marker(), &pins)?;
            Ok(())
        })?;
        eprintln!(
            "xtask: CUDA libraries installed under {}; `cargo build -p trinity-collective --features nccl` finds \
             their headers there by itself, and `cargo xtask test-cuda` runs that feature's tests",
            self.dir().join("libtorch").join("nvidia").display()
        );
        Ok(())
    }

    /// Checks that every library `libtorch_cuda.so` needs resolves (by its own RPATH, no `LD_LIBRARY_PATH`) and
    /// that the headers the `nccl` feature compiles against are there.
    fn check_cuda(&self, target: &Path) -> Result<()> {
        let lib = self.libtorch().join("lib").join("libtorch_cuda.so");
        let out = Command::new("ldd")
            .arg(&lib)
            .env_remove("LD_LIBRARY_PATH")
            .output()
            .context("cannot run ldd (Debian: libc-bin)")?;
        let listing = String::from_utf8_lossy(&out.stdout);
        let missing: Vec<&str> = listing.lines().filter(|l| l.contains("not found")).map(str::trim).collect();
        if !out.status.success() || !missing.is_empty() {
            bail!("{} still cannot load: {}", lib.display(), missing.join(", "));
        }
        let dirs = header_dirs(&target.join("nvidia"));
        for header in CUDA_HEADERS {
            if !dirs.iter().any(|d| d.join(header).is_file()) {
                bail!(
                    "no {header} under {}/*/include after installing the CUDA wheels",
                    target.join("nvidia").display()
                );
            }
        }
        Ok(())
    }
}

/// The requirements of torch's wheel metadata that are CUDA libraries: `nvidia-*` and `cuda-toolkit[...]`, with
/// their pins and platform markers as written (pip evaluates the markers). Python-only ones (`cuda-bindings`,
/// `triton`) and extras are left out: nothing native loads them. The toolkit also gets its header-only extras `cccl`
/// (libcu++'s `nv/target`, which `cuda_fp16.h` includes; 18 MB) and `crt` (`crt/host_config.h`, which
/// `cuda_runtime.h` includes; 0.5 MB) at the same pin: torch lists only what its libraries load, and a C++ build
/// against the CUDA headers needs those too.
fn cuda_requirements(metadata: &str) -> Vec<String> {
    metadata
        .lines()
        .filter_map(|line| line.strip_prefix("Requires-Dist:"))
        .map(str::trim)
        .filter(|req| !req.contains("extra =="))
        .filter(|req| {
            let name_end = req.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'));
            let name = &req[..name_end.unwrap_or(req.len())];
            name.starts_with("nvidia-") || name == "cuda-toolkit"
        })
        .map(with_header_extras)
        .collect()
}

/// `cuda-toolkit[a,b]==v; m` → `cuda-toolkit[cccl,crt,a,b]==v; m` (the same pin); other requirements unchanged.
fn with_header_extras(requirement: &str) -> String {
    match requirement.strip_prefix("cuda-toolkit") {
        Some(rest) if rest.starts_with('[') => format!("cuda-toolkit[cccl,crt,{}", &rest[1..]),
        Some(rest) => format!("cuda-toolkit[cccl,crt]{rest}"),
        None => requirement.to_owned(),
    }
}

/// `<nvidia>/*/include`: where the CUDA wheels put their headers (`cu13/` for the toolkit, `nccl/`, `cudnn/`, ...).
fn header_dirs(nvidia: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(nvidia)
        .map(|entries| entries.flatten().map(|e| e.path().join("include")).filter(|p| p.is_dir()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs
}

/// The bytes of the files directly in `dir`.
fn folder_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        total += entry?.metadata()?.len();
    }
    Ok(total)
}

/// Moves everything under `from` into `to`, descending into folders both have; a file `to` already has is kept
/// (it came from the same pinned wheel, e.g. the CUDA runtime the plain setup installed).
fn merge_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))? {
        let entry = entry?;
        let dest = to.join(entry.file_name());
        let is_dir = entry.file_type()?.is_dir();
        if is_dir && dest.is_dir() {
            merge_tree(&entry.path(), &dest)?;
        } else if std::fs::symlink_metadata(&dest).is_err() {
            std::fs::rename(entry.path(), &dest)
                .with_context(|| format!("cannot move {} to {}", entry.path().display(), dest.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_cuda_libraries_of_torchs_metadata_and_nothing_else() {
        let metadata = "Name: torch\nRequires-Dist: filelock\n\
            Requires-Dist: cuda-toolkit[cublas,cudart]==13.0.2; platform_system == \"Linux\"\n\
            Requires-Dist: cuda-bindings<14,>=13.0.3; platform_system == \"Linux\"\n\
            Requires-Dist: nvidia-nccl-cu13==2.28.9; platform_system == \"Linux\"\n\
            Requires-Dist: triton==3.6.0; platform_system == \"Linux\"\n\
            Requires-Dist: nvidia-extra-thing; extra == \"cuda\"\n";
        assert_eq!(
            cuda_requirements(metadata),
            [
                "cuda-toolkit[cccl,crt,cublas,cudart]==13.0.2; platform_system == \"Linux\"",
                "nvidia-nccl-cu13==2.28.9; platform_system == \"Linux\""
            ]
        );
    }

    #[test]
    fn the_toolkit_gets_its_header_extras_at_the_same_pin() {
        assert_eq!(with_header_extras("cuda-toolkit==13.0.2"), "cuda-toolkit[cccl,crt]==13.0.2");
        assert_eq!(with_header_extras("nvidia-nccl-cu13==2.28.9"), "nvidia-nccl-cu13==2.28.9");
    }

    #[test]
    fn merging_moves_new_files_and_keeps_existing_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("from"), dir.path().join("to"));
        std::fs::create_dir_all(from.join("nvidia/cu13/lib")).unwrap();
        std::fs::create_dir_all(from.join("nvidia/nccl/lib")).unwrap();
        std::fs::create_dir_all(from.join("nvidia/nccl/include")).unwrap();
        std::fs::create_dir_all(to.join("nvidia/cu13/lib")).unwrap();
        std::fs::write(from.join("nvidia/cu13/lib/libcudart.so.13"), "new").unwrap();
        std::fs::write(from.join("nvidia/cu13/lib/libcublas.so.13"), "cublas").unwrap();
        std::fs::write(from.join("nvidia/nccl/lib/libnccl.so.2"), "nccl").unwrap();
        std::fs::write(to.join("nvidia/cu13/lib/libcudart.so.13"), "old").unwrap();
        merge_tree(&from, &to).unwrap();
        let read = |p: &str| std::fs::read_to_string(to.join(p)).unwrap();
        assert_eq!(read("nvidia/cu13/lib/libcudart.so.13"), "old");
        assert_eq!(read("nvidia/cu13/lib/libcublas.so.13"), "cublas");
        assert_eq!(read("nvidia/nccl/lib/libnccl.so.2"), "nccl");
        assert_eq!(header_dirs(&to.join("nvidia")), [to.join("nvidia/nccl/include")]);
    }
}
