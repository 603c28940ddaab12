//! Hugging Face dataset directories as `huggingface-cli download` leaves them.
//!
//! Layouts tried, first match wins (with `S` = split, `X` = parquet, jsonl or json):
//! `<path>/<subset>/S-*.X`, `<path>/<subset>/S.X`, `<path>/<subset>/data/S-*.X`, `<path>/<subset>/S/*.X`
//! (only when `subset_name` is set), then the same four under `<path>/data/` … and `<path>/` itself. Within a
//! layout the files are sorted by name, so shards are read in order.

use std::path::{Path, PathBuf};

use crate::error::{BufferError, Result};
use crate::reader::extension;

const EXTENSIONS: [&str; 3] = ["parquet", "jsonl", "json"];

/// The files holding `split` of the dataset at `root`.
pub fn split_files(root: &Path, subset_name: Option<&str>, split: &str) -> Result<Vec<PathBuf>> {
    let mut bases = Vec::new();
    if let Some(subset) = subset_name.filter(|s| !s.is_empty()) {
        bases.push(root.join(subset));
        bases.push(root.join(subset).join("data"));
    }
    bases.push(root.join("data"));
    bases.push(root.to_owned());
    for base in &bases {
        let files = files_in(base, split)?;
        if !files.is_empty() {
            return Ok(files);
        }
    }
    let looked_for =
        bases.iter().map(|b| format!("{}/{split}-*, {split}.*, {split}/*", b.display())).collect::<Vec<_>>().join("; ");
    Err(BufferError::NoSplitFiles { path: root.to_owned(), split: split.to_owned(), looked_for })
}

fn files_in(base: &Path, split: &str) -> Result<Vec<PathBuf>> {
    if !base.is_dir() {
        return Ok(Vec::new());
    }
    let shard_prefix = format!("{split}-");
    let mut files: Vec<PathBuf> = list(base)?
        .into_iter()
        .filter(|p| p.is_file() && data_file(p))
        .filter(|p| {
            let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            stem == split || stem.starts_with(&shard_prefix)
        })
        .collect();
    let split_dir = base.join(split);
    if files.is_empty() && split_dir.is_dir() {
        files = list(&split_dir)?.into_iter().filter(|p| p.is_file() && data_file(p)).collect();
    }
    files.sort();
    Ok(files)
}

fn data_file(path: &Path) -> bool {
    extension(path).is_some_and(|e| EXTENSIONS.contains(&e.as_str()))
}

fn list(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|source| BufferError::Io { path: dir.to_owned(), source })?;
    let mut paths = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| BufferError::Io { path: dir.to_owned(), source })?;
        paths.push(entry.path());
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "").unwrap();
    }

    #[test]
    fn subset_shards_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        touch(&root.join("main/train-00001-of-00002.parquet"));
        touch(&root.join("main/train-00000-of-00002.parquet"));
        touch(&root.join("main/test-00000-of-00001.parquet"));
        touch(&root.join("README.md"));
        let files = split_files(root, Some("main"), "train").unwrap();
        let names: Vec<_> = files.iter().map(|f| f.file_name().unwrap().to_str().unwrap().to_owned()).collect();
        assert_eq!(names, ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]);
    }

    #[test]
    fn data_dir_and_plain_split_files() {
        let dir = tempfile::tempdir().unwrap();
        touch(&dir.path().join("data/test-00000-of-00001.parquet"));
        let files = split_files(dir.path(), None, "test").unwrap();
        assert_eq!(files.len(), 1);
        let dir = tempfile::tempdir().unwrap();
        touch(&dir.path().join("train.jsonl"));
        touch(&dir.path().join("training_notes.jsonl"));
        assert_eq!(split_files(dir.path(), None, "train").unwrap(), [dir.path().join("train.jsonl")]);
    }

    #[test]
    fn a_missing_split_says_where_it_looked() {
        let dir = tempfile::tempdir().unwrap();
        touch(&dir.path().join("data/train-0.parquet"));
        let text = split_files(dir.path(), Some("main"), "validation").unwrap_err().to_string();
        assert!(text.contains("validation") && text.contains("main"), "{text}");
    }
}
