//! `cargo xtask wheel` end to end: the wheel of this test build's `trinity` binary installs into a fresh venv with
//! pip, and the `trinity` command it puts on PATH runs (a `--dry-run`, then a two-step GRPO run on the tiny model)
//! and loads libtorch from the `torch` package alone, with neither `LD_LIBRARY_PATH` nor `LIBTORCH` set.
//!
//! torch is not downloaded: the venv sees the torch 2.11 that `cargo xtask setup` installed with `pip --target`
//! through a `.pth` file, the way a second site directory is added to an environment, and the wheel is installed
//! with `--no-index --no-deps` (the deps folder holds torch without its own Python requirements, so pip could not
//! resolve them offline); the test checks the wheel's requirement on `torch==2.11.0` from its installed metadata
//! instead. That torch lies outside the venv's site-packages, so the binary's own run path
//! (`$ORIGIN/../../torch/lib`) cannot find it: only the launcher's search for the torch package can, which is what
//! the test is about.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::{grpo_run_config, stderr, stdout, tiny_model_dir, workspace_root};

fn run(command: &mut Command) -> Output {
    let output = command.output().unwrap_or_else(|error| panic!("{command:?} cannot start: {error}"));
    assert!(output.status.success(), "{command:?} failed:\n{}{}", stdout(&output), stderr(&output));
    output
}

/// A command without the variables that would find libtorch for it.
fn bare(program: &Path) -> Command {
    let mut command = Command::new(program);
    command.env_remove("LD_LIBRARY_PATH").env_remove("LIBTORCH").env_remove("PYTHONPATH");
    command
}

fn deps_torch_dir() -> PathBuf {
    let deps = std::env::var_os("TRINITY_DEPS_DIR").map_or_else(|| workspace_root().join(".deps"), PathBuf::from);
    deps.join("libtorch")
}

#[test]
fn the_wheel_installs_a_trinity_command_that_finds_torch() {
    let torch = deps_torch_dir();
    assert!(torch.join("torch/lib").is_dir(), "no torch at {}; run `cargo xtask setup`", torch.display());
    let dir = tempfile::tempdir().unwrap();
    let binary = Path::new(env!("CARGO_BIN_EXE_trinity"));
    let target = binary.parent().and_then(Path::parent).expect("<target>/<profile>/trinity");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = run(Command::new(cargo)
        .current_dir(workspace_root())
        .args(["run", "-q", "--locked", "-p", "xtask", "--target-dir"])
        .arg(target)
        .args(["--", "wheel", "--binary"])
        .arg(binary)
        .arg("--out")
        .arg(dir.path().join("wheels")));
    let wheel = PathBuf::from(stdout(&built).trim());
    let name = wheel.file_name().unwrap().to_str().unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert!(name.starts_with(&format!("trinity-{version}-py3-none-manylinux_2_")), "{name}");
    assert!(name.ends_with("_x86_64.whl") || name.ends_with("_aarch64.whl"), "{name}");

    let venv = dir.path().join("venv");
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
    let python = venv.join("bin/python");
    let site = run(bare(&python).args(["-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]));
    let site = PathBuf::from(stdout(&site).trim());
    std::fs::write(site.join("deps-torch.pth"), format!("{}\n", torch.display())).unwrap();
    run(bare(&python)
        .args(["-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check"])
        .arg(&wheel));

    let requires = run(bare(&python).args(["-c", "import importlib.metadata as m; print(m.requires('trinity'))"]));
    assert!(stdout(&requires).contains("torch==2.11.0"), "{}", stdout(&requires));
    // The command is found on PATH, as a user types it.
    let path = format!("{}:/usr/bin:/bin", venv.join("bin").display());
    let version_output = run(bare(Path::new("trinity")).env("PATH", &path).arg("--version"));
    assert!(stdout(&version_output).contains(version), "{}", stdout(&version_output));
    // Built-in algorithm components run tensor code in libtorch.
    let list = run(bare(Path::new("trinity")).env("PATH", &path).args(["algorithm", "list"]));
    assert!(stdout(&list).contains("grpo"), "{}", stdout(&list));
    // A config checks, and a two-step GRPO run on the tiny model trains and checkpoints, from the wheel alone.
    let job = dir.path().join("job");
    std::fs::create_dir_all(&job).unwrap();
    let rows: String = (0..4).map(|i| format!("{{\"prompt\": \"ab{i}\", \"response\": \"{i}\"}}\n")).collect();
    std::fs::write(job.join("tasks.jsonl"), rows).unwrap();
    let config = format!("{}    default_workflow_type: simple_workflow\n", grpo_run_config(&tiny_model_dir(), 40));
    std::fs::write(job.join("config.yaml"), config).unwrap();
    let trinity_in = |args: &[&str]| run(bare(Path::new("trinity")).env("PATH", &path).current_dir(&job).args(args));
    let dry = trinity_in(&["run", "--config", "config.yaml", "--dry-run"]);
    assert!(stdout(&dry).contains("algorithm_type: grpo"), "{}", stdout(&dry));
    trinity_in(&["run", "--config", "config.yaml"]);
    let metrics = std::fs::read_to_string(job.join("ckpt/p/n/monitor/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2, "two steps:\n{metrics}");
    assert!(job.join("ckpt/p/n/global_step_2/hf/model.safetensors").is_file());

    // The binary alone has no run path to the build's libtorch: without the launcher it cannot start here.
    let installed = site.join("trinity_rs/bin/trinity");
    let alone = bare(&installed).arg("--version").output().unwrap();
    assert!(!alone.status.success(), "the packaged binary found libtorch by itself: {}", stdout(&alone));
    assert!(stderr(&alone).contains("libtorch_cpu.so"), "{}", stderr(&alone));
}
