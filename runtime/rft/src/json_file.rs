//! Small JSON state files of a run (`bench_meta.json`, `stage_meta.json`, the weight store's records) and the
//! serve mode's URL file, written beside their final name and renamed into place, so a process killed mid-write
//! never leaves half a file and a reader in another process sees the old or the new content, never an empty one.

use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::RftError;

/// The file's content, or `None` when it does not exist.
pub(crate) fn read<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, RftError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| RftError::Unsupported(format!("{}: unreadable: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(RftError::Io { path: path.to_owned(), source }),
    }
}

/// Replaces the file with `value`, atomically.
pub(crate) fn write<T: Serialize>(path: &Path, value: &T) -> Result<(), RftError> {
    let text = serde_json::to_vec(value).map_err(|e| RftError::Unsupported(format!("{}: {e}", path.display())))?;
    replace(path, &text)
}

/// Replaces the file with `bytes`, atomically: written as `.<name>.partial` beside it, then renamed.
pub(crate) fn replace(path: &Path, bytes: &[u8]) -> Result<(), RftError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| RftError::Io { path: parent.to_owned(), source })?;
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let partial = path.with_file_name(format!(".{name}.partial"));
    std::fs::write(&partial, bytes).map_err(|source| RftError::Io { path: partial.clone(), source })?;
    std::fs::rename(&partial, path).map_err(|source| RftError::Io { path: path.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_file_holds_the_new_bytes_and_no_partial_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job/explorer_server_url.txt");
        replace(&path, b"http://127.0.0.1:1\n").unwrap();
        replace(&path, b"http://127.0.0.1:2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "http://127.0.0.1:2\n");
        let names: Vec<_> =
            std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["explorer_server_url.txt"]);
        write(&dir.path().join("meta.json"), &serde_json::json!({"step": 3})).unwrap();
        let back: Option<serde_json::Value> = read(&dir.path().join("meta.json")).unwrap();
        assert_eq!(back, Some(serde_json::json!({"step": 3})));
    }
}
