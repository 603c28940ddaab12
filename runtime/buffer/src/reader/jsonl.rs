//! JSON Lines tasksets: one object per line; blank lines are skipped; errors give the 1-based line number.

use std::io::BufRead;
use std::path::Path;

use serde_json::Value;

use crate::error::{BufferError, Result, json_kind};
use crate::task::Row;

pub fn read(path: &Path) -> Result<Vec<Row>> {
    let file = std::fs::File::open(path).map_err(|source| BufferError::Io { path: path.to_owned(), source })?;
    let mut rows = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|source| BufferError::Io { path: path.to_owned(), source })?;
        if line.trim().is_empty() {
            continue;
        }
        rows.push(parse_line(path, i + 1, &line)?);
    }
    Ok(rows)
}

/// Parses one line (shared with the JSON reader, which accepts JSON Lines in `.json` files as `datasets` does).
pub(crate) fn parse_line(path: &Path, line: usize, text: &str) -> Result<Row> {
    let value: Value =
        serde_json::from_str(text).map_err(|source| BufferError::JsonLine { path: path.to_owned(), line, source })?;
    match value {
        Value::Object(row) => Ok(row),
        other => Err(BufferError::NotAnObject {
            path: path.to_owned(),
            location: format!("line {line}"),
            found: json_kind(&other),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rows_and_skips_blank_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        std::fs::write(&path, "{\"q\": \"a\", \"n\": 1}\n\n{\"q\": \"b\"}\n").unwrap();
        let rows = read(&path).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1]["q"], "b");
    }

    #[test]
    fn malformed_line_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.jsonl");
        std::fs::write(&path, "{\"q\": 1}\n{\"q\": \n").unwrap();
        let text = read(&path).unwrap_err().to_string();
        assert!(text.contains("bad.jsonl") && text.contains("line 2"), "{text}");
        std::fs::write(&path, "{\"q\": 1}\n[1, 2]\n").unwrap();
        let text = read(&path).unwrap_err().to_string();
        assert!(text.contains("line 2") && text.contains("an array"), "{text}");
    }
}
