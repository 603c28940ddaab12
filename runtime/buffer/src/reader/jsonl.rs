//! JSON Lines tasksets: one object per line; blank lines are skipped; errors give the 1-based line number.

use std::io::BufRead;
use std::path::Path;

use serde_json::Value;

use crate::error::{BufferError, Result, json_kind};
use crate::task::Row;

pub fn read(path: &Path) -> Result<Vec<Row>> {
    let file = std::fs::File::open(path).map_err(|source| BufferError::Io { path: path.to_owned(), source })?;
    let mut rows = Vec::new();
    // Lines are split as bytes and decoded one by one, so a bad byte is reported at its line: `BufRead::lines`
    // would fail with a bare "stream did not contain valid UTF-8".
    for (i, line) in std::io::BufReader::new(file).split(b'\n').enumerate() {
        let bytes = line.map_err(|source| BufferError::Io { path: path.to_owned(), source })?;
        let line = utf8_line(path, i + 1, &bytes)?;
        if line.trim().is_empty() {
            continue;
        }
        rows.push(parse_line(path, i + 1, line)?);
    }
    Ok(rows)
}

/// One line's bytes as text, or an error naming the line and the 1-based column of the first bad byte.
pub(crate) fn utf8_line<'b>(path: &Path, line: usize, bytes: &'b [u8]) -> Result<&'b str> {
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    std::str::from_utf8(bytes).map_err(|error| BufferError::NotUtf8Line {
        path: path.to_owned(),
        line,
        column: error.valid_up_to() + 1,
    })
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
    fn a_bad_utf8_byte_names_its_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bytes.jsonl");
        std::fs::write(&path, b"{\"q\": \"a\"}\r\n{\"q\": \"b\xffc\"}\n").unwrap();
        let text = read(&path).unwrap_err().to_string();
        assert!(text.contains("bytes.jsonl") && text.contains("line 2") && text.contains("column 9"), "{text}");
        std::fs::write(&path, b"{\"q\": \"a\"}\r\n{\"q\": \"\xc3\xa9\"}\n").unwrap();
        assert_eq!(read(&path).unwrap()[1]["q"], "\u{e9}");
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
