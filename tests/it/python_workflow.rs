//! Trinity-RFT users' Python workflow classes, named by dotted path, run by the Python workflow host on the tiny
//! model, in the venv `cargo xtask setup` makes with `trinity-rft==0.6.0`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::{grpo_run_config, stderr, tiny_model_dir, workspace_root};

/// The user's module: a single-turn workflow that samples the group with one `chat` call (`n`), one that raises
/// on one row, and one that hangs on one row.
const USER_MODULE: &str = r#"
import time

from trinity.common.workflows.workflow import Workflow


class LengthWorkflow(Workflow):
    can_repeat = True

    def set_repeat_times(self, repeat_times, run_id_base):
        self.repeat_times = repeat_times
        self.run_id_base = run_id_base

    def run(self):
        row = self.task.raw_task
        if row["prompt"] == "boom":
            raise ValueError("the user's workflow refused row boom")
        if row["prompt"] == "hang":
            time.sleep(600)
        messages = [{"role": "user", "content": row["prompt"]}]
        experiences = self.model.chat(messages, n=self.repeat_times, temperature=1.0, max_tokens=6, logprobs=0)
        assert isinstance(self.model.model_version, int)
        print("sampled", len(experiences), "for", row["prompt"])
        for run, exp in enumerate(experiences):
            exp.reward = float(len(exp.response_text) % 3)
            exp.metrics = {"length_reward": exp.reward}
            exp.eid.run = self.run_id_base + run
        return experiences
"#;

/// Where `cargo xtask setup` installed Trinity-RFT 0.6.0.
fn trinity_rft_python() -> PathBuf {
    let python = std::env::var_os("TRINITY_RFT_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        let deps = std::env::var_os("TRINITY_DEPS_DIR").map_or_else(|| workspace_root().join(".deps"), PathBuf::from);
        deps.join("trinity-rft-venv/bin/python")
    });
    let imports = Command::new(&python)
        .args(["-c", "import torch, transformers, omegaconf"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        imports,
        "{} cannot import torch: run `cargo xtask setup`, which installs Trinity-RFT 0.6.0",
        python.display()
    );
    python
}

/// A GRPO run dir whose workflow is `userwf.<class>` from a module in the run's directory; `rows` are prompts.
fn run_dir(rows: &[&str], extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("userwf.py"), USER_MODULE).unwrap();
    let tasks: String = rows.iter().map(|p| format!("{{\"prompt\": \"{p}\", \"response\": \"1\"}}\n")).collect();
    std::fs::write(dir.path().join("tasks.jsonl"), tasks).unwrap();
    let config =
        format!("{}    default_workflow_type: userwf.LengthWorkflow\n{extra}", grpo_run_config(&tiny_model_dir(), 40));
    std::fs::write(dir.path().join("config.yaml"), config).unwrap();
    dir
}

fn run(dir: &Path, python: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trinity"))
        .current_dir(dir)
        .args(args)
        .env_remove("RUST_LOG")
        .env("TRINITY_PYTHON", python)
        .output()
        .expect("the trinity binary runs")
}

#[test]
fn a_user_class_by_dotted_path_samples_its_group_and_trains_a_grpo_step() {
    let python = trinity_rft_python();
    let dir = run_dir(&["ab1", "ab2"], "");
    let output = run(dir.path(), &python, &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = dir.path().join("ckpt/p/n");
    let metrics = std::fs::read_to_string(job.join("monitor/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 1, "one step:\n{metrics}");
    let step: serde_json::Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
    assert!(step["train/pg_loss"].is_number(), "{step}");
    assert_eq!(step["rollout/failed_tasks"], 0.0, "{step}");
    assert!(step["rollout/length_reward/mean"].is_number(), "the workflow's metrics reach the step: {step}");
    let log = std::fs::read_to_string(job.join("log/trinity.log")).unwrap();
    assert!(log.contains("sampled 2 for ab1"), "the worker's output is in the log, attributed:\n{log}");
    assert!(log.contains("provided a stand-in module `ray`"), "{log}");
}

#[test]
fn a_workflow_that_raises_or_hangs_costs_only_its_task() {
    let python = trinity_rft_python();
    let dir = run_dir(&["ab1", "boom", "hang", "ab2"], "explorer:\n  max_timeout: 20\n  max_retry_times: 0\n");
    let output = run(dir.path(), &python, &["run", "--config", "config.yaml"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let job = dir.path().join("ckpt/p/n");
    let failed = std::fs::read_to_string(job.join("failed_tasks.jsonl")).unwrap();
    let failed: Vec<serde_json::Value> = failed.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(failed.len(), 2, "{failed:?}");
    let text = serde_json::to_string(&failed).unwrap();
    assert!(text.contains("Traceback") && text.contains("the user's workflow refused row boom"), "{text}");
    assert!(text.contains("20"), "the hung task timed out: {text}");
    let metrics = std::fs::read_to_string(job.join("monitor/metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2, "both steps ran:\n{metrics}");
}

#[test]
fn a_missing_trinity_package_is_a_dry_run_error_with_the_pip_line() {
    let dir = run_dir(&["ab1"], "");
    let output = run(dir.path(), Path::new("python3"), &["run", "--config", "config.yaml", "--dry-run"]);
    let err = stderr(&output);
    let has_trinity =
        Command::new("python3").args(["-c", "import trinity.common"]).output().is_ok_and(|o| o.status.success());
    if has_trinity {
        println!("skipped: the system python3 has Trinity-RFT installed");
        return;
    }
    assert_eq!(output.status.code(), Some(1), "{err}");
    for piece in ["userwf.LengthWorkflow", "`trinity`", "pip install trinity-rft==0.6.0"] {
        assert!(err.contains(piece), "stderr lacks {piece:?}:\n{err}");
    }
    let missing = run(dir.path(), Path::new("/nonexistent/python"), &["run", "--config", "config.yaml", "--dry-run"]);
    assert!(stderr(&missing).contains("/nonexistent/python"), "{}", stderr(&missing));
}
