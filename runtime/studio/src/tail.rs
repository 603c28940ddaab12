//! A JSON Lines file that a run appends to, read from where the last read stopped, and indexed line by line.
//!
//! The experiences and failed-task indexes both need the same things of a growing file: read only the bytes
//! appended since the last request, hand over only complete lines (a line the run is writing right now, or the
//! torn last line of a crash, waits until it ends with a newline), notice a file that shrank or was replaced
//! (another inode), whose index must then be dropped and rebuilt from the start, and page through the lines a
//! filter keeps by reading them back from their offsets. [`Tail`] does the reading and [`LineIndex`] the rest;
//! each file kind only says what it keeps of a line ([`IndexEntry`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Where reading a growing file got to.
#[derive(Debug)]
pub(crate) struct Tail {
    path: PathBuf,
    /// Every byte before this offset was handed over (it always ends a line).
    consumed: u64,
    identity: Option<(u64, u64)>,
}

impl Tail {
    pub(crate) fn new(path: &Path) -> Tail {
        Tail { path: path.to_owned(), consumed: 0, identity: None }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Hands each complete line appended since the last call to `line` (its byte offset and its text without
    /// the newline). When the file was replaced or shrank, `restart` runs first and every line is handed over
    /// again. An error (the file is gone) leaves the position as it was.
    pub(crate) fn read_new(&mut self, restart: impl FnOnce(), mut line: impl FnMut(u64, &[u8])) -> std::io::Result<()> {
        let file = File::open(&self.path)?;
        let meta = file.metadata()?;
        let identity = file_identity(&meta);
        if identity != self.identity || meta.len() < self.consumed {
            if self.identity.is_some() || self.consumed > 0 {
                restart();
            }
            self.consumed = 0;
            self.identity = identity;
        }
        if meta.len() <= self.consumed {
            return Ok(());
        }
        let mut reader = BufReader::with_capacity(1 << 16, file);
        reader.seek(SeekFrom::Start(self.consumed))?;
        let mut text = Vec::new();
        loop {
            text.clear();
            let read = reader.read_until(b'\n', &mut text)?;
            if read == 0 || text.last() != Some(&b'\n') {
                // The end, or a line still being written: it is handed over once it is whole.
                return Ok(());
            }
            line(self.consumed, &text[..read - 1]);
            self.consumed += read as u64;
        }
    }
}

/// What a [`LineIndex`] keeps of one line: the few fields its filters and summaries need, never the line.
pub trait IndexEntry: Sized {
    /// Which entries a page shows.
    type Filter;
    /// The entry of one line (without its newline), or `None` for a line that is not one of the file's records;
    /// such lines are counted as skipped.
    fn parse(text: &[u8]) -> Option<Self>;
    /// The step the line belongs to.
    fn step(&self) -> u64;
    /// Whether `filter` keeps this entry.
    fn kept_by(&self, filter: &Self::Filter) -> bool;
}

/// An entry and where its line is in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct Indexed<E> {
    pub offset: u64,
    pub len: usize,
    pub entry: E,
}

/// The index of a growing JSON Lines file: an entry per line, extended by each [`LineIndex::refresh`] with the
/// lines appended since, rebuilt when the file was replaced or shrank.
#[derive(Debug)]
pub struct LineIndex<E> {
    tail: Tail,
    lines: Vec<Indexed<E>>,
    skipped: usize,
}

impl<E: IndexEntry> LineIndex<E> {
    pub fn new(path: &Path) -> LineIndex<E> {
        LineIndex { tail: Tail::new(path), lines: Vec::new(), skipped: 0 }
    }

    /// Indexes the lines appended since the last refresh (all of them the first time, or after the file was
    /// replaced).
    pub fn refresh(&mut self) -> std::io::Result<()> {
        let LineIndex { tail, lines, skipped } = self;
        // New entries are collected apart and added once the tail says whether the file started over.
        let (mut fresh, mut fresh_skipped, mut restarted) = (Vec::new(), 0, false);
        tail.read_new(
            || restarted = true,
            |offset, text| {
                if text.iter().all(u8::is_ascii_whitespace) {
                    return;
                }
                match E::parse(text) {
                    Some(entry) => fresh.push(Indexed { offset, len: text.len(), entry }),
                    None => fresh_skipped += 1,
                }
            },
        )?;
        if restarted {
            lines.clear();
            *skipped = 0;
        }
        lines.append(&mut fresh);
        *skipped += fresh_skipped;
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.lines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Lines that are not records of this file's kind.
    pub fn skipped(&self) -> usize {
        self.skipped
    }

    /// Every entry, in file order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = &E> {
        self.lines.iter().map(|line| &line.entry)
    }

    /// Every step in the file with its number of entries, in step order.
    pub(crate) fn step_counts(&self) -> Vec<(u64, usize)> {
        let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
        for entry in self.entries() {
            *counts.entry(entry.step()).or_default() += 1;
        }
        counts.into_iter().collect()
    }

    /// The entries `filter` keeps: how many, and `read` of `limit` of them from the `offset`-th on, given the
    /// file to read their lines back from.
    pub(crate) fn read_page<R>(
        &self,
        filter: &E::Filter,
        offset: usize,
        limit: usize,
        mut read: impl FnMut(&mut File, &Indexed<E>) -> std::io::Result<R>,
    ) -> std::io::Result<(usize, Vec<R>)> {
        let kept: Vec<&Indexed<E>> = self.lines.iter().filter(|line| line.entry.kept_by(filter)).collect();
        let mut file = File::open(self.tail.path())?;
        let mut rows = Vec::with_capacity(limit.min(kept.len()));
        for line in kept.iter().skip(offset).take(limit) {
            rows.push(read(&mut file, line)?);
        }
        Ok((kept.len(), rows))
    }
}

/// Reads back the line of `len` bytes at `offset`, which parsed as a JSON object when it was indexed.
pub(crate) fn read_object_at(
    file: &mut File,
    offset: u64,
    len: usize,
) -> std::io::Result<serde_json::Map<String, serde_json::Value>> {
    file.seek(SeekFrom::Start(offset))?;
    let mut bytes = vec![0; len];
    file.read_exact(&mut bytes)?;
    match serde_json::from_slice(&bytes) {
        Ok(serde_json::Value::Object(object)) => Ok(object),
        // A file rewritten under us since it was indexed is reported, not guessed at.
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("the line at byte {offset} changed since it was indexed"),
        )),
    }
}

#[cfg(unix)]
fn file_identity(meta: &std::fs::Metadata) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    Some((meta.dev(), meta.ino()))
}

#[cfg(not(unix))]
fn file_identity(_: &std::fs::Metadata) -> Option<(u64, u64)> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(tail: &mut Tail) -> (bool, Vec<(u64, String)>) {
        let mut restarted = false;
        let mut seen = Vec::new();
        tail.read_new(|| restarted = true, |offset, text| seen.push((offset, String::from_utf8_lossy(text).into())))
            .unwrap();
        (restarted, seen)
    }

    #[test]
    fn hands_over_whole_lines_once_and_starts_over_on_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl");
        std::fs::write(&path, "one\ntw").unwrap();
        let mut tail = Tail::new(&path);
        assert_eq!(lines(&mut tail), (false, vec![(0, "one".into())]));
        assert_eq!(lines(&mut tail), (false, vec![]), "the torn line waits");
        std::fs::write(&path, "one\ntwo\n").unwrap();
        // Same inode, grown: only the completed line.
        assert_eq!(lines(&mut tail), (false, vec![(4, "two".into())]));
        std::fs::remove_file(&path).unwrap();
        assert!(tail.read_new(|| {}, |_, _| {}).is_err(), "a deleted file is an error");
        std::fs::write(&path, "new\n").unwrap();
        assert_eq!(lines(&mut tail), (true, vec![(0, "new".into())]));
    }
}
