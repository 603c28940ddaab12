//! Hosted monitors (`wandb`, `mlflow`, `swanlab`): each service's official Python client in a side process,
//! configured as Trinity-RFT 0.6.0 configures it.
//!
//! The side process runs `hosted_monitor.py` (embedded here) with `TRINITY_PYTHON` or `python3`. A monitor that
//! fails or stalls never stops or slows training: [`HostedSink::record`] only offers the step to a bounded queue
//! that a thread of its own writes to the process, so a full queue drops the step (counted) instead of waiting.
//! The first trouble is warned about once, naming the monitor; what the service missed is reported once, with a
//! count, when the run ends. `metrics.jsonl` is written before any sink, so it stays complete whatever happens.
//!
//! Starting is strict, as in Trinity-RFT (which fails when the client package is missing or `init` raises): a
//! missing package or a refused login is an error before the first step, naming the `pip install` line. Only a
//! start that takes longer than [`Limits::start`] lets the run go on while the monitor catches up.

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::{Metrics, MonitorError, MonitorSpec, Sink};

/// The side process's program: reads the run and then one step a line on stdin, answers on stdout.
const SCRIPT: &str = include_str!("hosted_monitor.py");

/// A service a hosted monitor reports to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Service {
    Wandb,
    Mlflow,
    Swanlab,
}

impl Service {
    /// The service `monitor_type` names, if it names one.
    pub(crate) fn named(monitor_type: &str) -> Option<Service> {
        match monitor_type {
            "wandb" => Some(Service::Wandb),
            "mlflow" => Some(Service::Mlflow),
            "swanlab" => Some(Service::Swanlab),
            _ => None,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Service::Wandb => "wandb",
            Service::Mlflow => "mlflow",
            Service::Swanlab => "swanlab",
        }
    }

    /// The package that provides the client (`mlflow-skinny` is enough for logging, and smaller).
    fn package(self) -> &'static str {
        match self {
            Service::Wandb => "wandb",
            Service::Mlflow => "mlflow-skinny",
            Service::Swanlab => "swanlab",
        }
    }
}

/// How long a hosted monitor may take, and how far it may fall behind.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Steps waiting for the side process; a step offered to a full queue is dropped from the service.
    pub(crate) queue: usize,
    /// How long the run waits for the client to import and log in before it starts without it.
    pub(crate) start: Duration,
    /// How long the run's end waits for the client to send what it holds (wandb uploads at `finish`).
    pub(crate) finish: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { queue: 1024, start: Duration::from_secs(120), finish: Duration::from_secs(300) }
    }
}

/// The interpreter hosted monitors run with: `TRINITY_PYTHON`, else `python3` on PATH.
pub(crate) fn python() -> OsString {
    std::env::var_os("TRINITY_PYTHON").filter(|p| !p.is_empty()).unwrap_or_else(|| "python3".into())
}

/// What a run's end found: steps the service missed, by why.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Missed {
    /// Offered while the queue was full.
    pub(crate) queue_full: u64,
    /// Queued, but never written to the side process (it had stopped reading).
    pub(crate) process_gone: u64,
    /// Read by the side process, but refused by the client.
    pub(crate) refused: u64,
    /// Whether the side process finished the run (`finish()` returned).
    pub(crate) finished: bool,
}

/// The sink that feeds one hosted monitor.
pub(crate) struct HostedSink {
    shared: Arc<Shared>,
    limits: Limits,
    queue: Option<SyncSender<String>>,
    child: Child,
    /// Ends (or is dropped) when the writer thread does.
    writer_done: Receiver<()>,
    events: Receiver<Value>,
    queue_full: u64,
    offered: u64,
    missed: Option<Missed>,
}

/// What the sink's threads share: which monitor, where its log is, whether it was warned about, how many steps
/// reached the side process's stdin.
struct Shared {
    service: Service,
    log: PathBuf,
    warned: AtomicBool,
    written: AtomicU64,
}

impl Shared {
    /// The first trouble of a run, once; later ones are in the count at the end.
    fn warn_once(&self, what: &str) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "monitor `{}` {what}; training goes on and metrics.jsonl keeps every step (details: {})",
                self.service.name(),
                self.log.display()
            );
        }
    }

    fn error(&self, message: String) -> MonitorError {
        MonitorError::Hosted { monitor: self.service.name(), message }
    }
}

impl HostedSink {
    /// Starts `service`'s client for `spec` with `python`, its output appended to `<dir>/<service>.log`, and waits
    /// until it has logged in (at most `limits.start`).
    pub(crate) fn start(
        service: Service,
        python: &OsStr,
        spec: &MonitorSpec,
        dir: &Path,
        limits: Limits,
    ) -> Result<HostedSink, MonitorError> {
        let log = dir.join(format!("{}.log", service.name()));
        let shared =
            Arc::new(Shared { service, log: log.clone(), warned: AtomicBool::new(false), written: AtomicU64::new(0) });
        let log_file =
            std::fs::OpenOptions::new().create(true).append(true).open(&log).map_err(MonitorError::io(&log))?;
        let mut command = Command::new(python);
        command.args(["-u", "-c", SCRIPT]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(log_file);
        // A process group of its own: the terminal's Ctrl-C stops the run, which then finishes the monitor's run
        // itself instead of the client dying mid-upload.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command.spawn().map_err(|error| {
            shared.error(format!(
                "cannot start `{}` ({error}): set TRINITY_PYTHON to a Python that has `pip install {}`",
                python.to_string_lossy(),
                service.package()
            ))
        })?;
        // Both pipes exist: they were just requested with `Stdio::piped()`.
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            unreachable!("piped stdin and stdout")
        };
        let (event_tx, events) = mpsc::channel();
        let reader_shared = Arc::clone(&shared);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let Ok(event) = serde_json::from_str::<Value>(&line) else { continue };
                if event["event"] == "log_failed" {
                    let message = event["message"].as_str().unwrap_or_default();
                    reader_shared.warn_once(&format!("refused a step ({message})"));
                }
                if event_tx.send(event).is_err() {
                    break;
                }
            }
        });
        let (queue, lines) = mpsc::sync_channel(limits.queue);
        let first = run_line(service, spec, dir);
        let writer_shared = Arc::clone(&shared);
        let (done, writer_done) = mpsc::channel();
        std::thread::spawn(move || {
            write_steps(stdin, &first, &lines, &writer_shared);
            drop(done);
        });
        let mut sink = HostedSink {
            shared,
            limits,
            queue: Some(queue),
            child,
            writer_done,
            events,
            queue_full: 0,
            offered: 0,
            missed: None,
        };
        sink.wait_until_ready(python)?;
        Ok(sink)
    }

    /// Waits for the client's `ready`; an `error` (or the process's end) before it is the run's error.
    fn wait_until_ready(&mut self, python: &OsStr) -> Result<(), MonitorError> {
        let service = self.shared.service;
        let deadline = Instant::now() + self.limits.start;
        let mut imported = false;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = match self.events.recv_timeout(left) {
                Ok(event) => event,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.shared.warn_once(&format!(
                        "did not start within {} s; the run starts without waiting for it",
                        self.limits.start.as_secs()
                    ));
                    return Ok(());
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().ok();
                    let status = status.map(|s| s.to_string()).unwrap_or_else(|| "an unknown status".into());
                    let what = if imported { "while logging in" } else { "before importing its client" };
                    return Err(self.shared.error(format!(
                        "`{}` exited with {status} {what}: {}",
                        python.to_string_lossy(),
                        log_tail(&self.shared.log)
                    )));
                }
            };
            match event["event"].as_str() {
                Some("imported") => imported = true,
                Some("ready") => return Ok(()),
                Some("error") => {
                    let message = event["message"].as_str().unwrap_or_default().to_owned();
                    let _ = self.child.wait();
                    return Err(self.shared.error(if event["stage"] == "import" {
                        format!(
                            "`{}` cannot import the {} client ({message}): `{0} -m pip install {}`, or set \
                             TRINITY_PYTHON to a Python that has it, or use monitor_type `tensorboard`",
                            python.to_string_lossy(),
                            service.name(),
                            service.package()
                        )
                    } else {
                        format!("the client did not start: {message} (details: {})", self.shared.log.display())
                    }));
                }
                _ => {}
            }
        }
    }

    /// Ends the side process's run: the queued steps are written, the client finishes (at most
    /// `limits.finish`, then it is stopped), and what the service missed is reported once.
    pub(crate) fn close(&mut self) -> Missed {
        if let Some(missed) = self.missed {
            return missed;
        }
        drop(self.queue.take());
        let service = self.shared.service.name();
        let deadline = Instant::now() + self.limits.finish;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                Ok(None) | Err(_) => {
                    tracing::warn!(
                        "monitor `{service}` did not finish within {} s and was stopped (details: {})",
                        self.limits.finish.as_secs(),
                        self.shared.log.display()
                    );
                    let _ = self.child.kill();
                    break self.child.wait().ok();
                }
            }
        };
        // The writer ends once the process's stdin closes; a grandchild that inherited the pipe could hold it
        // open, and the thread is then left behind, blocked, rather than holding up the run's end.
        let _ = self.writer_done.recv_timeout(Duration::from_secs(2));
        let process_gone = self.offered.saturating_sub(self.shared.written.load(Ordering::Relaxed));
        let finished = self.events.try_iter().find(|event| event["event"] == "finished");
        let missed = Missed {
            queue_full: self.queue_full,
            process_gone,
            refused: finished.as_ref().and_then(|event| event["failed"].as_u64()).unwrap_or(0),
            finished: finished.is_some(),
        };
        if !missed.finished && !status.is_some_and(|s: ExitStatus| s.success()) {
            tracing::warn!(
                "monitor `{service}` ended before finishing its run ({}): {}",
                status.map(|s| s.to_string()).unwrap_or_else(|| "no exit status".into()),
                log_tail(&self.shared.log)
            );
        }
        let total = missed.queue_full + missed.process_gone + missed.refused;
        if total > 0 {
            tracing::warn!(
                "monitor `{service}` missed {total} of {} step(s): {} while its queue was full, {} after its process \
                 stopped, {} its client refused; metrics.jsonl holds them all",
                self.offered + self.queue_full,
                missed.queue_full,
                missed.process_gone,
                missed.refused
            );
        }
        self.missed = Some(missed);
        missed
    }
}

impl Sink for HostedSink {
    /// Offers the step to the queue and returns at once; a full queue drops it from the service (counted).
    fn record(&mut self, step: u64, metrics: &Metrics) -> Result<(), MonitorError> {
        let Some(queue) = &self.queue else { return Ok(()) };
        match queue.try_send(step_line(step, metrics)) {
            Ok(()) => self.offered += 1,
            Err(TrySendError::Full(_)) => {
                self.queue_full += 1;
                self.shared.warn_once(&format!(
                    "is falling behind ({} steps wait for it), so steps are dropped from it",
                    self.limits.queue
                ));
            }
            // The writer keeps its end until the queue is dropped in `close`.
            Err(TrySendError::Disconnected(_)) => self.queue_full += 1,
        }
        Ok(())
    }
}

impl Drop for HostedSink {
    fn drop(&mut self) {
        self.close();
    }
}

/// The writer thread: the run line, then each queued step, until the queue closes; counts the steps written.
fn write_steps(mut stdin: ChildStdin, first: &str, lines: &Receiver<String>, shared: &Shared) {
    let mut alive = writeln!(stdin, "{first}").and_then(|()| stdin.flush()).is_ok();
    for line in lines {
        if !alive {
            continue;
        }
        if writeln!(stdin, "{line}").and_then(|()| stdin.flush()).is_ok() {
            shared.written.fetch_add(1, Ordering::Relaxed);
        } else {
            alive = false;
            shared.warn_once("stopped reading steps (its process ended)");
        }
    }
}

/// The first line the side process reads: the service, the run's names (as Trinity-RFT names it), the
/// monitor's arguments and the run's config (secrets masked), and the folder for the client's local files.
fn run_line(service: Service, spec: &MonitorSpec, dir: &Path) -> String {
    let mut config = spec.config.clone();
    if let Some(args) = config.pointer_mut("/monitor/monitor_args").and_then(Value::as_object_mut) {
        for secret in ["api_key", "password"] {
            if let Some(value) = args.get_mut(secret).filter(|v| !v.is_null()) {
                *value = Value::from("***");
            }
        }
    }
    serde_json::json!({
        "monitor": service.name(),
        "project": spec.project,
        "group": spec.group,
        "name": spec.name,
        "role": spec.role,
        "args": spec.monitor_args,
        "config": config,
        "dir": dir,
    })
    .to_string()
}

/// One step as the side process reads it; JSON has no NaN or infinity, so those travel as strings.
fn step_line(step: u64, metrics: &Metrics) -> String {
    let values: Map<String, Value> = metrics
        .iter()
        .map(|(key, &value)| {
            let value = match serde_json::Number::from_f64(value) {
                Some(number) => Value::Number(number),
                None if value.is_nan() => "nan".into(),
                None if value > 0.0 => "inf".into(),
                None => "-inf".into(),
            };
            (key.clone(), value)
        })
        .collect();
    serde_json::json!({ "step": step, "metrics": values }).to_string()
}

/// The last lines of a monitor's log, for an error that has to say why.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
    if tail.is_empty() { format!("no output (see {})", log.display()) } else { tail }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(monitor_type: &str) -> MonitorSpec {
        MonitorSpec { monitor_type: monitor_type.to_owned(), role: "trainer".into(), ..MonitorSpec::default() }
    }

    fn metrics(value: f64) -> Metrics {
        Metrics::from([("train/loss".to_owned(), value)])
    }

    /// A stand-in interpreter (`sh`, ignoring `-u -c SCRIPT`): `body` plays the side process.
    fn fake(dir: &Path, body: &str) -> OsString {
        let path = dir.join("fake-python");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        let mut permissions = std::fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
        std::fs::set_permissions(&path, permissions).unwrap();
        path.into_os_string()
    }

    const FAST: Limits = Limits { queue: 4, start: Duration::from_secs(10), finish: Duration::from_secs(1) };

    #[test]
    fn a_stalled_monitor_drops_steps_without_slowing_the_run_and_counts_them() {
        let dir = tempfile::tempdir().unwrap();
        // Logs in, then never reads a step.
        let python = fake(dir.path(), r#"read line; echo '{"event":"ready"}'; sleep 30"#);
        let mut sink = HostedSink::start(Service::Wandb, &python, &spec("wandb"), dir.path(), FAST).unwrap();
        let started = Instant::now();
        // Enough steps to fill the pipe and the queue: each of them is 100 kB.
        let big: Metrics = (0..4000).map(|i| (format!("metric/{i:020}"), i as f64)).collect();
        for step in 1..=20 {
            sink.record(step, &big).unwrap();
        }
        assert!(started.elapsed() < Duration::from_secs(2), "recording waited for the monitor");
        let missed = sink.close();
        assert!(!missed.finished);
        assert!(missed.queue_full > 0 && missed.queue_full + missed.process_gone <= 20, "{missed:?}");
        assert!(started.elapsed() < Duration::from_secs(10), "closing waits at most the finish limit");
    }

    #[test]
    fn a_monitor_that_dies_loses_the_steps_after_it_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let python = fake(dir.path(), r#"read line; echo '{"event":"ready"}'; echo 'lost the service' >&2; exit 3"#);
        let mut sink = HostedSink::start(Service::Mlflow, &python, &spec("mlflow"), dir.path(), FAST).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        for step in 1..=3 {
            sink.record(step, &metrics(1.0)).unwrap();
        }
        let missed = sink.close();
        assert_eq!(missed.process_gone + missed.queue_full, 3, "{missed:?}");
        assert!(std::fs::read_to_string(dir.path().join("mlflow.log")).unwrap().contains("lost the service"));
    }

    #[test]
    fn a_missing_client_is_an_error_that_names_the_pip_line() {
        let dir = tempfile::tempdir().unwrap();
        let python = fake(
            dir.path(),
            r#"read line; echo '{"event":"error","stage":"import","message":"No module named swanlab"}'; exit 1"#,
        );
        let Err(error) = HostedSink::start(Service::Swanlab, &python, &spec("swanlab"), dir.path(), FAST) else {
            panic!("started without its client")
        };
        let error = error.to_string();
        assert!(error.contains("monitor `swanlab`") && error.contains("pip install swanlab"), "{error}");
        let Err(error) =
            HostedSink::start(Service::Wandb, OsStr::new("/nonexistent/python"), &spec("wandb"), dir.path(), FAST)
        else {
            panic!("started without an interpreter")
        };
        assert!(error.to_string().contains("TRINITY_PYTHON"), "{error}");
    }

    /// Each real client (from `cargo xtask setup`'s monitors venv) in its offline mode takes every step and
    /// finishes its run; `tests/it/monitors.rs` reads back what they wrote.
    #[test]
    fn the_official_clients_take_every_step_offline() {
        let python = std::env::var_os("TRINITY_MONITORS_PYTHON")
            .expect("TRINITY_MONITORS_PYTHON names the monitors venv's python: run `cargo xtask setup`");
        let dir = tempfile::tempdir().unwrap();
        let store = format!("file:{}", dir.path().join("mlruns").display());
        let cases = [
            (Service::Wandb, serde_json::json!({})),
            (Service::Mlflow, serde_json::json!({ "uri": store })),
            (Service::Swanlab, serde_json::json!({ "mode": "offline" })),
        ];
        // The offline switches and a HOME of the test's own, for the clients' processes only.
        let python = fake(
            dir.path(),
            &format!(
                "WANDB_MODE=offline MLFLOW_ALLOW_FILE_STORE=true HOME='{}' exec '{}' \"$@\"",
                dir.path().display(),
                python.to_string_lossy()
            ),
        );
        let limits = Limits { queue: 16, start: Duration::from_secs(120), finish: Duration::from_secs(120) };
        for (service, args) in cases {
            let mut spec = spec(service.name());
            spec.project = "p".into();
            spec.name = "n".into();
            spec.monitor_args = args.as_object().unwrap().clone();
            let mut sink = HostedSink::start(service, &python, &spec, dir.path(), limits)
                .unwrap_or_else(|e| panic!("{e}: {}", log_tail(&dir.path().join(format!("{}.log", service.name())))));
            for step in 1..=3 {
                sink.record(
                    step,
                    &Metrics::from([("train/loss".into(), step as f64), ("eval/acc@1".into(), f64::NAN)]),
                )
                .unwrap();
            }
            let missed = sink.close();
            assert_eq!(missed, Missed { finished: true, ..Missed::default() }, "{}", service.name());
        }
    }

    #[test]
    fn steps_travel_as_json_lines_with_non_finite_values_as_strings() {
        let line =
            step_line(7, &Metrics::from([("a".into(), f64::NAN), ("b".into(), f64::NEG_INFINITY), ("c".into(), 0.5)]));
        let line: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(line, serde_json::json!({"step": 7, "metrics": {"a": "nan", "b": "-inf", "c": 0.5}}));
        let mut spec = spec("wandb");
        spec.config = serde_json::json!({"monitor": {"monitor_args": {"api_key": "secret", "base_url": "http://h"}}});
        let first = run_line(Service::Wandb, &spec, Path::new("/m"));
        assert!(!first.contains("secret") && first.contains("http://h"), "{first}");
    }
}
