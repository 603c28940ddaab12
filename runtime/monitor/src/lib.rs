//! Where a run's per-step metrics go.
//!
//! Every run writes `metrics.jsonl` (one JSON object per step: `{"step": N, "rollout/reward_mean": ..., ...}`),
//! the format the rest of trinity and users' scripts read. `monitor.monitor_type` adds one more sink: `csv`
//! (a wide table a spreadsheet opens) or `tensorboard` (event files TensorBoard reads). Sinks flush every step
//! so a killed run keeps every step it reported.

mod crc32c;
mod csv_sink;
mod error;
mod hosted;
mod jsonl_sink;
mod progress;
mod tensorboard;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use crate::csv_sink::CsvSink;
pub use crate::error::MonitorError;
pub use crate::jsonl_sink::JsonlSink;
pub use crate::progress::{Phase, Progress, observe, stop_observing};
pub use crate::tensorboard::TensorboardSink;

/// One step's metrics, by name (`rollout/reward_mean`, `train/pg_loss`, ...). Sorted, so files are stable.
pub type Metrics = BTreeMap<String, f64>;

/// What a run tells its monitor: the sink `monitor_type` names and, for a hosted service, who the run is, as
/// Trinity-RFT names it (`project`, `group`, a run `{name}_{role}` tagged `role`), `monitor.monitor_args`, and
/// the run's resolved config (logged as the service's run config or parameters).
#[derive(Debug, Clone, Default)]
pub struct MonitorSpec {
    pub monitor_type: String,
    pub monitor_args: serde_json::Map<String, serde_json::Value>,
    pub project: String,
    pub group: String,
    pub name: String,
    /// The explorer's or trainer's name (Trinity-RFT's monitor `role`), or `both` for one process doing both.
    pub role: String,
    pub config: serde_json::Value,
}

/// A destination for per-step metrics.
pub trait Sink: Send {
    /// Records the metrics of one step and makes them durable before returning.
    fn record(&mut self, step: u64, metrics: &Metrics) -> Result<(), MonitorError>;

    /// Forgets every step after `step`: a resumed run redoes them from its checkpoint, and the history must hold
    /// each step once. Returns how many records were dropped. Sinks whose readers show the newest record of a
    /// step anyway (TensorBoard) keep theirs.
    fn rewind(&mut self, _step: u64) -> Result<usize, MonitorError> {
        Ok(0)
    }
}

/// The file beside `metrics.jsonl` that holds a run's planned steps (`{"total_steps": N}`, `null` when the run
/// cannot know), so that readers (the studio) can show steps done of total.
pub const PLAN_FILE: &str = "plan.json";

/// Every sink of a run, fed together, and the run's progress (see [`Progress`]).
pub struct Monitor {
    dir: PathBuf,
    sinks: Vec<Box<dyn Sink>>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor").field("sinks", &self.sinks.len()).finish()
    }
}

impl Monitor {
    /// Opens `metrics.jsonl` in `dir`, plus the sink `monitor_type` names (`jsonl` adds none), for a run with no
    /// name (a hosted service then files it under empty names: use [`Monitor::open_run`]).
    pub fn open(dir: &Path, monitor_type: &str) -> Result<Monitor, MonitorError> {
        Monitor::open_run(dir, &MonitorSpec { monitor_type: monitor_type.to_owned(), ..MonitorSpec::default() })
    }

    /// Opens `metrics.jsonl` in `dir`, plus the sink `spec.monitor_type` names. A hosted service's client is
    /// started here, with `TRINITY_PYTHON` or `python3`; a missing client package (or monitor arguments it cannot
    /// use) is an error, a service that is down or refuses the login a warning.
    ///
    /// Appends to existing files, so a resumed run continues its history.
    pub fn open_run(dir: &Path, spec: &MonitorSpec) -> Result<Monitor, MonitorError> {
        std::fs::create_dir_all(dir).map_err(|source| MonitorError::Io { path: dir.to_owned(), source })?;
        let mut sinks: Vec<Box<dyn Sink>> = vec![Box::new(JsonlSink::open(&dir.join("metrics.jsonl"))?)];
        match spec.monitor_type.as_str() {
            "jsonl" => {}
            "csv" => sinks.push(Box::new(CsvSink::open(&dir.join("metrics.csv"))?)),
            "tensorboard" => sinks.push(Box::new(TensorboardSink::create(&dir.join("tensorboard"))?)),
            other => {
                let service =
                    hosted::Service::named(other).ok_or_else(|| MonitorError::UnknownMonitor(other.to_owned()))?;
                let limits = hosted::Limits::default();
                sinks.push(Box::new(hosted::HostedSink::start(service, &hosted::python(), spec, dir, limits)?));
            }
        }
        Ok(Monitor { dir: dir.to_owned(), sinks })
    }

    /// Records the run's plan: `total_steps` (`None` when it cannot know) with `done` of them done before this
    /// process started. Written to a temporary file and renamed, so a reader never sees half of it.
    ///
    /// Steps after `done` that a killed process had recorded are dropped ([`Sink::rewind`]): this process redoes
    /// them from the checkpoint at `done`, and would otherwise leave each of them twice in the history.
    pub fn plan(&mut self, total_steps: Option<u64>, done: u64) -> Result<(), MonitorError> {
        for sink in &mut self.sinks {
            let dropped = sink.rewind(done)?;
            if dropped > 0 {
                tracing::info!("monitor: dropped {dropped} record(s) after step {done}, which this run redoes");
            }
        }
        let path = self.dir.join(PLAN_FILE);
        let partial = self.dir.join(format!(".{PLAN_FILE}.partial"));
        let text = serde_json::json!({ "total_steps": total_steps, "resumed_at": done }).to_string();
        std::fs::write(&partial, text).map_err(MonitorError::io(&partial))?;
        std::fs::rename(&partial, &path).map_err(MonitorError::io(&path))?;
        progress::notify(|progress| progress.planned(total_steps, done));
        Ok(())
    }

    /// Step `step` entered `phase` (for live displays; nothing is written).
    pub fn phase(&self, step: u64, phase: Phase) {
        progress::notify(|progress| progress.phase(step, phase));
    }

    /// Records one step in every sink; the first failure is returned after all sinks were tried.
    pub fn record(&mut self, step: u64, metrics: &Metrics) -> Result<(), MonitorError> {
        let mut first_error = None;
        for sink in &mut self.sinks {
            if let Err(error) = sink.record(step, metrics) {
                first_error.get_or_insert(error);
            }
        }
        progress::notify(|progress| progress.recorded(step, metrics));
        first_error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_the_sinks_the_monitor_type_names() {
        let dir = tempfile::tempdir().unwrap();
        let mut monitor = Monitor::open(dir.path(), "csv").unwrap();
        monitor.record(1, &Metrics::from([("a".to_owned(), 1.0)])).unwrap();
        assert!(dir.path().join("metrics.jsonl").exists());
        assert!(dir.path().join("metrics.csv").exists());
        let error = Monitor::open(dir.path(), "neptune").unwrap_err().to_string();
        assert!(error.contains("neptune") && error.contains("wandb"), "{error}");
    }

    #[test]
    fn a_resumed_plan_drops_the_steps_the_run_redoes_from_every_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut monitor = Monitor::open(dir.path(), "csv").unwrap();
        for step in 1..=3 {
            monitor.record(step, &Metrics::from([("a".to_owned(), step as f64)])).unwrap();
        }
        drop(monitor);
        let mut resumed = Monitor::open(dir.path(), "csv").unwrap();
        resumed.plan(Some(5), 1).unwrap();
        resumed.record(2, &Metrics::from([("a".to_owned(), 20.0)])).unwrap();
        let jsonl = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
        assert_eq!(jsonl, "{\"step\":1,\"a\":1.0}\n{\"step\":2,\"a\":20.0}\n");
        let csv = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
        assert_eq!(csv, "step,a\n1,1\n2,20\n");
    }

    /// Every event reaches the installed observer, and the plan is on disk for readers.
    #[test]
    fn the_plan_is_written_and_events_reach_the_observer() {
        use std::sync::{Arc, Mutex};
        #[derive(Default)]
        struct Seen(Arc<Mutex<Vec<String>>>);
        impl Progress for Seen {
            fn planned(&mut self, total_steps: Option<u64>, done: u64) {
                self.0.lock().unwrap().push(format!("plan {total_steps:?} {done}"));
            }
            fn phase(&mut self, step: u64, phase: Phase) {
                self.0.lock().unwrap().push(format!("{step} {}", phase.label()));
            }
            fn recorded(&mut self, step: u64, metrics: &Metrics) {
                self.0.lock().unwrap().push(format!("{step} recorded {}", metrics.len()));
            }
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        observe(Box::new(Seen(Arc::clone(&seen))));
        let dir = tempfile::tempdir().unwrap();
        let mut monitor = Monitor::open(dir.path(), "jsonl").unwrap();
        monitor.plan(Some(4), 1).unwrap();
        monitor.phase(102, Phase::Explore);
        monitor.record(102, &Metrics::from([("a".to_owned(), 1.0)])).unwrap();
        assert!(stop_observing().is_some());
        monitor.phase(103, Phase::Train);
        // Other tests of this binary record steps below 100 meanwhile; only this test's events count.
        let seen: Vec<String> =
            seen.lock().unwrap().iter().filter(|e| e.starts_with("plan") || e.starts_with("10")).cloned().collect();
        assert_eq!(seen, ["plan Some(4) 1", "102 explore", "102 recorded 1"]);
        let plan: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join(PLAN_FILE)).unwrap()).unwrap();
        assert_eq!(plan, serde_json::json!({"total_steps": 4, "resumed_at": 1}));
    }
}
