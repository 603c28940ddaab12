//! `metrics.csv`: a wide table, one row per step, one column per metric.
//!
//! Metrics can appear after the first step (eval metrics arrive every `eval_interval` steps). A new column
//! rewrites the file with the wider header (to a temporary file, then renamed, so a crash leaves the old file
//! or the new one, never half of either); otherwise a step is one appended line.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::{Metrics, MonitorError, Sink};

/// Writes a wide CSV.
#[derive(Debug)]
pub struct CsvSink {
    path: PathBuf,
    /// Metric columns after `step`, in header order.
    columns: Vec<String>,
    /// Every row written so far, as cells after `step`, kept to rewrite the file when a column appears.
    rows: Vec<(u64, Vec<String>)>,
    file: Option<File>,
}

impl CsvSink {
    /// Opens an existing table (keeping its rows) or starts a new one.
    pub fn open(path: &Path) -> Result<CsvSink, MonitorError> {
        let mut sink = CsvSink { path: path.to_owned(), columns: Vec::new(), rows: Vec::new(), file: None };
        if path.exists() {
            let text = std::fs::read_to_string(path).map_err(MonitorError::io(path))?;
            let mut lines = text.lines();
            if let Some(header) = lines.next() {
                let header = split_line(header);
                if header.first().map(String::as_str) != Some("step") {
                    return Err(MonitorError::Corrupt {
                        path: path.to_owned(),
                        reason: "first column is not `step`".into(),
                    });
                }
                sink.columns = header[1..].to_vec();
                for (n, line) in lines.enumerate() {
                    let cells = split_line(line);
                    let step = cells.first().and_then(|s| s.parse().ok()).ok_or_else(|| MonitorError::Corrupt {
                        path: path.to_owned(),
                        reason: format!("line {}: no step number", n + 2),
                    })?;
                    sink.rows.push((step, cells[1..].to_vec()));
                }
            }
        }
        Ok(sink)
    }

    fn rewrite(&mut self) -> Result<(), MonitorError> {
        let temp = self.path.with_extension("csv.tmp");
        let mut text = header_line(&self.columns);
        for (step, cells) in &self.rows {
            text.push_str(&row_line(*step, cells));
        }
        std::fs::write(&temp, text).map_err(MonitorError::io(&temp))?;
        std::fs::rename(&temp, &self.path).map_err(MonitorError::io(&self.path))?;
        self.file = None;
        Ok(())
    }
}

impl Sink for CsvSink {
    fn record(&mut self, step: u64, metrics: &Metrics) -> Result<(), MonitorError> {
        let known: BTreeSet<&str> = self.columns.iter().map(String::as_str).collect();
        let new: Vec<String> = metrics.keys().filter(|k| !known.contains(k.as_str())).cloned().collect();
        let widened = !new.is_empty() || !self.path.exists();
        self.columns.extend(new);
        let cells: Vec<String> =
            self.columns.iter().map(|c| metrics.get(c).map(|v| v.to_string()).unwrap_or_default()).collect();
        self.rows.push((step, cells));
        if widened {
            // Older rows get empty cells for the new columns when rewritten.
            let width = self.columns.len();
            for (_, cells) in &mut self.rows {
                cells.resize(width, String::new());
            }
            return self.rewrite();
        }
        if self.file.is_none() {
            self.file = Some(OpenOptions::new().append(true).open(&self.path).map_err(MonitorError::io(&self.path))?);
        }
        let line = row_line(step, &self.rows[self.rows.len() - 1].1);
        let path = &self.path;
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| MonitorError::Corrupt { path: path.clone(), reason: "metrics file closed".into() })?;
        file.write_all(line.as_bytes()).map_err(MonitorError::io(path))?;
        file.flush().map_err(MonitorError::io(path))
    }

    fn rewind(&mut self, step: u64) -> Result<usize, MonitorError> {
        let before = self.rows.len();
        self.rows.retain(|(s, _)| *s <= step);
        let dropped = before - self.rows.len();
        if dropped > 0 {
            self.rewrite()?;
        }
        Ok(dropped)
    }
}

fn header_line(columns: &[String]) -> String {
    let mut line = "step".to_owned();
    for column in columns {
        line.push(',');
        line.push_str(&quote(column));
    }
    line.push('\n');
    line
}

fn row_line(step: u64, cells: &[String]) -> String {
    let mut line = step.to_string();
    for cell in cells {
        line.push(',');
        line.push_str(cell);
    }
    line.push('\n');
    line
}

fn quote(cell: &str) -> String {
    if cell.contains([',', '"', '\n']) { format!("\"{}\"", cell.replace('"', "\"\"")) } else { cell.to_owned() }
}

/// Splits one CSV line written by this sink (quoted cells may contain commas and doubled quotes).
fn split_line(line: &str) -> Vec<String> {
    let mut cells = Vec::new();
    let mut cell = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cell.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => cells.push(std::mem::take(&mut cell)),
            (c, _) => cell.push(c),
        }
    }
    cells.push(cell);
    cells
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(pairs: &[(&str, f64)]) -> Metrics {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    #[test]
    fn widens_the_table_when_a_metric_first_appears() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        let mut sink = CsvSink::open(&path).unwrap();
        sink.record(1, &metrics(&[("rollout/reward_mean", 0.5)])).unwrap();
        sink.record(2, &metrics(&[("rollout/reward_mean", 0.75)])).unwrap();
        sink.record(3, &metrics(&[("rollout/reward_mean", 1.0), ("eval/x,y/accuracy", 0.25)])).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "step,rollout/reward_mean,\"eval/x,y/accuracy\"\n1,0.5,\n2,0.75,\n3,1,0.25\n");
    }

    #[test]
    fn reopening_keeps_history_and_columns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        CsvSink::open(&path).unwrap().record(1, &metrics(&[("a", 1.0), ("b", 2.0)])).unwrap();
        let mut sink = CsvSink::open(&path).unwrap();
        sink.record(2, &metrics(&[("b", 3.0)])).unwrap();
        sink.record(3, &metrics(&[("c", 4.0)])).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "step,a,b,c\n1,1,2,\n2,,3,\n3,,,4\n");
    }

    #[test]
    fn a_foreign_file_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        std::fs::write(&path, "time,a\n").unwrap();
        let error = CsvSink::open(&path).unwrap_err().to_string();
        assert!(error.contains("metrics.csv") && error.contains("step"), "{error}");
    }
}
