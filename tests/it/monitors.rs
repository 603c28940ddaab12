//! `monitor.monitor_type` wandb, mlflow and swanlab: a run reports each step through the service's official
//! client (from `cargo xtask setup`'s monitors venv, `$TRINITY_MONITORS_PYTHON`) in its offline mode, or to a
//! real MLflow tracking server the test runs on loopback, and what the client wrote, read back with the client's
//! own code, holds every step of metrics.jsonl under the names Trinity-RFT gives the run. A server that is down
//! or never answers costs one warning, not the run. Nothing leaves the machine.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

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
fn read_back(python: &Path, script: &str, arg: impl AsRef<OsStr>) -> Value {
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
    // wandb's own `sync` takes the directory as the offline run it uploads.
    let [run] = std::fs::read_dir(monitor.join("wandb"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.file_name().unwrap().to_string_lossy().starts_with("offline-run-"))
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    let sync = Command::new(python.with_file_name("wandb"))
        .args(["sync", "--dry-run"])
        .arg(&run)
        .env("HOME", dir.path())
        .output();
    let sync = sync.expect("the venv's wandb command runs");
    let said = format!("{}{}", String::from_utf8_lossy(&sync.stdout), String::from_utf8_lossy(&sync.stderr));
    assert!(sync.status.success() && said.contains("Would sync 1 run(s)"), "{said}");
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
                  "params": run.data.params, "status": run.info.status, "ended": run.info.end_time is not None,
                  "history": history}))
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
    assert_eq!(got["params"]["project"], "p", "the run's config is logged as parameters");
    assert_eq!((&got["status"], &got["ended"]), (&"FINISHED".into(), &true.into()), "the run's end ends it");
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

/// A two-step run with swanlab in `mode` (`offline`, for `swanlab sync`, or `local`, for `swanlab watch`) holds
/// every step in its run file, read with swanlab's own reader.
fn swanlab_run_holds_every_step(mode: &str) {
    let python = monitors_python();
    let dir = tempfile::tempdir().unwrap();
    let output = run_with(
        dir.path(),
        &format!(
            "  monitor_type: swanlab\n  monitor_args:\n    mode: {mode}\n    logdir: ./swanlog\n    tags: [grpo]\n"
        ),
        &python,
        &[],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let got = read_back(&python, SWANLAB_READER, dir.path().join("swanlog"));
    assert_eq!(got["run"], serde_json::json!({"project": "p", "name": "n_both", "tags": ["grpo", "both"]}));
    assert_eq!(got["finished"], true, "the run's end finishes the swanlab run");
    assert_history_holds(dir.path(), &got["history"], str::to_owned);
    assert!(!stderr(&output).contains("monitor `swanlab`"), "no warning: {}", stderr(&output));
}

#[test]
fn swanlab_offline_runs_hold_every_step_under_trinity_rft_names() {
    swanlab_run_holds_every_step("offline");
}

#[test]
fn swanlab_local_runs_hold_every_step_under_trinity_rft_names() {
    swanlab_run_holds_every_step("local");
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

/// A loopback port nothing listens on (the OS's pick, released again).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A local MLflow tracking server (`mlflow server`, a SQLite backend store in a directory of its own) on a free
/// loopback port; dropping it stops the server (its whole process group: uvicorn and the job runner) and
/// removes the directory.
struct MlflowServer {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl MlflowServer {
    fn start(python: &Path) -> MlflowServer {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let mut command = Command::new(python.with_file_name("mlflow"));
        command
            .args(["server", "--host", "127.0.0.1", "--port", &port.to_string(), "--workers", "1"])
            .arg("--backend-store-uri")
            .arg(format!("sqlite:///{}", dir.path().join("mlflow.db").display()))
            .arg("--default-artifact-root")
            .arg(dir.path().join("artifacts"))
            .env("HOME", dir.path())
            // The server's job runner (seven huey consumers, for GenAI jobs) has nothing to do with tracking.
            .env("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut server = MlflowServer { child: command.spawn().unwrap(), url: format!("http://127.0.0.1:{port}"), dir };
        // The first start creates the database's tables: tens of seconds on a busy 2-core machine.
        let deadline = Instant::now() + Duration::from_secs(240);
        while !healthy(port) {
            let log = || std::fs::read_to_string(server.dir.path().join("server.log")).unwrap_or_default();
            assert!(server.child.try_wait().unwrap().is_none(), "mlflow server exited: {}", log());
            assert!(Instant::now() < deadline, "mlflow server not up within 240 s: {}", log());
            std::thread::sleep(Duration::from_millis(250));
        }
        server
    }
}

impl Drop for MlflowServer {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}

/// Whether the server on `port` answers its `/health` with 200.
fn healthy(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut answer = String::new();
    stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_ok()
        && stream.read_to_string(&mut answer).is_ok()
        && answer.starts_with("HTTP/1.1 200")
}

#[test]
fn an_mlflow_tracking_server_holds_the_params_every_step_and_the_finished_run() {
    let python = monitors_python();
    let server = MlflowServer::start(&python);
    let dir = tempfile::tempdir().unwrap();
    let monitor = format!("  monitor_type: mlflow\n  monitor_args:\n    uri: {}\n", server.url);
    let output = run_with(dir.path(), &monitor, &python, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!stderr(&output).contains("monitor `mlflow`"), "no warning: {}", stderr(&output));
    let got = read_back(&python, MLFLOW_READER, &server.url);
    assert_eq!((&got["name"], &got["role"]), (&"n_both".into(), &"both".into()));
    let params = &got["params"];
    assert_eq!((&params["project"], &params["name"]), (&"p".into(), &"n".into()), "{params}");
    assert_eq!(params["algorithm.algorithm_type"], "grpo", "the run's config, flattened: {params}");
    assert_eq!(got["status"], "FINISHED", "the run's end finishes the MLflow run");
    assert_eq!(got["ended"], true);
    assert_history_holds(dir.path(), &got["history"], |key| key.replace('@', "_at_"));
    let steps: Vec<u64> = jsonl_steps(dir.path()).into_iter().map(|(step, _)| step).collect();
    let logged: Vec<u64> = got["history"].as_object().unwrap().keys().map(|k| k.parse().unwrap()).collect();
    assert_eq!(logged.len(), steps.len(), "one MLflow step per metrics.jsonl step: {logged:?} {steps:?}");
    drop(server);
}

/// The lines of a run's stderr that name `monitor`.
fn warnings<'a>(err: &'a str, monitor: &str) -> Vec<&'a str> {
    let name = format!("monitor `{monitor}`");
    err.lines().filter(|line| line.contains(&name)).collect()
}

/// A run whose MLflow server does not answer (`uri`) completes with every step in metrics.jsonl and one warning
/// naming mlflow that says it missed them all; returns that warning and how long the run took.
fn run_with_silent_mlflow(uri: &str) -> (String, Duration) {
    let python = monitors_python();
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let output =
        run_with(dir.path(), &format!("  monitor_type: mlflow\n  monitor_args:\n    uri: {uri}\n"), &python, &[]);
    let took = started.elapsed();
    let err = stderr(&output);
    assert!(output.status.success(), "the monitor cost the run: {err}");
    let steps: Vec<u64> = jsonl_steps(dir.path()).into_iter().map(|(step, _)| step).collect();
    assert_eq!(steps, [1, 2], "metrics.jsonl keeps every step");
    let warned = warnings(&err, "mlflow");
    assert_eq!(warned.len(), 1, "one warning, naming the monitor: {err}");
    assert!(warned[0].contains("missed 2 of 2 step(s)"), "{}", warned[0]);
    (warned[0].to_owned(), took)
}

#[test]
fn an_mlflow_server_that_is_down_costs_one_warning_not_the_run() {
    // Nothing listens there: MLflow's client retries the connection for about 4 minutes.
    let (warning, _) = run_with_silent_mlflow(&format!("http://127.0.0.1:{}", free_port()));
    assert!(warning.contains("Connection refused"), "the warning says why: {warning}");
}

#[test]
fn an_mlflow_server_that_never_answers_does_not_hold_the_run_up() {
    // Accepts every connection and never answers: each of MLflow's requests waits its 120 s timeout.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    let silent = std::thread::spawn(move || {
        let mut held = Vec::new();
        while !stopping.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, _)) => held.push(stream),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        held.len()
    });
    let (warning, took) = run_with_silent_mlflow(&format!("http://127.0.0.1:{port}"));
    stop.store(true, Ordering::Relaxed);
    assert!(silent.join().unwrap() > 0, "the client reached the silent server");
    assert!(warning.contains("did not answer for 30 s and was stopped"), "{warning}");
    // The run's end waits at most 30 s after the client's last answer (its import, here), where MLflow's
    // first request alone would hold it 120 s.
    assert!(took < Duration::from_secs(110), "the run took {took:?}");
}
