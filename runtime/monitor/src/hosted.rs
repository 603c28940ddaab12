//! Hosted monitors (`wandb`, `mlflow`, `swanlab`): each service's official Python client in a side process,
//! configured as Trinity-RFT 0.6.0 configures it.
//!
//! The side process runs `hosted_monitor.py` (embedded here) with `TRINITY_PYTHON` or `python3`. A monitor that
//! fails or stalls never stops or slows training: [`HostedSink::record`] only offers the step to a bounded queue
//! ([`Limits::queue`] steps) that a thread of its own writes to the process, so a full queue drops the step
//! (counted) instead of waiting. The client answers every step; one that has work and has not answered for
//! [`Limits::silence`] is warned about, and the run's end stops it after that long instead of waiting for it.
//! The first trouble is warned about once, naming the monitor; what the service missed is reported once, with
//! counts, when the run ends. `metrics.jsonl` is written before any sink, so it stays complete whatever happens.
//!
//! Only what the user has to fix before anything can be reported is the run's error before its first step: a
//! missing client package (named with its `pip install` line), or monitor arguments the client cannot use. A
//! service that is down, refuses the login or never answers costs a warning, not the run: the run starts as
//! soon as the client is imported, while the client logs in.

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
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
    /// How long the run waits for the client to import before it starts without it.
    pub(crate) start: Duration,
    /// How long a client that has steps (or its login) in hand may go without answering before it counts as
    /// stalled: warned about during the run, stopped at its end. MLflow's own client waits 120 s for each
    /// request and retries for about 4 minutes, so without this a run's end would wait that long.
    pub(crate) silence: Duration,
    /// How long the run's end waits for a client that has taken every step to finish its run (wandb uploads
    /// at `finish`).
    pub(crate) finish: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            queue: 1024,
            start: Duration::from_secs(120),
            silence: Duration::from_secs(30),
            finish: Duration::from_secs(300),
        }
    }
}

/// The interpreter hosted monitors run with: `TRINITY_PYTHON`, else `python3` on PATH.
pub(crate) fn python() -> OsString {
    std::env::var_os("TRINITY_PYTHON").filter(|p| !p.is_empty()).unwrap_or_else(|| "python3".into())
}

/// What a run's end found: how many steps the service took of those the run recorded, and why it missed the
/// others.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Missed {
    /// Steps the run recorded.
    pub(crate) recorded: u64,
    /// Steps the client took.
    pub(crate) logged: u64,
    /// Offered while the queue was full.
    pub(crate) queue_full: u64,
    /// Read by the side process, but refused by the client.
    pub(crate) refused: u64,
    /// Whether the side process finished the run (`finish()` returned).
    pub(crate) finished: bool,
}

impl Missed {
    /// Steps the service does not have.
    pub(crate) fn total(&self) -> u64 {
        self.recorded.saturating_sub(self.logged)
    }
}

/// Why the run's end stopped the side process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopped {
    /// It had work in hand and had not answered for [`Limits::silence`].
    Silent,
    /// It had taken every step but did not finish its run within [`Limits::finish`].
    Slow,
}

/// What the side process has said so far; the thread that reads its answers keeps it.
#[derive(Debug)]
struct State {
    imported: bool,
    ready: bool,
    /// The `error` event's stage (`import`, `config`, `init`) and message.
    error: Option<(String, String)>,
    logged: u64,
    refused: u64,
    finished: bool,
    /// The process's answers ended (it exited, or closed its end).
    hung_up: bool,
    /// When it last answered anything (or was started).
    last_answer: Instant,
}

impl State {
    /// Whether the client has work in hand that it has not answered: its login, or steps it was offered.
    fn busy(&self, offered: u64) -> bool {
        self.error.is_none() && !self.hung_up && (!self.ready || self.logged + self.refused < offered)
    }
}

/// The sink that feeds one hosted monitor.
pub(crate) struct HostedSink {
    shared: Arc<Shared>,
    limits: Limits,
    queue: Option<SyncSender<String>>,
    child: Child,
    /// Ends (or is dropped) when the writer thread does.
    writer_done: Receiver<()>,
    queue_full: u64,
    offered: u64,
    missed: Option<Missed>,
}

/// What the sink's threads share: which monitor, where its log is, whether it was warned about, and what its
/// process has answered.
struct Shared {
    service: Service,
    log: PathBuf,
    warned: AtomicBool,
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    /// The first trouble of a run, once; the run's end reports the rest with counts.
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

    fn state(&self) -> MutexGuard<'_, State> {
        // The state is plain counters and flags, whole after any panic of a thread holding it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl HostedSink {
    /// Starts `service`'s client for `spec` with `python`, its output appended to `<dir>/<service>.log`, and waits
    /// until it has imported its client (at most `limits.start`); the login goes on while the run does.
    pub(crate) fn start(
        service: Service,
        python: &OsStr,
        spec: &MonitorSpec,
        dir: &Path,
        limits: Limits,
    ) -> Result<HostedSink, MonitorError> {
        let log = dir.join(format!("{}.log", service.name()));
        let state = State {
            imported: false,
            ready: false,
            error: None,
            logged: 0,
            refused: 0,
            finished: false,
            hung_up: false,
            last_answer: Instant::now(),
        };
        let shared = Arc::new(Shared {
            service,
            log: log.clone(),
            warned: AtomicBool::new(false),
            state: Mutex::new(state),
            changed: Condvar::new(),
        });
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
        let reader_shared = Arc::clone(&shared);
        std::thread::spawn(move || read_answers(stdout, &reader_shared));
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
            queue_full: 0,
            offered: 0,
            missed: None,
        };
        sink.wait_until_imported(python)?;
        Ok(sink)
    }

    /// Waits for the client's `imported`; an `error` (or the process's end) before it is the run's error.
    fn wait_until_imported(&mut self, python: &OsStr) -> Result<(), MonitorError> {
        let service = self.shared.service;
        let deadline = Instant::now() + self.limits.start;
        let mut state = self.shared.state();
        let (stage, message) = loop {
            if state.imported {
                return Ok(());
            }
            if let Some(error) = state.error.clone() {
                break error;
            }
            if state.hung_up {
                break (String::new(), String::new());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(state);
                self.shared.warn_once(&format!(
                    "did not import its client within {} s; the run starts without waiting for it",
                    self.limits.start.as_secs()
                ));
                return Ok(());
            }
            state = self.shared.changed.wait_timeout(state, left).unwrap_or_else(PoisonError::into_inner).0;
        };
        drop(state);
        let status = self.child.wait().ok();
        let python = python.to_string_lossy();
        Err(self.shared.error(match stage.as_str() {
            "import" => format!(
                "`{python}` cannot import the {} client ({message}): `{python} -m pip install {}`, or set \
                 TRINITY_PYTHON to a Python that has it, or use monitor_type `tensorboard`",
                service.name(),
                service.package()
            ),
            "config" => format!("{message} (details: {})", self.shared.log.display()),
            _ => {
                let status = status.map(|s| s.to_string()).unwrap_or_else(|| "an unknown status".into());
                format!("`{python}` exited with {status} before importing its client: {}", log_tail(&self.shared.log))
            }
        }))
    }

    /// Ends the side process's run: the queued steps are written, the client finishes (stopped when it has
    /// not answered for `limits.silence` with steps in hand, or has not finished within `limits.finish`), and
    /// what the service missed is reported once.
    pub(crate) fn close(&mut self) -> Missed {
        if let Some(missed) = self.missed {
            return missed;
        }
        // From here on the report below says what went wrong, once: the writer's broken pipe after the process
        // is stopped, say, is no news.
        self.shared.warned.store(true, Ordering::Relaxed);
        drop(self.queue.take());
        let (status, stopped) = self.wait_for_exit();
        // The writer ends once the process's stdin closes; a grandchild that inherited the pipe could hold it
        // open, and the thread is then left behind, blocked, rather than holding up the run's end.
        let _ = self.writer_done.recv_timeout(Duration::from_secs(2));
        let state = self.wait_for_answers_end(Duration::from_secs(2));
        let missed = Missed {
            recorded: self.offered + self.queue_full,
            logged: state.logged,
            queue_full: self.queue_full,
            refused: state.refused,
            finished: state.finished,
        };
        let init_error = state.error.as_ref().map(|(_, message)| message.clone());
        drop(state);
        self.report(&missed, status, stopped, init_error);
        self.missed = Some(missed);
        missed
    }

    /// Waits for the side process to exit, stopping it as [`HostedSink::close`] says.
    fn wait_for_exit(&mut self) -> (Option<ExitStatus>, Option<Stopped>) {
        let began = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return (Some(status), None),
                Ok(None) => {}
                Err(_) => return (None, None),
            }
            let (busy, last_answer) = {
                let state = self.shared.state();
                (state.busy(self.offered), state.last_answer)
            };
            let stopped = if busy && last_answer.elapsed() >= self.limits.silence {
                Some(Stopped::Silent)
            } else if began.elapsed() >= self.limits.finish {
                Some(Stopped::Slow)
            } else {
                None
            };
            if let Some(stopped) = stopped {
                let _ = self.child.kill();
                return (self.child.wait().ok(), Some(stopped));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The state once the reader has read the exited process's last answers (at most `wait`).
    fn wait_for_answers_end(&self, wait: Duration) -> MutexGuard<'_, State> {
        let state = self.shared.state();
        self.shared
            .changed
            .wait_timeout_while(state, wait, |state| !state.hung_up)
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }

    /// The one warning of a run's end: what went wrong and what the service missed, if anything did.
    fn report(&self, missed: &Missed, status: Option<ExitStatus>, stopped: Option<Stopped>, error: Option<String>) {
        let mut what = Vec::new();
        if let Some(message) = error {
            what.push(format!("could not start its run ({message})"));
        }
        match stopped {
            Some(Stopped::Silent) => {
                what.push(format!("did not answer for {} s and was stopped", self.limits.silence.as_secs()));
            }
            Some(Stopped::Slow) => {
                what.push(format!("did not finish its run within {} s and was stopped", self.limits.finish.as_secs()));
            }
            None if !missed.finished && what.is_empty() => {
                let status = status.map(|s| s.to_string()).unwrap_or_else(|| "no exit status".into());
                what.push(format!("ended ({status}) before finishing its run"));
            }
            None => {}
        }
        let total = missed.total();
        if total > 0 {
            let never_taken = total.saturating_sub(missed.queue_full + missed.refused);
            let why: Vec<String> = [
                (missed.queue_full, "dropped while its queue was full"),
                (missed.refused, "refused by its client"),
                (never_taken, "never taken by its client"),
            ]
            .into_iter()
            .filter(|(count, _)| *count > 0)
            .map(|(count, why)| format!("{count} {why}"))
            .collect();
            what.push(format!("it missed {total} of {} step(s) ({})", missed.recorded, why.join(", ")));
        }
        if !what.is_empty() {
            let last_line = std::fs::read_to_string(&self.shared.log)
                .unwrap_or_default()
                .lines()
                .rfind(|line| !line.trim().is_empty())
                .map(|line| format!(": {line}"))
                .unwrap_or_default();
            tracing::warn!(
                "monitor `{}` {}; metrics.jsonl holds every step (details: {}{last_line})",
                self.shared.service.name(),
                what.join("; "),
                self.shared.log.display(),
            );
        }
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
        let silent = {
            let state = self.shared.state();
            state.busy(self.offered) && state.last_answer.elapsed() >= self.limits.silence
        };
        if silent {
            self.shared.warn_once(&format!(
                "has not answered for {} s; its steps wait for it (up to {}), then are dropped from it",
                self.limits.silence.as_secs(),
                self.limits.queue
            ));
        }
        Ok(())
    }
}

impl Drop for HostedSink {
    fn drop(&mut self) {
        self.close();
    }
}

/// The reader thread: keeps [`State`] up to date with each answer, and warns about the first trouble.
fn read_answers(stdout: ChildStdout, shared: &Shared) {
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        let Ok(event) = serde_json::from_str::<Value>(&line) else { continue };
        let message = event["message"].as_str().unwrap_or_default().to_owned();
        let mut state = shared.state();
        state.last_answer = Instant::now();
        let warning = match event["event"].as_str() {
            Some("imported") => {
                state.imported = true;
                None
            }
            Some("ready") => {
                state.ready = true;
                None
            }
            Some("logged") => {
                state.logged += 1;
                None
            }
            Some("refused") => {
                state.refused += 1;
                Some(format!("refused a step ({message})"))
            }
            Some("error") => {
                let stage = event["stage"].as_str().unwrap_or("init").to_owned();
                let warning = state.imported.then(|| format!("could not start its run ({message})"));
                state.error = Some((stage, message));
                warning
            }
            Some("finished") => {
                state.finished = true;
                None
            }
            _ => None,
        };
        drop(state);
        shared.changed.notify_all();
        if let Some(warning) = warning {
            shared.warn_once(&warning);
        }
    }
    shared.state().hung_up = true;
    shared.changed.notify_all();
}

/// The writer thread: the run line, then each queued step, until the queue closes.
fn write_steps(mut stdin: ChildStdin, first: &str, lines: &Receiver<String>, shared: &Shared) {
    let mut alive = writeln!(stdin, "{first}").and_then(|()| stdin.flush()).is_ok();
    for line in lines {
        if !alive {
            continue;
        }
        if writeln!(stdin, "{line}").and_then(|()| stdin.flush()).is_err() {
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

    const FAST: Limits = Limits {
        queue: 4,
        start: Duration::from_secs(10),
        silence: Duration::from_secs(1),
        finish: Duration::from_secs(5),
    };

    /// The side process's answers up to its login, as the real script gives them.
    const LOGGED_IN: &str = r#"read line; echo '{"event":"imported"}'; echo '{"event":"ready"}'"#;

    #[test]
    fn a_stalled_monitor_drops_steps_without_slowing_the_run_and_is_stopped_at_its_end() {
        let dir = tempfile::tempdir().unwrap();
        // Logs in, then never reads a step.
        let python = fake(dir.path(), &format!("{LOGGED_IN}; exec sleep 30"));
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
        assert_eq!((missed.recorded, missed.logged), (20, 0));
        assert!(missed.queue_full > 0, "{missed:?}");
        // It was stopped after `silence` without an answer, well before its `sleep 30` or the finish limit.
        assert!(started.elapsed() < Duration::from_secs(4), "closing waited {:?}", started.elapsed());
    }

    #[test]
    fn a_monitor_that_never_logs_in_is_stopped_after_its_silence_not_the_finish_limit() {
        let dir = tempfile::tempdir().unwrap();
        // Imports its client, then hangs in the login (a server that accepts and never answers).
        let python = fake(dir.path(), r#"read line; echo '{"event":"imported"}'; exec sleep 30"#);
        let limits = Limits { finish: Duration::from_secs(60), ..FAST };
        let mut sink = HostedSink::start(Service::Mlflow, &python, &spec("mlflow"), dir.path(), limits).unwrap();
        let started = Instant::now();
        sink.record(1, &metrics(1.0)).unwrap();
        let missed = sink.close();
        assert_eq!(missed, Missed { recorded: 1, ..Missed::default() });
        assert!(started.elapsed() < Duration::from_secs(5), "closing waited {:?}", started.elapsed());
    }

    #[test]
    fn a_silent_monitor_is_warned_about_once_its_silence_has_passed() {
        let dir = tempfile::tempdir().unwrap();
        let python = fake(dir.path(), r#"read line; echo '{"event":"imported"}'; exec sleep 30"#);
        let mut sink = HostedSink::start(Service::Mlflow, &python, &spec("mlflow"), dir.path(), FAST).unwrap();
        sink.record(1, &metrics(1.0)).unwrap();
        assert!(!sink.shared.warned.load(Ordering::Relaxed), "warned before its silence passed");
        std::thread::sleep(FAST.silence);
        sink.record(2, &metrics(2.0)).unwrap();
        assert!(sink.shared.warned.load(Ordering::Relaxed), "not warned after {:?} without an answer", FAST.silence);
    }

    #[test]
    fn a_monitor_that_answers_every_step_is_waited_for_until_it_finishes() {
        let dir = tempfile::tempdir().unwrap();
        // Takes each step, then spends longer than `silence` in its finish (an upload), and finishes.
        let python = fake(
            dir.path(),
            &format!(
                r#"{LOGGED_IN}; while read step; do echo '{{"event":"logged"}}'; done; sleep 2; echo '{{"event":"finished","failed":0}}'"#
            ),
        );
        let mut sink = HostedSink::start(Service::Wandb, &python, &spec("wandb"), dir.path(), FAST).unwrap();
        for step in 1..=3 {
            sink.record(step, &metrics(step as f64)).unwrap();
        }
        assert_eq!(sink.close(), Missed { recorded: 3, logged: 3, finished: true, ..Missed::default() });
    }

    #[test]
    fn a_service_that_is_down_costs_the_run_nothing_but_its_steps() {
        let dir = tempfile::tempdir().unwrap();
        let python = fake(
            dir.path(),
            r#"read line; echo '{"event":"imported"}'; echo 'Connection refused' >&2
               echo '{"event":"error","stage":"init","message":"ConnectionError: Connection refused"}'; exit 1"#,
        );
        let mut sink = HostedSink::start(Service::Mlflow, &python, &spec("mlflow"), dir.path(), FAST).unwrap();
        for step in 1..=3 {
            sink.record(step, &metrics(1.0)).unwrap();
        }
        let missed = sink.close();
        assert_eq!(missed, Missed { recorded: 3, ..Missed::default() });
    }

    #[test]
    fn a_monitor_that_dies_loses_the_steps_after_it_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let python = fake(dir.path(), &format!("{LOGGED_IN}; echo 'lost the service' >&2; exit 3"));
        let mut sink = HostedSink::start(Service::Mlflow, &python, &spec("mlflow"), dir.path(), FAST).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        for step in 1..=3 {
            sink.record(step, &metrics(1.0)).unwrap();
        }
        let missed = sink.close();
        assert_eq!((missed.recorded, missed.logged, missed.finished), (3, 0, false), "{missed:?}");
        assert!(std::fs::read_to_string(dir.path().join("mlflow.log")).unwrap().contains("lost the service"));
    }

    #[test]
    fn a_missing_client_or_unusable_arguments_are_errors_that_say_what_to_do() {
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
        let python = fake(
            dir.path(),
            r#"read line; echo '{"event":"error","stage":"config","message":"SWANLAB_API_KEY is not set"}'; exit 1"#,
        );
        let Err(error) = HostedSink::start(Service::Swanlab, &python, &spec("swanlab"), dir.path(), FAST) else {
            panic!("started with arguments its client cannot use")
        };
        assert!(error.to_string().contains("SWANLAB_API_KEY is not set"), "{error}");
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
        let limits = Limits { queue: 16, start: Duration::from_secs(120), ..Limits::default() };
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
            let all = Missed { recorded: 3, logged: 3, finished: true, ..Missed::default() };
            assert_eq!(missed, all, "{}", service.name());
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
