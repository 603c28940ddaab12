//! JSON tasksets: a top-level array of row objects (errors give the 0-based row index). A `.json` file that
//! holds JSON Lines instead is read as such, as Hugging Face `datasets` does.

use std::path::Path;

use serde_json::Value;

use crate::error::{BufferError, Result, json_kind};
use crate::task::Row;

pub fn read(path: &Path) -> Result<Vec<Row>> {
    let bytes = std::fs::read(path).map_err(|source| BufferError::Io { path: path.to_owned(), source })?;
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(error) => {
            // Name the line of the first bad byte, as the JSON Lines reader does.
            let bytes = error.as_bytes();
            let bad = error.utf8_error().valid_up_to();
            let line = bytes[..bad].iter().filter(|&&b| b == b'\n').count() + 1;
            let start = bytes[..bad].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            return Err(BufferError::NotUtf8Line { path: path.to_owned(), line, column: bad - start + 1 });
        }
    };
    let value: Value = match serde_json::from_str(&text) {
        Ok(value) => value,
        // Several top-level objects: JSON Lines under a `.json` name.
        Err(err) if text.trim_start().starts_with('{') && err.is_syntax() && text.trim().lines().count() > 1 => {
            return read_lines(path, &text);
        }
        Err(source) => return Err(BufferError::Json { path: path.to_owned(), source }),
    };
    match value {
        Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::Object(row) => Ok(row),
                other => Err(BufferError::NotAnObject {
                    path: path.to_owned(),
                    location: format!("row {i}"),
                    found: json_kind(&other),
                }),
            })
            .collect(),
        Value::Object(row) => Ok(vec![row]),
        other => Err(BufferError::NotAnArray { path: path.to_owned(), found: json_kind(&other) }),
    }
}

fn read_lines(path: &Path, text: &str) -> Result<Vec<Row>> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| super::jsonl::parse_line(path, i + 1, line))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn a_bad_utf8_byte_names_its_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bytes.json");
        std::fs::write(&path, b"[\n  {\"q\": \"a\"},\n  {\"q\": \"\xfe\"}\n]\n").unwrap();
        let text = read(&path).unwrap_err().to_string();
        assert!(text.contains("bytes.json") && text.contains("line 3") && text.contains("column 10"), "{text}");
    }

    #[test]
    fn reads_an_array_of_rows() {
        let (_dir, path) = write("t.json", r#"[{"q": "a"}, {"q": "b", "answer": 3}]"#);
        let rows = read(&path).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1]["answer"], 3);
    }

    #[test]
    fn reads_json_lines_named_json() {
        let (_dir, path) = write("t.json", "{\"q\": \"a\"}\n{\"q\": \"b\"}\n");
        assert_eq!(read(&path).unwrap().len(), 2);
        let (_dir, path) = write("t.json", "{\"q\": \"a\"}\n{\"q\": oops}\n");
        let text = read(&path).unwrap_err().to_string();
        assert!(text.contains("line 2"), "{text}");
    }

    #[test]
    fn non_object_rows_and_bad_json_are_named() {
        let (_dir, path) = write("t.json", r#"[{"q": "a"}, 5]"#);
        let text = read(&path).unwrap_err().to_string();
        assert!(text.contains("row 1") && text.contains("a number"), "{text}");
        let (_dir, path) = write("t.json", r#"[{"q": "a"},"#);
        assert!(matches!(read(&path), Err(BufferError::Json { .. })));
        let (_dir, path) = write("t.json", "7");
        assert!(matches!(read(&path), Err(BufferError::NotAnArray { .. })));
    }
}
