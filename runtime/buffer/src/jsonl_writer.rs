//! Appends every experience to a JSON Lines file (the run's `experiences.jsonl`, or a queue's `.jsonl`
//! backup).
//!
//! One experience per line, a batch written then flushed and `fsync`ed per call, so after a crash the file
//! holds every batch whose `write_batch` returned, plus at most one partial last line — which
//! [`read_experiences`] skips (and only that one: a malformed line anywhere else is an error).

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{BufferError, Result};
use crate::experience::Experience;

/// An open, append-only experience file.
#[derive(Debug)]
pub struct JsonlWriter {
    path: PathBuf,
    file: BufWriter<File>,
}

impl JsonlWriter {
    /// Opens `path` for appending, creating it and its directory if needed.
    pub fn open(path: &Path) -> Result<JsonlWriter> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| BufferError::Io { path: parent.to_owned(), source })?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| BufferError::Io { path: path.to_owned(), source })?;
        Ok(JsonlWriter { path: path.to_owned(), file: BufWriter::new(file) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a batch and makes it durable before returning.
    pub fn write_batch(&mut self, batch: &[Experience]) -> Result<()> {
        let io = |source| BufferError::Io { path: self.path.clone(), source };
        for exp in batch {
            let line =
                serde_json::to_string(exp).map_err(|source| BufferError::Encode { uid: exp.eid.uid(), source })?;
            self.file.write_all(line.as_bytes()).map_err(io)?;
            self.file.write_all(b"\n").map_err(io)?;
        }
        self.file.flush().map_err(io)?;
        self.file.get_ref().sync_data().map_err(io)
    }
}

/// Reads an experience file back, skipping a partial final line left by a crash.
pub fn read_experiences(path: &Path) -> Result<Vec<Experience>> {
    let file = File::open(path).map_err(|source| BufferError::Io { path: path.to_owned(), source })?;
    let lines: Vec<String> = std::io::BufReader::new(file)
        .lines()
        .collect::<std::io::Result<_>>()
        .map_err(|source| BufferError::Io { path: path.to_owned(), source })?;
    let text_ends_with_newline = std::fs::read(path)
        .map_err(|source| BufferError::Io { path: path.to_owned(), source })?
        .last()
        .is_none_or(|b| *b == b'\n');
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(exp) => out.push(exp),
            Err(_) if i + 1 == lines.len() && !text_ends_with_newline => break,
            Err(source) => return Err(BufferError::JsonLine { path: path.to_owned(), line: i + 1, source }),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experience::Eid;

    fn exp(run: u64) -> Experience {
        Experience::single_turn(Eid { run, ..Eid::default() }, vec![1, 2, 3], 2, vec![-1.0])
    }

    #[test]
    fn appends_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/experiences.jsonl");
        JsonlWriter::open(&path).unwrap().write_batch(&[exp(0), exp(1)]).unwrap();
        JsonlWriter::open(&path).unwrap().write_batch(&[exp(2)]).unwrap();
        let back = read_experiences(&path).unwrap();
        assert_eq!(back.iter().map(|e| e.eid.run).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 3);
    }

    #[test]
    fn routed_experts_are_dumped_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("experiences.jsonl");
        let mut routed = exp(0);
        routed.routed_experts = Some(crate::RoutedExperts { layers: 1, top_k: 2, ids: vec![3, 1, 0, 2] });
        JsonlWriter::open(&path).unwrap().write_batch(std::slice::from_ref(&routed)).unwrap();
        let line = std::fs::read_to_string(&path).unwrap();
        assert!(
            line.contains(r#""routed_experts":{"layers":1,"top_k":2,"dtype":"uint8","data":"AwEAAg=="}"#),
            "{line}"
        );
        assert_eq!(read_experiences(&path).unwrap(), [routed]);
    }

    #[test]
    fn a_torn_last_line_is_skipped_but_a_bad_middle_line_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.jsonl");
        JsonlWriter::open(&path).unwrap().write_batch(&[exp(0)]).unwrap();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"eid\": {\"bat").unwrap();
        drop(f);
        assert_eq!(read_experiences(&path).unwrap().len(), 1);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"\n").unwrap();
        drop(f);
        JsonlWriter::open(&path).unwrap().write_batch(&[exp(1)]).unwrap();
        let text = read_experiences(&path).unwrap_err().to_string();
        assert!(text.contains("line 2"), "{text}");
    }
}
