//! Where a run's per-step metrics go.
//!
//! Every run writes `metrics.jsonl` (one JSON object per step: `{"step": N, "rollout/reward_mean": ..., ...}`),
//! the format the rest of trinity and users' scripts read. `monitor.monitor_type` adds one more sink: `csv`
//! (a wide table a spreadsheet opens) or `tensorboard` (event files TensorBoard reads). Sinks flush every step
//! so a killed run keeps every step it reported.

mod crc32c;
mod csv_sink;
mod error;
mod jsonl_sink;
mod tensorboard;

use std::collections::BTreeMap;
use std::path::Path;

pub use crate::csv_sink::CsvSink;
pub use crate::error::MonitorError;
pub use crate::jsonl_sink::JsonlSink;
pub use crate::tensorboard::TensorboardSink;

/// One step's metrics, by name (`rollout/reward_mean`, `train/pg_loss`, ...). Sorted, so files are stable.
pub type Metrics = BTreeMap<String, f64>;

/// A destination for per-step metrics.
pub trait Sink: Send {
    /// Records the metrics of one step and makes them durable before returning.
    fn record(&mut self, step: u64, metrics: &Metrics) -> Result<(), MonitorError>;
}

/// Every sink of a run, fed together.
pub struct Monitor {
    sinks: Vec<Box<dyn Sink>>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor").field("sinks", &self.sinks.len()).finish()
    }
}

impl Monitor {
    /// Opens `metrics.jsonl` in `dir`, plus the sink `monitor_type` names (`jsonl` adds none).
    ///
    /// Appends to existing files, so a resumed run continues its history.
    pub fn open(dir: &Path, monitor_type: &str) -> Result<Monitor, MonitorError> {
        std::fs::create_dir_all(dir).map_err(|source| MonitorError::Io { path: dir.to_owned(), source })?;
        let mut sinks: Vec<Box<dyn Sink>> = vec![Box::new(JsonlSink::open(&dir.join("metrics.jsonl"))?)];
        match monitor_type {
            "jsonl" => {}
            "csv" => sinks.push(Box::new(CsvSink::open(&dir.join("metrics.csv"))?)),
            "tensorboard" => sinks.push(Box::new(TensorboardSink::create(&dir.join("tensorboard"))?)),
            other => return Err(MonitorError::UnknownMonitor(other.to_owned())),
        }
        Ok(Monitor { sinks })
    }

    /// Records one step in every sink; the first failure is returned after all sinks were tried.
    pub fn record(&mut self, step: u64, metrics: &Metrics) -> Result<(), MonitorError> {
        let mut first_error = None;
        for sink in &mut self.sinks {
            if let Err(error) = sink.record(step, metrics) {
                first_error.get_or_insert(error);
            }
        }
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
        let error = Monitor::open(dir.path(), "wandb").unwrap_err().to_string();
        assert!(error.contains("wandb"), "{error}");
    }
}
