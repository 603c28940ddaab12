//! `monitor.monitor_type` wandb, mlflow and swanlab: a run reports each step through the service's official
//! client (from `cargo xtask setup`'s monitors venv, `$TRINITY_MONITORS_PYTHON`) in its offline mode, and what the
//! client wrote, read back with the client's own code, holds every step of metrics.jsonl under the names
//! Trinity-RFT gives the run. Nothing reaches the network.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::{grpo_run_config, openai_python, stderr, tiny_model_dir, workspace_root};

/// Where `cargo xtask setup` installed the monitors' clients.
fn monitors_python() -> PathBuf {
    let python = std::env::var_os("TRINITY_MONITORS_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        let deps = std::env::var_os("TRINITY_DEPS_DIR").map_or_else(|| workspace_root().join(".deps"), PathBuf::from);
        deps.join("monitors-venv/bin/python")
    });
    let imports =
        Command::new(&python).args(["-c", "import wandb, mlflow, swanlab"]).output().is_ok_and(|o| o.status.success());
    assert!(imports, "{} cannot import wandb, mlflow and swanlab: run `cargo xtask setup`", python.display());
    python
}

/// Runs two GRPO steps in `dir` with `monitor` (the `monitor:` section's lines) and the interpreter `python`.
fn run_with(dir: &Path, monitor: &str, python: &Path, env: &[(&str, &str)]) -> Output {
    std::fs::write(dir.join("tasks.jsonl"), "{\"prompt\": \"ab\", \"response\": \"b\"}\n".repeat(2)).unwrap();
    let config = format!("{}  total_steps: 2\nmonitor:\n{monitor}", grpo_run_config(&tiny_model_dir(), 64));
    std::fs::write(dir.join("config.yaml"), config).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_trinity"));
    command
        .current_dir(dir)
        .args(["run", "--config", "config.yaml"])
        .env_remove("RUST_LOG")
        .env_remove("TRINITY_CHECKPOINT_ROOT_DIR")
        .env_remove("TRINITY_MODEL_PATH")
        .env_remove("TRINITY_TASKSET_PATH")
        // The clients keep their settings and caches under HOME; the test's stay in its directory.
        .env("HOME", dir)
        .env("TRINITY_PYTHON", python);
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("the trinity binary runs")
}

/// metrics.jsonl's steps, by step number.
fn jsonl_steps(dir: &Path) -> Vec<(u64, serde_json::Map<String, Value>)> {
    let text = std::fs::read_to_string(dir.join("ckpt/p/n/monitor/metrics.jsonl")).unwrap();
    text.lines()
        .map(|line| {
            let mut row: serde_json::Map<String, Value> = serde_json::from_str(line).unwrap();
            (row.remove("step").unwrap().as_u64().unwrap(), row)
        })
        .collect()
}

/// Runs `script` (which prints one JSON object) with the monitors' Python, `argv[1]` being `arg`.
fn read_back(python: &Path, script: &str, arg: &Path) -> Value {
    let output =
        Command::new(python).args(["-c", script]).arg(arg).env("MLFLOW_ALLOW_FILE_STORE", "true").output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)))
}

/// Every finite value of every metrics.jsonl step is in `history` (`{"step": {"key": value}}`) under `rename(key)`.
fn assert_history_holds(dir: &Path, history: &Value, rename: impl Fn(&str) -> String) {
    let steps = jsonl_steps(dir);
    assert!(steps.len() >= 2, "{steps:?}");
    for (step, row) in steps {
        let logged = &history[step.to_string()];
        for (key, value) in row {
            let Some(value) = value.as_f64() else { continue };
            let got = logged[rename(&key)].as_f64();
            assert!(
                got.is_some_and(|g| (g - value).abs() <= 1e-9 * value.abs().max(1.0)),
                "step {step} `{key}`: metrics.jsonl {value}, service {got:?}"
            );
        }
    }
}

/// Reads a wandb offline run's `.wandb` file (LevelDB's log format, as wandb writes it) with wandb's own record
/// protobufs: the run record's names and every history row by step.
const WANDB_READER: &str = r#"
import glob, json, struct, sys
from wandb.proto import wandb_internal_pb2 as pb
[path] = glob.glob(sys.argv[1] + "/wandb/offline-run-*/run-*.wandb")
data = open(path, "rb").read()
assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
records, pending, pos = [], b"", 7
while pos + 7 <= len(data):
    if 32768 - pos % 32768 < 7:
        pos += 32768 - pos % 32768
        continue
    _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
    if kind == 0:
        break
    pending = chunk if kind in (1, 2) else pending + chunk
    if kind in (1, 4):
        records.append(pending)
out = {"history": {}}
for raw in records:
    record = pb.Record()
    record.ParseFromString(raw)
    kind = record.WhichOneof("record_type")
    if kind == "run":
        run = record.run
        config = {u.key: json.loads(u.value_json) for u in run.config.update}
        out["run"] = {"project": run.project, "group": run.run_group, "name": run.display_name,
                      "tags": list(run.tags), "config_project": config.get("project")}
    elif kind == "history":
        row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
        out["history"][str(row["_step"])] = row
print(json.dumps(out))
"#;

#[test]
fn wandb_offline_runs_hold_every_step_under_trinity_rft_names() {
    let python = monitors_python();
    let dir = tempfile::tempdir().unwrap();
    let output = run_with(
        dir.path(),
        "  monitor_type: wandb\n  monitor_args:\n    base_url: null\n    api_key: null\n",
        &python,
        &[("WANDB_MODE", "offline")],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let monitor = dir.path().join("ckpt/p/n/monitor");
    let got = read_back(&python, WANDB_READER, &monitor);
    assert_eq!(
        got["run"],
        serde_json::json!({"project": "p", "group": "n", "name": "n_both", "tags": ["both"], "config_project": "p"})
    );
    assert_history_holds(dir.path(), &got["history"], str::to_owned);
    assert!(!stderr(&output).contains("monitor `wandb`"), "no warning: {}", stderr(&output));
}

const MLFLOW_READER: &str = r#"
import json, sys
from mlflow.tracking import MlflowClient
client = MlflowClient(sys.argv[1])
[run] = client.search_runs([client.get_experiment_by_name("p").experiment_id])
history = {}
for key in run.data.metrics:
    for m in client.get_metric_history(run.info.run_id, key):
        history.setdefault(str(m.step), {})[key] = m.value
print(json.dumps({"name": run.info.run_name, "group": run.data.tags.get("group"), "role": run.data.tags.get("role"),
                  "project_param": run.data.params.get("project"), "history": history}))
"#;

#[test]
fn mlflow_file_store_runs_hold_every_step_under_trinity_rft_names() {
    let python = monitors_python();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file:{}", dir.path().join("mlruns").display());
    let output = run_with(
        dir.path(),
        &format!("  monitor_type: mlflow\n  monitor_args:\n    uri: {store}\n"),
        &python,
        // MLflow 3 keeps its file store for those who ask for it; a user's default is a tracking server.
        &[("MLFLOW_ALLOW_FILE_STORE", "true")],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let got = read_back(&python, MLFLOW_READER, Path::new(&store));
    assert_eq!((&got["name"], &got["group"], &got["role"]), (&"n_both".into(), &"".into(), &"both".into()));
    assert_eq!(got["project_param"], "p", "the run's config is logged as parameters");
    assert_history_holds(dir.path(), &got["history"], |key| key.replace('@', "_at_"));
}

const SWANLAB_READER: &str = r#"
import glob, json, sys
from swanlab.sdk.internal.core_python.store import DataStoreReader
from swanlab.proto.swanlab.record.v1.record_pb2 import Record
[path] = glob.glob(sys.argv[1] + "/run-*/run-*.swanlab")
reader = DataStoreReader()
reader.open(path)
out = {"history": {}}
for raw in reader:
    record = Record()
    record.ParseFromString(raw)
    kind = record.WhichOneof("record_type")
    if kind == "start":
        out["run"] = {"project": record.start.project, "name": record.start.name, "tags": list(record.start.tags)}
    elif kind == "scalar":
        out["history"].setdefault(str(record.scalar.step), {})[record.scalar.key] = record.scalar.value.number
    elif kind == "finish":
        out["finished"] = True
print(json.dumps(out))
"#;

#[test]
fn swanlab_offline_runs_hold_every_step_under_trinity_rft_names() {
    let python = monitors_python();
    let dir = tempfile::tempdir().unwrap();
    let output = run_with(
        dir.path(),
        "  monitor_type: swanlab\n  monitor_args:\n    mode: offline\n    logdir: ./swanlog\n    tags: [grpo]\n",
        &python,
        &[],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let got = read_back(&python, SWANLAB_READER, &dir.path().join("swanlog"));
    assert_eq!(got["run"], serde_json::json!({"project": "p", "name": "n_both", "tags": ["grpo", "both"]}));
    assert_eq!(got["finished"], true, "the run's end finishes the swanlab run");
    assert_history_holds(dir.path(), &got["history"], str::to_owned);
}

#[test]
fn a_missing_client_fails_the_run_at_start_with_the_pip_line() {
    let dir = tempfile::tempdir().unwrap();
    // The openai venv is a Python without wandb.
    let output = run_with(dir.path(), "  monitor_type: wandb\n", &openai_python(), &[("WANDB_MODE", "offline")]);
    let err = stderr(&output);
    assert!(!output.status.success(), "{err}");
    assert!(err.contains("monitor `wandb`") && err.contains("pip install wandb"), "{err}");
    assert!(!dir.path().join("ckpt/p/n/global_step_1").exists(), "nothing trained before the error");
}
