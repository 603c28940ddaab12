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

    /// Rewrites the file (beside, then renamed) without the lines of later steps. A line that does not parse
    /// (the torn end of a write the kill interrupted) is dropped too: appending after it would garble the next.
    fn rewind(&mut self, step: u64) -> Result<usize, MonitorError> {
        let text = std::fs::read_to_string(&self.path).map_err(MonitorError::io(&self.path))?;
        let mut kept = String::with_capacity(text.len());
        let mut dropped = 0;
        for line in text.split_inclusive('\n') {
            let keep = line.ends_with('\n')
                && serde_json::from_str::<Value>(line)
                    .ok()
                    .and_then(|row| row.get("step").and_then(Value::as_u64))
                    .is_some_and(|s| s <= step);
            if keep {
                kept.push_str(line);
            } else if !line.trim().is_empty() {
                dropped += 1;
            }
        }
        if dropped == 0 {
            return Ok(0);
        }
        let temp = self.path.with_extension("jsonl.tmp");
        std::fs::write(&temp, kept).map_err(MonitorError::io(&temp))?;
        std::fs::rename(&temp, &self.path).map_err(MonitorError::io(&self.path))?;
        *self = JsonlSink::open(&self.path)?;
        Ok(dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewinding_drops_later_steps_and_a_torn_line_then_appends_after_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut sink = JsonlSink::open(&path).unwrap();
        for step in [0, 1, 2, 3] {
            sink.record(step, &Metrics::from([("r".to_owned(), step as f64)])).unwrap();
        }
        drop(sink);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"step\": 4, \"r\"");
        std::fs::write(&path, text).unwrap();
        let mut sink = JsonlSink::open(&path).unwrap();
        assert_eq!(sink.rewind(2).unwrap(), 2, "step 3 and the torn step 4");
        sink.record(3, &Metrics::from([("r".to_owned(), 30.0)])).unwrap();
        assert_eq!(sink.rewind(3).unwrap(), 0);
        let steps: Vec<(u64, f64)> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|v| (v["step"].as_u64().unwrap(), v["r"].as_f64().unwrap()))
            .collect();
        assert_eq!(steps, [(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0)]);
    }

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
