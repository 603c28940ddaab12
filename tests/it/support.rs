//! Small helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// The workspace root, for fixtures.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The tiny Llama checkpoint the repository ships, which the run-level tests train.
pub fn tiny_model_dir() -> PathBuf {
    workspace_root().join("runtime/model/tests/fixtures/tiny/llama_tied")
}

/// The `model:` and `buffer:` sections the run-level tests share: `model` with short responses, batches of two
/// tasks from `tasks.jsonl`. It ends inside `buffer.explorer_input.taskset`, so a caller may go on with taskset
/// keys (six spaces), `explorer_input` keys (four), `buffer` keys (two) or top-level sections.
pub fn model_and_tasks(model: &Path, max_model_len: u32) -> String {
    format!(
        "model:
  model_path: {}
  max_model_len: {max_model_len}
  max_response_tokens: 6
buffer:
  batch_size: 2
  explorer_input:
    taskset:
      path: tasks.jsonl
",
        model.display()
    )
}

/// The start of a GRPO run config (job names, `algorithm:` with two samples per task, then
/// [`model_and_tasks`]), ending inside the taskset like that function.
pub fn grpo_run_config(model: &Path, max_model_len: u32) -> String {
    format!(
        "project: p
name: n
checkpoint_root_dir: ./ckpt
algorithm:
  algorithm_type: grpo
  repeat_times: 2
{}",
        model_and_tasks(model, max_model_len)
    )
}

pub fn fixture(relative: &str) -> PathBuf {
    workspace_root().join("tests/fixtures").join(relative)
}

/// Runs `trinity` with `args` in `dir`, with a clean, predictable environment.
pub fn trinity(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trinity"))
        .current_dir(dir)
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("TRINITY_CHECKPOINT_ROOT_DIR")
        .env_remove("TRINITY_MODEL_PATH")
        .env_remove("TRINITY_TASKSET_PATH")
        .output()
        .expect("the trinity binary runs")
}

/// Starts `trinity run --config CONFIG` in `dir` as a long-lived child (a server, a trainer), stdout discarded
/// and stderr piped so that a failing test can print what the process said.
pub fn spawn_run(dir: &Path, config: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_trinity"))
        .current_dir(dir)
        .args(["run", "--config", config])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the trinity binary starts")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts a failed run with a one-line named error and no panic.
pub fn assert_clean_failure(output: &Output, expected: &[&str]) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(1), "exit code; stderr:\n{err}");
    assert!(!err.contains("panicked"), "panic instead of an error:\n{err}");
    for piece in expected {
        assert!(err.contains(piece), "stderr lacks {piece:?}:\n{err}");
    }
}

/// Where `cargo xtask setup` installed the `openai` package.
pub fn openai_python() -> PathBuf {
    let python = std::env::var_os("TRINITY_OPENAI_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        let deps = std::env::var_os("TRINITY_DEPS_DIR").map_or_else(|| workspace_root().join(".deps"), PathBuf::from);
        deps.join("openai-venv/bin/python")
    });
    let imports = Command::new(&python).args(["-c", "import openai"]).output().is_ok_and(|o| o.status.success());
    assert!(
        imports,
        "{} cannot import the `openai` package: run `cargo xtask setup`, which installs it",
        python.display()
    );
    python
}

/// The interpreter of the venv `cargo xtask setup` makes with Trinity-RFT 0.6.0 and the packages its workflow
/// modules import (`TRINITY_RFT_PYTHON`, else `<deps>/trinity-rft-venv`); a venv that cannot import them fails the
/// test with the command that installs them.
pub(crate) fn trinity_rft_python() -> PathBuf {
    setup_python(
        "TRINITY_RFT_PYTHON",
        "trinity-rft-venv",
        "import trinity, torch, transformers, omegaconf, gymnasium, math_verify",
        "Trinity-RFT 0.6.0 and its workflows' packages",
    )
}

/// The interpreter of the AgentScope venv `cargo xtask setup` makes, layered on the Trinity-RFT venv
/// (`TRINITY_AGENTSCOPE_PYTHON`, else `<deps>/agentscope-venv`); one that cannot import AgentScope's ReAct agent
/// and Trinity-RFT fails the test with the command that installs them.
pub(crate) fn agentscope_python() -> PathBuf {
    setup_python(
        "TRINITY_AGENTSCOPE_PYTHON",
        "agentscope-venv",
        "import trinity, agentscope.agent; agentscope.agent.ReActAgent",
        "AgentScope 1.x and Trinity-RFT 0.6.0",
    )
}

/// The python of `venv` under the deps directory (or `$var`), checked to run `imports`.
fn setup_python(var: &str, venv: &str, imports: &str, what: &str) -> PathBuf {
    let python = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        let deps = std::env::var_os("TRINITY_DEPS_DIR").map_or_else(|| workspace_root().join(".deps"), PathBuf::from);
        deps.join(venv).join("bin/python")
    });
    let runs = Command::new(&python).args(["-c", imports]).output().is_ok_and(|o| o.status.success());
    assert!(runs, "{} cannot import {what}: run `cargo xtask setup`, which installs them", python.display());
    python
}
