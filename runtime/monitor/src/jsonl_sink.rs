//! `metrics.jsonl`: one JSON object per step.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::{Metrics, MonitorError, Sink};

/// Appends `{"step": N, ...metrics}` lines.
#[derive(Debug)]
pub struct JsonlSink {
    path: PathBuf,
    file: File,
}

impl JsonlSink {
    /// Opens (or creates) the file for appending.
    pub fn open(path: &Path) -> Result<JsonlSink, MonitorError> {
        let file = OpenOptions::new().create(true).append(true).open(path).map_err(MonitorError::io(path))?;
        Ok(JsonlSink { path: path.to_owned(), file })
    }
}

impl Sink for JsonlSink {
    fn record(&mut self, step: u64, metrics: &Metrics) -> Result<(), MonitorError> {
        let mut object = Map::new();
        object.insert("step".to_owned(), Value::from(step));
        for (key, value) in metrics {
            // JSON has no NaN or infinity; null keeps the key visible without breaking readers.
            let value = serde_json::Number::from_f64(*value).map_or(Value::Null, Value::Number);
            object.insert(key.clone(), value);
        }
        let mut line = Value::Object(object).to_string();
        line.push('\n');
        // One write call per line keeps lines whole even if the process dies mid-step.
        self.file.write_all(line.as_bytes()).map_err(MonitorError::io(&self.path))?;
        self.file.flush().map_err(MonitorError::io(&self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_one_object_per_step_and_appends_on_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut sink = JsonlSink::open(&path).unwrap();
        sink.record(1, &Metrics::from([("train/pg_loss".to_owned(), 0.5), ("x".to_owned(), f64::NAN)])).unwrap();
        drop(sink);
        JsonlSink::open(&path).unwrap().record(2, &Metrics::from([("train/pg_loss".to_owned(), 0.25)])).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["step"], 1);
        assert_eq!(lines[0]["train/pg_loss"], 0.5);
        assert_eq!(lines[0]["x"], Value::Null);
        assert_eq!(lines[1]["step"], 2);
    }
}
